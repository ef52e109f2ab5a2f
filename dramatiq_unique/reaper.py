"""The orphan reaper.

A lock is an orphan when no live message or worker will ever release it. The
reaper walks the locks in bounded batches with a resumable cursor and
releases:

* run locks whose worker is dead by what it published: its last heartbeat
  plus its own lease period lie in the past (their lease would free them
  too, within about a heartbeat interval more: the reaper is the fast path);
* enqueue locks whose message no longer exists in the broker (and the places a
  lock's line handed to a message, in either lock). ``RedisBroker``
  and ``StubBroker`` are asked for the message by its id. RabbitMQ cannot be:
  there, a message is gone when its queue and delay queue have no message
  waiting, before and after every live worker published the messages in its
  hands (see :mod:`dramatiq_unique.in_hand`), and none holds it. Other brokers
  are not asked. ``until_expired`` locks are left alone: they are meant to
  outlive their message.

A place that a lock's line handed to a message whose enqueue was lost with the
process that freed the place is not released: the message, which the lock store
keeps until it starts, is enqueued again.

It never releases the lock of a message that is queued, delayed, retrying or
running on a live worker: a message is looked for twice, a moment
apart, before its lock goes, and a place is only released while it is still
exactly as read (neither renewed, re-entered nor re-taken since).

One run covers every lock prefix in use: the middleware's and those of
actors with a ``lock_prefix`` of their own, one after the other. Only one
reaper runs at a time across the deployment: it holds a leader lock
``<prefix>:reaper`` (of the middleware's prefix) while it works.
"""

from __future__ import annotations

import abc
import bisect
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import dramatiq
import redis
from dramatiq import Broker, Message
from dramatiq.actor import Actor
from dramatiq.common import dq_name, q_name
from dramatiq.errors import DecodeError
from dramatiq.results import Results

from .backends import Holder, LockBackend, LockRecord
from .errors import InvalidLockOptions, LineNeedsBroker
from .events import REAPED, Events, LockEvent
from .forks import reset_in_child
from .handoffs import handed_message
from .held import QUEUED
from .in_hand import held_by_live_workers
from .keys import RUN, digest_of, reaper_cursor_key, reaper_leader_key, registry_key
from .locks import outlives_message
from .options import DEFAULT_HEARTBEAT_INTERVAL, DEFAULTS
from .presentation import count

_logger = logging.getLogger(__name__)

#: The name of the orphan reaper actor.
REAPER_ACTOR_NAME = "dramatiq_unique_reaper"
#: About how many keys one pass inspects.
DEFAULT_BATCH = 500
#: An enqueue lock younger than this (ms) is never reaped: its message may be on its way to the broker.
DEFAULT_MIN_AGE = 10_000
#: How long the saved cursor is kept between two runs (ms).
CURSOR_TTL = 24 * 3600 * 1000
#: How long the leader lock outlives its last renewal (ms): a reaper that died lets another run then.
LEADER_TTL = 60_000
#: How long a dead worker stays in the registry (ms), longer than RabbitMQ's heartbeat timeout
#: (60 s by default): until RabbitMQ has given back the messages of a worker whose host died,
#: the reaper decides nothing about lost messages there.
FORGET_DEAD_WORKERS_AFTER = 300_000

#: A position the reaper saves: a scan cursor.
_CURSOR = re.compile(r"[0-9]+(:[0-9]+)?")


