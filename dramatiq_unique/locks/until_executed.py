from __future__ import annotations

from .base import LockType


class UntilExecuted(LockType):
    """Locked from enqueue until the actor has succeeded or failed for good (SPEC L2).

    Retries keep the lock; a message that lands in the dead-letter queue
    gives it up.
    """

    name = "until_executed"

    def start(self, lock):
        lock.start_holding_enqueue()
        return None
