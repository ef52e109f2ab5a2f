from __future__ import annotations

from typing import TYPE_CHECKING

from .base import LockType

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class UntilExecuting(LockType):
    """Locked from enqueue until a worker starts the message.

    A duplicate can be enqueued again as soon as the message starts running.
    A retry re-takes the lock for the time the message waits again.
    """

    name = "until_executing"
    code = "s"

    def start(self, lock: MessageLock) -> Acquisition | None:
        lock.start_releasing_enqueue()
        return None
