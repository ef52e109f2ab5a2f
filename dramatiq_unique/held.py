"""What :class:`~dramatiq_unique.Locks` reads, as values: held locks, their
holders, the workers that heartbeat, and explanations.

They hold no connection and do no I/O, so the presentation of the command
line and the web page can take them without the operations API.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .backends import LockRecord

#: The states a holder is recorded in.
QUEUED = "queued"
RUNNING = "running"
STATES = (QUEUED, RUNNING)


@dataclass(frozen=True)
class HolderInfo:
    """One holder's place in a lock.

    Parameters:
      message_id(str): The message that holds the place.
      state(str): ``"queued"`` or ``"running"``, as the lock recorded it, not
        where the message is now: an enqueue lock records ``"queued"`` at
        enqueue and keeps it while its message runs, except where the message
        records that it starts (``replace``, or a lock taken again after it
        lapsed); a run lock is always ``"running"``. See :doc:`Operations </operations>`.
      worker_id(str): The worker process running the message, for run locks.
      acquired_at(int): When the place was taken, in ms of the backend's clock.
      expires_at(int): When the place lapses, in ms of the backend's clock;
        ``None`` when it never does.
      token(int): The place's fencing token.
      actor(str): The actor of the holder's message.
      queue(str): The canonical queue of the holder's message.
      lock(str): The lock type of the holder's message.
      place(LockRecord): The place as read: freeing it only gives it up while it is still this.
      call(str): The holder's actor call as a person reads it, e.g. ``reindex('acme', 200)``:
        kept by the lock for an actor with ``lock_info``, else read from the broker by
        :meth:`~dramatiq_unique.Locks.with_calls`; ``None`` when neither tells it.
      stop_requested_by(str): Who asked this running holder to stop, as a person reads it:
        ``message <message_id>`` for a newer message (``cancel_in_progress``), ``operator <who>``
        for :meth:`~dramatiq_unique.Locks.cancel`; ``None`` for a holder not asked.
    """

    message_id: str
    state: str
    worker_id: str | None
    acquired_at: int
    expires_at: int | None
    token: int
    actor: str
    queue: str
    lock: str
    place: LockRecord
    call: str | None = None
    stop_requested_by: str | None = None

    @classmethod
    def from_record(cls, record: LockRecord) -> HolderInfo:
        holder = record.holder
        return cls(
            message_id=str(holder.get("message_id", "")),
            state=str(holder.get("state", "")),
            worker_id=holder.get("worker_id"),
            acquired_at=record.acquired_at,
            expires_at=record.expires_at,
            token=record.token,
            actor=str(holder.get("actor", "")),
            queue=str(holder.get("queue", "")),
            lock=str(holder.get("lock", "")),
            place=record,
            call=holder.get("call"),
            stop_requested_by=holder.get("stop_requested_by"),
        )

    def as_dict(self) -> dict[str, Any]:
        """The holder as JSON: times in epoch milliseconds."""
        return {
            "message_id": self.message_id,
            "state": self.state,
            "worker_id": self.worker_id,
            "acquired_at": self.acquired_at,
            "expires_at": self.expires_at,
            "token": self.token,
            "call": self.call,
            "stop_requested_by": self.stop_requested_by,
        }


@dataclass(frozen=True)
class LockInfo:
    """A held lock: the enqueue lock or the run lock of one digest, and its holders.

    Parameters:
      digest(str): The digest that names the lock.
      kind(str): ``"enqueue"`` or ``"run"``.
      prefix(str): The lock prefix it lives under.
      key(str): Its key in the backend.
      holders(tuple[HolderInfo]): Its holders, oldest first (by fencing token).
      read_at(int): When it was read, in ms of the backend's clock: the
        reference for its holders' ages and remaining time.
      waiting(tuple[str]): The message_ids that wait in the lock's line (``wait``,
        ``keep_latest``), the next one first.
    """

    digest: str
    kind: str
    prefix: str
    key: str
    holders: tuple[HolderInfo, ...]
    read_at: int
    waiting: tuple[str, ...] = ()

    @property
    def actor(self) -> str:
        """The actor of its oldest holder (several actors share a lock with ``unique_across_actors``)."""
        return self.holders[0].actor

    @property
    def queue(self) -> str:
        """The queue of its oldest holder."""
        return self.holders[0].queue

    @property
    def lock(self) -> str:
        """The lock type of its oldest holder."""
        return self.holders[0].lock

    def only(
        self, *, actor: str | None = None, state: str | None = None, message_id: str | None = None
    ) -> LockInfo | None:
        """The lock with only the holders that match every filter given, ``None`` when none does."""
        wanted = {"actor": actor, "state": state, "message_id": message_id}
        holders = tuple(
            h for h in self.holders if all(value is None or getattr(h, name) == value for name, value in wanted.items())
        )
        if not holders:
            return None
        return self if len(holders) == len(self.holders) else dataclasses.replace(self, holders=holders)

    def as_dict(self) -> dict[str, Any]:
        """The lock as JSON: times in epoch milliseconds, ``expires_at`` null for a place that never lapses."""
        return {
            "digest": self.digest,
            "kind": self.kind,
            "actor": self.actor,
            "queue": self.queue,
            "lock": self.lock,
            "holders": [holder.as_dict() for holder in self.holders],
            "waiting": list(self.waiting),
        }


@dataclass(frozen=True)
class WorkerInfo:
    """A worker process in the heartbeat registry of one lock prefix or more.

    Parameters:
      worker_id(str): The worker process: host, pid and a random part.
      prefixes(tuple[str]): The lock prefixes whose registry it heartbeats into.
      alive_until(int): Until when it counts as alive, in ms of the backend's
        clock: its last heartbeat plus its own lease period.
      read_at(int): When the registry was read, in ms of the backend's clock.
    """

    worker_id: str
    prefixes: tuple[str, ...]
    alive_until: int
    read_at: int

    @property
    def alive(self) -> bool:
        """Whether it counted as alive when the registry was read."""
        return self.alive_until > self.read_at


@dataclass(frozen=True)
class Explanation:
    """What the lock of an actor and its arguments looks like now, and what
    a new message with those arguments would meet.

    Parameters:
      actor(str): The actor.
      queue(str): Its canonical queue.
      lock(str): Its lock type; ``None`` when it has no lock.
      digest(str): The digest the middleware computes for those arguments.
      lock_args(Any): The value that decides uniqueness: what the actor's
        ``lock_args_method`` returns, or all the arguments.
      prefix(str): The lock prefix of the actor.
      lock_limit(int): How many messages may hold the lock at once.
      locks(tuple[LockInfo]): The digest's held locks: enqueue lock, then run lock.
      on_send(str): What a new send with these arguments would meet now.
      on_start(str): What such a message would meet if a worker started it
        now, for lock types that take a run lock; else ``None``.
      conflicts(tuple[ConflictInfo]): The messages of this digest that met its lock, or a
        failing store, in the last hour, newest first (the conflict trail).
    """

    actor: str
    queue: str
    lock: str | None
    digest: str | None
    lock_args: Any
    prefix: str | None
    lock_limit: int | None
    locks: tuple[LockInfo, ...]
    on_send: str
    on_start: str | None
    conflicts: tuple[ConflictInfo, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The explanation as JSON."""
        return {
            "actor": self.actor,
            "queue": self.queue,
            "lock": self.lock,
            "digest": self.digest,
            "lock_args": self.lock_args,
            "prefix": self.prefix,
            "lock_limit": self.lock_limit,
            "locks": [lock.as_dict() for lock in self.locks],
            "on_send": self.on_send,
            "on_start": self.on_start,
            "conflicts": [entry.as_dict() for entry in self.conflicts],
        }


