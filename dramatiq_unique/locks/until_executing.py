from __future__ import annotations

from .base import LockType


class UntilExecuting(LockType):
    """Locked from enqueue until a worker starts the message.

    A duplicate can be enqueued again as soon as the message starts running.
    A retry re-takes the lock for the time the message waits again.
    """

    name = "until_executing"
    code = "s"
