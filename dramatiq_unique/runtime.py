"""The background work of one process: the only place that starts threads.

A process runs at most two threads of this library, both daemons:

* the periodic thread, ``dramatiq-unique-periodic``, which wakes once per
  heartbeat interval. In a worker process it runs from the boot of the first
  Worker to the shutdown of the last, and does all of the worker's
  maintenance in one round: the heartbeat, the lease renewals and the failed
  releases tried again (:class:`~dramatiq_unique.liveness.Liveness`), the
  activity counts flushed, and the tasks it was given (the orphan reaper's
  trigger). In a process that only sends, it runs while activity counts wait
  to be flushed, and ends when none is left; at exit it writes the counts
  left as it ends, waited for as a Worker's stop waits for it;
* the release thread, ``dramatiq-unique-releases``, in a worker process with
  background releases, from the boot of the first Worker to the shutdown of
  the last (:class:`~dramatiq_unique.releases.BackgroundReleases`).

In a process that gevent monkey-patched (``dramatiq-gevent``), ``threading`` makes greenlets,
which a job that keeps the gevent hub busy stops. The periodic thread is then a native thread
(:mod:`dramatiq_unique.native`) on a lock backend of its own whose sockets are not gevent's
(:meth:`~dramatiq_unique.backends.LockBackend.for_native_thread`), so that leases are renewed
while such a job runs; its periodic tasks, which send through the broker, and the lock events
it tells, whose subscribers may use gevent sockets, run in a greenlet of the Worker's hub. The
release thread stays a greenlet: a release can wait. A backend that cannot be reached from a
native thread keeps the periodic thread a greenlet, with a WARNING at boot.

Workers are told apart by identity: a Worker that stops twice, or stops
without having booted, stops nothing. A child forked from the process has
none of its threads and none of its queued work: it starts threads of its
own when a Worker boots in it, or when it counts activity.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import partial

from .activity import ActivityCounter
from .backends import LockBackend
from .cancellation import Cancellations
from .cut_off import CutOff
from .errors import LockBackendError
from .events import Events
from .forks import reset_in_child
from .history import KINDS as HISTORY_KINDS
from .history import ConflictRecorder
from .in_hand import InHand
from .liveness import Liveness, worker_id
from .native import (
    BackgroundThread,
    NativeEvent,
    NativeThread,
    StopEvent,
    current_hub,
    gevent_patched,
    is_current,
    start_in_hub,
)
from .releases import BackgroundReleases

#: The names of the threads.
PERIODIC_THREAD = "dramatiq-unique-periodic"
RELEASE_THREAD = "dramatiq-unique-releases"

#: The shortest wait, in milliseconds, for the periodic thread to finish its round when the
#: last Worker stops, for the release thread's next answer, and for the last write of the
#: activity counts of a process that only sends; the wait is the lease period when that is longer.
MIN_STOP_WAIT = 5_000

#: A started thread, and the event that tells it to stop.
_Started = tuple[BackgroundThread, StopEvent]


class Runtime:
    """The threads of one process and the work they do.

    Parameters:
      backend(LockBackend): Where locks, registries and counts are.
      prefix(str): The middleware's lock prefix.
      lease_period(int): Milliseconds a run lock is held without a renewal.
      heartbeat_interval(int): Milliseconds between two rounds of the periodic thread.
      logger(logging.Logger): Where to report.
      events(Events): Where lock events are told, and counted.
      background_releases(bool): Whether a worker process gives up finished
        messages' enqueue locks from the release thread.
      activity(bool): Whether lock events are counted per minute in the backend.
      history(tuple[int, int]): The conflict trail's most entries per lock prefix and its
        retention in ms, written with the activity counts; ``None`` for no trail.
      periodic_tasks(Sequence[collections.abc.Callable]): Called by each round of a worker's
        periodic thread with the backend's time, after the heartbeat.
      healing(collections.abc.Callable): Called by the round that found that the lock store
        lost its data, after the run locks of the running messages were taken again, with
        ``True``; and with ``False`` by each round after, for as long as it answers ``True``: it heals still.
      hand_over_healing(collections.abc.Callable): Called when the last Worker stops.
      holds_back_when_cut_off(bool): Whether a worker cut off from the lock store for a lease
        period runs no message with a lock until it answers (see ``dramatiq_unique.cut_off``).
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
        background_releases: bool,
        activity: bool,
        history: tuple[int, int] | None = None,
        periodic_tasks: Sequence[Callable[[int], None]] = (),
        healing: Callable[[bool], bool] | None = None,
        hand_over_healing: Callable[[], None] | None = None,
        holds_back_when_cut_off: bool = True,
    ):
        self.logger = logger
        #: The backend of the threads that send, whose lock store's marks it may have seen.
        self._backend = backend
        #: In a process that gevent monkey-patched, the periodic thread is a native thread with a
        #: backend of its own, so that a job that keeps the gevent hub busy does not stop it.
        self._native_backend = backend.for_native_thread() if gevent_patched() else None
        #: The gevent hub of the booted Worker, which runs the periodic tasks of a native thread.
        self._hub: object | None = None
        periodic_backend = self._native_backend or backend
        #: The messages in this process's hands, published with each heartbeat where the broker
        #: cannot be asked for a message by its id.
        self.in_hand = InHand(interval=heartbeat_interval)
        self.cut_off = CutOff(holds_back=holds_back_when_cut_off, logger=logger)
        #: The messages interrupted because their holder was asked to stop.
        self.cancellations = Cancellations(logger=logger)
        self.liveness = Liveness(
            periodic_backend,
            prefix=prefix,
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            logger=logger,
            events=events,
            running=lambda: self.running,
            in_hand=self.in_hand.publication,
            on_cut_off=self.cut_off.changed,
            on_stop_requested=self.cancellations.interrupt,
        )
        self.releases = (
            BackgroundReleases(backend, logger=logger, events=events, retry=self.liveness.retry_release)
            if background_releases
            else None
        )
        self.activity = (
            ActivityCounter(
                periodic_backend,
                prefix=prefix,
                clock=self.liveness.backend_time,
                logger=logger,
                on_counts=self._counted,
                on_close=self._activity_closed,
            )
            if activity or history is not None
            else None
        )
        if self.activity is not None and activity:
            events.add_counter(self.activity)
        #: The conflict trail's recorder, ``None`` without one; it is written with the activity counts.
        self.history = self._record_history(events, history) if history is not None else None
        self._tasks = tuple(periodic_tasks)
        self._heal = healing
        self._hand_over_healing = hand_over_healing
        self._init_state()
        reset_in_child(self._reset_in_child)
        if self.activity is not None:
            # The periodic thread is a daemon: without this, a process that sends and
            # exits would lose what it counted since its last flush.
            atexit.register(_close_activity, weakref.ref(self))

    def _record_history(self, events: Events, history: tuple[int, int]) -> ConflictRecorder:
        """The conflict trail's recorder, subscribed to the events it records and written with the counts."""
        max_entries, retention = history
        recorder = ConflictRecorder(
            self.liveness.backend,
            clock=self.liveness.backend_time,
            worker=worker_id,
            max_entries=max_entries,
            retention=retention,
            logger=self.logger,
            on_entries=self._counted,
        )
        events.subscribe(HISTORY_KINDS, recorder)
        assert self.activity is not None
        self.activity.also.append(recorder)
        return recorder

    def _init_state(self) -> None:
        #: Guards the state below; never held during a round trip or a join.
        self._mutex = threading.Lock()
        #: Serializes a Worker's registration with the departure of the last one.
        self._transition = threading.Lock()
        #: The booted Workers of this process that have not stopped, by identity.
        self._workers: dict[int, object] = {}
        #: Whether the periodic thread does a worker's work: from the registration
        #: of the first Worker to the shutdown of the last.
        self._serving = False
        self._periodic: _Started | None = None
        self._release_thread: tuple[threading.Thread, threading.Event] | None = None
        #: The stop event of the periodic thread that, stopped by the last Worker, does the
        #: worker's last work on its way out: a thread can be waited for with a bound, a round trip cannot.
        self._leaving: StopEvent | None = None
        #: Whether the healing is called again next round: this process's worker heals the lock
        #: store after a loss of its data, or watches another worker heal it.
        self._healing = False

    @property
    def running(self) -> bool:
        """Whether a worker's periodic thread runs in this process."""
        periodic = self._periodic
        return self._serving and periodic is not None and periodic[0].is_alive()

    # Workers ---------------------------------------------------------------------

    def worker_booted(self, worker: object, *, publish_in_hand: bool = False) -> None:
        """Start a worker's background work, if ``worker`` is the first Worker of
        the process: called before it takes any message. Registers the process
        in the worker registry first.

        Parameters:
          publish_in_hand(bool): Whether its broker cannot be asked for a message by its
            id: the heartbeat then publishes the messages in this process's hands.
        """
        if publish_in_hand:
            self.in_hand.start()
        self.in_hand.watch(worker)
        with self._transition:
            with self._mutex:
                if id(worker) in self._workers:
                    return
                self._workers[id(worker)] = worker
                register, self._serving = not self._serving, True
            if register:
                self._warn_if_greenlet_leases()
                if self._native_backend is not None:
                    self._hub = current_hub()
                    self.liveness.tell = partial(start_in_hub, self._hub)
                self.liveness.register()
                if self._backend is not self.liveness.backend:
                    # The sending threads' backend reads the marks too: a stop made it forget them (_leave).
                    try:
                        self._backend.epochs(self.liveness.prefix)
                    except LockBackendError:
                        pass  # the heartbeats tell of the outage
            with self._mutex:
                self._start_periodic()
                if self.releases is not None and self._release_thread is None:
                    thread, stopping = _thread(RELEASE_THREAD, self.releases.serve)
                    self.releases.open(thread, stopping)
                    try:
                        thread.start()
                    except BaseException:
                        self.releases.close(stopping)  # no thread serves: the worker threads release
                        raise
                    self._release_thread = (thread, stopping)

    def worker_stopped(self, worker: object) -> None:
        """Stop a worker's background work, if ``worker`` booted and is the last
        Worker of the process: called after its worker threads finished. Sends
        the releases that wait, then stops the periodic thread, which on its way
        out flushes the activity counts, tries the failed releases once more and
        leaves the registry."""
        self.in_hand.unwatch(worker)
        with self._mutex:
            if self._workers.pop(id(worker), None) is None or self._workers:
                return
            releasing, self._release_thread = self._release_thread, None
        sent = True
        if releasing is not None and self.releases is not None:
            # The releases go first: the periodic thread, still running, keeps those that fail
            # to try them again. A warm shutdown sends every release before the worker is gone,
            # for as long as the backend answers.
            thread, stopping = releasing
            self.releases.close(stopping)
            sent = self._join_releases(self.releases, thread)
        with self._transition:
            with self._mutex:
                if self._workers:
                    return  # a Worker booted meanwhile: the periodic thread is its own now
                self._serving = False
                periodic, self._periodic = self._periodic, None
                self._leaving = periodic[1] if sent and periodic is not None else None
            if not sent:
                if periodic is not None:
                    periodic[1].set()
                self.logger.error(
                    "Worker %r stops while its release thread is still waiting for the lock backend: the enqueue "
                    "locks of finished messages that it has not released yet stay held until the backend answers, "
                    "or the orphan reaper or their lock_ttl frees them. It leaves without a last flush of its "
                    "activity counts and without trying its failed releases again; its place in the worker "
                    "registry lapses.",
                    self.liveness.worker_id,
                )
            elif periodic is None:
                self._leave()
            elif not self._join(periodic):
                self.logger.error(
                    "Worker %r stops while its heartbeat is still waiting for the lock backend: its last flush of "
                    "the activity counts, its failed releases and its departure from the worker registry wait for "
                    "that backend in a thread that the shutdown does not wait for. If the process exits first, its "
                    "place in the worker registry lapses; the orphan reaper or lock_ttl frees what it held.",
                    self.liveness.worker_id,
                )
            else:
                self._left(periodic[1])  # nothing left to do, unless the thread ended some other way
            # A count starts the thread of a process that only sends only when none waits: counts
            # left unflushed here would otherwise wait for the exit of a process that goes on sending.
            if self.activity is not None and self.activity.pending:
                self._counted()

    # The periodic thread ---------------------------------------------------------------

    def tick(self) -> None:
        """One round of a worker's periodic thread: heartbeat, renewals, failed
        releases, activity flush, then the periodic tasks. Nothing after a failed heartbeat."""
        now = self.liveness.tick()
        if now is None:
            return
        self._flush()
        data_lost = self.liveness.found_data_loss
        if (self._tasks or data_lost or self._healing) and self._hub is not None:
            # The tasks read and send through the broker, whose gevent sockets only the hub's thread may use.
            start_in_hub(self._hub, self._run_tasks, now, data_lost)
        else:
            self._run_tasks(now, data_lost)

    def _run_tasks(self, now: int, data_lost: bool = False) -> None:
        if (data_lost or self._healing) and self._heal is not None:
            try:
                self._healing = self._heal(data_lost)
            except Exception:
                self._healing = False
                self.logger.exception("Healing the lock store after it lost its data failed.")
        for task in self._tasks:
            try:
                task(now)
            except Exception:
                self.logger.exception("The periodic task %r failed.", task)

    def _warn_if_greenlet_leases(self) -> None:
        if gevent_patched() and self._native_backend is None:
            self.logger.warning(
                "Worker %r runs in a process that gevent monkey-patched, and its lock backend cannot be reached "
                "from a native thread (only a RedisBackend of a plain redis:// URL or redis.Redis client can): the "
                "leases of its run locks are renewed from a greenlet. A job that keeps the gevent hub busy for "
                "longer than lease_period (%d ms) loses its run lock, and another copy may run beside it.",
                self.liveness.worker_id,
                self.liveness.lease_period,
            )

    def _start_periodic(self) -> None:
        """Start the periodic thread unless it runs (the caller holds the mutex)."""
        if self._periodic is None or not self._periodic[0].is_alive():
            # The thread holds the runtime only during a round: a runtime that is gone ends it.
            target = partial(_run_periodic, weakref.ref(self), self.liveness.heartbeat_interval / 1000)
            thread: BackgroundThread
            stop: StopEvent
            if self._native_backend is not None:
                stop = NativeEvent()
                thread = NativeThread(name=PERIODIC_THREAD, target=target, stop=stop)
            else:
                thread, stop = _thread(PERIODIC_THREAD, target)
            thread.start()
            self._periodic = (thread, stop)

    def _round(self, stop: StopEvent) -> bool:
        """One round; False when the thread is to end."""
        if self._serving:
            self.tick()
            return True
        # A process that only sends: it flushes while counts wait.
        activity = self.activity
        if activity is not None and not activity.closed:
            activity.flush()
        with self._mutex:
            if self._serving or (activity is not None and activity.pending and not activity.closed):
                return True
            # It gives its slot up where it decides to end: a count made just after
            # then starts a thread of its own instead of counting on this one.
            if self._periodic is not None and self._periodic[1] is stop:
                self._periodic = None
            return False

    def _counted(self) -> None:
        """The activity counter holds counts again: a process that only sends starts
        its periodic thread to flush them, unless it runs."""
        activity = self.activity
        with self._mutex:
            if activity is not None and not activity.closed:
                try:
                    self._start_periodic()
                except RuntimeError:
                    # Python starts no thread at interpreter shutdown (a send from an exit
                    # handler): the flush at exit takes these counts.
                    pass

    def _activity_closed(self) -> None:
        """The activity counter is closed: a process that only sends stops its periodic thread,
        which writes what is left on its way out, and waits for it as a worker's stop waits for
        that thread (:meth:`_join`); it says at WARNING what was not written. A worker's periodic
        thread goes on writing them, and the worker's stop writes the last ones."""
        activity = self.activity
        if activity is None:
            return
        with self._mutex:
            if self._serving:
                return
            if activity.pending:
                try:
                    self._start_periodic()  # unless it runs
                except RuntimeError:
                    pass  # Python starts no thread at interpreter shutdown
            periodic, self._periodic = self._periodic, None
        if periodic is None:
            # Counts made by a send from an exit handler after the thread ended: written from
            # here, as that send's own round trips were.
            self._flush()
        elif is_current(periodic[0]):
            return  # closed from a round of that thread: it writes them on its way out
        elif not self._join(periodic):
            activity.give_up(f"the lock backend did not answer within {self._stop_wait_ms()} ms")
            return
        if activity.failure is not None:
            activity.give_up(f"the lock backend failed: {activity.failure}")

    def _last_flush(self) -> None:
        """The periodic thread of a process that only sends writes what is left as it ends,
        once the activity counter is closed."""
        activity = self.activity
        if activity is not None and activity.closed and not self._serving:
            self._flush()

    def _join(self, started: _Started) -> bool:
        """Stop a periodic thread and wait for it to finish its round, and the worker's last
        work if it was given it: at most the lease period (then the process counts as dead
        anyway), and at least :data:`MIN_STOP_WAIT`.

        Returns:
          bool: Whether it finished.
        """
        thread, stop = started
        stop.set()
        thread.join(self._stop_wait())
        return not thread.is_alive()

    def _join_releases(self, releases: BackgroundReleases, thread: threading.Thread) -> bool:
        """Wait for the release thread, told to stop, to send what waits: for as long as the
        backend answers its round trips, and for the wait of :meth:`_join` after the last answer.

        Returns:
          bool: Whether it finished.
        """
        while True:
            answered = releases.answered
            thread.join(self._stop_wait())
            if not thread.is_alive():
                return True
            if releases.answered == answered:
                return False

    def _stop_wait(self) -> float:
        """Seconds to wait for a thread that talks to the backend when the last Worker stops."""
        return self._stop_wait_ms() / 1000

    def _stop_wait_ms(self) -> int:
        return max(self.liveness.lease_period, MIN_STOP_WAIT)

    def _left(self, stop: StopEvent) -> None:
        """The worker's last work, if the periodic thread stopped by ``stop`` is to do it
        and has not: the last Worker stopped it, and none booted since."""
        with self._mutex:
            if self._leaving is not stop or self._serving:
                return
            self._leaving = None
        self._leave()

    def _leave(self) -> None:
        """The worker's last work: flush the activity counts, try the failed releases once
        more and leave the registry."""
        self._flush()
        if self._hand_over_healing is not None:
            # (Under gevent a round may heal in the hub right now: it hands over as it ends.)
            self._healing = False
            self._hand_over_healing()
        self.liveness.leave()
        # A store emptied from now on, while no Worker of this process runs (a test suite's flush), is no loss.
        self._backend.forget_epochs()
        self.liveness.backend.forget_epochs()

    def _flush(self) -> None:
        if self.activity is not None:
            try:
                self.activity.flush()
            except Exception:
                self.logger.exception("The flush of the lock activity counts failed.")

    def _reset_in_child(self) -> None:
        """In a child forked from this process: none of the parent's threads run
        here, and none of its queued work is this process's."""
        self._init_state()
        self._hub = None
        self.liveness.reset_after_fork()
        self.in_hand.reset_after_fork()
        if self.releases is not None:
            self.releases.reset_after_fork()
        if self.activity is not None:
            self.activity.reset_after_fork()


