from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LockType

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class UntilExpired(LockType):
    """Locked from enqueue until ``lock_ttl`` runs out, whatever happens to the message."""

    name = "until_expired"
    code = "x"
    holds_enqueue_lock_while_running = True
    outlives_message = True
    requires_ttl = True

    def start(self, lock: MessageLock) -> Acquisition | None:
        lock.start_holding_enqueue()
        return None

    def end(self, lock: MessageLock, *, requeued: bool) -> None:
        # The lock is never given up: only its TTL ends it.
        return None
