"""Running messages asked to stop, and their interruption.

A holder is asked to stop by a mark in its own record in the lock store
(``LockBackend.request_stop``); its worker learns it in the answer to the lease
renewal its heartbeat thread makes anyway, and that thread interrupts the
message's worker thread as Dramatiq's ``TimeLimit`` does, with
:class:`~dramatiq_unique.Cancelled`. The runtime owns one :class:`Cancellations`
per process; the heartbeat thread hands it plain data only: a thread's id and
what the lock is about.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from dramatiq import Broker
from dramatiq.broker import MessageProxy
from dramatiq.middleware import raise_thread_exception
from dramatiq.results import Results

from .errors import Cancelled, LockBackendError
from .events import BACKEND_ERROR, CANCELLED, EventSubject
from .forks import reset_in_child
from .keys import RUN
from .native import gevent_patched

if TYPE_CHECKING:
    from .lock import MessageLock


class Cancellations:
    """The messages of this process interrupted because their holder was asked to stop.

    Parameters:
      logger(logging.Logger): Where to tell of each interruption.
    """

    def __init__(self, *, logger: logging.Logger):
        self.logger = logger
        self._mutex = threading.Lock()
        #: The messages interrupted, by message_id, with their lock's digest, until they left.
        self._interrupted: dict[str, str] = {}
        reset_in_child(self._reset_in_child)

    def _reset_in_child(self) -> None:
        self._mutex = threading.Lock()
        self._interrupted = {}

    def interrupt(self, thread: int, subject: EventSubject) -> None:
        """Interrupt the message of ``subject``, which runs in the thread whose id is ``thread``:
        its holder was asked to stop. Called by the heartbeat thread while the message still
        holds its lease; a message is interrupted once."""
        if gevent_patched():
            # A greenlet cannot be interrupted from this native thread: the holder runs to its end.
            with self._mutex:
                if self._interrupted.setdefault(subject.message_id, "") == "":
                    self.logger.warning(
                        "Message %r of actor %r was asked to stop (lock %r), but a message under gevent cannot be "
                        "interrupted: it runs to its end.",
                        subject.message_id,
                        subject.actor_name,
                        subject.digest,
                    )
                    self._interrupted[subject.message_id] = "-"
            return
        with self._mutex:
            if subject.message_id in self._interrupted:
                return
            self._interrupted[subject.message_id] = subject.digest
        self.logger.warning(
            "Message %r of actor %r was asked to stop while it ran (lock %r): it is interrupted with Cancelled.",
            subject.message_id,
            subject.actor_name,
            subject.digest,
        )
        raise_thread_exception(thread, Cancelled)  # type: ignore[no-untyped-call, unused-ignore]

    def interrupted(self, message_id: str) -> bool:
        """Whether the message was interrupted and has not left yet."""
        return self._interrupted.get(message_id, "-") != "-"

    def forget(self, message_id: str) -> None:
        """The message left the worker."""
        if self._interrupted:
            with self._mutex:
                self._interrupted.pop(message_id, None)


def ask_to_stop(lock: MessageLock, holders: tuple[str, ...]) -> None:
    """The message of ``lock`` waits in the run lock's line (``cancel_in_progress``): ask the
    running ``holders`` to stop. Never raises: without an answer it waits until they finish."""
    message = lock.message
    try:
        asked = lock.ask_holders_to_stop(holders)
    except LockBackendError as e:
        lock.emit(BACKEND_ERROR, reason="request to stop", error=e)
        lock.logger.warning(
            "Message %r of actor %r could not ask running message %s to stop (lock %r): %s. It waits until they end.",
            message.message_id,
            message.actor_name,
            ", ".join(map(repr, holders)),
            lock.digest,
            e,
        )
        return
    if asked:
        lock.logger.info(
            "Message %r of actor %r asked running message %s to stop (lock %r, strategy %r); it runs once stopped.",
            message.message_id,
            message.actor_name,
            ", ".join(map(repr, asked)),
            lock.digest,
            lock.config.server_strategy.name,
        )


def tell_cancelled(broker: Broker, message: MessageProxy, lock: MessageLock, exception: BaseException) -> None:
    """The message of ``lock`` was interrupted with ``Cancelled``: log it, tell the event, and
    store the error for a Results backend. Never raises (it runs in a Dramatiq hook)."""
    try:
        fate = (
            "it had used up its retries, so Dramatiq dead-letters it"
            if message.failed
            else "it is neither retried nor dead-lettered"
        )
        lock.logger.warning(
            "Message %r of actor %r was cancelled while it ran: it was asked to stop while it held lock %r; %s.",
            message.message_id,
            message.actor_name,
            lock.digest,
            fate,
        )
        lock.emit(CANCELLED, lock_kind=RUN)
        _store_error(broker, message, lock.digest)
    except Exception:
        lock.logger.exception("What became of cancelled message %r could not be told.", message.message_id)


def _store_error(broker: Broker, message: MessageProxy, digest: str) -> None:
    """Store the error in a Results backend, for an actor that stores results: its caller
    sees ``Cancelled``, not a timeout."""
    for middleware in broker.middleware:
        if not isinstance(middleware, Results):
            continue
        actor = broker.get_actor(message.actor_name)
        store = message.options.get("store_results", actor.options.get("store_results", middleware.store_results))
        if store:
            ttl = message.options.get("result_ttl", actor.options.get("result_ttl", middleware.result_ttl))
            error = Cancelled(
                f"Message {message.message_id} was cancelled: its holder of lock {digest} was asked to stop."
            )
            middleware.backend.store_exception(message, error, ttl)
