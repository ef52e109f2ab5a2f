from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LockType

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class WhileExecuting(LockType):
    """Locked while the actor runs, whatever its outcome.

    Nothing is locked at enqueue: duplicates queue up and run one after another.
    """

    name = "while_executing"
    code = "w"
    takes_run_lock = True
    locks_at_enqueue = False

    def start(self, lock: MessageLock) -> Acquisition | None:
        return lock.acquire_run()
