from __future__ import annotations

from .base import LockType


class UntilExpired(LockType):
    """Locked from enqueue until ``lock_ttl`` runs out, whatever happens to the message."""

    name = "until_expired"
    code = "x"
    holds_enqueue_lock_while_running = True
    outlives_message = True
    requires_ttl = True
