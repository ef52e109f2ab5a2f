"""Lock activity per minute, kept in the lock backend for some hours.

Each process counts the lock events of its messages in memory, per minute,
actor and kind of event; the periodic thread of the process (see
:class:`~dramatiq_unique.runtime.Runtime`) adds them to the backend once per
heartbeat interval, in one round trip, and never on a message's path: in a
worker process from its boot to its shutdown, in a process that only sends
while it has counts, and once more at exit.

Each minute is one hash ``<prefix>:activity:{activity}:<minute>`` whose
fields are ``<actor>|<event kind>``, kept for :data:`ACTIVITY_RETENTION`.
Every such key shares one hash tag, so one call writes them all on Redis
Cluster too. :func:`read_activity` reads them back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .backends import LockBackend
from .errors import LockBackendError
from .events import EVENT_KINDS
from .keys import activity_key
from .options import DEFAULT_LOCK_PREFIX

if TYPE_CHECKING:
    from .history import ConflictRecorder

#: How long the counts of a minute are kept, in milliseconds: 6 hours.
ACTIVITY_RETENTION = 6 * 60 * 60 * 1000
#: A minute, in milliseconds.
MINUTE = 60_000


def _nothing() -> None:
    pass


class ActivityCounter:
    """A subscriber to every lock event that counts them per minute and
    actor in memory; :meth:`flush` adds the counts to the backend.

    Parameters:
      backend(LockBackend): Where the counts are kept.
      prefix(str): The lock prefix of their keys.
      clock(collections.abc.Callable): Now, in ms of the backend's clock, as estimated by the
        heartbeat; ``None`` until it knows, when this machine's clock is used.
      logger(logging.Logger): Where failed flushes are reported.
      on_counts(collections.abc.Callable): Called when a count is made while none
        waits: there is something to flush again.
      on_close(collections.abc.Callable): Called by :meth:`close` to write what is left;
        ``None`` for a flush in the thread that closes.
      retention(int): Milliseconds the counts of a minute are kept.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        clock: Callable[[], int | None],
        logger: logging.Logger,
        on_counts: Callable[[], None] = _nothing,
        on_close: Callable[[], None] | None = None,
        retention: int = ACTIVITY_RETENTION,
    ):
        self.backend = backend
        self.prefix = prefix
        self.clock = clock
        self.logger = logger
        self.on_counts = on_counts
        self.on_close = on_close or self.flush
        self.retention = retention
        self._mutex = threading.Lock()
        #: (minute, actor, kind) -> count, not flushed yet.
        self._counts: dict[tuple[int, str, str], int] = {}
        #: The counts of the flushes waiting for the backend's answer.
        self._sending: list[dict[tuple[int, str, str], int]] = []
        self._closed = False
        self._failing = False
        #: Why the last flush failed; ``None`` when it succeeded.
        self.last_error: LockBackendError | None = None
        #: What else the periodic thread writes with the counts, in one round trip of its own:
        #: the conflict trail (a :class:`~dramatiq_unique.history.ConflictRecorder`).
        self.also: list[ConflictRecorder] = []

    def __call__(self, actor_name: str, kind: str) -> None:
        """Count one event of ``kind`` about ``actor_name`` (an :meth:`Events.add_counter` counter)."""
        # _now() spelt out: this runs for every lock event.
        now = self.clock()
        if now is None:
            now = time.time_ns() // 1_000_000
        key = (now // MINUTE, actor_name, kind)
        with self._mutex:
            first = not self._counts
            self._counts[key] = self._counts.get(key, 0) + 1
        if first:
            self.on_counts()

    @property
    def pending(self) -> bool:
        """Whether counts, or entries of what is written with them, wait for a flush."""
        return bool(self._counts) or any(writer.pending for writer in self.also)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: a process that only sends flushes no more."""
        return self._closed

    def flush(self) -> None:
        """Add the counts so far to the backend in one round trip; if the
        backend fails, they are kept for the next flush (for as long as
        they would be kept in the backend). Then write what is written with them."""
        self._flush_counts()
        for writer in self.also:
            writer.flush()

    @property
    def failure(self) -> LockBackendError | None:
        """Why the last flush of the counts, or of what is written with them, failed; ``None`` if none did."""
        return self.last_error or next((w.last_error for w in self.also if w.last_error is not None), None)

    def _flush_counts(self) -> None:
        with self._mutex:
            counts, self._counts = self._counts, {}
            if not counts:
                return
            self._sending.append(counts)
        by_key: dict[str, dict[str, int]] = {}
        for (minute, actor, kind), count in counts.items():
            by_key.setdefault(activity_key(self.prefix, minute), {})[f"{actor}|{kind}"] = count
        try:
            self.backend.add_counts(by_key, ttl=self.retention)
        except LockBackendError as e:
            oldest = (self._now() - self.retention) // MINUTE
            with self._mutex:
                self._sending.remove(counts)
                for key, count in counts.items():
                    if key[0] >= oldest:
                        self._counts[key] = self._counts.get(key, 0) + count
            self.last_error = e
            # The outage itself is reported where locks meet it; these counts only wait (a closed
            # counter's are reported as it closes).
            if not self._failing and not self._closed:
                self.logger.info("The lock activity counts could not be saved; they are tried again later: %s", e)
            self._failing = True
            return
        with self._mutex:
            self._sending.remove(counts)
        self._failing = False
        self.last_error = None

    def close(self) -> None:
        """Write what is left, and flush no more from a process that only sends:
        later events are only flushed by a worker's periodic thread."""
        self._closed = True
        self.on_close()

    def unwritten(self) -> dict[str, int]:
        """The events counted and not written to the backend yet, waiting or being
        written, per actor."""
        per_actor: dict[str, int] = {}
        with self._mutex:
            for counts in (self._counts, *self._sending):
                for (_, actor, _), count in counts.items():
                    per_actor[actor] = per_actor.get(actor, 0) + count
        return per_actor

    def give_up(self, why: str) -> None:
        """Say at WARNING which counts a closed counter leaves unwritten, if any, and ``why``,
        and forget those that wait: a later close does not report them again."""
        for writer in self.also:
            writer.give_up(why)
        per_actor = self.unwritten()
        with self._mutex:
            self._counts = {}
        if not per_actor:
            return
        self.logger.warning(
            "The last lock activity counts of this process were not written (lock events of actors %s: %d): %s. "
            "They are missing from the lock activity; no lock is affected.",
            ", ".join(repr(actor) for actor in sorted(per_actor)),
            sum(per_actor.values()),
            why,
        )

    def reset_after_fork(self) -> None:
        """In a forked child: the parent flushes what it counted, and the parent's
        mutex may have been held by one of its threads at the fork."""
        self._mutex = threading.Lock()
        self._counts = {}
        self._sending = []
        for writer in self.also:
            writer.reset_after_fork()

    def _now(self) -> int:
        now = self.clock()
        return time.time_ns() // 1_000_000 if now is None else now


@dataclass(frozen=True)
class MinuteActivity:
    """The lock events of one actor in one minute.

    Parameters:
      minute(int): The start of the minute, in ms since the epoch (the backend's clock).
      actor_name(str): The actor; ``""`` for events outside any message (a failed heartbeat).
      counts(Mapping[str, int]): How many events of each kind (see
        :data:`~dramatiq_unique.EVENT_KINDS`); kinds without events are left out.
    """

    minute: int
    actor_name: str
    counts: Mapping[str, int]


@dataclass(frozen=True)
class ActivityReport:
    """The lock activity of the last minutes, as :func:`read_activity` found it.

    Parameters:
      now(int): When it was read, in ms of the backend's clock.
      minutes(int): How many minutes it covers, the current one included.
      rows(tuple[MinuteActivity]): One per minute and actor with events,
        oldest minute first, then by actor.
    """

    now: int
    minutes: int
    rows: tuple[MinuteActivity, ...]

    def __iter__(self) -> Iterator[MinuteActivity]:
        return iter(self.rows)

    def totals(self) -> dict[str, dict[str, int]]:
        """Per actor, the number of events of each kind over all the minutes."""
        totals: dict[str, dict[str, int]] = {}
        for row in self.rows:
            actor = totals.setdefault(row.actor_name, {})
            for kind, count in row.counts.items():
                actor[kind] = actor.get(kind, 0) + count
        return totals

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON values: times in ms since the epoch."""
        return {
            "now": self.now,
            "minutes": self.minutes,
            "rows": [{"minute": r.minute, "actor_name": r.actor_name, "counts": dict(r.counts)} for r in self.rows],
            "totals": self.totals(),
        }


def read_activity(backend: LockBackend, *, prefix: str = DEFAULT_LOCK_PREFIX, minutes: int = 60) -> ActivityReport:
    """The lock events counted by every process using ``backend`` under the
    middleware's lock ``prefix`` in the last ``minutes`` minutes, the current
    one included, per minute and actor. In two round trips.

    Counts reach the backend once per heartbeat interval, so the latest
    seconds may be missing.

    Parameters:
      backend(LockBackend): Where the counts are kept.
      prefix(str): The middleware's ``lock_prefix``.
      minutes(int): How many minutes, at most as many as are kept (360).

    Raises:
      ValueError: If ``minutes`` is not an integer in that range.
      LockBackendError: If the backend cannot be reached.
    """
    kept = ACTIVITY_RETENTION // MINUTE
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= kept:
        raise ValueError(
            f"read_activity() has an invalid minutes={minutes!r}: it must be an integer from 1 to {kept}, "
            "as the counts of each minute are kept for 6 hours."
        )
    now = backend.time()
    last = now // MINUTE
    covered = list(range(last - minutes + 1, last + 1))
    contents = backend.read_counts([activity_key(prefix, minute) for minute in covered])
    rows: list[MinuteActivity] = []
    for minute, fields in zip(covered, contents, strict=True):
        by_actor: dict[str, dict[str, int]] = {}
        for name, count in fields.items():
            actor, _, kind = name.rpartition("|")
            if kind in EVENT_KINDS and count:
                by_actor.setdefault(actor, {})[kind] = count
        rows.extend(MinuteActivity(minute * MINUTE, actor, counts) for actor, counts in sorted(by_actor.items()))
    return ActivityReport(now=now, minutes=minutes, rows=tuple(rows))
