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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name
from dramatiq.logging import get_logger

from .backends import LockBackend, LockRecord
from .calls import short_call
from .cancellation import asked_by_operator
from .digest import DIGEST_LENGTH, compute_digest, encodes_as_utf8, lock_arguments
from .errors import InvalidLockOptions
from .held import QUEUED, RUNNING, STATES, ConflictInfo, Explanation, HolderInfo, LockInfo, WorkerInfo
from .history import DEFAULT_HISTORY_READ, EXPLAINED_HISTORY, history_of, read_history
from .keys import ENQUEUE, RUN, digest_of, enqueue_key, prefix_of, registry_key, run_key
from .options import DEFAULT_LOCK_PREFIX, LOCK_INFO_LENGTH, LockConfig, prefix_problem
from .presentation import count, describe_holder, describe_holders
from .reaper import DEFAULT_BATCH, locator_for
from .strategies import CLIENT, SERVER

if TYPE_CHECKING:
    from dramatiq import Actor, Broker

    from .middleware import UniqueJobs

__all__ = ["ConflictInfo", "Explanation", "HolderInfo", "LockInfo", "Locks", "WorkerInfo"]

#: The shortest digest prefix :meth:`Locks.resolve` takes, as ``git`` takes at least 4
#: characters of a commit id.
MIN_DIGEST_PREFIX = 4


