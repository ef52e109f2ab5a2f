"""The conflict trail: which messages met a held lock, or a failing lock store, and what became of them.

A :class:`ConflictRecorder` subscribes to the lock events of the kinds that tell it (a conflict, a
reschedule, a rejection, a replaced queued message, a wait in a lock's line, a backend error): a
send that meets no lock builds no event and records nothing. It keeps the entries in memory, and
the periodic thread of the process writes them to the backend with the activity counts, once per
heartbeat interval, in one round trip per lock prefix; a process that only sends writes them while
it has some, and at exit.

The trail of each lock prefix is kept by the backend (``<prefix>:history:{activity}``, a Redis
stream), bounded by a number of entries and by their age. :func:`read_history` reads it back,
newest first, as :class:`~dramatiq_unique.held.ConflictInfo` values.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from dramatiq.common import q_name

from .backends import LockBackend
from .digest import DIGEST_LENGTH, compute_digest, lock_arguments
from .errors import InvalidLockOptions, LockBackendError, LockStoreHealing
from .events import BACKEND_ERROR, CANCELLED, CONFLICT, REJECTED, REPLACED, RESCHEDULED, WAITING, LockEvent
from .held import QUEUED, RUNNING, ConflictInfo
from .keys import ENQUEUE, RUN, digest_of, enqueue_key, history_key, prefix_of, run_key

if TYPE_CHECKING:
    from dramatiq import Actor

    from .options import LockConfig

#: How many entries the trail of one lock prefix keeps at most, by default.
DEFAULT_HISTORY_LIMIT = 10_000
#: How long an entry is kept, by default, in milliseconds: 24 hours.
DEFAULT_HISTORY_RETENTION = 24 * 60 * 60 * 1000

#: What became of a message of the trail (:attr:`ConflictInfo.outcome`).
DROPPED = "dropped"  #: dropped as a duplicate (``log``, ``replace``)
RAISED = "raised"  #: ``send()`` raised, or the worker failed it to be retried (``raise``)
REJECTED_OUTCOME = "rejected"  #: sent to its dead-letter queue
RESCHEDULED_OUTCOME = "rescheduled"  #: enqueued again to try later
REPLACED_OUTCOME = "replaced"  #: a queued holder whose place a newer message took (``replace``)
WAITING_OUTCOME = "waiting"  #: waits in the lock's line (``wait``, ``keep_latest``)
DISPLACED = "displaced"  #: a waiter whose place in the line a newer message took (``keep_latest``)
HEALING = "healing"  #: refused while the lock store healed after a loss of its data
OUTAGE = "outage"  #: met a lock backend that failed
CANCELLED_OUTCOME = "cancelled"  #: stopped while it ran (``cancel_in_progress``, or an operator's cancel)
OUTCOMES = (
    DROPPED,
    RAISED,
    REJECTED_OUTCOME,
    RESCHEDULED_OUTCOME,
    REPLACED_OUTCOME,
    WAITING_OUTCOME,
    DISPLACED,
    HEALING,
    OUTAGE,
    CANCELLED_OUTCOME,
)

#: The outcome of a conflict, by the strategy that deals with it; a strategy of your own is
#: named as it is. A reschedule or a rejection that follows is its outcome instead.
_STRATEGY_OUTCOMES = {
    "log": DROPPED,
    "replace": DROPPED,
    "raise": RAISED,
    "reject": REJECTED_OUTCOME,
    "wait": REJECTED_OUTCOME,
    "keep_latest": REJECTED_OUTCOME,
    "reschedule": RESCHEDULED_OUTCOME,
}

#: The most entries a trail may be configured to keep: each is some hundreds of bytes.
LONGEST_HISTORY = 1_000_000
#: The longest retention a trail may be configured with, in milliseconds: 30 days.
LONGEST_HISTORY_RETENTION = 30 * 24 * 60 * 60 * 1000


def check_history_options(*, history: Any, history_limit: Any, history_retention: Any) -> tuple[int, int] | None:
    """Validate the trail's options of the middleware.

    Returns:
      tuple[int, int]: The most entries kept per lock prefix and their retention in ms; ``None``
      with ``history=False``.

    Raises:
      InvalidLockOptions: Naming the option, the bad value and what it must be.
    """
    if not isinstance(history, bool):
        raise InvalidLockOptions(f"UniqueJobs has an invalid history={history!r}: it must be True or False.")
    for name, value, unit, most in (
        ("history_limit", history_limit, "entries per lock prefix", LONGEST_HISTORY),
        ("history_retention", history_retention, "milliseconds", LONGEST_HISTORY_RETENTION),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise InvalidLockOptions(
                f"UniqueJobs has an invalid {name}={value!r}: it must be an integer from 1 to {most:_} ({unit})."
            )
    return (history_limit, history_retention) if history else None


#: How many digests a write of the trail reads the locks of, to name their holders' state and worker.
HOLDER_LOOKUPS = 32

#: The event kinds the recorder subscribes to.
KINDS = (CONFLICT, RESCHEDULED, REJECTED, REPLACED, WAITING, BACKEND_ERROR, CANCELLED)


class _Thread(threading.local):
    #: The last entry recorded in this thread: a reschedule or a rejection of the same message
    #: that follows is its outcome, not another entry.
    last: tuple[str, dict[str, str]] | None = None


class ConflictRecorder:
    """A subscriber to the events of :data:`KINDS` that keeps an entry per message in memory;
    :meth:`flush` adds them to the backend.

    Parameters:
      backend(LockBackend): Where the trail is kept.
      clock(collections.abc.Callable): Now, in ms of the backend's clock, as estimated by the
        heartbeat; ``None`` until it knows, when this machine's clock is used.
      worker(collections.abc.Callable): The id of this process, as the worker registry knows it.
      max_entries(int): The most entries the trail of one lock prefix keeps.
      retention(int): Milliseconds an entry is kept.
      logger(logging.Logger): Where failed flushes are reported.
      on_entries(collections.abc.Callable): Called when an entry is made while none
        waits: there is something to flush again.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        clock: Callable[[], int | None],
        worker: Callable[[], str],
        max_entries: int = DEFAULT_HISTORY_LIMIT,
        retention: int = DEFAULT_HISTORY_RETENTION,
        logger: logging.Logger,
        on_entries: Callable[[], None] = lambda: None,
    ):
        self.backend = backend
        self.clock = clock
        self.worker = worker
        self.max_entries = max_entries
        self.retention = retention
        self.logger = logger
        self.on_entries = on_entries
        self._mutex = threading.Lock()
        #: The entries not written yet, oldest first: (lock prefix, fields).
        self._entries: list[tuple[str, dict[str, str]]] = []
        #: How many entries the bound on memory dropped since the last flush.
        self._dropped = 0
        self._thread = _Thread()
        self._failing = False
        #: Why the last flush failed; ``None`` when it succeeded.
        self.last_error: LockBackendError | None = None

    # Recording (in the thread of the event) ------------------------------------------

    def __call__(self, event: LockEvent) -> None:
        """Record what ``event`` tells of its message (an :meth:`Events.subscribe` subscriber)."""
        if event.message_id is None or event.lock_prefix is None:
            return  # a backend error outside any message, or an event of another origin
        kind, thread = event.kind, self._thread
        last = thread.last
        if kind in (RESCHEDULED, REJECTED) and last is not None and last[0] == event.message_id:
            # What the strategy did with the conflict, or with the failure, recorded just before.
            thread.last = None
            with self._mutex:
                fields = last[1]
                fields["outcome"] = RESCHEDULED_OUTCOME if kind == RESCHEDULED else REJECTED_OUTCOME
                _put(fields, "delay", event.delay)
                _put(fields, "reason", event.reason)
            return
        if kind == REPLACED:
            # The loser is the queued message whose place this one took.
            fields = self._fields(event, outcome=REPLACED_OUTCOME, holders=(event.message_id,), lock_kind=ENQUEUE)
            fields.update(message_id=event.replaced or "", side="client", strategy="replace", holder_state=QUEUED)
            fields.pop("call", None)
            self._add(event.lock_prefix, fields)
            return
        entries = [self._fields(event, outcome=self._outcome(event))]
        if kind == WAITING and event.replaced:
            displaced = self._fields(event, outcome=DISPLACED, holders=(event.message_id,))
            displaced["message_id"] = event.replaced
            displaced.pop("call", None)
            entries.append(displaced)
        thread.last = (event.message_id, entries[0])
        for fields in entries:
            self._add(event.lock_prefix, fields)

    @staticmethod
    def _outcome(event: LockEvent) -> str:
        kind = event.kind
        if kind == CONFLICT:
            return _STRATEGY_OUTCOMES.get(event.strategy or "", event.strategy or DROPPED)
        if kind == WAITING:
            return WAITING_OUTCOME
        if kind == BACKEND_ERROR:
            return HEALING if isinstance(event.error, LockStoreHealing) else OUTAGE
        if kind == CANCELLED:
            return CANCELLED_OUTCOME
        return RESCHEDULED_OUTCOME if kind == RESCHEDULED else REJECTED_OUTCOME

    def _fields(
        self,
        event: LockEvent,
        *,
        outcome: str,
        holders: tuple[str, ...] | None = None,
        lock_kind: str | None = None,
    ) -> dict[str, str]:
        now = self.clock()
        if now is None:
            now = time.time_ns() // 1_000_000
        side = event.side
        if lock_kind is None and event.kind != BACKEND_ERROR:
            lock_kind = event.lock_kind or (None if side is None else ENQUEUE if side == "client" else RUN)
        holders = event.holders if holders is None else holders
        fields = {
            "at": str(now),
            "actor": event.actor_name,
            "queue": event.queue_name,
            "message_id": event.message_id or "",
            "outcome": outcome,
            "worker": self.worker(),
        }
        _put(fields, "call", event.call)
        _put(fields, "digest", event.digest)
        _put(fields, "lock", event.lock)
        _put(fields, "lock_kind", lock_kind)
        _put(fields, "side", side)
        _put(fields, "strategy", event.strategy)
        if holders:
            fields["holders"] = ",".join(holders)
            if lock_kind == RUN and outcome not in (REPLACED_OUTCOME, DISPLACED):
                # Only running messages hold a run lock.
                fields["holder_state"] = RUNNING
        _put(fields, "delay", event.delay)
        _put(fields, "cancelled_by", event.cancelled_by)
        if event.kind == BACKEND_ERROR:
            _put(fields, "reason", f"{event.reason}: {event.error}" if event.error is not None else event.reason)
        else:
            _put(fields, "reason", event.reason)
        return fields

    def _add(self, prefix: str, fields: dict[str, str]) -> None:
        with self._mutex:
            first = not self._entries
            self._entries.append((prefix, fields))
            if len(self._entries) > self.max_entries:
                # The backend would keep no more of them: the oldest go.
                del self._entries[0]
                self._dropped += 1
        if first:
            self.on_entries()

    # Writing (in the periodic thread) -------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether entries wait for a flush."""
        return bool(self._entries)

    def flush(self) -> None:
        """Add the entries so far to the backend, in one round trip per lock prefix; if the
        backend fails, they are kept for the next flush (for as long as they would be kept there)."""
        with self._mutex:
            entries, self._entries = self._entries, []
            # Copies: a reschedule that follows its conflict changes the entry in place.
            by_prefix: dict[str, list[dict[str, str]]] = {}
            for prefix, fields in entries:
                by_prefix.setdefault(prefix, []).append(dict(fields))
        if not entries:
            return
        self._name_holders(by_prefix)
        failed: list[tuple[str, dict[str, str]]] = []
        error: LockBackendError | None = None
        for prefix, written in by_prefix.items():
            try:
                self.backend.add_history(
                    history_key(prefix), written, max_entries=self.max_entries, retention=self.retention
                )
            except LockBackendError as e:
                error = e
                failed += [(p, fields) for p, fields in entries if p == prefix]
        self.last_error = error
        if error is None:
            self._failing = False
            return
        oldest = self._now() - self.retention
        with self._mutex:
            kept = [(p, fields) for p, fields in failed if int(fields["at"]) >= oldest]
            self._entries[:0] = kept[-self.max_entries :]
        if not self._failing:
            self.logger.info("The conflict trail could not be saved; its entries are tried again later: %s", error)
        self._failing = True

    def _name_holders(self, by_prefix: dict[str, list[dict[str, str]]]) -> None:
        """Fill in the first holder's state, and the worker running it, as the locks of the
        entries' digests are now, for the latest :data:`HOLDER_LOOKUPS` digests: in one round trip
        on one Redis, one per digest on Redis Cluster. A holder gone since is left as the process
        knew it."""
        digests: dict[tuple[str, str], list[dict[str, str]]] = {}
        for prefix, written in by_prefix.items():
            for fields in reversed(written):
                if "holders" in fields and "digest" in fields and "holder_worker" not in fields:
                    digests.setdefault((prefix, fields["digest"]), []).append(fields)
        looked_up = list(digests)[:HOLDER_LOOKUPS]
        if not looked_up:
            return
        keys = [key for prefix, digest in looked_up for key in (enqueue_key(prefix, digest), run_key(prefix, digest))]
        try:
            records = self.backend.read_many(keys)
        except LockBackendError:
            return  # the write that follows says so
        found: dict[tuple[str | None, str, str], tuple[str, str | None]] = {}
        for record in sorted(records, key=lambda record: record.kind == RUN):  # a run lock's place says most
            holder = record.holder
            if not record.unreadable and holder.get("message_id"):
                key = (prefix_of(record.key), digest_of(record.key) or "", str(holder["message_id"]))
                found[key] = (str(holder.get("state") or ""), holder.get("worker_id"))
        for prefix, digest in looked_up:
            for fields in digests[(prefix, digest)]:
                state, worker = found.get((prefix, digest, fields["holders"].split(",")[0]), ("", None))
                if fields.get("outcome") not in (REPLACED_OUTCOME, DISPLACED):
                    _put(fields, "holder_state", state)
                _put(fields, "holder_worker", worker)

    def give_up(self, why: str) -> None:
        """Say at WARNING how many entries a closed process leaves unwritten, if any, and ``why``."""
        with self._mutex:
            left, self._entries = len(self._entries), []
        if left:
            self.logger.warning(
                "The last %d entries of the conflict trail of this process were not written: %s. "
                "They are missing from the trail; no lock is affected.",
                left,
                why,
            )

    def reset_after_fork(self) -> None:
        """In a forked child: the parent writes what it recorded, and the parent's mutex may
        have been held by one of its threads at the fork."""
        self._mutex = threading.Lock()
        self._entries = []
        self._thread = _Thread()

    def _now(self) -> int:
        now = self.clock()
        return time.time_ns() // 1_000_000 if now is None else now


