from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LockType

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class UntilAndWhileExecuting(LockType):
    """Locked at enqueue; at start the run lock is taken and the enqueue lock
    given up in one atomic step.

    One copy may wait in the queue while another runs; a retry re-takes the
    enqueue lock.
    """

    name = "until_and_while_executing"
    code = "a"
    takes_run_lock = True

    def start(self, lock: MessageLock) -> Acquisition | None:
        return lock.swap_enqueue_for_run()
