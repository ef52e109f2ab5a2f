"""What every lock type has in common."""

from __future__ import annotations

from typing import ClassVar


class LockType:
    """When a lock type takes its locks and when it gives them up, as facts.

    A lock type with ``locks_at_enqueue`` takes the enqueue lock in
    ``before_enqueue``; Dramatiq's own re-enqueues of the message (retries,
    delay-queue moves) re-enter that lock. In the worker, before the actor
    runs, a type that ``takes_run_lock`` takes the run lock (giving the
    enqueue lock up in the same step if it has one); otherwise the enqueue
    lock is kept if ``holds_enqueue_lock_while_running``, else given up. When
    the message leaves the worker, the run lock is given up, and the enqueue
    lock too unless the lock ``outlives_message`` or Dramatiq enqueued the
    message again meanwhile (a retry), whose copy keeps it.
    """

    #: The name used in ``@dramatiq.actor(lock=...)``.
    name: ClassVar[str]
    #: Its letter in the compact record of a holder (see
    #: :doc:`How the Redis backend stores locks </backend-internals>`).
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
