"""Dramatiq's "was skipped" WARNING, left out for a message that waits in a lock's line.

A message that must wait in the run lock's line leaves the worker the only way a middleware can
stop it before its actor runs: by raising ``SkipMessage``. Dramatiq's worker thread then logs
``Message ... was skipped.`` at WARNING, though the message will run. The middleware says at
INFO that it waits, and this filter on the worker thread's logger drops that one WARNING.

The filter only drops the record of the message that the same thread marked as waiting, right
before it raised; the mark is cleared when the message leaves the worker. Every other skip (a
replaced copy, ``AgeLimit``) is logged as Dramatiq logs it.
"""

from __future__ import annotations

import logging
import threading

#: The logger of Dramatiq's worker threads (``dramatiq.worker.WorkerThread``).
WORKER_THREAD_LOGGER = "dramatiq.worker.WorkerThread"
#: The format of Dramatiq's line for a skipped message, with the message as its one argument.
SKIPPED = "Message %s was skipped."


class _Marks(threading.local):
    #: The message_id of the message this thread skips because it waits in line.
    waiting: str | None = None


class WaitingIsNotSkipped(logging.Filter):
    """Drops Dramatiq's "was skipped" record of the message this thread marked as waiting."""

    def __init__(self) -> None:
        super().__init__()
        self._marks = _Marks()

    def mark(self, message_id: str) -> None:
        """The message this thread processes waits in line: its skip is no news."""
        self._marks.waiting = message_id

    def clear(self) -> None:
        """The message left the worker."""
        marks = self._marks
        if marks.waiting is not None:
            marks.waiting = None

    def filter(self, record: logging.LogRecord) -> bool:
        waiting = self._marks.waiting
        if waiting is None or record.msg != SKIPPED or not isinstance(record.args, tuple) or not record.args:
            return True
        return getattr(record.args[0], "message_id", None) != waiting


#: The one filter of the process, whatever the number of middleware instances.
WAITING = WaitingIsNotSkipped()


def install() -> None:
    """Put the filter on Dramatiq's worker thread logger (once: adding it again does nothing)."""
    logging.getLogger(WORKER_THREAD_LOGGER).addFilter(WAITING)
