"""The errors raised by dramatiq_unique.

Every error derives from :class:`dramatiq.middleware.MiddlewareError`: it is
the only kind of exception that Dramatiq lets escape from ``before_*`` hooks,
so these errors reach the caller of ``send()`` instead of being logged and
ignored while the message is enqueued or run anyway.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dramatiq import Retry
from dramatiq.middleware import Interrupt, MiddlewareError

from .version import RECORD_FORMAT

if TYPE_CHECKING:
    from dramatiq import Message
    from dramatiq.broker import MessageProxy


class UniqueError(MiddlewareError):
    """Base class for all dramatiq_unique errors."""


class InvalidLockOptions(UniqueError, ValueError):
    """Raised when an actor or a message is given lock options that are not valid."""


class LockArgumentsError(UniqueError, ValueError):
    """Raised when the lock arguments of a message cannot be computed or serialised."""


class InvalidBackendOptions(UniqueError, ValueError):
    """Raised when a lock backend is given connection options it cannot use, e.g. a URL that
    cannot be parsed, or when a UniqueJobs given no backend finds none to use. Its message
    never quotes the URL, which may hold a password."""


class LockBackendError(UniqueError):
    """Raised when the lock backend cannot be reached or fails to answer."""


class LockStoreHealing(LockBackendError):
    """Raised when the lock store refuses a new lock because it lost its data and heals:
    until the workers have taken again the locks of the messages they know of. The
    ``on_backend_error`` policy decides what a caller sees, as in an outage. See
    :doc:`Deploying the lock store </deploying-the-lock-store>`."""

    def __init__(self) -> None:
        super().__init__(
            "The lock store lost its data and heals: it takes no new lock until the workers have taken again the "
            "locks of the messages they know of (see Deploying the lock store in the docs)."
        )


class NewerLockFormat(LockBackendError):
    """Raised when the lock store holds locks in a record format newer than this version's: a
    newer dramatiq-unique wrote them, and this process takes no lock beside them. The
    ``on_backend_error`` policy decides what a caller sees, as in an outage. See
    :doc:`Upgrading </upgrading>`.

    Parameters:
      prefix(str): The lock prefix whose format marker says so.
      marker(str): The marker as found: the format and the version that wrote it.
    """

    def __init__(self, prefix: str, marker: str) -> None:
        format_number, _, writer = marker.partition(" ")
        super().__init__(
            f"The locks under prefix {prefix!r} are in record format {format_number!r}, written by "
            f"dramatiq-unique {writer or 'of an unknown version'}; this version writes format {RECORD_FORMAT} and "
            "takes no lock beside them. Upgrade dramatiq-unique in this process (see Upgrading in the docs)."
        )
        self.prefix = prefix
        self.marker = marker


class LockBackendRetry(LockBackendError, Retry):
    """Raised in the worker when the lock backend cannot be reached before a message runs.

    Being a :class:`dramatiq.Retry`, it takes Dramatiq's exception path
    without a traceback in the log: Retries retries the message with backoff,
    and it counts against ``max_retries``.
    """

    def __init__(self, reason: str):
        Retry.__init__(self, reason)


class DuplicateMessage(UniqueError):
    """Raised by ``send()`` when the lock is held and the actor's client strategy is ``raise``.

    Parameters:
      digest(str): The lock's digest.
      holder(str): The message_id of a message that holds the lock.
    """

    def __init__(self, reason: str, *, digest: str, holder: str):
        super().__init__(reason)
        self.digest = digest
        self.holder = holder


class LockConflict(UniqueError, Retry):
    """Raised in the worker when the lock is held and the actor's server strategy is ``raise``.

    It takes Dramatiq's exception path, so Retries retries the message with
    backoff; being a :class:`dramatiq.Retry`, it is not logged as an error.
    """

    def __init__(self, reason: str, *, digest: str, holder: str):
        Retry.__init__(self, reason)
        self.digest = digest
        self.holder = holder


class LineNeedsBroker(UniqueError):
    """Raised when a process that cannot enqueue messages (its lock backend has no ``handoffs``:
    the command or the web page run with ``--url``, a :class:`~dramatiq_unique.Locks` built
    on a bare backend) would free a place of a lock whose line has messages waiting: the first
    of them would be handed the place, and never enqueued. Nothing of that lock was freed.

    Parameters:
      key(str): The lock's key.
      waiting(int): How many messages wait in its line.
    """

    def __init__(self, key: str, waiting: int):
        super().__init__(
            f"Lock {key!r} has {waiting} message(s) waiting in its line, and was left held: a place freed here "
            "would go to the first of them, which only a process with the application's broker can enqueue "
            "(the command or the web page with --app, Locks.from_middleware)."
        )
        self.key = key
        self.waiting = waiting


class NoLockHeld(UniqueError, LookupError):
    """Raised by :func:`~dramatiq_unique.require_current_lock` where the running code holds no lock."""


class EnqueueCancelled(UniqueError):
    """Raised inside ``before_enqueue`` to stop an enqueue that ``send()`` then reports as not enqueued.

    :class:`UniqueJobs` catches it around the broker's ``enqueue`` and returns
    its ``message``, whose :func:`enqueue_outcome` says what happened.

    Parameters:
      reason(str): Why the message was not enqueued.
      message(dramatiq.Message): The message that was not enqueued.
    """

    def __init__(self, reason: str, message: Message[Any] | MessageProxy):
        super().__init__(reason)
        self.message = message


class Cancelled(Interrupt):
    """Raised in the thread of a running message whose holder was asked to stop: a newer
    message of a ``cancel_in_progress`` actor met it, or an operator cancelled it
    (:meth:`~dramatiq_unique.Locks.cancel`). An async actor's task is cancelled instead.

    Like Dramatiq's ``TimeLimitExceeded``, it derives from
    :class:`dramatiq.middleware.Interrupt`, not from :class:`UniqueError` nor ``Exception``, so
    that an ``except Exception`` in the actor does not swallow it, while its ``finally``
    blocks run. The message is neither retried nor dead-lettered.
    """
