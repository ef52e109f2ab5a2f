"""What every lock type has in common."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from ..backends import Acquisition
    from ..lock import MessageLock


class LockType:
    """When a lock type takes its locks and when it gives them up.

    A lock type with ``locks_at_enqueue`` takes the enqueue lock in
    ``before_enqueue``; Dramatiq's own re-enqueues of the message (retries,
    delay-queue moves) re-enter that lock. In the worker, :meth:`start` runs
    before the actor and :meth:`end` once the message leaves the worker.
    """

    #: The name used in ``@dramatiq.actor(lock=...)``.
    name: ClassVar[str]
    #: Its letter in the compact record of a holder (see docs/backends.md).
    code: ClassVar[str]
    #: Whether the lock is taken when the message is enqueued.
    locks_at_enqueue: ClassVar[bool] = True
    #: Whether the enqueue lock is still held while the actor runs.
    holds_enqueue_lock_while_running: ClassVar[bool] = False
    #: Whether a run lock is taken for each processing attempt.
    takes_run_lock: ClassVar[bool] = False
    #: Whether the lock outlives its message; only its TTL ends it.
    outlives_message: ClassVar[bool] = False
    #: Whether the lock type needs ``lock_ttl`` to mean anything.
    requires_ttl: ClassVar[bool] = False

    def start(self, lock: MessageLock) -> Acquisition | None:
        """Called in the worker before the actor runs.

        Returns:
          Acquisition: A failed acquisition when the message must not run now
          (its conflict strategy decides what becomes of it), else ``None``.
        """
        return None

    def end(self, lock: MessageLock, *, requeued: bool) -> None:
        """Called when the message leaves the worker: it ran, raised, or was skipped.

        Parameters:
          requeued(bool): Whether Dramatiq enqueued the message again meanwhile
            (a retry), in which case that copy keeps the enqueue lock.
        """
        lock.release_run()
        if not requeued:
            lock.release_enqueue(background=True)
