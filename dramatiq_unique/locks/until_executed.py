from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LockType

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class UntilExecuted(LockType):
    """Locked from enqueue until the actor has succeeded or failed for good.

    Retries keep the lock; a message that lands in the dead-letter queue
    gives it up.
    """

    name = "until_executed"
    code = "e"
    holds_enqueue_lock_while_running = True

    def start(self, lock: MessageLock) -> Acquisition | None:
        lock.start_holding_enqueue()
        return None
