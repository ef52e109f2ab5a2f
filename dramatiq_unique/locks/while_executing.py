from __future__ import annotations

from .base import LockType


class WhileExecuting(LockType):
    """Locked while the actor runs, whatever its outcome (SPEC L4).

    Nothing is locked at enqueue: duplicates queue up and run one after another.
    """

    name = "while_executing"
    locks_at_enqueue = False

    def start(self, lock):
        return lock.acquire_run()
