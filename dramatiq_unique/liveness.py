"""Worker liveness: this process's heartbeat, the leases of the run
locks its messages hold, and the releases that failed and are tried again.

In a worker process, the periodic thread of the :class:`~dramatiq_unique.runtime.Runtime`
does all three once per heartbeat interval (:meth:`Liveness.tick`):

* it records the process in the worker registry, a sorted set
  ``<prefix>:workers`` of worker id -> the time until which it counts as
  alive (its heartbeat plus its lease period, by the server clock), which
  the orphan reaper reads to tell live workers from dead ones: in the
  registry of every lock prefix its actors use, so that a run lock's worker
  is known under the prefix of the lock;
* it renews each run lock whose lease has less than two heartbeat intervals
  left, so a message running for a long time costs about one renewal per
  lease period, and a dead process's run locks lapse within one
  lease period; the leases due are renewed together, in one round trip
  (one per master of a Redis Cluster: :meth:`~dramatiq_unique.LockBackend.renew_many`);
* it gives up the locks whose release failed while the backend was down;
* it asks which of the messages this process parked in a run lock's line still wait there, so
  that a loss of the store's data can say how many it took (:meth:`Liveness.park`).

What it looks after is plain data: keys, owners, expiry times, the
subject of the events it tells, and how to interrupt each message.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from .backends import Holder, Lease, LockBackend, MessagesInHand, StopRequested
from .cancellation import Interrupter, interrupter
from .errors import LockBackendError
from .events import BACKEND_ERROR, DATA_LOST, LEASE_LOST, Events, EventSubject, LockEvent
from .keys import RUN, registry_key

_worker_id: tuple[int, str] | None = None

#: The most messages parked in a line that one process remembers; past that, a loss is told as "at least".
PARKED_LIMIT = 10_000
#: The most message ids a loss of waiting messages names.
PARKED_SHOWN = 5


def worker_id() -> str:
    """This process, as recorded in the run locks it holds and in the worker
    registry: host, pid and a random part, so that a new process that reuses
    a pid is another worker (and a forked child gets its own id)."""
    global _worker_id
    pid = os.getpid()
    if _worker_id is None or _worker_id[0] != pid:
        _worker_id = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
    return _worker_id[1]


def _call(function: Callable[[], None]) -> None:
    function()


@dataclass
class _Lease:
    expires_at: int
    deadline: int | None
    subject: EventSubject
    #: How to interrupt the message when its holder is asked to stop; made by the thread that runs
    #: it. ``None`` for a message that is not interrupted: it runs to its end.
    interrupt: Interrupter | None
    #: How to take the place again after the store lost its data: its lock's limit and its holder.
    limit: int = 1
    holder: Holder | None = None
    #: Renewed at every heartbeat, so that a request to stop reaches it within one interval.
    eager: bool = False
    #: Whether its message began to give it up: it must not be interrupted any more.
    dropped: bool = False

    def held(self) -> bool:
        return not self.dropped


class Liveness:
    """The heartbeat of one process and what it looks after.

    Parameters:
      backend(LockBackend): Where the registries and the locks are.
      prefix(str): The lock prefix of the first registry (the middleware's);
        :meth:`add_prefix` adds others.
      lease_period(int): Milliseconds a run lock is held without a renewal.
      heartbeat_interval(int): Milliseconds between two heartbeats.
      logger(logging.Logger): Where to report.
      events(Events): Where lost leases and backend errors are told.
      running(collections.abc.Callable): Whether a worker's periodic thread runs in
        this process, calling :meth:`tick`: only then is a failed release kept to be
        tried again.
      in_hand(collections.abc.Callable): What each heartbeat publishes of the messages in
        this process's hands, or ``None`` for nothing; given a time of the backend's clock
        that is not yet past.
      on_stop_requested(collections.abc.Callable): Called, by the heartbeat thread, with how to
        interrupt a message (made by the thread that runs it), what its lock is about, what
        says whether it still holds its lease, and who asked, when a renewal answers that its
        holder was asked to stop; while the message still holds its lease.
      on_cut_off(collections.abc.Callable): Called with ``True`` when no heartbeat has been
        answered for a whole lease period, or since the process registered, and with ``False``
        when one is answered again; and with the milliseconds since the last heartbeat that was
        answered (``None``: none since it registered).
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        lease_period: int,
        heartbeat_interval: int,
        logger: logging.Logger,
        events: Events,
        running: Callable[[], bool],
        in_hand: Callable[[int], MessagesInHand | None] = lambda taken_at: None,
        on_cut_off: Callable[[bool, int | None], None] = lambda cut_off, since: None,
        on_stop_requested: Callable[[Interrupter, EventSubject, Callable[[], bool], str], None] | None = None,
    ):
        self.backend = backend
        self.events = events
        self.prefix = prefix
        self.registry_key = registry_key(prefix)
        #: The other lock prefixes this process's actors use, and their registries.
        self._other_prefixes: tuple[str, ...] = ()
        self._other_registries: tuple[str, ...] = ()
        self.lease_period = lease_period
        self.heartbeat_interval = heartbeat_interval
        self.logger = logger
        self._running = running
        self._in_hand = in_hand
        self._on_cut_off = on_cut_off
        self._on_stop_requested = on_stop_requested
        self._mutex = threading.Lock()
        self._leases: dict[tuple[str, str], _Lease] = {}
        #: The places whose release failed, tried again each round, with when each frees itself.
        self._pending: dict[tuple[str, str], int | None] = {}
        #: The backend's clock at the last heartbeat (ms), and our monotonic clock (s) when it
        #: was sent and when it was answered: the server read its clock in between.
        self._synced: tuple[int, float, float] | None = None
        #: Heartbeats that failed in a row.
        self._failed_heartbeats = 0
        #: When a heartbeat was last answered (our monotonic clock, s); ``None`` before the first.
        self._answered_at: float | None = None
        #: Whether no heartbeat has been answered for a whole lease period: the run locks of this
        #: process have lapsed, and what it publishes of its messages is out of date.
        self.cut_off = False
        #: The marks of the store's data as last read (see LockBackend.epochs), and when (monotonic, s).
        self._epochs: dict[str, str] = {}
        self._epochs_read: float | None = None
        #: Whether the last round found that the store lost its data.
        self.found_data_loss = False
        #: Whether the store refused new places when this worker registered.
        self._refused_at_boot = False
        #: How the events of the periodic thread reach their subscribers: called at once, unless the
        #: runtime hands them to the thread of the Worker (a gevent hub), where the subscribers'
        #: own connections work.
        self.tell: Callable[[Callable[[], None]], None] = _call
        #: The messages this process parked in a run lock's line and last saw waiting there:
        #: message_id -> (lock key, actor name); whether more were parked than it keeps since the
        #: last loss; and when they were last all seen waiting (our monotonic clock, s).
        self._parked: dict[str, tuple[str, str]] = {}
        self._parked_overflow = False
        self._parked_seen_at = 0.0
        #: When the last round of the periodic thread started, and when it last went through
        #: the leases due (our monotonic clock, s).
        self._last_round: float | None = None
        self._renewed_at: float | None = None

    @property
    def worker_id(self) -> str:
        return worker_id()

    @property
    def running(self) -> bool:
        """Whether a worker's periodic thread runs in this process."""
        return self._running()

    @property
    def registry_keys(self) -> tuple[str, ...]:
        """Every registry this process heartbeats into."""
        return (self.registry_key, *self._other_registries)

    def add_prefix(self, prefix: str) -> None:
        """Heartbeat into the registry of ``prefix`` too, and keep the mark of the store's data
        under it: the lock prefix of an actor, whose senders look for that mark."""
        key = registry_key(prefix)
        with self._mutex:
            if key != self.registry_key and key not in self._other_registries:
                self._other_registries += (key,)
                self._other_prefixes += (prefix,)

    def backend_time(self) -> int | None:
        """Now on the backend's clock, in milliseconds, estimated from the last
        heartbeat's answer; ``None`` before one was answered. Times the backend
        recorded are compared with this, never with this machine's clock."""
        if self._synced is None:
            return None
        now, sent, answered = self._synced
        # About halfway through the round trip. Our monotonic clock, unlike our wall clock, does not step.
        return now + int((time.monotonic() - (sent + answered) / 2) * 1000)

    # A worker's arrival and departure --------------------------------------------

    def register(self) -> None:
        """The first heartbeat of a worker process, before it takes any message,
        and the departure from the registries of processes that died long ago."""
        # The periodic thread's first round is measured from here: it may already be late.
        self._last_round = self._renewed_at = time.monotonic()
        self._answered_at = None
        now = self._beat()
        if now is None:
            return
        # The marks this worker compares with from now on: what happened to the store while no
        # Worker of this process ran (a test's flush between two Workers) is no loss it can tell.
        self._epochs, self._epochs_read = {}, None
        self._data_lost()
        self._refused_at_boot = self._refusing()
        for key in self.registry_keys:
            try:  # processes killed long ago leave the registry, reaper or not
                self.backend.forget_workers(key, before=now - 10 * self.lease_period)
            except LockBackendError:
                pass

    def leave(self) -> None:
        """When the last Worker of the process stopped: try the failed releases
        once more, report those still failing, and leave the registries."""
        self._retry_releases()
        for (key, owner), until in self._pending.items():
            self.logger.error(
                "The lock %r of %r could not be released before this worker stopped; %s",
                key,
                owner,
                f"its lease, no longer renewed, frees it within lease_period ({self.lease_period} ms)."
                if until is not None
                else "the orphan reaper or its lock_ttl will free it.",
            )
        for key in self.registry_keys:
            try:
                self.backend.forget_workers(key, worker_id=self.worker_id)
            except LockBackendError:
                self.logger.warning(
                    "Worker %r could not leave the worker registry %r.", self.worker_id, key, exc_info=True
                )

    def reset_after_fork(self) -> None:
        """In a forked child: no lease and no failed release of the parent is
        looked after here, and the parent's mutex may have been held at the fork."""
        self._mutex = threading.Lock()
        self._leases = {}
        self._pending = {}
        self._failed_heartbeats = 0
        self._answered_at = None
        self.cut_off = False
        self._last_round = None
        self._renewed_at = None
        self._epochs, self._epochs_read = {}, None
        self._refused_at_boot = False
        self._parked, self._parked_overflow = {}, False
        self.tell = _call

    # What the periodic thread looks after -----------------------------------------

    def hold(
        self,
        key: str,
        owner: str,
        *,
        expires_at: int | None,
        deadline: int | None,
        subject: EventSubject,
        limit: int = 1,
        holder: Holder | None = None,
        eager: bool = False,
        interruptible: bool = True,
    ) -> None:
        """Renew this run lock until :meth:`drop`; a place that never lapses needs nothing.
        Called by the thread that runs the message.

        Parameters:
          subject(EventSubject): What to tell of a lost lease, or of a renewal that failed.
          limit(int): The lock's limit, and
          holder(Holder): its holder's record: to take the place again when the store
            lost its data while the message runs; ``None`` never does.
          eager(bool): Renew it at every heartbeat, not only when it is due, so that a request
            to stop reaches it within one heartbeat interval (``cancel_in_progress``).
          interruptible(bool): Whether a request to stop interrupts the message: only where
            :meth:`settle` is told when its actor returns.
        """
        if expires_at and (deadline is None or expires_at < deadline):
            lease = _Lease(
                expires_at=expires_at,
                deadline=deadline,
                subject=subject,
                interrupt=interrupter() if interruptible else None,
                limit=limit,
                holder=holder,
                eager=eager,
            )
            with self._mutex:
                self._leases[(key, owner)] = lease

    def settle(self, key: str, owner: str) -> None:
        """The message of ``owner``'s lease at ``key`` returned from its actor: it is not
        interrupted from now on. An interruption the heartbeat thread asked for before is
        delivered while this waits for the mutex, in the thread that calls it."""
        if self._settled(key, owner):
            with self._mutex:  # the heartbeat checks and interrupts under it
                pass

    def _settled(self, key: str, owner: str) -> bool:
        """Mark the lease as not to be interrupted; whether this process renews it. Before the
        mutex, which may be gevent's: a greenlet that waits for it lets the hub run, and the hub
        must not interrupt a message that is giving its lease up."""
        held = self._leases.get((key, owner))
        if held is not None:
            held.dropped = True
        return held is not None

    def drop(self, key: str, owner: str) -> int | None:
        """Stop renewing this run lock: its message finished. Tells of a lease that ran out
        meanwhile, unrenewed.

        Returns:
          int: When its lease ends, in ms of the backend's clock; ``None`` for a place not renewed here.
        """
        self._settled(key, owner)
        with self._mutex:
            lease = self._leases.pop((key, owner), None)
        if lease is None:
            return None
        now = self.backend_time()
        if now is None or lease.expires_at > now:
            return lease.expires_at
        # A round may have started since, and wait for the backend: what counts is when the
        # leases were last all gone through.
        stalled = self._stalled_since(self._renewed_at)
        if stalled is not None:
            self._report_stalled([key], stalled)
        else:
            self._report_lapsed(key)
        self.events.notify_about(lease.subject, LEASE_LOST, lock_kind=RUN)
        return lease.expires_at

    def retry_release(self, key: str, owner: str, *, until: int | None = None) -> None:
        """Give up ``owner``'s place at ``key`` later, if a worker runs in this
        process: its release just failed. The caller says so.

        Parameters:
          until(int): When the place frees itself, in ms of the backend's clock (the end of a run
            lock's lease): it is not tried again after that. ``None``: until it is given up.
        """
        if self.running:
            with self._mutex:
                self._pending[(key, owner)] = until

    def park(self, key: str, message_id: str, actor_name: str) -> None:
        """Remember that ``message_id`` of ``actor_name`` waits in the line of the run lock at
        ``key``, parked there by this process: it lives only in the lock store from now on."""
        with self._mutex:
            if not self._parked:
                self._parked_seen_at = time.monotonic()
            if message_id in self._parked or len(self._parked) < PARKED_LIMIT:
                self._parked[message_id] = (key, actor_name)
            else:
                self._parked_overflow = True

    def unpark(self, message_id: str) -> None:
        """``message_id`` starts in this process: it no longer waits."""
        if self._parked:  # a process that parked nothing looks at nothing
            with self._mutex:
                self._parked.pop(message_id, None)

    def tick(self) -> int | None:
        """Heartbeat, renewals, failed releases: the liveness part of one round of
        the periodic thread.

        Returns:
          int: The backend's time at the heartbeat; ``None`` when it failed, and
          nothing else was tried.
        """
        stalled = self._stalled_since(self._last_round)
        self._last_round = time.monotonic()
        now = self._beat()
        if now is None:
            return None
        self.found_data_loss = self._data_lost() or self._refused_at_boot
        self._refused_at_boot = False
        if not self.found_data_loss:
            self._look_at_parked()
        self._renew_due(stalled, data_lost=self.found_data_loss)
        self._retry_releases()
        return now

    def _stalled_since(self, at: float | None) -> int | None:
        """Milliseconds since ``at`` (our monotonic clock), when that is longer than the lease
        period: the periodic thread did not run on time, and a lease due meanwhile lapsed."""
        if at is None:
            return None
        since = int((time.monotonic() - at) * 1000)
        return since if since > self.lease_period else None

    def _beat(self) -> int | None:
        # The backend's clock had passed this before what the heartbeat publishes was counted:
        # the server read its clock at the latest when the last heartbeat was answered.
        last = self._synced
        taken_at = 0 if last is None else last[0] + int((time.monotonic() - last[2]) * 1000)
        in_hand = self._in_hand(taken_at)
        sent = time.monotonic()
        try:
            if in_hand is None:  # a LockBackend of your own, written before in_hand, may not take it
                now = self.backend.heartbeat(self.registry_key, self.worker_id, ttl=self.lease_period)
            else:
                now = self.backend.heartbeat(self.registry_key, self.worker_id, ttl=self.lease_period, in_hand=in_hand)
        except LockBackendError as e:
            self._heartbeat_failed(e)
            self._backend_failed("heartbeat", e)
            return None
        self._synced = (now, sent, time.monotonic())
        # A run lock's worker must count as alive under the lock's prefix.
        # Leases are renewed only after every registry heard of it: a worker never holds a
        # renewed run lock while some registry has given it up for dead.
        for key in self._other_registries:
            try:
                self.backend.heartbeat(key, self.worker_id, ttl=self.lease_period)
            except LockBackendError as e:
                self._heartbeat_failed(e)
                self._backend_failed("heartbeat", e)
                return None
        self._heartbeat_answered()
        return now

    def _heartbeat_failed(self, error: LockBackendError) -> None:
        # One line per outage, not one per heartbeat interval.
        self._failed_heartbeats += 1
        level = logging.WARNING if self._failed_heartbeats == 1 else logging.DEBUG
        self.logger.log(
            level,
            "Worker %r could not send its heartbeat: %s. It tries again every %d ms and renews no lease until then.",
            self.worker_id,
            error,
            self.heartbeat_interval,
        )
        # A worker that boots without its store takes no message it cannot lock either.
        answered_at = self._answered_at
        since = None if answered_at is None else int((time.monotonic() - answered_at) * 1000)
        if not self.cut_off and (since is None or since >= self.lease_period):
            self.cut_off = True
            self._on_cut_off(True, since)

    def _heartbeat_answered(self) -> None:
        answered_at, self._answered_at = self._answered_at, time.monotonic()
        if self._failed_heartbeats:
            self.logger.info(
                "Worker %r sends its heartbeat again, after %d that failed.", self.worker_id, self._failed_heartbeats
            )
            self._failed_heartbeats = 0
        if self.cut_off:
            self.cut_off = False
            self._on_cut_off(False, None if answered_at is None else int((self._answered_at - answered_at) * 1000))

    def _refusing(self) -> bool:
        """Whether the store refuses new places as this worker boots: a process found that it lost
        its data while no worker ran, or a worker heals it. This worker takes part in the healing."""
        try:
            refusing = self.backend.refusing(self.prefix)
        except LockBackendError:
            return False  # the heartbeats tell of the outage
        if refusing:
            self.logger.warning(
                "Worker %r boots while the lock store refuses new locks after a loss of its data: it takes part in "
                "healing the store.",
                self.worker_id,
            )
        return refusing

    def _data_lost(self) -> bool:
        """Whether the store lost its data since the marks were last read: say so if it did."""
        try:
            epochs: dict[str, str] = {}
            for prefix in (self.prefix, *self._other_prefixes):
                epochs.update(self.backend.epochs(prefix))
        except LockBackendError as e:
            self._backend_failed("data check", e)
            return False
        read_at, previous_read = time.monotonic(), self._epochs_read
        changed = sorted(key for key, mark in epochs.items() if self._epochs.get(key, mark) != mark)
        self._epochs, self._epochs_read = epochs, read_at
        if not changed or previous_read is None:
            return False
        self.logger.error(
            "The lock store lost its data: %s changed between two heartbeats of worker %r, at most %d ms apart. "
            "It restarted without persistence, was flushed, or failed over to a replica that did not have the data. "
            "Every lock held until then is gone: new locks are refused until the workers have taken again those of "
            "the messages they know of. Give the lock store persistence (appendonly yes) and "
            "maxmemory-policy noeviction (see Deploying the lock store in the docs).",
            ", ".join(f"the mark {key!r}" for key in changed),
            self.worker_id,
            int((read_at - previous_read) * 1000),
        )
        waiting_lost = self._report_parked_lost()
        reason = ", ".join(changed)
        self.tell(
            partial(
                self.events.notify,
                DATA_LOST,
                "",
                partial(
                    LockEvent, kind=DATA_LOST, actor_name="", queue_name="", reason=reason, waiting_lost=waiting_lost
                ),
            )
        )
        return True

    def _look_at_parked(self) -> None:
        """Forget the parked messages that no longer wait in their line: handed a place, let go,
        or displaced. One round trip, only while this process has parked messages."""
        with self._mutex:
            parked = list(self._parked.items())
        if not parked:
            return
        asked_at = time.monotonic()
        try:
            waits = self.backend.still_waiting([(key, message_id) for message_id, (key, _) in parked])
        except LockBackendError as e:
            self._backend_failed("line check", e)
            return
        with self._mutex:
            for (message_id, place), still in zip(parked, waits, strict=True):
                # Unless it was parked again meanwhile (a retry that met the lock again).
                if not still and self._parked.get(message_id) is place:
                    del self._parked[message_id]
            self._parked_seen_at = asked_at

    def _report_parked_lost(self) -> int:
        """The store lost its data: the parked messages last seen waiting went with it. Say how
        many, and forget them; returns how many (those this process kept)."""
        with self._mutex:
            parked, self._parked = self._parked, {}
            overflow, self._parked_overflow = self._parked_overflow, False
            seen_at = self._parked_seen_at
        if not parked and not overflow:
            return 0
        actors = sorted({actor for _, actor in parked.values()})
        shown = list(parked)[:PARKED_SHOWN]
        self.logger.error(
            "The lock store's loss of its data took %s%d message(s) that worker %r had parked in the lines of run "
            "locks (actors %s; message ids %s%s): they were waiting at this worker's last heartbeat, %d ms before, "
            "were acked by the broker, and cannot be recovered from the lock store. Send them again if they must run.",
            "at least " if overflow else "",
            len(parked),
            self.worker_id,
            ", ".join(map(repr, actors)) or "unknown",
            ", ".join(map(repr, shown)) or "unknown",
            f" and {len(parked) - len(shown)} more" if len(parked) > len(shown) else "",
            int((time.monotonic() - seen_at) * 1000),
        )
        return len(parked)

    def _renew_due(self, stalled: int | None, *, data_lost: bool = False) -> None:
        now = self.backend_time()
        if now is None:
            return
        # After a loss of the store's data, every lease is looked at at once: each lost one is told as such.
        horizon = now + 2 * self.heartbeat_interval
        with self._mutex:
            due = [
                (k, lease)
                for k, lease in self._leases.items()
                if data_lost or lease.expires_at <= horizon or lease.eager
            ]
        lost: list[tuple[str, _Lease]] = []
        retaken: list[str] = []
        answers: list[int | None | LockBackendError] = []
        if due:
            try:
                answers = self.backend.renew_many(
                    [Lease(key, owner, ttl=self.lease_period, deadline=lease.deadline) for (key, owner), lease in due]
                )
            except LockBackendError as e:  # a backend may fail them all at once instead of each
                answers = [e] * len(due)
        for ((key, owner), lease), expires_at in zip(due, answers, strict=True):
            if expires_at is None and data_lost and lease.holder is not None:
                try:
                    expires_at = self._retake(key, owner, lease, now)
                except LockBackendError as e:
                    expires_at = e
                if isinstance(expires_at, int):
                    retaken.append(key)
            if isinstance(expires_at, LockBackendError):
                self.logger.warning("The lease of run lock %r could not be renewed: %s", key, expires_at)
                self.tell(
                    partial(
                        self.events.notify_about,
                        lease.subject,
                        BACKEND_ERROR,
                        lock_kind=RUN,
                        reason="renewal",
                        error=expires_at,
                    )
                )
                continue
            with self._mutex:
                if (key, owner) not in self._leases:
                    continue  # released meanwhile
                if expires_at is None:
                    del self._leases[(key, owner)]
                elif lease.deadline is not None and expires_at >= lease.deadline:
                    del self._leases[(key, owner)]  # lock_ttl ends it; nothing more to renew
                else:
                    lease.expires_at = expires_at
                if (
                    isinstance(expires_at, StopRequested)
                    and self._on_stop_requested is not None
                    and lease.interrupt is not None
                ):
                    # Under the mutex: the message still holds its lease, so it still runs.
                    self._on_stop_requested(lease.interrupt, lease.subject, lease.held, expires_at.by)
            if expires_at is None:
                lost.append((key, lease))
        self._renewed_at = time.monotonic()
        if retaken:
            self.logger.warning(
                "The run lock(s) %s went with the lock store's data while their messages were still running; "
                "this worker took them again.",
                ", ".join(repr(key) for key in retaken),
            )
        if lost and data_lost:
            self.logger.warning(
                "The run lock(s) %s went with the lock store's data while their messages were still running, and "
                "another copy took them since: it may run beside them now.",
                ", ".join(repr(key) for key, _ in lost),
            )
        elif lost and stalled is not None:
            self._report_stalled([key for key, _ in lost], stalled)
        for key, lease in lost:
            if stalled is None and not data_lost:
                self._report_lapsed(key, early=now < lease.expires_at)
            self.tell(partial(self.events.notify_about, lease.subject, LEASE_LOST, lock_kind=RUN))

    def _retake(self, key: str, owner: str, lease: _Lease, now: int) -> int | None:
        """Take a run lock that went with the store's data again; its new expiry, or ``None``
        when another message holds it now. Never past its ``lock_ttl``."""
        ttl = self.lease_period if lease.deadline is None else min(self.lease_period, lease.deadline - now)
        if ttl <= 0 or lease.holder is None:
            return None
        acquisition = self.backend.acquire(key, owner, limit=lease.limit, ttl=ttl, holder=lease.holder, healing=True)
        return acquisition.expires_at if acquisition.acquired else None

    def _report_lapsed(self, key: str, *, early: bool = False) -> None:
        if early:
            self.logger.warning(
                "The run lock %r was removed while its message was still running, before its lease ran out: "
                "the lock store evicted it (its maxmemory-policy), or it was freed by hand. Another copy may run now.",
                key,
            )
            return
        self.logger.warning(
            "The run lock %r lapsed while its message was still running: its lease ran out "
            "before this worker renewed it. Another copy may run now.",
            key,
        )

    def _report_stalled(self, keys: list[str], stalled: int) -> None:
        self.logger.error(
            "The run lock(s) %s lapsed while their messages were still running, and another copy may run now: "
            "worker %r renewed no lease for %d ms, longer than its lease_period of %d ms, because something kept "
            "its periodic thread from running. That is a job that holds the GIL (a C extension), or, in a "
            "monkey-patched gevent worker whose leases are renewed from a greenlet, a job that keeps the gevent "
            "hub busy (CPU-bound code, a driver gevent has not patched). Give the lock backend as a plain "
            "redis:// URL or client, so that a gevent worker renews from a native thread; release the GIL or "
            "yield to the hub (gevent.sleep(0)) at least once per heartbeat interval; or choose a lease_period "
            "longer than the longest such stretch.",
            ", ".join(repr(key) for key in keys),
            self.worker_id,
            stalled,
            self.lease_period,
        )

    def _retry_releases(self) -> None:
        now = self.backend_time()
        with self._mutex:
            pending = list(self._pending.items())
        for (key, owner), until in pending:
            if until is not None and now is not None and until <= now:
                with self._mutex:  # its lease ended: nothing is left to give up
                    self._pending.pop((key, owner), None)
                continue
            try:
                self.backend.release(key, owner)
            except LockBackendError as e:
                self._backend_failed("release", e)
                continue
            with self._mutex:
                self._pending.pop((key, owner), None)
            self.logger.info("The lock %r of %r was released on a later attempt.", key, owner)

    def _backend_failed(self, what: str, error: LockBackendError) -> None:
        """Tell of a failure outside any message (a heartbeat, a release tried again)."""
        self.tell(
            partial(
                self.events.notify,
                BACKEND_ERROR,
                "",
                lambda: LockEvent(kind=BACKEND_ERROR, actor_name="", queue_name="", reason=what, error=error),
            )
        )