@dataclass
class ReapReport:
    """What one reaper run did.

    Parameters:
      passes(int): Bounded batches inspected.
      inspected(int): Places (holders of locks) inspected.
      released_dead_workers(int): Run locks released because their worker is dead.
      released_missing_messages(int): Enqueue locks released because their message no longer exists.
      released_lapsed(int): Places whose lease or ``lock_ttl`` ran out that no other step had
        dropped yet (another holder or a line kept the lock), freed: a line waiting is handed them.
      enqueued_again(int): Messages handed a place by a lock's line that never reached the
        broker, enqueued again.
      left_for_broker(int): Places that were to be freed and were left held: messages wait in
        their lock's line, and a reaper without the application's broker could not enqueue the
        one handed the place.
      forgotten_workers(int): Dead workers removed from the worker registry.
      unreadable(int): Places this version cannot read (another version's, a hand edit), left as they are.
      complete(bool): Whether the run reached the end of the locks (a full cycle).
      skipped(bool): Whether another reaper was running, so this one did nothing.
      seconds(float): How long the run took.
    """

    passes: int = 0
    inspected: int = 0
    released_dead_workers: int = 0
    released_missing_messages: int = 0
    released_lapsed: int = 0
    enqueued_again: int = 0
    left_for_broker: int = 0
    forgotten_workers: int = 0
    unreadable: int = 0
    complete: bool = False
    skipped: bool = False
    seconds: float = 0.0

    @property
    def released(self) -> int:
        return self.released_dead_workers + self.released_missing_messages + self.released_lapsed

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "released": self.released}


