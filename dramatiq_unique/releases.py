"""Releases off the worker's critical path.

When a message is done, the worker thread that processed it hands its enqueue
lock's release to one thread of the process and takes the next message at
once. That thread sends every release waiting for it in one round trip as soon
as the previous one is answered: a busy worker pays one round trip for many
messages instead of one per message, and none of it between two messages.

What a user sees of it:

* a finished message holds its lock a little longer: until its release's round
  trip, plus the one in flight when it was handed over and the thread's wait for
  the interpreter lock (see :doc:`Performance </performance>` for the figures measured);
* a ``send()`` in the same process never meets a lock whose release is waiting:
  it sends that release itself, or waits for the round trip that carries it
  (:meth:`BackgroundReleases.settle`);
* a warm shutdown sends every release before the worker leaves the registry;
  a failed release is tried again by the periodic thread, as any other;
* after a ``kill -9``, the releases not sent yet are left to the orphan reaper
  and to ``lock_ttl``, as a release lost with a dying process always was.

Run locks are always released by the worker thread itself: the next copy of a
``while_executing`` message waits for exactly that release, and a copy in
another process that came a moment too early would wait a whole
``reschedule_delay``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from .backends import LockBackend
from .errors import LockBackendError
from .events import BACKEND_ERROR, LAPSED, RELEASED, Events, EventSubject
from .keys import ENQUEUE

__all__ = ["BackgroundReleases"]

#: The most releases sent in one round trip.
MAX_BATCH = 256

#: How long, in seconds, a ``send()`` waits for a release of its lock to be
#: answered before it tries the lock anyway (the backend is failing then).
SETTLE_TIMEOUT = 5.0


class Released(Protocol):
    """What a release handed over is about: the message's lock, a :class:`~dramatiq_unique.lock.MessageLock`."""

    @property
    def actor_name(self) -> str: ...

    @property
    def message_id(self) -> str: ...

    @property
    def subject(self) -> EventSubject: ...


#: A release handed over: the key of the enqueue lock, its owner (the message id), and what it is
#: about, whose event is built by the thread that tells it, and only for a subscriber.
_Release = tuple[str, str, Released]