class Locks:
    """The locks held in a backend: list them, look one up, explain why a
    message would not run, free them by hand, and see the workers that hold
    run locks.

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

    Raises:
      InvalidLockOptions: If a prefix is one that no actor may declare: no lock is held under it.
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
        for prefix in self.prefixes:
            problem = prefix_problem(prefix)
            if problem is not None:
                raise InvalidLockOptions(f"Locks has an invalid lock prefix {prefix!r}: it {problem}.")
        self.batch = batch
        #: The places that the last call of :meth:`list`, :meth:`page` or :meth:`get` met and that this
        #: version cannot read (another version's, a hand edit): by key, by owner, why. Every method
        #: leaves them out; the first meeting of each logs it at WARNING.
        self.unreadable: dict[str, dict[str, str]] = {}
        self._logged: set[tuple[str, str]] = set()

    @classmethod
    def from_middleware(
        cls, middleware: UniqueJobs, *, backend: LockBackend | None = None, batch: int = DEFAULT_BATCH
    ) -> Locks:
        """The locks of ``middleware``'s backend, under every lock prefix its actors use.

        Parameters:
          backend(LockBackend): Where to read them instead, e.g. the same Redis by another URL.
          batch(int): About how many keys one step of the backend's scan looks at.
        """
        return cls(
            backend if backend is not None else middleware.backend,
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
        _check_state("Locks.list", state)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"Locks.list got limit={limit!r}: it must be an integer >= 1 or None.")
        count, seen = 0, set()
        self.unreadable = {}
        for step in self._scan(_Position(0, "0")):
            for found in step.locks:
                # A SCAN may return a key twice.
                if found.key in seen:
                    continue
                seen.add(found.key)
                lock = found.only(actor=actor, state=state)
                if lock is None:
                    continue
                yield lock
                count += 1
                if limit is not None and count >= limit:
                    return

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
        _check_state("Locks.page", state)
        for name, value in (("limit", limit), ("max_steps", max_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Locks.page got {name}={value!r}: it must be an integer >= 1.")
        start, after = self._parse_cursor(cursor)
        self.unreadable = {}
        found: builtins.list[LockInfo] = []
        seen: set[str] = set()
        resume: _Position | None = start
        for taken, step in enumerate(self._scan(start, digest_prefix=digest_prefix), 1):
            for lock in step.locks:
                if lock.key in seen or (after is not None and _place_in_step(lock) <= after):
                    continue
                seen.add(lock.key)
                matched = lock.only(actor=actor, state=state)
                if matched is None:
                    continue
                if len(found) == limit:
                    # The page is full inside this step: the next page reads
                    # the step again and starts after the last lock shown here.
                    return tuple(found), _cursor(step.position, _place_in_step(found[-1]))
                found.append(matched)
            after, resume = None, step.next
            if taken == max_steps or len(found) >= limit:
                break
        return tuple(found), (_cursor(resume, None) if resume is not None else None)

    def _scan(self, start: _Position, *, digest_prefix: str | None = None) -> Iterator[_Step]:
        """The held locks one backend scan step at a time, from ``start`` to the end of the last
        prefix; a step is only read when the one before has been taken."""
        position: _Position | None = start
        while position is not None:
            prefix = self.prefixes[position.index]
            if digest_prefix:
                # The backend filters where the keys are: a lock of another digest is not read.
                next_cursor, records = self.backend.scan(
                    prefix, position.cursor, self.batch, digest_start=digest_prefix
                )
            else:
                next_cursor, records = self.backend.scan(prefix, position.cursor, self.batch)
            now = self.backend.time() if records else 0
            if next_cursor != "0":
                following: _Position | None = _Position(position.index, next_cursor)
            elif position.index + 1 < len(self.prefixes):
                following = _Position(position.index + 1, "0")
            else:
                following = None
            locks = _locks_of(self._readable(records), now)
            yield _Step(position=position, locks=self._with_lines(locks), next=following)
            position = following

    def _parse_cursor(self, cursor: str | None) -> tuple[_Position, tuple[str, int] | None]:
        """Where a :meth:`page` cursor starts, and the last lock shown of that step."""
        if cursor is None:
            return _Position(0, "0"), None
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
        return _Position(index, position), after

    def get(self, digest: str) -> tuple[LockInfo, ...]:
        """The held locks of ``digest``: its enqueue lock and its run lock, under every prefix covered.

        Returns:
          tuple[LockInfo]: Empty when nobody holds a lock of that digest.
        """
        _check_digest(digest)
        self.unreadable = {}
        return tuple(lock for prefix in self.prefixes for lock in self._read(prefix, digest)[1])

    def resolve(self, digest_prefix: str) -> tuple[str, ...]:
        """The digests of the held locks that start with ``digest_prefix``, as ``git`` takes a
        unique prefix of a commit id: one digest when the prefix is unique.

        The backend is scanned for the keys of those digests only (``SCAN MATCH`` on Redis, on
        every master of a Redis Cluster), under every prefix covered, a bounded step at a time.
        A lock holding only places this version cannot read counts too: :meth:`get` leaves its
        places out, and :attr:`unreadable` says why.

        Parameters:
          digest_prefix(str): The first characters of a digest, at least 4; a whole digest
            is its own prefix.

        Returns:
          tuple[str]: The matching digests, sorted; empty when none is held.

        Raises:
          ValueError: If ``digest_prefix`` is shorter than 4 characters or holds a
            character no digest has in a key (``{``, ``}``, ``:``).
        """
        _check_digest(digest_prefix)
        if len(digest_prefix) < MIN_DIGEST_PREFIX:
            raise ValueError(
                f"{digest_prefix!r} is too short a digest prefix: give at least {MIN_DIGEST_PREFIX} characters "
                f"of the digest (a digest has {DIGEST_LENGTH})."
            )
        self.unreadable = {}
        steps = self._scan(_Position(0, "0"), digest_prefix=digest_prefix)
        found = {lock.digest for step in steps for lock in step.locks}
        found.update(digest for digest in map(digest_of, self.unreadable) if digest is not None)
        return tuple(sorted(found))

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
        # As the worker receives them: the digest is computed from this form.
        received = json.loads(json.dumps(lock_args))
        return self._explanation(digest, actor=actor.actor_name, config=config, queue=queue, lock_args=received)

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
        return self._explanation(digest, actor=actor, config=config, queue=None, lock_args=None)

    def _explanation(
        self, digest: str, *, actor: str, config: LockConfig, queue: str | None, lock_args: Any
    ) -> Explanation:
        """Read the locks of ``digest`` under the actor's prefix and say what a new message would meet.

        Parameters:
          queue(str): The actor's canonical queue; ``None`` to take it from the oldest holder.
        """
        self.unreadable = {}
        now, locks = self._read(config.lock_prefix, digest)
        held = {lock.kind: lock for lock in locks}
        on_send = _on_send(config, held.get(ENQUEUE), now)
        on_start = _on_start(config, held.get(RUN), now) if config.lock.takes_run_lock else None
        # A lock holding a place this version cannot read takes no new place: the step fails.
        enqueue, run = enqueue_key(config.lock_prefix, digest), run_key(config.lock_prefix, digest)
        if enqueue in self.unreadable and config.lock.locks_at_enqueue:
            on_send = _unreadable_fails("send", enqueue, self.unreadable[enqueue])
        if run in self.unreadable and on_start is not None:
            on_start = _unreadable_fails("start", run, self.unreadable[run])
        return Explanation(
            actor=actor,
            queue=queue if queue is not None else (locks[0].queue if locks else ""),
            lock=config.lock.name,
            digest=digest,
            lock_args=lock_args,
            prefix=config.lock_prefix,
            lock_limit=config.lock_limit,
            locks=tuple(locks),
            on_send=on_send,
            on_start=on_start,
            conflicts=read_history(
                self.backend, (config.lock_prefix,), digest=digest, within=EXPLAINED_HISTORY, limit=DEFAULT_HISTORY_READ
            ),
        )

    def _read(self, prefix: str, digest: str) -> tuple[int, builtins.list[LockInfo]]:
        """The enqueue and run lock of ``digest`` under ``prefix``, and when they were read."""
        now, records = self.backend.read([enqueue_key(prefix, digest), run_key(prefix, digest)])
        return now, self._with_lines(_locks_of(self._readable(records), now))

    def _readable(self, records: builtins.list[LockRecord]) -> builtins.list[LockRecord]:
        """``records`` without those this version cannot read, which are kept in :attr:`unreadable`
        and logged at WARNING the first time."""
        readable = []
        for record in records:
            if record.unreadable is None:
                readable.append(record)
                continue
            self.unreadable.setdefault(record.key, {})[record.owner] = record.unreadable
            if (record.key, record.owner) not in self._logged:
                self._logged.add((record.key, record.owner))
                self.logger.warning("A record in lock %r is left out: %s.", record.key, record.unreadable)
        return readable

    def _with_lines(self, locks: builtins.list[LockInfo]) -> builtins.list[LockInfo]:
        """The locks with the messages that wait in their lines, read in one round trip."""
        lines = self.backend.lines([lock.key for lock in locks]) if locks else {}
        return [dataclasses.replace(lock, waiting=lines[lock.key]) if lock.key in lines else lock for lock in locks]

    def history(
        self,
        actor: str | Actor[Any, Any] | None = None,
        *,
        args: Iterable[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        digest: str | None = None,
        since_ms: int | None = None,
        within_ms: int | None = None,
        limit: int = DEFAULT_HISTORY_READ,
    ) -> tuple[ConflictInfo, ...]:
        """The conflict trail: the messages that met a held lock or a failing lock store, and
        what became of them, newest first, under every prefix covered. One round trip per prefix.

        Entries reach the backend once per heartbeat interval, so the latest seconds may be missing.

        Parameters:
          actor(str|dramatiq.Actor): Only the messages of this actor.
          args(Iterable): With ``kwargs``, only the messages of ``actor`` with these
            arguments: their digest is computed as :meth:`explain` computes it (for an actor given
            by name, as if it had no ``lock_args_method``, under each queue of its entries).
          kwargs(dict): The keyword arguments that go with ``args``.
          digest(str): Only the messages of this digest.
          since_ms(int): Only the entries since this time, in ms of the backend's clock.
          within_ms(int): Only the entries of the last ``within_ms`` milliseconds.
          limit(int): The most entries returned.

        Raises:
          ValueError: If an option is not valid, or ``args`` come without an actor.
          LockArgumentsError: If the lock arguments cannot be computed.
        """
        return history_of(
            self.backend,
            self.prefixes,
            actor=actor,
            args=args,
            kwargs=kwargs,
            digest=digest,
            since=since_ms,
            within=within_ms,
            limit=limit,
            lock_config=lambda actor: unique_jobs_of(actor.broker).lock_config(actor.actor_name),
        )

    def workers(self) -> tuple[int, tuple[WorkerInfo, ...]]:
        """The worker processes in the heartbeat registry of each lock prefix covered.

        Returns:
          tuple: When the registries were read, in ms of the backend's clock,
          and the workers, the one alive the longest first; a worker lapsed
          long ago may be gone, as the orphan reaper forgets it.
        """
        registered: dict[str, tuple[int, tuple[str, ...]]] = {}
        now = 0
        for prefix in self.prefixes:
            now, registry = self.backend.heartbeats(registry_key(prefix))
            for worker, alive_until in registry.items():
                until, prefixes = registered.get(worker, (alive_until, ()))
                registered[worker] = (max(until, alive_until), (*prefixes, prefix))
        workers = tuple(
            WorkerInfo(worker_id=worker, prefixes=prefixes, alive_until=alive_until, read_at=now)
            for worker, (alive_until, prefixes) in sorted(registered.items(), key=lambda item: (-item[1][0], item[0]))
        )
        return now, workers

    def in_broker(self, locks: Iterable[LockInfo], broker: Broker | None) -> dict[tuple[str, str], bool]:
        """Whether the message of each queued holder of an enqueue lock is still in ``broker``.

        Parameters:
          locks(Iterable[LockInfo]): The locks, e.g. of :meth:`get`.
          broker(dramatiq.Broker): The broker the messages were sent through.

        Returns:
          dict: By ``(lock key, message id)``; empty when the broker cannot be
          asked (a ``RedisBroker``, a ``RabbitmqBroker`` and a ``StubBroker`` can;
          RabbitMQ answers after the workers' next heartbeats, and only where a
          queue has no message waiting).
        """
        locator = locator_for(broker, backend=self.backend, registry=registry_key(self.prefixes[0]), logger=self.logger)
        queued = [(lock, h) for lock in locks if lock.kind == ENQUEUE for h in lock.holders if h.state == QUEUED]
        if locator is None or not queued:
            return {}
        missing = locator.missing([h.place for _, h in queued])
        return {(lock.key, h.message_id): not gone for (lock, h), gone in zip(queued, missing, strict=True)}

    def with_calls(self, locks: Iterable[LockInfo], broker: Broker | None) -> tuple[LockInfo, ...]:
        """The locks with the call of each holder, ``reindex('acme', 200)``, where the lock does
        not keep it (an actor without ``lock_info``): read from the holder's message in ``broker``
        by its id, for every holder in one round trip, and cut as ``lock_info=True`` cuts it.

        Parameters:
          locks(Iterable[LockInfo]): The locks, e.g. a page of :meth:`page`.
          broker(dramatiq.Broker): The broker the messages were sent through. A ``RedisBroker``
            gives the message of an enqueue lock's holder until it is acknowledged; a
            ``StubBroker`` that of a message not yet fetched. A ``RabbitmqBroker`` cannot be
            asked for a message by its id, nor can any broker for a run lock's holder (it
            records no broker id); those holders get the call of their message's place in the
            enqueue lock, when the locks hold one.

        Returns:
          tuple[LockInfo]: The locks, each holder's ``call`` filled where it was found.
        """
        locks = tuple(locks)
        calls = {h.message_id: h.call for lock in locks for h in lock.holders if h.call is not None}
        unknown = {h.message_id: h for lock in locks for h in lock.holders if h.message_id not in calls}
        locator = None
        if unknown and broker is not None:
            registry = registry_key(self.prefixes[0])
            locator = locator_for(broker, backend=self.backend, registry=registry, logger=self.logger)
        if locator is not None:
            holders = builtins.list(unknown.values())
            for holder, message in zip(holders, locator.messages([h.place for h in holders]), strict=True):
                call = (
                    None
                    if message is None
                    else short_call(message.actor_name, message.args, message.kwargs, LOCK_INFO_LENGTH)
                )
                if call is not None:
                    calls[holder.message_id] = call
        return tuple(_with_calls(lock, calls) for lock in locks)

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
                    "The %s lock %r of actor %r was unlocked by hand, for message %s.",
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
            found = tuple(lock for lock in (lock.only(message_id=message_id) for lock in found) if lock is not None)
        return self.release(found)

    def cancel(self, digest: str, message_id: str | None = None, *, by: str | None = None) -> tuple[LockInfo, ...]:
        """Stop the running holders of the run lock of ``digest``, or only ``message_id``: each
        is asked to stop, and its worker interrupts it with :class:`~dramatiq_unique.Cancelled`
        at its next lease renewal, as ``cancel_in_progress`` does. Unlike :meth:`unlock`, the
        place stays held until the holder has stopped, so no second copy starts meanwhile.

        Only a run lock's holders can be cancelled (``while_executing``,
        ``until_and_while_executing``): their workers renew their leases. A holder whose worker
        died is not interrupted; its lease lapses.

        Parameters:
          by(str): Who asks, which the holder's worker logs and its ``cancelled`` event and
            the conflict trail tell as ``operator <by>``; ``None``, the default, for the user
            and host of this process, e.g. ``alice@ops-1``. A character that is not printable
            (a line break) is kept as U+FFFD, so that it cannot start a log line of its own.

        Returns:
          tuple[LockInfo]: The run locks with the holders asked to stop; empty when no running
          holder matched.
        """
        asked_locks: builtins.list[LockInfo] = []
        asker = asked_by_operator(by)
        for lock in self.get(digest):
            running = [
                h
                for h in lock.holders
                if lock.kind == RUN and h.state == RUNNING and message_id in (None, h.message_id)
            ]
            if not running:
                continue
            asked = set(self.backend.request_stop(lock.key, [h.message_id for h in running], by=asker))
            # As the records are now: a holder asked before keeps who asked first.
            holders = tuple(
                dataclasses.replace(h, stop_requested_by=h.stop_requested_by or asker)
                for h in running
                if h.message_id in asked
            )
            if holders:
                asked_locks.append(dataclasses.replace(lock, holders=holders))
                self.logger.info(
                    "The running message %s of actor %r was asked by %s to stop (run lock %r).",
                    ", ".join(repr(h.message_id) for h in holders),
                    lock.actor,
                    asker,
                    lock.digest,
                )
        return tuple(asked_locks)

    def unlock_all(self, *, actor: str) -> tuple[LockInfo, ...]:
        """Free every place held by messages of ``actor``, as read (see :meth:`release`).

        Returns:
          tuple[LockInfo]: The locks with the holders that were freed.
        """
        freed: builtins.list[LockInfo] = []
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


# Helpers ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Position:
    """Where a scan step starts: the index of a prefix, and the backend's cursor under it."""

    index: int
    cursor: str