class Reaper:
    """Finds and releases orphaned locks under the lock prefixes in use.

    Parameters:
      backend(LockBackend): Where the locks are.
      prefix(str): The lock prefix of the reaper's own keys (leader lock,
        schedule, cursor), and the first whose locks it reaps;
        :meth:`add_prefix` adds others.
      logger(logging.Logger): Where each released lock is reported.
      batch(int): About how many keys one pass inspects.
      min_age(int): Enqueue locks younger than this (ms) are never reaped.
      confirm_delay(float): Seconds between the two looks for a message.
      events(Events): Where each released lock is told.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        logger: logging.Logger,
        batch: int = DEFAULT_BATCH,
        min_age: int = DEFAULT_MIN_AGE,
        confirm_delay: float = 0.05,
        events: Events | None = None,
    ):
        self.backend = backend
        self.events = events if events is not None else Events(logger=logger)
        #: Every lock prefix whose locks a run reaps, in the order it reaps them.
        self.prefixes: tuple[str, ...] = (prefix,)
        self.logger = logger
        self.batch = batch
        self.min_age = min_age
        self.confirm_delay = confirm_delay
        self._mutex = threading.Lock()
        reset_in_child(self._reset_in_child)
        self.leader_key = reaper_leader_key(prefix)
        #: Where the workers publish the messages in their hands: under the middleware's prefix.
        self.registry = registry_key(prefix)
        self.cursor_key = reaper_cursor_key(prefix)

    def add_prefix(self, prefix: str) -> None:
        """Reap the locks under ``prefix`` too: the lock prefix of an actor."""
        with self._mutex:
            if prefix not in self.prefixes:
                self.prefixes = tuple(sorted({*self.prefixes, prefix}))

    def _reset_in_child(self) -> None:
        # A thread of the parent may have held the mutex at the fork.
        self._mutex = threading.Lock()

    def run(self, *, broker: Broker | None = None, max_passes: int | None = None) -> ReapReport:
        """Inspect the locks, from where the previous run stopped, until the
        end or ``max_passes`` passes; do nothing if another reaper runs.

        Parameters:
          broker(dramatiq.Broker): The broker to ask whether a message still exists;
            ``None`` (or a broker that cannot be asked) leaves enqueue locks alone.
          max_passes(int): At most this many batches; ``None`` for a full cycle.
        """
        started = time.monotonic()
        report = ReapReport()
        owner = uuid.uuid4().hex
        holder = Holder(message_id=owner, actor=REAPER_ACTOR_NAME, queue="", lock="reaper", state="running")
        if not self.backend.acquire(self.leader_key, owner, limit=1, ttl=LEADER_TTL, holder=holder).acquired:
            self.logger.info("The orphan reaper is already running elsewhere; this run does nothing.")
            report.skipped = True
            return report
        unreadable: list[LockRecord] = []
        try:
            locator = locator_for(broker, backend=self.backend, registry=self.registry, logger=self.logger)
            prefixes = self.prefixes
            index, cursor = self._resume(prefixes)
            while True:
                cursor = self._pass(prefixes[index], cursor, locator, report, unreadable)
                if cursor == "0":
                    index += 1
                if index == len(prefixes):
                    report.complete = True
                    index = 0
                # Where the next run starts: one position across the prefixes, each scanned in turn.
                position = json.dumps([prefixes[index], cursor])
                self.backend.set_value(self.cursor_key, position, ttl=CURSOR_TTL)
                self.backend.renew(self.leader_key, owner, ttl=LEADER_TTL)
                if report.complete or (max_passes is not None and report.passes >= max_passes):
                    break
            if report.complete:
                # After a full cycle, the workers dead for long leave the registries: any run lock of
                # theirs still held is left to its lease, which ends about when the worker's time did.
                for prefix in prefixes:
                    now, _ = self.backend.heartbeats(registry_key(prefix))
                    report.forgotten_workers += self.backend.forget_workers(
                        registry_key(prefix), before=now - FORGET_DEAD_WORKERS_AFTER
                    )
        finally:
            self.backend.release(self.leader_key, owner)
        report.seconds = time.monotonic() - started
        if unreadable:
            self.logger.warning(
                "The orphan reaper left %s it cannot read untouched: %s%s. Remove what is not a "
                "lock of this version (see Errors in the docs).",
                count(len(unreadable), "lock record"),
                "; ".join(f"in {record.key!r}, {record.unreadable}" for record in unreadable[:3]),
                f"; and {len(unreadable) - 3} more" if len(unreadable) > 3 else "",
            )
        self.logger.info(
            "The orphan reaper inspected %s of locks in %s and released %d: %d of dead workers, "
            "%d of messages that no longer exist%s.%s",
            count(report.inspected, "holder"),
            count(report.passes, "pass", "passes"),
            report.released,
            report.released_dead_workers,
            report.released_missing_messages,
            f", {report.released_lapsed} that lapsed" * bool(report.released_lapsed),
            f" It enqueued again {count(report.enqueued_again, 'message')} that a line handed a slot."
            * bool(report.enqueued_again),
        )
        return report

    def _resume(self, prefixes: tuple[str, ...]) -> tuple[int, str]:
        """Where the previous run stopped: the index of a prefix, and a cursor under it."""
        saved = self.backend.get_value(self.cursor_key)
        if saved is None:
            return 0, "0"
        try:
            prefix, cursor = json.loads(saved)
            # A scan cursor: a number, or "<node>:<number>" on a Redis Cluster.
            if not isinstance(prefix, str) or not isinstance(cursor, str) or not _CURSOR.fullmatch(cursor):
                raise TypeError
        except (ValueError, TypeError):
            # Not written by this version: the run starts over, and writes its own.
            shown = saved if len(saved) <= 100 else saved[:100] + "…"
            self.logger.warning(
                "The orphan reaper starts over from the first lock: where the last run stopped, %r holds %r, "
                "which is not a position this version writes.",
                self.cursor_key,
                shown,
            )
            return 0, "0"
        # A prefix that is no longer in use: go on with the next one.
        index = bisect.bisect_left(prefixes, prefix)
        if index == len(prefixes):
            return 0, "0"
        return index, cursor if prefixes[index] == prefix else "0"

    def _pass(
        self, prefix: str, cursor: str, locator: _Locator | None, report: ReapReport, unreadable: list[LockRecord]
    ) -> str:
        # Workers heartbeat into the registry of each prefix their actors use.
        now, alive_until = self.backend.heartbeats(registry_key(prefix))
        cursor, records = self.backend.scan(prefix, cursor, self.batch)
        report.passes += 1
        report.inspected += len(records)
        enqueue_locks = []
        for record in records:
            if record.unreadable is not None:
                report.unreadable += 1
                unreadable.append(record)
                continue
            if record.expires_at is not None and record.expires_at <= now:
                # Lapsed (a dead worker's lease): dropped, and its place handed to the lock's line, if
                # any, by a release that frees nothing else. Without a line, the next operation would.
                ran_out = "lease" if record.kind == RUN else "lock_ttl"
                self._release(record, report, f"its {ran_out} ran out", lapsed=True)
                continue
            # Only run locks end with their worker. An enqueue lock recorded as running (replace)
            # belongs to a message the broker redelivers when its worker dies; a queued place in
            # a run lock, handed by its line, to a message on its way through the broker.
            if record.kind == RUN and record.holder.get("state") != QUEUED:
                worker = record.holder.get("worker_id")
                until = alive_until.get(worker) if isinstance(worker, str) else None
                # Each worker says how long it counts as alive: its heartbeat plus its own lease
                # period. A worker missing from the registry (forgotten after
                # it died, or not registered yet) may still run: its lock is left to its lease.
                if until is not None and until <= now:
                    self._release(record, report, f"its worker {worker!r} stopped sending heartbeats")
            elif (
                locator is not None
                and not outlives_message(record.holder.get("lock"))
                and record.acquired_at <= now - self.min_age
            ):
                enqueue_locks.append(record)
        if enqueue_locks and locator is not None:
            suspects = [r for r, gone in zip(enqueue_locks, locator.missing(enqueue_locks), strict=True) if gone]
            if suspects:
                # A message moving between queues (a retry, a due delayed message) is
                # enqueued again before its old copy goes: look again a moment later.
                time.sleep(self.confirm_delay)
                for record, gone in zip(suspects, locator.missing(suspects), strict=True):
                    if gone and not self._enqueue_again(record, report, locator.broker):
                        self._release(record, report, "its message no longer exists in the broker")
        return cursor

    def _enqueue_again(self, record: LockRecord, report: ReapReport, broker: Broker) -> bool:
        """Enqueue again the message of a place that its line handed it, if the lock store still
        keeps it (it has not started), under a new token of that place; returns whether the
        place is its message's (then it is not released)."""
        message_id = str(record.holder.get("message_id"))
        if self.backend.waiting_message(record.key, message_id) is None:
            return False
        handed = self.backend.hand_again(record.key, record.owner, record.record)
        if handed is None:
            return True  # it changed since it was read: the message is on its way
        broker.enqueue(handed_message(handed))
        report.enqueued_again += 1
        self.logger.warning(
            "The orphan reaper enqueued message %r of actor %r again: the line of lock %r handed it a place, "
            "and it never reached the broker (the process that freed the place died first).",
            message_id,
            record.holder.get("actor"),
            record.key,
        )
        return True

    def _release_record(self, record: LockRecord, report: ReapReport) -> bool:
        """Free the place of ``record`` while it is as read; returns whether it did."""
        try:
            return self.backend.release_record(record.key, record.owner, record.record)
        except LineNeedsBroker as e:
            report.left_for_broker += 1
            self.logger.warning("The orphan reaper could not free a place: %s", e)
            return False

    def _release(self, record: LockRecord, report: ReapReport, reason: str, *, lapsed: bool = False) -> None:
        if not self._release_record(record, report):
            return  # renewed, re-entered or released since it was read, or left to a reaper with a broker
        if lapsed:
            report.released_lapsed += 1
        elif record.kind == RUN:
            report.released_dead_workers += 1
        else:
            report.released_missing_messages += 1
        holder = record.holder
        actor_name = str(holder.get("actor", ""))
        self.events.notify(
            REAPED,
            actor_name,
            lambda: LockEvent(
                kind=REAPED,
                actor_name=actor_name,
                queue_name=str(holder.get("queue", "")),
                digest=digest_of(record.key) or "",
                message_id=holder.get("message_id"),
                lock=holder.get("lock"),
                lock_kind=record.kind,
                reason=reason,
            ),
        )
        self.logger.warning(
            "The orphan reaper released lock %r of message %r of actor %r (%s): %s.",
            record.key,
            record.holder.get("message_id"),
            record.holder.get("actor"),
            record.holder.get("lock"),
            reason,
        )


