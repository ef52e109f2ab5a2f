from __future__ import annotations

from .base import LockType


class UntilAndWhileExecuting(LockType):
    """Locked at enqueue; at start the run lock is taken and the enqueue lock
    given up in one atomic step.

    One copy may wait in the queue while another runs; a retry re-takes the
    enqueue lock.
    """

    name = "until_and_while_executing"
    code = "a"
    takes_run_lock = True