@dataclass(frozen=True)
class _Step:
    """The locks one scan step read, where it started, and where the next one starts (``None``: the end)."""

    position: _Position
    locks: list[LockInfo]
    next: _Position | None


def _check_state(method: str, state: str | None) -> None:
    if state is not None and state not in STATES:
        raise ValueError(f"{method} got state={state!r}. Valid choices are: 'queued', 'running' or None.")


def _check_digest(digest: str) -> None:
    # A lone surrogate would fail in the client that encodes the key.
    if (
        not isinstance(digest, str)
        or not digest
        or "{" in digest
        or "}" in digest
        or ":" in digest
        or not encodes_as_utf8(digest)
    ):
        raise ValueError(
            f"{digest!r} is not a digest: a digest is the {DIGEST_LENGTH} characters between the braces of a lock key."
        )


def _cursor(position: _Position, after: tuple[str, int] | None) -> str:
    """A :meth:`Locks.page` cursor: opaque, and safe in a URL."""
    return base64.urlsafe_b64encode(json.dumps([position.index, position.cursor, after]).encode()).decode()


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


def _with_calls(lock: LockInfo, calls: dict[str, str]) -> LockInfo:
    """``lock`` with the call of each holder that has none and whose message is in ``calls``."""
    if not any(h.call is None and h.message_id in calls for h in lock.holders):
        return lock
    holders = tuple(
        dataclasses.replace(h, call=calls[h.message_id]) if h.call is None and h.message_id in calls else h
        for h in lock.holders
    )
    return dataclasses.replace(lock, holders=holders)