def _thread(name: str, target: Callable[[threading.Event], None]) -> tuple[threading.Thread, threading.Event]:
    """A daemon thread that runs ``target`` until the event, which it is given, is set."""
    stop = threading.Event()
    return threading.Thread(target=target, args=(stop,), name=name, daemon=True), stop


def _run_periodic(ref: weakref.ref[Runtime], interval: float, stop: StopEvent) -> None:
    """The periodic thread: a round every ``interval`` seconds until ``stop`` is set, the
    round says it is the last, or the runtime is gone; then the worker's last work, if the
    last Worker left it to this thread."""
    _rounds(ref, interval, stop)
    runtime = ref()
    if runtime is not None:
        runtime._left(stop)
        runtime._last_flush()


def _rounds(ref: weakref.ref[Runtime], interval: float, stop: StopEvent) -> None:
    while not stop.wait(interval):
        runtime = ref()
        if runtime is None:
            return
        try:
            if not runtime._round(stop):
                return
        except Exception:  # the thread must outlive anything
            runtime.logger.exception("The periodic thread of worker %r failed.", runtime.liveness.worker_id)
        del runtime


def _close_activity(ref: weakref.ref[Runtime]) -> None:
    runtime = ref()
    if runtime is not None and runtime.activity is not None:
        runtime.activity.close()