class BackgroundReleases:
    """The releases of finished messages' enqueue locks, and the loop that
    sends them in batches (``serve``), which the release thread of the
    process runs.

    Parameters:
      backend(LockBackend): Where the locks are.
      logger(logging.Logger): Where failed releases are reported.
      events(Events): Where what became of each lock is told.
      retry(collections.abc.Callable): Called with ``(key, owner)`` of each release that
        failed, to try it again later (the periodic thread's job).
      max_batch(int): The most releases in one round trip.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        logger: logging.Logger,
        events: Events,
        retry: Callable[[str, str], None],
        max_batch: int = MAX_BATCH,
    ):
        self.backend = backend
        self.logger = logger
        self.events = events
        self.retry = retry
        self.max_batch = max_batch
        self._init_state()
        #: How many batches of releases were answered (or failed) so far: whether the thread gets on.
        self.answered = 0

    def _init_state(self) -> None:
        #: Guards the state below; a worker thread holds it only to hand a release over.
        self._mutex = threading.Lock()
        #: Where a release thread with nothing to send waits for a release, or for its stop.
        self._handed = threading.Condition(self._mutex)
        #: Where a send() waits for the answer to a release of its lock.
        self._answered = threading.Condition(self._mutex)
        self._waiting: list[_Release] = []
        #: Key -> releases of it handed over and not answered yet.
        self._unsettled: dict[str, int] = {}
        #: The thread that serves now, and the event set when it is to stop once nothing
        #: waits; ``None`` while no thread serves in this process.
        self._serving: tuple[threading.Thread, threading.Event] | None = None
        #: Whether that thread takes releases: from :meth:`open` until :meth:`close`, or until it
        #: ends some other way. Read for every message, where ``Thread.is_alive()`` costs more.
        self._taking = False
        #: Whether a release thread waits on ``_handed`` with nothing to send: only then does a
        #: release handed over wake it; an awake thread finds it in ``_waiting`` when its round trip ends.
        self._asleep = False

    @property
    def running(self) -> bool:
        """Whether a thread of this process serves, and takes releases."""
        return self._taking

    def open(self, thread: threading.Thread, stopping: threading.Event) -> None:
        """Take releases from now on, for ``thread``, which serves them until
        ``stopping`` is given to :meth:`close`. The caller starts ``thread`` right after."""
        with self._mutex:
            self._serving = (thread, stopping)
            self._taking = not stopping.is_set()

    def close(self, stopping: threading.Event) -> None:
        """Take no more releases: the thread serving until ``stopping`` sends
        what waits, then ends. Later releases are sent by the threads that make them."""
        with self._mutex:
            stopping.set()
            self._stop_taking(stopping)
            self._handed.notify_all()

    def _stop_taking(self, stopping: threading.Event) -> None:
        # A thread that stops after a newer one took over leaves the newer one taking.
        serving = self._serving
        if serving is not None and serving[1] is stopping:
            self._taking = False

    def reset_after_fork(self) -> None:
        """In a forked child: no thread serves, no release of the parent waits
        here, and the parent's mutex may have been held at the fork."""
        self._init_state()

    @property
    def idle(self) -> bool:
        """Whether every release handed over so far has been answered."""
        return not self._unsettled

    def hand_over(self, key: str, owner: str, about: Released) -> bool:
        """Have the serving thread give up ``owner``'s place in the enqueue lock
        at ``key``, which the message holds no more as far as the caller is concerned.

        Parameters:
          about(Released): The message's lock, whose release is told.

        Returns:
          bool: False when no thread serves: the caller releases it itself.
        """
        if not self._taking:  # read again below: this spares a process without the thread the mutex
            return False
        with self._mutex:
            if not self._taking:
                return False
            self._waiting.append((key, owner, about))
            unsettled = self._unsettled
            unsettled[key] = unsettled.get(key, 0) + 1
            if self._asleep:
                # Once: the releases handed over until the thread runs go out in its next batch.
                self._asleep = False
                self._handed.notify()
        return True

    def settle(self, key: str) -> None:
        """Wait until every release of ``key`` handed over so far is answered.

        A release of ``key`` still waiting for the thread is sent at once by the
        caller: the thread may be busy (or be the caller, in an event subscriber).
        """
        if key not in self._unsettled:  # nearly always: no lock taken for nothing
            return
        with self._mutex:
            mine = [release for release in self._waiting if release[0] == key]
            if mine:
                self._waiting = [release for release in self._waiting if release[0] != key]
        if mine:
            self._release(mine)
        serving = self._serving
        if serving is not None and serving[0] is threading.current_thread():
            # The serving thread itself, once a round trip was answered (a message a release
            # handed a place, being enqueued; an event subscriber): nothing of it is in flight.
            return
        with self._mutex:
            # What is left is in flight in another thread's round trip.
            self._answered.wait_for(lambda: key not in self._unsettled, timeout=SETTLE_TIMEOUT)

    def serve(self, stopping: threading.Event) -> None:
        """Send the releases handed over, as they come, until ``stopping`` is
        set and none waits: the release thread's loop."""
        try:
            while batch := self._next_batch(stopping):
                self._release(batch)
        finally:
            with self._mutex:
                # However it ends: the releases handed over from now on are sent by the threads that make them.
                self._stop_taking(stopping)

    def _next_batch(self, stopping: threading.Event) -> list[_Release]:
        """The next releases to send, once some wait; none once ``stopping`` is set and none waits."""
        with self._mutex:
            while not self._waiting and not stopping.is_set():
                # Cleared by the hand_over() that wakes it. Left set when close() or a spurious
                # wake-up woke it: a needless notify then costs less than one missed.
                self._asleep = True
                self._handed.wait()
            batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
        return batch

    def _release(self, batch: list[_Release]) -> None:
        """Send the releases of ``batch``, mark them answered, then tell the
        subscribers: one that sends a message of the same lock finds it settled."""
        events: list[Callable[[], None]] = []
        try:
            events = self._send(batch)
        except Exception:  # neither the thread nor a send() may die of it, and no lock may stay behind
            self.logger.exception("Lock releases of %d finished messages failed; they are tried again.", len(batch))
            for key, owner, _ in batch:
                self.retry(key, owner)
        finally:
            with self._mutex:
                self.answered += 1
                for key, _, _ in batch:
                    left = self._unsettled[key] - 1
                    if left:
                        self._unsettled[key] = left
                    else:
                        del self._unsettled[key]
                self._answered.notify_all()
        for emit in events:
            emit()

    def _send(self, batch: list[_Release]) -> list[Callable[[], None]]:
        """Send the releases of ``batch``; returns the events to tell about them."""
        places = [(key, owner) for key, owner, _ in batch]
        try:
            released = self.backend.release_many(places)
        except LockBackendError as e:
            for key, owner in places:
                self.retry(key, owner)
            first = batch[0][2]
            self.logger.warning(
                "The locks of %d finished messages (the first: message %r of actor %r) could not be released: %s. "
                "This worker tries again; the orphan reaper or the locks' lock_ttl frees them if that fails too.",
                len(batch),
                first.message_id,
                first.actor_name,
                e,
            )
            return [partial(self._tell, about, BACKEND_ERROR, reason="release", error=e) for _, _, about in batch]
        return [
            partial(self._tell, about, RELEASED if was_held else LAPSED, lock_kind=ENQUEUE)
            for (_, _, about), was_held in zip(batch, released, strict=True)
        ]

    def _tell(self, about: Released, kind: str, **details: Any) -> None:
        """Count an event of ``kind`` about a release, and build it only for its subscribers."""
        self.events.notify(kind, about.actor_name, lambda: about.subject.event(kind, **details))
