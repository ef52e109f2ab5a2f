"""Dramatiq's own log lines of a message, left out where the middleware tells it better.

- A message that must wait in the run lock's line leaves the worker the only way a middleware
  can stop it before its actor runs: by raising ``SkipMessage``. Dramatiq's worker thread then
  logs ``Message ... was skipped.`` at WARNING, though the message will run. The middleware
  says at INFO that it waits.
- A message interrupted with ``Cancelled`` ends as any exception ends a message: the worker
  thread logs ``Failed to process message ... with unhandled exception.`` at ERROR with a
  traceback, and ``Retries`` logs ``Retrying message ...`` before the middleware drops that
  retry. The middleware says at WARNING that it was cancelled, by whom, and what became of it.

The filter drops those records of the one message concerned, in the thread that processes it:
a skip the thread marked as a wait right before it raised, and the failure with ``Cancelled`` of
a message the middleware interrupted, then that message's retry line. The marks are cleared when the message leaves
the worker. Every other skip, failure and retry is logged as Dramatiq logs it.
"""

from __future__ import annotations

import logging
import threading
import weakref

from .cancellation import Cancellations
from .errors import Cancelled

#: The logger of Dramatiq's worker threads (``dramatiq.worker.WorkerThread``).
WORKER_THREAD_LOGGER = "dramatiq.worker.WorkerThread"
#: The logger of Dramatiq's ``Retries`` middleware.
RETRIES_LOGGER = "dramatiq.middleware.retries.Retries"
#: The formats of Dramatiq's lines: a skipped message and a failed one, with the message as
#: their one argument, and a retry, with the message_id first.
SKIPPED = "Message %s was skipped."
FAILED = "Failed to process message %s with unhandled exception."
RETRYING = "Retrying message %r in %d milliseconds."


class _Marks(threading.local):
    #: The message_id of the message this thread skips because it waits in line.
    waiting: str | None = None
    #: The message_id of the message this thread processed that was cancelled.
    cancelled: str | None = None


class Retold(logging.Filter):
    """Drops Dramatiq's lines of a message the middleware tells of itself (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self._marks = _Marks()
        #: Where the messages interrupted in this process are known: one per middleware.
        self._cancellations: weakref.WeakSet[Cancellations] = weakref.WeakSet()

    def tell_of(self, cancellations: Cancellations) -> None:
        """The messages that ``cancellations`` interrupts are told of by the middleware."""
        self._cancellations.add(cancellations)

    def waits(self, message_id: str) -> None:
        """The message this thread processes waits in line: its skip is no news."""
        self._marks.waiting = message_id

    def clear(self) -> None:
        """The message left the worker."""
        marks = self._marks
        if marks.waiting is not None or marks.cancelled is not None:
            marks.waiting = marks.cancelled = None

    def filter(self, record: logging.LogRecord) -> bool:
        marks = self._marks
        if not isinstance(record.args, tuple) or not record.args:
            return True
        if record.msg == SKIPPED:
            return marks.waiting is None or _message_id(record) != marks.waiting
        if record.msg == FAILED and record.exc_info and isinstance(record.exc_info[1], Cancelled):
            # Only a message the middleware interrupted, not an actor's own raise of Cancelled.
            # Dramatiq logs the failure before any middleware's hook: its retry line follows.
            message_id = _message_id(record)
            if message_id is None or not any(c.interrupted(message_id) for c in self._cancellations):
                return True
            marks.cancelled = message_id
            return False
        if record.msg == RETRYING:
            return marks.cancelled is None or record.args[0] != marks.cancelled
        return True


def _message_id(record: logging.LogRecord) -> str | None:
    assert isinstance(record.args, tuple)
    return getattr(record.args[0], "message_id", None)


#: The one filter of the process, whatever the number of middleware instances.
RETOLD = Retold()


def install(cancellations: Cancellations) -> None:
    """Put the filter on Dramatiq's loggers (once: adding it again does nothing), for the
    messages ``cancellations`` interrupts too."""
    RETOLD.tell_of(cancellations)
    logging.getLogger(WORKER_THREAD_LOGGER).addFilter(RETOLD)
    logging.getLogger(RETRIES_LOGGER).addFilter(RETOLD)
