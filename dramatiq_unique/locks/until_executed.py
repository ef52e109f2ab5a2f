from __future__ import annotations

from .base import LockType


class UntilExecuted(LockType):
    """Locked from enqueue until the actor has succeeded or failed for good.

    Retries keep the lock; a message that lands in the dead-letter queue
    gives it up.
    """

    name = "until_executed"
    code = "e"
    holds_enqueue_lock_while_running = True