@dataclass(frozen=True)
class ConflictInfo:
    """One message of the conflict trail: it met a held lock, or a failing lock store, and did
    not run as sent, or not yet.

    Parameters:
      at(int): When, in ms of the backend's clock (as the process that met it estimated it).
      prefix(str): The lock prefix of its locks.
      actor(str): The actor of the message.
      queue(str): Its canonical queue.
      message_id(str): The message.
      call(str): Its actor call as a person reads it, e.g. ``reindex('acme', 200)``, cut to a
        bound; ``None`` when the process did not know it (a message displaced or replaced by another).
      digest(str): Its lock's digest.
      lock(str): Its lock type; ``None`` when not known.
      lock_kind(str): ``"enqueue"`` or ``"run"``: the lock it met; ``None`` for a failing store.
      side(str): ``"client"`` (at send) or ``"server"`` (at start); ``None`` when not known.
      strategy(str): The conflict strategy that dealt with it; ``None`` for a failing store.
      outcome(str): What became of it: one of :data:`~dramatiq_unique.history.OUTCOMES`, or the
        name of a strategy of your own.
      holders(tuple[str]): The message_ids that held the lock: for ``"replaced"`` and
        ``"displaced"``, the newer message that took its place.
      holder_state(str): ``"queued"`` or ``"running"``: the first holder's state, where known.
      holder_worker(str): The worker running the first holder, where known.
      worker(str): The worker or process where it happened: host, pid and a random part.
      reason(str): What failed, or why, where it tells more than the outcome.
      delay(int): Milliseconds after which a rescheduled message tries again.
      cancelled_by(str): Who asked a cancelled message to stop: ``message <message_id>`` or
        ``operator <who>`` (as a holder's ``stop_requested_by``).
    """

    at: int
    prefix: str
    actor: str
    queue: str
    message_id: str
    call: str | None
    digest: str | None
    lock: str | None
    lock_kind: str | None
    side: str | None
    strategy: str | None
    outcome: str
    holders: tuple[str, ...]
    holder_state: str | None
    holder_worker: str | None
    worker: str
    reason: str | None = None
    delay: int | None = None
    cancelled_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The entry as JSON: times in epoch milliseconds."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)} | {
            "holders": list(self.holders)
        }
