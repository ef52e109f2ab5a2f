"""Seeing, explaining and freeing held locks.

:class:`Locks` reads the locks through the backend: a bounded scan step at a
time for :meth:`Locks.list`, one call per digest for :meth:`Locks.get`. It
covers every lock prefix it is given: the middleware's and those of actors
with their own (:meth:`Locks.from_middleware` knows them all). Freeing a lock
gives up the places that were read, each only while it is still exactly as
read, so a holder that came or renewed since keeps its place.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name
from dramatiq.logging import get_logger

from .backends import LockBackend, LockRecord
from .digest import compute_digest, lock_arguments
from .keys import ENQUEUE, RUN, digest_of, enqueue_key, prefix_of, run_key
from .options import DEFAULT_LOCK_PREFIX, LockConfig
from .reaper import DEFAULT_BATCH
from .strategies import CLIENT, SERVER

if TYPE_CHECKING:
    from dramatiq import Actor, Broker

    from .middleware import UniqueJobs

#: The states a holder is recorded in.
QUEUED = "queued"
RUNNING = "running"
STATES = (QUEUED, RUNNING)

#: The lock types that take a run lock while the message runs.
_RUN_LOCK_TYPES = frozenset({"while_executing", "until_and_while_executing"})


@dataclass(frozen=True)
class HolderInfo:
    """One holder's place in a lock.

    Parameters:
      message_id(str): The message that holds the place.
      state(str): ``"queued"`` or ``"running"``, as the lock recorded it, not
        where the message is now: an enqueue lock records ``"queued"`` at
        enqueue and keeps it while its message runs, except where the message
        records that it starts (``replace``, or a lock taken again after it
        lapsed); a run lock is always ``"running"``. See docs/operations.md.
      worker_id(str): The worker process running the message, for run locks.
      acquired_at(int): When the place was taken, in ms of the backend's clock.
      expires_at(int): When the place lapses, in ms of the backend's clock;
        ``None`` when it never does.
      token(int): The place's fencing token.
      actor(str): The actor of the holder's message.
      queue(str): The canonical queue of the holder's message.
      lock(str): The lock type of the holder's message.
      place(LockRecord): The place as read: freeing it only gives it up while it is still this.
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
    """

    digest: str
    kind: str
    prefix: str
    key: str
    holders: tuple[HolderInfo, ...]
    read_at: int

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

    def as_dict(self) -> dict[str, Any]:
        """The lock as JSON: times in epoch milliseconds, ``expires_at`` null for a place that never lapses."""
        return {
            "digest": self.digest,
            "kind": self.kind,
            "actor": self.actor,
            "queue": self.queue,
            "lock": self.lock,
            "holders": [holder.as_dict() for holder in self.holders],
        }


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
        }


class Locks:
    """The locks held in a backend: list them, look one up, explain why a
    message would not run, and free them by hand.

    Examples:
      >>> locks = Locks.from_middleware(unique_jobs)
      >>> for lock in locks.list(actor="settle_payment"):
      ...     print(lock.digest, [holder.message_id for holder in lock.holders])
      >>> locks.explain(settle_payment, "evt_123").on_send
      "A new send would be dropped as a duplicate of message '…' (strategy 'log')."

    Parameters:
      backend(LockBackend): Where the locks are.
      lock_prefix(str): The middleware's lock prefix.
      actor_prefixes(Iterable[str]): The ``lock_prefix`` of actors that have
        their own: their locks are listed too.
      batch(int): About how many keys one step of the backend's scan looks at.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        lock_prefix: str = DEFAULT_LOCK_PREFIX,
        actor_prefixes: Iterable[str] = (),
        batch: int = DEFAULT_BATCH,
    ):
        self.logger: logging.Logger = get_logger(__name__, type(self))  # type: ignore[no-untyped-call]
        self.backend = backend
        #: Every lock prefix covered, the middleware's first.
        self.prefixes: tuple[str, ...] = tuple(dict.fromkeys((lock_prefix, *sorted(actor_prefixes))))
        self.batch = batch

    @classmethod
    def from_middleware(cls, middleware: UniqueJobs, *, batch: int = DEFAULT_BATCH) -> Locks:
        """The locks of ``middleware``'s backend, under every lock prefix its actors use."""
        return cls(
            middleware.backend,
            lock_prefix=middleware.defaults["lock_prefix"],
            actor_prefixes=middleware.lock_prefixes,
            batch=batch,
        )

    def list(
        self, *, actor: str | None = None, state: str | None = None, limit: int | None = None
    ) -> Iterator[LockInfo]:
        """The held locks, read a bounded scan step at a time.

        Parameters:
          actor(str): Only the holders of messages of this actor.
          state(str): Only the holders in this state: ``"queued"`` or ``"running"``.
          limit(int): At most this many locks.

        Returns:
          Iterator[LockInfo]: Each lock with the holders that match; locks
          without any are left out. A lock whose every place lapsed is free
          and left out too.
        """
        if state is not None and state not in STATES:
            raise ValueError(f"Locks.list got state={state!r}. Valid choices are: 'queued', 'running' or None.")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"Locks.list got limit={limit!r}: it must be an integer >= 1 or None.")
        count, seen = 0, set()
        for prefix in self.prefixes:
            cursor = "0"
            while True:
                cursor, records = self.backend.scan(prefix, cursor, self.batch)
                now = self.backend.time() if records else 0
                for found in _locks_of(records, now):
                    # A SCAN may return a key twice.
                    if found.key in seen:
                        continue
                    seen.add(found.key)
                    lock = _only(found, actor=actor, state=state)
                    if lock is None:
                        continue
                    yield lock
                    count += 1
                    if limit is not None and count >= limit:
                        return
                if cursor == "0":
                    break

    def page(
        self,
        *,
        cursor: str | None = None,
        limit: int = 50,
        actor: str | None = None,
        state: str | None = None,
        digest_prefix: str | None = None,
        max_steps: int = 10,
    ) -> tuple[tuple[LockInfo, ...], str | None]:
        """One page of the held locks, for a person paging through them: at
        most ``limit`` locks, read in at most ``max_steps`` scan steps, so a
        page costs about the same with a hundred locks or a million, filters
        or not.

        Parameters:
          cursor(str): Where the page starts: ``None`` for the first page,
            else the cursor the previous page returned.
          limit(int): At most this many locks.
          actor(str): Only the holders of messages of this actor.
          state(str): Only the holders in this state: ``"queued"`` or ``"running"``.
          digest_prefix(str): Only the locks whose digest starts with this.
          max_steps(int): At most this many scan steps of about ``batch`` keys each.

        Returns:
          tuple: The locks found, and the cursor of the next page; ``None``
          when every lock was seen. A page with filters may hold fewer than
          ``limit`` locks, or none, and still have a next page.

        Raises:
          ValueError: If an argument is invalid, or the cursor is none that this method returned.
        """
        if state is not None and state not in STATES:
            raise ValueError(f"Locks.page got state={state!r}. Valid choices are: 'queued', 'running' or None.")
        for name, value in (("limit", limit), ("max_steps", max_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Locks.page got {name}={value!r}: it must be an integer >= 1.")
        index, position, after = self._parse_cursor(cursor)
        found: builtins.list[LockInfo] = []
        seen: set[str] = set()
        for _ in range(max_steps):
            if index >= len(self.prefixes) or len(found) >= limit:
                break
            next_position, records = self.backend.scan(self.prefixes[index], position, self.batch)
            if digest_prefix:
                records = [r for r in records if (digest_of(r.key) or "").startswith(digest_prefix)]
            now = self.backend.time() if records else 0
            for lock in _locks_of(records, now):
                if lock.key in seen or (after is not None and _place_in_step(lock) <= after):
                    continue
                seen.add(lock.key)
                matched = _only(lock, actor=actor, state=state)
                if matched is None:
                    continue
                if len(found) == limit:
                    # The page is full inside this step: the next page reads
                    # the step again and starts after the last lock shown here.
                    return tuple(found), _cursor(index, position, _place_in_step(found[-1]))
                found.append(matched)
            after, position = None, next_position
            if position == "0":
                index += 1
        return tuple(found), (_cursor(index, position, None) if index < len(self.prefixes) else None)

    def _parse_cursor(self, cursor: str | None) -> tuple[int, str, tuple[str, int] | None]:
        """(prefix index, backend cursor, the last lock shown of that step) of a :meth:`page` cursor."""
        if cursor is None:
            return 0, "0", None
        try:
            index, position, after = json.loads(base64.urlsafe_b64decode(cursor.encode()))
            if not (isinstance(index, int) and 0 <= index < len(self.prefixes) and isinstance(position, str)):
                raise ValueError
            if after is not None:
                digest, kind = after
                if not isinstance(digest, str) or kind not in (0, 1):
                    raise ValueError
                after = (digest, kind)
        except (ValueError, TypeError, AttributeError):
            raise ValueError(f"{cursor!r} is not a cursor of Locks.page: pass None for the first page.") from None
        return index, position, after

    def get(self, digest: str) -> tuple[LockInfo, ...]:
        """The held locks of ``digest``: its enqueue lock and its run lock, under every prefix covered.

        Returns:
          tuple[LockInfo]: Empty when nobody holds a lock of that digest.
        """
        _check_digest(digest)
        found: list[LockInfo] = []
        for prefix in self.prefixes:
            now, records = self.backend.read([enqueue_key(prefix, digest), run_key(prefix, digest)])
            found.extend(_locks_of(records, now))
        return tuple(found)

    def explain(self, actor: Actor[Any, Any], *args: Any, **kwargs: Any) -> Explanation:
        """Compute the digest of ``actor`` with these arguments as the
        middleware would (its ``lock_args_method``, queue and lock options),
        read who holds its locks, and say what a new message with these
        arguments would meet now.

        Options given to a single message with ``send_with_options`` are not known here.

        Raises:
          ValueError: If the actor's broker has no ``UniqueJobs`` middleware.
          LockArgumentsError: If the lock arguments cannot be computed.
        """
        config = unique_jobs_of(actor.broker).lock_config(actor.actor_name)
        queue = q_name(actor.queue_name)
        if config is None:
            return Explanation(
                actor=actor.actor_name,
                queue=queue,
                lock=None,
                digest=None,
                lock_args=None,
                prefix=None,
                lock_limit=None,
                locks=(),
                on_send=f"No lock: actor {actor.actor_name!r} has no lock option, so every send is enqueued and runs.",
                on_start=None,
            )
        lock_args = lock_arguments(actor.actor_name, config.lock_args_method, args, kwargs)
        digest = compute_digest(
            actor_name=actor.actor_name,
            queue_name=queue,
            lock_args=lock_args,
            unique_across_actors=config.unique_across_actors,
            unique_across_queues=config.unique_across_queues,
        )
        prefix = config.lock_prefix
        now, records = self.backend.read([enqueue_key(prefix, digest), run_key(prefix, digest)])
        locks = _locks_of(records, now)
        held = {lock.kind: lock for lock in locks}
        return Explanation(
            actor=actor.actor_name,
            queue=queue,
            lock=config.lock.name,
            digest=digest,
            # As the worker receives them: the digest is computed from this form.
            lock_args=json.loads(json.dumps(lock_args)),
            prefix=prefix,
            lock_limit=config.lock_limit,
            locks=tuple(locks),
            on_send=_on_send(config, held.get(ENQUEUE), now),
            on_start=_on_start(config, held.get(RUN), now) if config.lock.name in _RUN_LOCK_TYPES else None,
        )

    def explain_digest(self, digest: str, *, actor: str, config: LockConfig) -> Explanation:
        """Say what a new message of ``actor`` whose arguments have ``digest``
        would meet now, as :meth:`explain` does when the arguments are known.

        Parameters:
          digest(str): The digest, e.g. of a listed lock.
          actor(str): The actor whose options apply.
          config(LockConfig): Its lock options: ``UniqueJobs.lock_config(actor)``.

        Returns:
          Explanation: Its ``lock_args`` are ``None``: a digest does not tell them.
        """
        _check_digest(digest)
        prefix = config.lock_prefix
        now, records = self.backend.read([enqueue_key(prefix, digest), run_key(prefix, digest)])
        locks = _locks_of(records, now)
        held = {lock.kind: lock for lock in locks}
        return Explanation(
            actor=actor,
            queue=locks[0].queue if locks else "",
            lock=config.lock.name,
            digest=digest,
            lock_args=None,
            prefix=prefix,
            lock_limit=config.lock_limit,
            locks=tuple(locks),
            on_send=_on_send(config, held.get(ENQUEUE), now),
            on_start=_on_start(config, held.get(RUN), now) if config.lock.name in _RUN_LOCK_TYPES else None,
        )

    def release(self, locks: Iterable[LockInfo]) -> tuple[LockInfo, ...]:
        """Free the holders of ``locks`` as they were read: each place only
        while it is still exactly as read, so a holder that renewed or took the
        lock since keeps its place (a re-entry keeps it when it changed the
        place's expiry or broker id).

        A freed message is not stopped nor removed from its queue: a queued
        one still runs, a running one goes on, and a duplicate can now be sent.

        Returns:
          tuple[LockInfo]: The locks with the holders that were freed.
        """
        freed = []
        for lock in locks:
            owners = set(self.backend.release_records(lock.key, {h.place.owner: h.place.record for h in lock.holders}))
            holders = tuple(h for h in lock.holders if h.place.owner in owners)
            if holders:
                freed.append(dataclasses.replace(lock, holders=holders))
                self.logger.info(
                    "The %s lock %r of actor %r was unlocked by hand: it freed the place of message %s.",
                    lock.kind,
                    lock.digest,
                    lock.actor,
                    ", ".join(repr(h.message_id) for h in holders),
                )
        return tuple(freed)

    def unlock(self, digest: str, message_id: str | None = None) -> tuple[LockInfo, ...]:
        """Free the locks of ``digest`` (enqueue and run lock), or only the
        places of ``message_id`` in them, as read now (see :meth:`release`).

        Returns:
          tuple[LockInfo]: The locks with the holders that were freed; empty
          when nothing matched.
        """
        found = self.get(digest)
        if message_id is not None:
            found = tuple(lock for lock in (_only(lock, message_id=message_id) for lock in found) if lock is not None)
        return self.release(found)

    def unlock_all(self, *, actor: str) -> tuple[LockInfo, ...]:
        """Free every place held by messages of ``actor``, as read (see :meth:`release`).

        Returns:
          tuple[LockInfo]: The locks with the holders that were freed.
        """
        freed: list[LockInfo] = []
        for lock in self.list(actor=actor):
            freed.extend(self.release([lock]))
        return tuple(freed)


def unique_jobs_of(broker: Broker) -> UniqueJobs:
    """The ``UniqueJobs`` middleware of ``broker``.

    Raises:
      ValueError: If the broker has none.
    """
    from .middleware import UniqueJobs

    for middleware in broker.middleware:
        if isinstance(middleware, UniqueJobs):
            return middleware
    raise ValueError(f"The broker {type(broker).__name__} has no UniqueJobs middleware: its actors have no locks.")


def format_duration(ms: int) -> str:
    """A duration in milliseconds, in units a person reads: ``850ms``, ``42s``, ``4m 05s``, ``3h 07m``, ``2d 05h``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def describe_holder(holder: HolderInfo, now: int) -> str:
    """One holder, for a person: its message, state, age and remaining time, e.g.
    ``message '…' (queued, taken 2m 03s ago, never lapses)``."""
    state = holder.state
    if holder.worker_id:
        state += f" on worker {holder.worker_id!r}"
    lapses = "never lapses" if holder.expires_at is None else f"lapses in {format_duration(holder.expires_at - now)}"
    return f"message {holder.message_id!r} ({state}, taken {format_duration(now - holder.acquired_at)} ago, {lapses})"


# Helpers ---------------------------------------------------------------------


def _check_digest(digest: str) -> None:
    if not isinstance(digest, str) or not digest or "{" in digest or "}" in digest or ":" in digest:
        raise ValueError(f"{digest!r} is not a digest: a digest is the 64 hexadecimal characters between the braces.")


def _cursor(index: int, position: str, after: tuple[str, int] | None) -> str:
    """A :meth:`Locks.page` cursor: opaque, and safe in a URL."""
    return base64.urlsafe_b64encode(json.dumps([index, position, after]).encode()).decode()


def _place_in_step(lock: LockInfo) -> tuple[str, int]:
    """Where a lock comes among the locks of one scan step, as :func:`_locks_of` orders them."""
    return lock.digest, 0 if lock.kind == ENQUEUE else 1


def _locks_of(records: Iterable[LockRecord], now: int) -> list[LockInfo]:
    """The records grouped into locks, without lapsed places, in the order their keys came (enqueue before run)."""
    by_key: dict[str, list[LockRecord]] = {}
    for record in records:
        if record.expires_at is not None and record.expires_at <= now:
            continue  # lapsed: it holds nothing, and the next operation on the lock drops it
        by_key.setdefault(record.key, []).append(record)
    locks = []
    for key, places in by_key.items():
        digest, prefix = digest_of(key), prefix_of(key)
        if digest is None or prefix is None:
            continue
        holders = tuple(HolderInfo.from_record(r) for r in sorted(places, key=lambda r: r.token))
        locks.append(LockInfo(digest=digest, kind=places[0].kind, prefix=prefix, key=key, holders=holders, read_at=now))
    return sorted(locks, key=lambda lock: (lock.prefix, lock.digest, lock.kind != ENQUEUE))


def _only(
    lock: LockInfo, *, actor: str | None = None, state: str | None = None, message_id: str | None = None
) -> LockInfo | None:
    """``lock`` with only the holders that match, ``None`` when none does."""
    wanted: Mapping[str, str | None] = {"actor": actor, "state": state, "message_id": message_id}
    holders = tuple(
        h for h in lock.holders if all(value is None or getattr(h, name) == value for name, value in wanted.items())
    )
    if not holders:
        return None
    return lock if len(holders) == len(lock.holders) else dataclasses.replace(lock, holders=holders)


def _holders_phrase(holders: tuple[HolderInfo, ...], now: int) -> str:
    described = [describe_holder(h, now) for h in holders]
    if len(described) == 1:
        return described[0]
    return "messages " + ", ".join(d.removeprefix("message ") for d in described)


def _free_place(kind: str, lock: LockInfo | None, limit: int, subject: str) -> str | None:
    """What ``subject`` meets when the lock has a free place, ``None`` when it is full."""
    taken = len(lock.holders) if lock is not None else 0
    if taken >= limit:
        return None
    if taken == 0:
        return f"{subject} would take the {kind} lock: it is free."
    return f"{subject} would take a free place in the {kind} lock ({taken} of {limit} taken)."


def _outcome(strategy: str, config: LockConfig, *, side: str) -> str:
    """What becomes of a duplicate under ``strategy``, as the end of "… would …"."""
    if strategy == "reschedule" and config.max_reschedules == 0:
        strategy = "reject"  # rescheduled once too often already
    outcomes = {
        "log": "be dropped" if side == CLIENT else "be dropped without running",
        "raise": "make send() raise DuplicateMessage" if side == CLIENT else "fail with LockConflict, to be retried",
        "reject": "go to the dead-letter queue without running",
        "reschedule": f"be rescheduled to try again in {format_duration(config.reschedule_delay)}",
    }
    return outcomes.get(strategy, f"be left to strategy {strategy!r}")


def _on_send(config: LockConfig, lock: LockInfo | None, now: int) -> str:
    subject = "A new send"
    if not config.lock.locks_at_enqueue:
        return f"{subject} would be enqueued: {config.lock.name} takes no lock at enqueue."
    free = _free_place("enqueue", lock, config.lock_limit, subject)
    if free is not None or lock is None:
        return str(free)
    strategy, note = config.client_strategy, ""
    outcome = _outcome(strategy.name, config, side=CLIENT)
    if strategy.replaces_queued_holders:
        queued = [h for h in lock.holders if h.state == QUEUED and h.place.holder.get("replaceable")]
        if queued:
            return (
                f"{subject} would replace queued {describe_holder(queued[0], now)}, "
                f"which is skipped when it reaches a worker (strategy {strategy.name!r})."
            )
        outcome, note = _outcome("log", config, side=CLIENT), ": every holder runs, and a running one stays"
    sentence = f"{subject} would {outcome} as a duplicate of {_holders_phrase(lock.holders, now)}"
    sentence += f" (strategy {strategy.name!r}{note})."
    if config.lock.requires_ttl:
        sentence += f" An {config.lock.name} lock is only freed by its lock_ttl, whatever became of its message."
    return sentence


def _on_start(config: LockConfig, lock: LockInfo | None, now: int) -> str:
    subject = "A message with these arguments, started now,"
    free = _free_place("run", lock, config.lock_limit, subject)
    if free is not None or lock is None:
        return str(free)
    strategy = config.server_strategy
    return (
        f"{subject} would {_outcome(strategy.name, config, side=SERVER)}: the run lock is held by "
        f"{_holders_phrase(lock.holders, now)} (strategy {strategy.name!r})."
    )