def _put(fields: dict[str, str], name: str, value: object) -> None:
    if value is not None and value != "":
        fields[name] = str(value)


def conflict_of_entry(prefix: str, fields: dict[str, str]) -> ConflictInfo:
    """The entry of the trail of ``prefix`` whose ``fields`` the backend returned."""

    def integer(name: str) -> int | None:
        try:
            return int(fields[name])
        except (KeyError, ValueError):
            return None

    return ConflictInfo(
        at=integer("at") or 0,
        prefix=prefix,
        actor=fields.get("actor", ""),
        queue=fields.get("queue", ""),
        message_id=fields.get("message_id", ""),
        call=fields.get("call"),
        digest=fields.get("digest"),
        lock=fields.get("lock"),
        lock_kind=fields.get("lock_kind"),
        side=fields.get("side"),
        strategy=fields.get("strategy"),
        outcome=fields.get("outcome", ""),
        holders=tuple(h for h in fields.get("holders", "").split(",") if h),
        holder_state=fields.get("holder_state"),
        holder_worker=fields.get("holder_worker"),
        worker=fields.get("worker", ""),
        reason=fields.get("reason"),
        delay=integer("delay"),
        cancelled_by=fields.get("cancelled_by"),
    )


def read_history(
    backend: LockBackend,
    prefixes: Iterable[str],
    *,
    actor: str | None = None,
    digest: str | None = None,
    since: int | None = None,
    within: int | None = None,
    limit: int,
    matches: Callable[[ConflictInfo], bool] | None = None,
) -> tuple[ConflictInfo, ...]:
    """The entries of the trails of ``prefixes``, newest first: one round trip per prefix.

    Parameters:
      matches(collections.abc.Callable): Only the entries it says match, checked after the
        backend's read (which then looks through all the entries of ``actor``).

    Returns:
      tuple[ConflictInfo]: At most ``limit`` entries.
    """
    found = []
    for prefix in prefixes:
        _, entries = backend.read_history(
            history_key(prefix),
            since=since,
            actor=actor,
            digest=digest,
            within=within,
            limit=limit if matches is None else LONGEST_HISTORY,
        )
        for _, fields in entries:
            entry = conflict_of_entry(prefix, fields)
            if matches is None or matches(entry):
                found.append(entry)
    found.sort(key=lambda entry: entry.at, reverse=True)
    return tuple(found[:limit])


