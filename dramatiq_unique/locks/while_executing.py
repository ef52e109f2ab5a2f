from __future__ import annotations

from .base import LockType


class WhileExecuting(LockType):
    """Locked while the actor runs, whatever its outcome.

    Nothing is locked at enqueue: duplicates queue up and run one after another.
    """

    name = "while_executing"
    code = "w"
    takes_run_lock = True
    locks_at_enqueue = False
