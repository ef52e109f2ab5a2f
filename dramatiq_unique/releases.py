"""Releases off the worker's critical path.

When a message is done, the worker thread that processed it hands its enqueue
lock's release to one thread of the process and takes the next message at
once. That thread sends every release waiting for it in one round trip as soon
as the previous one is answered: a busy worker pays one round trip for many
messages instead of one per message, and none of it between two messages.

What a user sees of it:

* a finished message holds its lock a little longer: until its release's round
  trip, plus the one in flight when it was handed over and the thread's wait for
  the interpreter lock (see docs/performance.md for the figures measured);
* a ``send()`` in the same process never meets a lock whose release is waiting:
  it sends that release itself, or waits for the round trip that carries it
  (:meth:`BackgroundReleases.settle`);
* a warm shutdown sends every release before the worker leaves the registry;
  a failed release is tried again by the heartbeat thread, as any other;
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
from typing import TYPE_CHECKING

from .backends import LockBackend
from .errors import LockBackendError
from .events import BACKEND_ERROR, LAPSED, RELEASED
from .keys import ENQUEUE

if TYPE_CHECKING:
    from .lock import MessageLock

__all__ = ["BackgroundReleases"]

#: The most releases sent in one round trip.
MAX_BATCH = 256

#: How long, in seconds, a ``send()`` waits for a release of its lock to be
#: answered before it tries the lock anyway (the backend is failing then).
SETTLE_TIMEOUT = 5.0


class BackgroundReleases:
    """The thread that gives up finished messages' enqueue locks, in batches.

    Parameters:
      backend(LockBackend): Where the locks are.
      logger(logging.Logger): Where failed releases are reported.
      retry(collections.abc.Callable): Called with ``(key, owner)`` of each release that
        failed, to try it again later (the heartbeat thread's job).
      max_batch(int): The most releases in one round trip.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        logger: logging.Logger,
        retry: Callable[[str, str], None],
        max_batch: int = MAX_BATCH,
    ):
        self.backend = backend
        self.logger = logger
        self.retry = retry
        self.max_batch = max_batch
        self._changed = threading.Condition(threading.Lock())
        self._waiting: list[MessageLock] = []
        #: Key -> releases of it handed over and not answered yet.
        self._unsettled: dict[str, int] = {}
        self._users = 0
        self._thread: threading.Thread | None = None
        #: Set when the thread is to stop once nothing waits any more.
        self._stopping = threading.Event()

    @property
    def running(self) -> bool:
        """Whether the thread runs and takes releases."""
        return self._thread is not None and not self._stopping.is_set()

    def start(self) -> None:
        """Start the thread; called once per Worker started in the process."""
        with self._changed:
            self._users += 1
            if self.running:
                return
            # A thread that is stopping (the last Worker is leaving) finishes on its
            # own; this Worker gets a thread of its own.
            self._stopping = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(self._stopping,), name="dramatiq-unique-releases", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """When the last Worker of the process stopped: send what waits, then
        stop the thread. Later releases are sent by the threads that make them."""
        with self._changed:
            self._users -= 1
            if self._users > 0 or not self.running:
                return
            thread, stopping = self._thread, self._stopping
            stopping.set()
            self._changed.notify_all()
        assert thread is not None
        thread.join()
        with self._changed:
            if self._thread is thread:  # no Worker started another meanwhile
                self._thread = None

    @property
    def idle(self) -> bool:
        """Whether every release handed over so far has been answered."""
        return not self._unsettled

    def hand_over(self, lock: MessageLock) -> bool:
        """Have the thread give up ``lock``'s enqueue lock, which the message
        holds no more as far as the caller is concerned.

        Returns:
          bool: False when the thread does not run: the caller releases it itself.
        """
        key = lock.enqueue_key
        with self._changed:
            if not self.running:
                return False
            self._waiting.append(lock)
            self._unsettled[key] = self._unsettled.get(key, 0) + 1
            self._changed.notify_all()
        return True

    def settle(self, key: str) -> None:
        """Wait until every release of ``key`` handed over so far is answered.

        A release of ``key`` still waiting for the thread is sent at once by the
        caller: the thread may be busy (or be the caller, in an event subscriber).
        """
        if key not in self._unsettled:  # nearly always: no lock taken for nothing
            return
        with self._changed:
            mine = [lock for lock in self._waiting if lock.enqueue_key == key]
            if mine:
                self._waiting = [lock for lock in self._waiting if lock.enqueue_key != key]
        if mine:
            self._release(mine)
        with self._changed:
            # What is left is in flight in another thread's round trip.
            self._changed.wait_for(lambda: key not in self._unsettled, timeout=SETTLE_TIMEOUT)

    def _run(self, stopping: threading.Event) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or stopping.is_set())
                if not self._waiting:
                    return  # stopping, and nothing left to send
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch :]
            self._release(batch)

    def _release(self, batch: list[MessageLock]) -> None:
        """Send the releases of ``batch``, mark them answered, then tell the
        subscribers: one that sends a message of the same lock finds it settled."""
        events: list[Callable[[], None]] = []
        try:
            events = self._send(batch)
        except Exception:  # neither the thread nor a send() may die of it, and no lock may stay behind
            self.logger.exception("Lock releases of %d finished messages failed; they are tried again.", len(batch))
            for lock in batch:
                self.retry(lock.enqueue_key, lock.message.message_id)
        finally:
            with self._changed:
                for lock in batch:
                    key = lock.enqueue_key
                    left = self._unsettled[key] - 1
                    if left:
                        self._unsettled[key] = left
                    else:
                        del self._unsettled[key]
                self._changed.notify_all()
        for emit in events:
            emit()

    def _send(self, batch: list[MessageLock]) -> list[Callable[[], None]]:
        """Send the releases of ``batch``; returns the events to emit about them."""
        places = [(lock.enqueue_key, lock.message.message_id) for lock in batch]
        try:
            released = self.backend.release_many(places)
        except LockBackendError as e:
            for key, owner in places:
                self.retry(key, owner)
            self.logger.warning(
                "The locks of %d finished messages (the first: message %r of actor %r) could not be released: %s. "
                "This worker tries again; the orphan reaper or the locks' lock_ttl frees them if that fails too.",
                len(batch),
                batch[0].message.message_id,
                batch[0].message.actor_name,
                e,
            )
            return [partial(lock.emit, BACKEND_ERROR, reason="release", error=e) for lock in batch]
        return [
            partial(lock.emit, RELEASED if was_held else LAPSED, lock_kind=ENQUEUE)
            for lock, was_held in zip(batch, released, strict=True)
        ]