# The reaper actor, and the workers that send it -----------------------------------


def declare_reaper_actor(
    broker: Broker, reaper: Reaper, *, queue_name: str, actor_options: Mapping[str, Any] | None = None
) -> Actor[Any, Any]:
    """Declare the orphan reaper actor on ``broker`` and return it.

    It runs a reaper cycle: it accepts ``max_passes`` (``None``: until every
    lock was inspected) and logs its report in one line. With Dramatiq's
    ``Results`` middleware on the broker, it also returns the report as a dict.

    Parameters:
      reaper(Reaper): What it runs.
      queue_name(str): Its queue.
      actor_options(Mapping): More options of the actor, for the broker's
        other middleware: e.g. periodiq's ``periodic``, or ``max_retries``
        (``0`` unless given here).

    Raises:
      InvalidLockOptions: If an option is the actor's own (its name, its queue,
        a lock option) or no middleware on ``broker`` declares it.
    """
    options = dict(actor_options or {})
    check_reaper_options(broker, options)

    def dramatiq_unique_reaper(max_passes: int | None = None) -> dict[str, Any] | None:
        report = reaper.run(broker=broker, max_passes=max_passes)
        # Dramatiq warns of every value returned where no Results middleware keeps it.
        return report.as_dict() if any(isinstance(m, Results) for m in broker.middleware) else None

    actor: Actor[Any, Any] = dramatiq.actor(
        broker=broker,
        actor_name=REAPER_ACTOR_NAME,
        queue_name=queue_name,
        **{"max_retries": 0, **options, "lock": None},
    )(dramatiq_unique_reaper)
    return actor