def _unreadable_fails(step: str, key: str, places: dict[str, str]) -> str:
    return (
        f"A new {step} would fail with LockBackendError: in lock {key!r}, {next(iter(places.values()))}, and no "
        "slot is taken beside what cannot be read. Remove it (see Errors in the docs)."
    )


def _free_place(kind: str, lock: LockInfo | None, limit: int, subject: str) -> str | None:
    """What ``subject`` meets when the lock has a free slot, ``None`` when it is full."""
    taken = len(lock.holders) if lock is not None else 0
    if taken >= limit:
        return None
    if taken == 0:
        return f"{subject} would take the {kind} lock: it is free."
    return f"{subject} would take a free slot of the {kind} lock ({taken} of {limit} taken)."


def _outcome(config: LockConfig, side: str) -> str:
    """What becomes of a duplicate under the actor's strategy on ``side``, as the end of "… would …"."""
    strategy = config.client_strategy if side == CLIENT else config.server_strategy
    return strategy.explain(side, reschedule_delay=config.reschedule_delay, max_reschedules=config.max_reschedules)


def _on_send(config: LockConfig, lock: LockInfo | None, now: int) -> str:
    subject = "A new send"
    if not config.lock.locks_at_enqueue:
        return f"{subject} would be enqueued: {config.lock.name} takes no lock at enqueue."
    free = _free_place("enqueue", lock, config.lock_limit, subject)
    if free is not None or lock is None:
        return str(free)
    strategy, note = config.client_strategy, ""
    if strategy.replaces_queued_holders:
        queued = [h for h in lock.holders if h.state == QUEUED and h.place.holder.get("replaceable")]
        if queued:
            return (
                f"{subject} would replace queued {describe_holder(queued[0], now)}, "
                f"which is skipped when it reaches a worker (strategy {strategy.name!r})."
            )
        note = ": every holder runs, and a running one stays"
    sentence = f"{subject} would {_outcome(config, CLIENT)} as a duplicate of {describe_holders(lock.holders, now)}"
    sentence += f" (strategy {strategy.name!r}{note}){_line(lock)}."
    if config.lock.requires_ttl:
        sentence += f" An {config.lock.name} lock is only freed by its lock_ttl, whatever became of its message."
    return sentence


def _on_start(config: LockConfig, lock: LockInfo | None, now: int) -> str:
    subject = "A message with these arguments, started now,"
    free = _free_place("run", lock, config.lock_limit, subject)
    if free is not None or lock is None:
        return str(free)
    return (
        f"{subject} would {_outcome(config, SERVER)}: the run lock is held by "
        f"{describe_holders(lock.holders, now)} (strategy {config.server_strategy.name!r}){_line(lock)}."
    )


def _line(lock: LockInfo) -> str:
    """``; 3 messages wait in its line`` (``1 message waits``) for a lock with a line, else nothing."""
    verb = "waits" if len(lock.waiting) == 1 else "wait"
    return f"; {count(len(lock.waiting), 'message')} {verb} in its line" if lock.waiting else ""