#: How many entries :meth:`~dramatiq_unique.Locks.history` returns at most, by default.
DEFAULT_HISTORY_READ = 100
#: How far back :meth:`~dramatiq_unique.Locks.explain` reads the trail of its digest, in ms: an hour.
EXPLAINED_HISTORY = 3_600_000


def history_of(
    backend: LockBackend,
    prefixes: tuple[str, ...],
    *,
    actor: str | Actor[Any, Any] | None,
    args: Iterable[Any] | None,
    kwargs: dict[str, Any] | None,
    digest: str | None,
    since: int | None,
    within: int | None,
    limit: int,
    lock_config: Callable[[Actor[Any, Any]], LockConfig | None],
) -> tuple[ConflictInfo, ...]:
    """:meth:`~dramatiq_unique.Locks.history`: its options checked, and the digest of ``args`` computed
    with the lock options ``lock_config`` gives an actor.

    Raises:
      ValueError: If an option is not valid.
      LockArgumentsError: If the lock arguments cannot be computed.
    """
    for option, value, minimum in (("limit", limit, 1), ("since_ms", since, 0), ("within_ms", within, 0)):
        if (value is not None or option == "limit") and (
            isinstance(value, bool) or not isinstance(value, int) or value < minimum
        ):
            raise ValueError(f"Locks.history() has an invalid {option}={value!r}: it must be an integer >= {minimum}.")
    if digest is not None and (not isinstance(digest, str) or len(digest) != DIGEST_LENGTH):
        raise ValueError(f"Locks.history() has an invalid digest={digest!r}: a digest has {DIGEST_LENGTH} characters.")
    name: str | None = actor if actor is None or isinstance(actor, str) else actor.actor_name
    if args is None and kwargs is None:
        return read_history(backend, prefixes, actor=name, digest=digest, since=since, within=within, limit=limit)
    if actor is None or name is None:
        raise ValueError("Locks.history() was given arguments without an actor: their digest depends on it.")
    positional, keywords = list(args or ()), dict(kwargs or {})
    if isinstance(actor, str):
        # By name: the digests of the arguments under each queue of its entries, and either
        # setting of unique_across_queues and unique_across_actors.
        lock_args = [positional, keywords]
        digests: dict[str, frozenset[str]] = {}

        def matches(entry: ConflictInfo) -> bool:
            if entry.queue not in digests:
                digests[entry.queue] = frozenset(
                    compute_digest(
                        actor_name=entry.actor,
                        queue_name=entry.queue,
                        lock_args=lock_args,
                        unique_across_actors=across_actors,
                        unique_across_queues=across_queues,
                    )
                    for across_actors in (False, True)
                    for across_queues in (False, True)
                )
            return entry.digest in digests[entry.queue]

        return read_history(
            backend, prefixes, actor=name, digest=digest, since=since, within=within, limit=limit, matches=matches
        )
    config = lock_config(actor)
    if config is None:
        return ()
    computed = compute_digest(
        actor_name=name,
        queue_name=q_name(actor.queue_name),
        lock_args=lock_arguments(name, config.lock_args_method, tuple(positional), keywords),
        unique_across_actors=config.unique_across_actors,
        unique_across_queues=config.unique_across_queues,
    )
    if digest is not None and digest != computed:
        return ()
    return read_history(
        backend, (config.lock_prefix,), actor=name, digest=computed, since=since, within=within, limit=limit
    )