def check_reaper_options(broker: Broker, options: Mapping[str, Any]) -> None:
    """Check the options given to the reaper actor.

    Raises:
      InvalidLockOptions: Naming the option, its value and the valid choices.
    """
    valid = sorted(broker.actor_options - DEFAULTS.keys())
    for name, value in options.items():
        if name == "queue_name":
            problem = "it is the middleware's reaper_queue: set UniqueJobs(reaper_queue=...) instead"
        elif name in DEFAULTS or name == "actor_name":
            problem = f"the reaper actor sets {name} itself"
        elif name not in broker.actor_options:
            problem = (
                "no middleware on this broker declares it. Add the middleware that does before the reaper is declared"
            )
        else:
            continue
        raise InvalidLockOptions(
            f"The reaper actor {REAPER_ACTOR_NAME!r} has an invalid option {name}={value!r}: {problem}. "
            f"Valid choices on this broker are: {', '.join(repr(option) for option in valid)}."
        )


class ReaperTrigger:
    """A task of each worker's periodic thread: the first worker to take the
    schedule lock of an interval sends the reaper actor, so that it runs about
    once per interval across the deployment.

    Parameters:
      backend(LockBackend): Where the schedule lock is.
      schedule_key(str): The key of the schedule lock.
      interval(int): Milliseconds between two reaper runs.
      queue_name(str): The reaper actor's queue, recorded in the schedule lock.
      actor(collections.abc.Callable): The reaper actor, once declared; ``None`` before.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        schedule_key: str,
        interval: int,
        queue_name: str,
        actor: Callable[[], Actor[Any, Any] | None],
    ):
        self.backend = backend
        self.schedule_key = schedule_key
        self.interval = interval
        self.queue_name = queue_name
        self.actor = actor
        self._next_try = 0

    def __call__(self, now: int) -> None:
        """Try the schedule lock, if this process has not tried it in this interval.

        Parameters:
          now(int): The backend's time, in milliseconds.
        """
        actor = self.actor()
        # Each process asks at most once per interval: one round trip per interval, not per heartbeat.
        if actor is None or now < self._next_try:
            return
        self._next_try = now + self.interval
        owner = uuid.uuid4().hex
        holder = Holder(
            message_id=owner, actor=REAPER_ACTOR_NAME, queue=self.queue_name, lock="schedule", state="queued"
        )
        if self.backend.acquire(self.schedule_key, owner, limit=1, ttl=self.interval, holder=holder).acquired:
            actor.send()


# Asking brokers whether a message still exists -----------------------------------


class _Locator(abc.ABC):
    def __init__(self, broker: Any):
        self.broker = broker

    @abc.abstractmethod
    def missing(self, records: list[LockRecord]) -> list[bool]:
        """For each enqueue lock, whether its message is certainly gone from the broker."""

    def messages(self, records: list[LockRecord]) -> list[Message[Any] | None]:
        """For each place, its message as the broker keeps it, found by the id its holder
        recorded; ``None`` where the broker cannot give it. This broker never can: it cannot
        be asked for a message by its id."""
        return [None] * len(records)


class _RedisLocator(_Locator):
    """RedisBroker keeps every message, until it is acked, in ``<ns>:<queue>.msgs``
    (delayed ones and retries in ``<ns>:<queue>.DQ.msgs``), fetched or not."""

    def __init__(self, broker: Any, *, backend: LockBackend):
        super().__init__(broker)
        self.client = broker.client
        self.namespace = broker.namespace
        self.backend = backend

    def _ask(self, records: list[LockRecord], command: str) -> tuple[list[bool], Any]:
        """A pipeline of ``command`` (``hexists``, ``hget``) on the hashes of each record's queue
        and delay queue, by the message's Redis id: whether each record was asked, and the
        pipeline, two answers per record asked."""
        pipe = self.client.pipeline(transaction=False)
        asked = []
        for record in records:
            rid, queue = record.holder.get("redis_message_id"), record.holder.get("queue")
            if rid and queue:
                getattr(pipe, command)(f"{self.namespace}:{queue}.msgs", rid)
                getattr(pipe, command)(f"{self.namespace}:{dq_name(queue)}.msgs", rid)
            asked.append(bool(rid and queue))
        return asked, pipe

    def missing(self, records: list[LockRecord]) -> list[bool]:
        asked, pipe = self._ask(records, "hexists")
        answers = iter(pipe.execute())
        # A place recorded without the message's Redis id is never taken for an orphan, but one that
        # a line handed: its message records the id when it reaches the broker.
        return [
            not any([next(answers), next(answers)]) if ask else self._handed_and_lost(record)
            for record, ask in zip(records, asked, strict=True)
        ]

    def _handed_and_lost(self, record: LockRecord) -> bool:
        return self.backend.waiting_message(record.key, str(record.holder.get("message_id"))) is not None

    def messages(self, records: list[LockRecord]) -> list[Message[Any] | None]:
        """The message of each place that recorded its Redis id (an enqueue lock's), from its
        queue's hash or its delay queue's, in one round trip."""
        asked, pipe = self._ask(records, "hget")
        if not any(asked):
            return [None] * len(records)
        try:
            answers = iter(pipe.execute())
        except redis.RedisError as e:
            _logger.warning("The messages of the holders could not be read from the broker: %s", e)
            return [None] * len(records)
        found: list[Message[Any] | None] = []
        for record, ask in zip(records, asked, strict=True):
            payloads = (next(answers), next(answers)) if ask else (None, None)
            found.append(_decoded(payloads[0] or payloads[1], record))
        return found


class _StubLocator(_Locator):
    """StubBroker's queues hold the messages not yet fetched; a queue with a
    message in a worker's hands cannot be asked, so its locks are left alone."""

    def missing(self, records: list[LockRecord]) -> list[bool]:
        known: dict[str, set[str] | None] = {}
        answers = []
        for record in records:
            queue = str(record.holder.get("queue", ""))
            if queue not in known:
                known[queue] = self._message_ids(queue)
            ids = known[queue]
            answers.append(ids is not None and record.holder.get("message_id") not in ids)
        return answers

    def messages(self, records: list[LockRecord]) -> list[Message[Any] | None]:
        """The message of each place that waits in its queue or delay queue, not yet fetched."""
        waiting: dict[str, Message[Any]] = {}
        for queue in {str(record.holder.get("queue", "")) for record in records}:
            for name in (queue, dq_name(queue)):
                q = self.broker.queues.get(name)
                if q is None:
                    continue
                with q.mutex:
                    payloads = list(q.queue)
                for payload in payloads:
                    try:
                        message = Message.decode(payload)
                    except DecodeError:
                        continue
                    waiting[message.message_id] = message
        return [waiting.get(str(record.holder.get("message_id"))) for record in records]

    def _message_ids(self, queue: str) -> set[str] | None:
        ids: set[str] = set()
        for name in (queue, dq_name(queue)):
            q = self.broker.queues.get(name)
            if q is None:
                continue
            with q.mutex:
                if q.unfinished_tasks > len(q.queue):
                    return None
                payloads = list(q.queue)
            ids.update(Message.decode(p).message_id for p in payloads)
        return ids


class _QueueCountLocator(_Locator):
    """RabbitMQ counts the messages waiting in a queue but cannot be asked for one by its id,
    and a message a worker has received is no longer counted. So a message is gone when its
    queue and delay queue have none waiting, when every live worker then publishes, counted
    after that, the messages in its hands without it, and when its queues still have none
    waiting after that: a message on its way back to a queue (a redelivery, a retry) is seen
    in one of the three. A registry with a worker that died and is not forgotten yet decides
    nothing: its messages may be on their way back."""

    #: How long to wait for a publication, in heartbeat intervals.
    PATIENCE = 3
    #: Seconds between two reads of the publications.
    POLL = 0.2

    def __init__(self, broker: Any, *, backend: LockBackend, registry: str, logger: logging.Logger):
        super().__init__(broker)
        self.backend = backend
        self.registry = registry
        self.logger = logger
        #: Set once a run cannot decide: its other batches do not wait again.
        self._gave_up = False

    def missing(self, records: list[LockRecord]) -> list[bool]:
        import pika.exceptions  # type: ignore[import-untyped]

        if self._gave_up:
            return [False] * len(records)
        queues = {q_name(str(record.holder.get("queue", ""))) for record in records}
        # The registry's clock, which the publications are compared with.
        since, _, _ = self.backend.messages_in_hand(self.registry)
        try:
            with QueueCounter(self.broker) as counter:
                empty = {queue for queue in queues if queue and counter.waiting(queue) == 0}
                in_hand = self._in_hand_since(since) if empty else None
                if in_hand is None:
                    return [False] * len(records)
                empty = {queue for queue in empty if counter.waiting(queue) == 0}
        except pika.exceptions.AMQPError as e:
            self.logger.warning("The orphan reaper could not count the messages waiting in RabbitMQ: %s", e)
            return [False] * len(records)
        return [
            q_name(str(record.holder.get("queue", ""))) in empty and record.holder.get("message_id") not in in_hand
            for record in records
        ]

    def _in_hand_since(self, since: int) -> set[str] | None:
        """The ids of the messages in the live workers' hands, each worker's counted after
        ``since`` (the registry's clock); ``None`` when some worker does not publish in time,
        and then for the rest of the run."""
        deadline: float | None = None
        while True:
            now, alive_until, published = self.backend.messages_in_hand(self.registry)
            if any(until <= now for until in alive_until.values()):
                self.logger.info(
                    "The orphan reaper does not look for lost messages in RabbitMQ in this run: a worker stopped "
                    "sending heartbeats less than %d s ago, and the messages it held may be on their way back to "
                    "their queues.",
                    FORGET_DEAD_WORKERS_AFTER // 1000,
                )
                self._gave_up = True
                return None
            late = [
                worker
                for worker in alive_until
                if worker not in published or not published[worker].complete or published[worker].taken_at < since
            ]
            if not late:
                return held_by_live_workers(alive_until, published)
            if deadline is None:
                interval = max((p.interval for p in published.values()), default=DEFAULT_HEARTBEAT_INTERVAL)
                deadline = time.monotonic() + self.PATIENCE * interval / 1000
            if time.monotonic() > deadline:
                self.logger.info(
                    "The orphan reaper does not look for lost messages in RabbitMQ in this run: worker(s) %s did not "
                    "publish the messages in their hands in time (a worker of an earlier version of dramatiq-unique "
                    "publishes none).",
                    ", ".join(repr(worker) for worker in late),
                )
                self._gave_up = True
                return None
            time.sleep(self.POLL)


class QueueCounter:
    """Counts the messages waiting in RabbitMQ's queues, on a connection of its own, open
    while the counter is used as a context manager.

    Raises:
      pika.exceptions.AMQPError: When RabbitMQ cannot be reached.
    """

    def __init__(self, broker: Any):
        self.broker = broker

    def __enter__(self) -> QueueCounter:
        import pika

        self.connection = pika.BlockingConnection(self.broker.parameters)
        self.channel = self.connection.channel()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.connection.is_open:
            self.connection.close()

    def waiting(self, queue: str) -> int:
        """How many messages wait in ``queue`` and its delay queue."""
        import pika.exceptions

        total = 0
        for name in (queue, dq_name(queue)):
            try:
                total += self.channel.queue_declare(name, passive=True).method.message_count
            except pika.exceptions.ChannelClosedByBroker:
                # No such queue (deleted, or never declared): nothing waits there.
                self.channel = self.connection.channel()
        return total


def _decoded(payload: bytes | None, record: LockRecord) -> Message[Any] | None:
    """The message of ``payload``, when it is the holder's."""
    if payload is None:
        return None
    try:
        message = Message.decode(payload)
    except DecodeError:
        return None
    return message if message.message_id == record.holder.get("message_id") else None


def _locator_class(broker: Broker | None) -> type[_Locator] | None:
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.brokers.stub import StubBroker

    if isinstance(broker, RedisBroker):
        return _RedisLocator
    if isinstance(broker, StubBroker):
        return _StubLocator
    try:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError:  # pika is not installed: no broker here is RabbitMQ
        return None
    return _QueueCountLocator if isinstance(broker, RabbitmqBroker) else None


def needs_messages_in_hand(broker: Broker) -> bool:
    """Whether the workers of ``broker`` publish the messages in their hands for the reaper."""
    return _locator_class(broker) is _QueueCountLocator


def locator_for(
    broker: Broker | None, *, backend: LockBackend, registry: str, logger: logging.Logger
) -> _Locator | None:
    """How to ask ``broker`` whether a message exists, or ``None`` when it cannot be asked."""
    kind = _locator_class(broker)
    if kind is _QueueCountLocator:
        return _QueueCountLocator(broker, backend=backend, registry=registry, logger=logger)
    if kind is _RedisLocator:
        return _RedisLocator(broker, backend=backend)
    return None if kind is None else kind(broker)


def reap_orphans(
    backend: LockBackend,
    *,
    broker: Broker | None = None,
    prefix: str = "dramatiq-unique",
    actor_prefixes: Iterable[str] = (),
    max_passes: int | None = None,
    batch: int = DEFAULT_BATCH,
    logger: logging.Logger | None = None,
) -> ReapReport:
    """Run the orphan reaper once, without an actor (e.g. from a script or a CLI).

    Parameters:
      backend(LockBackend): Where the locks are.
      broker(dramatiq.Broker): The broker to ask whether a message still exists.
      prefix(str): The middleware's lock prefix.
      actor_prefixes(Iterable[str]): The ``lock_prefix`` of actors that have
        their own: their locks are reaped in the same run.
      max_passes(int): At most this many batches; ``None`` for a full cycle.
      batch(int): About how many keys one pass inspects.
      logger(logging.Logger): Where each released lock is reported.
    """
    reaper = Reaper(
        backend,
        prefix=prefix,
        batch=batch,
        logger=logger or logging.getLogger("dramatiq_unique.reaper"),
    )
    for actor_prefix in actor_prefixes:
        reaper.add_prefix(actor_prefix)
    return reaper.run(broker=broker, max_passes=max_passes)
