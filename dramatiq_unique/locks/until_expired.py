from __future__ import annotations

from .base import LockType


class UntilExpired(LockType):
    """Locked from enqueue until ``lock_ttl`` runs out, whatever happens to the message (SPEC L3)."""

    name = "until_expired"
    requires_ttl = True

    def start(self, lock):
        lock.start_holding_enqueue()
        return None

    def end(self, lock, *, requeued):
        # The lock is never given up: only its TTL ends it.
        return None
