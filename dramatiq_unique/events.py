"""Lock events: what happened to locks, for callbacks a user subscribes.

The middleware owns one :class:`Events` hub and hands it to the parts that
see each event: the message's locks, the conflict strategies, the heartbeat
thread and the orphan reaper. An event object is only built when somebody
subscribed to its kind, so a process without subscribers pays one dict
lookup per event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .forks import reset_in_child

#: A message took a place in a lock.
ACQUIRED = "acquired"
#: A message met a lock held by others; its conflict strategy decides what becomes of it.
CONFLICT = "conflict"
#: A message gave its place in a lock up.
RELEASED = "released"
#: A message's place ran out (``lock_ttl``, or a lease) before it gave it up.
LAPSED = "lapsed"
#: A running message's run lock lapsed because the heartbeat thread could not renew it in time.
LEASE_LOST = "lease_lost"
#: The orphan reaper released a place whose message or worker is gone.
REAPED = "reaped"
#: The lock backend failed to answer.
BACKEND_ERROR = "backend_error"
#: The lock store lost the data it held (a restart without persistence, a flush, a failover to a
#: replica without the data, an eviction): every lock held until then is gone.
DATA_LOST = "data_lost"
#: A duplicate was enqueued again, to try the lock later.
RESCHEDULED = "rescheduled"
#: A duplicate goes to its dead-letter queue.
REJECTED = "rejected"
#: A new message took the place of a queued holder, which will be skipped (``replace``).
REPLACED = "replaced"
#: A duplicate waits in the lock's line (``wait``, ``keep_latest``).
WAITING = "waiting"
#: A message that waited in line was handed a place, and is enqueued.
HANDED_OVER = "handed_over"
#: A running message was interrupted with ``Cancelled``: its holder was asked to stop
#: (``cancel_in_progress``, or an operator's cancel). It is neither retried nor dead-lettered.
CANCELLED = "cancelled"

#: Every kind of event, as passed to :meth:`Events.subscribe`.
EVENT_KINDS = frozenset(
    {
        ACQUIRED,
        CONFLICT,
        RELEASED,
        LAPSED,
        LEASE_LOST,
        REAPED,
        BACKEND_ERROR,
        DATA_LOST,
        RESCHEDULED,
        REJECTED,
        REPLACED,
        WAITING,
        HANDED_OVER,
        CANCELLED,
    }
)


@dataclass(slots=True)
class LockEvent:
    """Something that happened to a lock.

    The first fields are set for every kind (``digest`` and ``message_id``
    are ``None`` for a backend error outside any message); the others only
    for the kinds named. Every subscriber of the kind gets the same object:
    read it, do not change it. (It is not frozen, as building a frozen
    dataclass costs several times more, and events are built in Dramatiq's hooks.)

    Parameters:
      kind(str): One of :data:`EVENT_KINDS`.
      actor_name(str): The actor of the message; ``""`` when there is none.
      queue_name(str): The message's canonical queue (never a delay queue); ``""`` when there is none.
      digest(str): The lock's digest.
      message_id(str): The message.
      lock(str): The lock type, e.g. ``"until_executed"``.
      lock_kind(str): ``"enqueue"`` or ``"run"``: which of the digest's two
        locks (acquired, released, lapsed, lease_lost, reaped, replaced, waiting, handed_over,
        cancelled).
      token(int): The fencing token of the place taken (acquired).
      side(str): ``"client"`` (at enqueue) or ``"server"`` (at start) (conflict).
      strategy(str): The conflict strategy that deals with the duplicate (conflict).
      holders(tuple[str]): The message_ids holding the lock (conflict, waiting, and
        lapsed when another message holds it now).
      delay(int): Milliseconds until the duplicate tries again (rescheduled).
      replaced(str): The message_id of the queued message whose place was taken (replaced), or of
        the waiter whose place in the line was taken (waiting, ``keep_latest``).
      reason(str): Why (reaped, rejected), what failed (backend_error), or which part of
        the store lost its data (data_lost).
      error(Exception): The error the backend raised (backend_error).
      call(str): The message's actor call as a person reads it, e.g. ``reindex('acme', 200)``, cut
        to :data:`~dramatiq_unique.calls.CALL_SHOWN` characters (conflict, rescheduled,
        rejected, replaced, waiting, and backend_error about a message).
      lock_prefix(str): The lock prefix of the message's locks (the kinds of ``call``).
      cancelled_by(str): Who asked the running message to stop (cancelled), as a person reads
        it: ``message <message_id>`` for a newer message of a ``cancel_in_progress`` actor,
        ``operator <who>`` for :meth:`~dramatiq_unique.Locks.cancel`.
      waiting_lost(int): How many messages this process had parked in the lines of run locks,
        still waiting at its last heartbeat, went with the store's data (data_lost).
    """

    kind: str
    actor_name: str
    queue_name: str
    digest: str | None = None
    message_id: str | None = None
    lock: str | None = None
    lock_kind: str | None = None
    token: int | None = None
    side: str | None = None
    strategy: str | None = None
    holders: tuple[str, ...] = ()
    delay: int | None = None
    replaced: str | None = None
    reason: str | None = None
    error: Exception | None = None
    call: str | None = None
    lock_prefix: str | None = None
    cancelled_by: str | None = None
    waiting_lost: int | None = None


#: The kinds of event that tell why a message did not run as sent, or not yet: their events
#: carry the message's call and lock prefix, for the conflict trail.
TRAIL_KINDS = frozenset({CONFLICT, RESCHEDULED, REJECTED, REPLACED, WAITING, BACKEND_ERROR, CANCELLED})


class EventSubject(NamedTuple):
    """What an event is about: one message's lock. The background threads
    carry it, instead of the message's locks, to tell what became of them.

    Parameters:
      actor_name(str): The actor of the message.
      queue_name(str): The message's canonical queue.
      digest(str): The lock's digest.
      message_id(str): The message.
      lock(str): The lock type, e.g. ``"until_executed"``.
    """

    actor_name: str
    queue_name: str
    digest: str
    message_id: str
    lock: str

    def event(self, kind: str, **details: Any) -> LockEvent:
        """The event of ``kind`` about this lock, with the other fields of :class:`LockEvent` in ``details``."""
        return LockEvent(
            kind=kind,
            actor_name=self.actor_name,
            queue_name=self.queue_name,
            digest=self.digest,
            message_id=self.message_id,
            lock=self.lock,
            **details,
        )


#: A subscriber: called with each event of the kinds it subscribed to; what it returns is ignored.
Subscriber = Callable[[LockEvent], object]


class Events:
    """Subscribers, by event kind, and the delivery of events to them.

    Subscribers are called in the thread where the event happens, in the
    order they subscribed, inside Dramatiq's hooks: they should be quick. One
    that raises is logged and the lock operation goes on as if it had not
    been called.

    Parameters:
      logger(logging.Logger): Where failing subscribers are reported.
    """

    def __init__(self, *, logger: logging.Logger):
        self.logger = logger
        self._mutex = threading.Lock()
        reset_in_child(self._reset_in_child)
        # Replaced whole on every change, so that emit() reads it without the mutex.
        self._subscribers: dict[str, tuple[Subscriber, ...]] = {}
        #: Called with (actor_name, kind) of every event, whether or not it is built.
        self._counters: tuple[Callable[[str, str], None], ...] = ()
        #: Subscribers that failed before: later failures are logged without a traceback.
        self._failed: set[int] = set()

    def subscribe(self, kind: str | Iterable[str], callback: Subscriber) -> None:
        """Call ``callback`` with every event of ``kind`` (a kind, or several).

        Raises:
          ValueError: If a kind is not one of :data:`EVENT_KINDS`.
        """
        kinds = self._kinds(kind)
        with self._mutex:
            subscribers = dict(self._subscribers)
            for k in kinds:
                subscribers[k] = (*subscribers.get(k, ()), callback)
            self._subscribers = subscribers

    def unsubscribe(self, kind: str | Iterable[str], callback: Subscriber) -> None:
        """Stop calling ``callback`` for ``kind``; a callback that was not subscribed is ignored."""
        kinds = self._kinds(kind)
        with self._mutex:
            subscribers = dict(self._subscribers)
            for k in kinds:
                remaining = tuple(s for s in subscribers.get(k, ()) if s != callback)
                if remaining:
                    subscribers[k] = remaining
                else:
                    subscribers.pop(k, None)
            self._subscribers = subscribers

    def add_counter(self, counter: Callable[[str, str], None]) -> None:
        """Call ``counter(actor_name, kind)`` for every event of every kind.

        A counter costs no event object: events are built only for the kinds
        somebody subscribed to. It must not raise.
        """
        with self._mutex:
            self._counters = (*self._counters, counter)

    def notify(self, kind: str, actor_name: str, build: Callable[[], LockEvent]) -> None:
        """Count an event of ``kind`` about ``actor_name``, and call the subscribers
        of its kind with the event ``build()`` returns, built only if there are any."""
        self.count(actor_name, kind)
        if kind in self._subscribers:
            self.deliver(build())

    def count(self, actor_name: str, kind: str) -> None:
        """Count an event of ``kind`` about ``actor_name``, whether or not it is built. With
        :meth:`wants` and :meth:`deliver`, :meth:`notify` for a caller that would otherwise
        make a function to build the event for every message."""
        for counter in self._counters:
            counter(actor_name, kind)

    def wants(self, kind: str) -> bool:
        """Whether anybody subscribed to events of ``kind``: if not, none is built."""
        return kind in self._subscribers

    def notify_about(self, subject: EventSubject, kind: str, **details: Any) -> None:
        """:meth:`notify` of an event of ``kind`` about ``subject``, with the
        fields of :class:`LockEvent` given in ``details``."""
        self.notify(kind, subject.actor_name, lambda: subject.event(kind, **details))

    def emit(self, event: LockEvent) -> None:
        """Count the event and call the subscribers of its kind; none of them can make this raise."""
        self.count(event.actor_name, event.kind)
        self.deliver(event)

    def deliver(self, event: LockEvent) -> None:
        """Call the subscribers of the event's kind, and count nothing: it was counted already."""
        for callback in self._subscribers.get(event.kind, ()):
            try:
                callback(event)
            except Exception as e:
                first = id(callback) not in self._failed
                self._failed.add(id(callback))
                self.logger.error(
                    "The subscriber %r of %r events failed on the event of message %r of actor %r: %r. "
                    "Locking went on as if it had not been called.",
                    callback,
                    event.kind,
                    event.message_id,
                    event.actor_name,
                    e,
                    exc_info=first or self.logger.isEnabledFor(logging.DEBUG),
                )

    def _reset_in_child(self) -> None:
        # A thread of the parent may have held the mutex at the fork.
        self._mutex = threading.Lock()

    @staticmethod
    def _kinds(kind: str | Iterable[str]) -> tuple[str, ...]:
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        unknown = sorted(set(kinds) - EVENT_KINDS)
        if unknown or not kinds:
            raise ValueError(
                f"Cannot subscribe to events of kind {', '.join(map(repr, unknown)) or 'none'}: "
                f"valid kinds are {', '.join(map(repr, sorted(EVENT_KINDS)))}."
            )
        return kinds
