"""The worker side: a message's locks when it starts and when it leaves the worker.

What a message does with its locks at each step follows from its lock
type's facts (see :class:`~dramatiq_unique.locks.LockType`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any, NoReturn

from dramatiq import Actor, Broker, Message
from dramatiq.broker import MessageProxy
from dramatiq.middleware import SkipMessage

from .backends import Acquisition
from .cancellation import Cancellations
from .conflicts import TRY_AGAIN, conflict_of, strategy_for, waited_in_line
from .current import _set_current_lock
from .errors import LockBackendError, LockStoreHealing
from .events import BACKEND_ERROR, CONFLICT
from .keys import RUN
from .lock import LockFactory, MessageLock
from .options import ActorConfigs
from .outage import Outage
from .outcome import REJECTED, EnqueueOutcome, enqueue_outcome, plain_message
from .retold import RETOLD
from .stop_requests import ask_to_stop, tell_cancelled
from .strategies import SERVER


class _Thread(threading.local):
    """What the worker side knows about the worker thread."""

    #: The message this thread processes, locked or not.
    message: MessageProxy | None = None
    #: Its locks, once they are built.
    processing: MessageLock | None = None


#: How often, at most, a message that waits for the healing of the store says so at WARNING (s).
HEALING_WARNING_EVERY = 60.0


class WorkerSide:
    """``before_process_message`` and the end of a message in the worker.

    Parameters:
      configs(ActorConfigs): The lock options of actors and messages.
      locks(LockFactory): Builds a message's locks.
      outage(Outage): What a backend failure does.
      logger(logging.Logger): The middleware's logger.
      cancellations(Cancellations): This process's messages interrupted because their holder
        was asked to stop.
    """

    def __init__(
        self,
        *,
        configs: ActorConfigs,
        locks: LockFactory,
        outage: Outage,
        logger: logging.Logger,
        cancellations: Cancellations | None = None,
    ):
        self.cancellations = cancellations
        self.configs = configs
        self.lock_for = locks.build
        self.outage = outage
        self.logger = logger
        self._thread = _Thread()
        #: The actors whose function tells when it returns (:meth:`watch_return`).
        self._watched: set[str] = set()
        #: When a message last waited for the healing of the store with a WARNING (monotonic, s).
        self._warned_of_healing = -HEALING_WARNING_EVERY

    def processed(self) -> tuple[MessageProxy | None, MessageLock | None]:
        """The message this thread processes, if it is a worker thread, and
        its locks once they are built: the client side asks, to tell
        Dramatiq's own enqueues from new sends."""
        thread = self._thread
        return thread.message, thread.processing

    def start(self, broker: Broker, message: MessageProxy) -> None:
        """Take what the message's lock type holds while it runs, before its actor runs.

        Raises:
          SkipMessage: The message must not run: rejected, replaced, or a duplicate.
          UniqueError: Its conflict strategy or the outage policy stops it.
        """
        thread = self._thread
        thread.processing = None
        # Every message, locked or not: its pipeline's next step is enqueued from here.
        thread.message = message
        sent = plain_message(message)
        config = self.configs.for_message(sent)
        if config is None:
            return
        outcome = enqueue_outcome(sent)
        if outcome.status == REJECTED:
            self._dead_letter(message, outcome)
        lock = self.lock_for(message, config, outcome)
        lock.interruptible = lock.actor_name in self._watched
        thread.processing = lock
        if lock.cut_off and not self.outage.allows:
            self._enqueue_again(broker, lock, logging.INFO, "this worker cannot reach the lock store")
        try:
            acquisition = self._take(lock)
        except LockStoreHealing as e:
            lock.emit(BACKEND_ERROR, reason="start", error=e)
            if not self.outage.allows:
                self._wait_for_healing(broker, lock, e)
            self.outage.failed(message, "run", e)
            acquisition = None
        except LockBackendError as e:
            lock.emit(BACKEND_ERROR, reason="start", error=e)
            self.outage.failed(message, "run", e)  # raises, unless on_backend_error="allow"
            acquisition = None
        if lock.handoff is not None and lock.liveness is not None:
            # A message handed its place by a line: it no longer waits, if this process parked it.
            lock.liveness.unpark(lock.message_id)
        if lock.superseded:
            self.logger.info(
                "Message %r of actor %r is skipped: a newer message took its place in lock %r (strategy 'replace').",
                message.message_id,
                message.actor_name,
                lock.digest,
            )
            raise SkipMessage("A newer message replaced this one.")
        if lock.started_before:
            self.logger.info(
                "Message %r of actor %r is skipped: it waited in the line of lock %r, and a copy of it started "
                "already.",
                message.message_id,
                message.actor_name,
                lock.digest,
            )
            raise SkipMessage("A copy of this message started already.")
        if acquisition is not None and acquisition.waiting:
            waited_in_line(lock, acquisition, SERVER)
            if lock.liveness is not None:
                # Acked by the broker: from now on it lives only in the lock store.
                lock.liveness.park(lock.run_key, lock.message_id, lock.actor_name)
            # Its INFO line says it waits: Dramatiq's "was skipped" WARNING is left out.
            RETOLD.waits(message.message_id)
            if lock.config.server_strategy.cancels_running_holders:
                ask_to_stop(lock, acquisition.holders)
            raise SkipMessage("The message waits in the lock's line.")
        if acquisition is not None and not acquisition.acquired:
            self._conflict(broker, lock, acquisition.holders)
        _set_current_lock(lock.held())

    def enqueued(self, message: Message[Any]) -> None:
        """Dramatiq enqueued ``message``: if this thread processes it (a retry), that copy keeps its enqueue lock."""
        processing = self._thread.processing
        if processing is not None and processing.message_id == message.message_id:
            processing.requeued = True

    def stopped(self, broker: Broker, message: MessageProxy, exception: BaseException) -> None:
        """The message was interrupted with ``Cancelled``: tell what became of it, before
        :meth:`finish` gives its locks up."""
        lock = self._thread.processing
        if lock is not None and lock.message_id == message.message_id:
            by = None if self.cancellations is None else self.cancellations.asked_by(message.message_id)
            tell_cancelled(broker, message, lock, exception, by)

    def finish(self, message: MessageProxy) -> None:
        """The message leaves the worker: it ran, raised, or was skipped. Give up what it no longer holds."""
        _set_current_lock(None)
        RETOLD.clear()
        try:
            self._leave(message)
        finally:
            # Only once its lease is dropped: until then a renewal may still answer that its
            # holder was asked to stop, and the message must still count as interrupted once.
            if self.cancellations is not None:
                self.cancellations.forget(message.message_id)

    def _leave(self, message: MessageProxy) -> None:
        thread = self._thread
        thread.message = None
        lock, thread.processing = thread.processing, None
        if lock is None or (lock.message is not message and lock.message_id != message.message_id):
            # An earlier middleware skipped the message before we saw it
            # (AgeLimit): it gives up the enqueue lock it recorded, if any.
            sent = plain_message(message)
            config = self.configs.for_message(sent)
            if config is None or not enqueue_outcome(sent).digest:
                return
            lock = self.lock_for(message, config)
            if lock.handoff is not None and lock.handed_by == RUN:
                # A copy that a run lock's line handed a place, which it would have taken as it
                # started: the line goes on without it.
                self.outage.release(MessageLock.give_up_handed_run_place, lock, "after it was skipped")
        self.outage.release(self._give_up, lock, "after it was processed")

    def watch_return(self, actor: Actor[Any, Any]) -> None:
        """Have ``actor``'s function tell the message's lock as it returns or raises
        (:meth:`~dramatiq_unique.lock.MessageLock.actor_returned`): a message asked to stop is
        interrupted only while its actor runs, never in the hooks of other middleware after it.
        Once only per actor."""
        fn = actor.fn
        if getattr(fn, "__watched_by_unique_jobs__", False):
            return  # another middleware's: its messages are not interrupted here
        thread, actor_name = self._thread, actor.actor_name

        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                # Inline, as it runs for every message: only a message that holds a lease (its
                # run lock's) is ever interrupted, and only by its own actor's return.
                lock = thread.processing
                if lock is not None and lock.run_owner is not None and lock.actor_name == actor_name:
                    lock.actor_returned()

        watched.__watched_by_unique_jobs__ = True  # type: ignore[attr-defined]
        actor.fn = watched
        self._watched.add(actor_name)

    @staticmethod
    def _take(lock: MessageLock) -> Acquisition | None:
        """Take or keep the locks the message holds while it runs.

        Returns:
          Acquisition: A failed acquisition of the run lock when the message
          must not run now (its conflict strategy decides what becomes of it).
        """
        lock_type = lock.config.lock
        if lock_type.takes_run_lock:
            return lock.swap_enqueue_for_run() if lock_type.locks_at_enqueue else lock.acquire_run()
        if lock_type.holds_enqueue_lock_while_running:
            lock.start_holding_enqueue()
        else:
            lock.start_releasing_enqueue()
        return None

    @staticmethod
    def _give_up(lock: MessageLock) -> None:
        lock.release_run()
        # A copy that Dramatiq enqueued again meanwhile (a retry) keeps the enqueue lock.
        if not lock.requeued and not lock.config.lock.outlives_message:
            lock.release_enqueue(background=True)

    def _conflict(self, broker: Broker, lock: MessageLock, holders: tuple[str, ...]) -> None:
        message = lock.message
        conflict = conflict_of(lock, broker=broker, holders=holders, side=SERVER)
        strategy = strategy_for(message, lock.config.server_strategy)
        if message.message_id in holders:
            # A redelivery met the run lock of its own earlier attempt, whose worker died or
            # which the broker gave up on: it is no duplicate to drop, so it tries again
            # once that attempt has finished or its lease has run out.
            strategy = TRY_AGAIN
        lock.emit(CONFLICT, side=SERVER, strategy=strategy.name, holders=holders)
        strategy.on_server_conflict(conflict)

    def _wait_for_healing(self, broker: Broker, lock: MessageLock, error: LockStoreHealing) -> NoReturn:
        """The store heals after a loss of its data, for a few heartbeat intervals."""
        # One WARNING a minute at most (a healing lasts a few heartbeat intervals), INFO for the others.
        now = time.monotonic()
        level = logging.WARNING if now - self._warned_of_healing > HEALING_WARNING_EVERY else logging.INFO
        if level == logging.WARNING:
            self._warned_of_healing = now
        self._enqueue_again(broker, lock, level, str(error))

    def _enqueue_again(self, broker: Broker, lock: MessageLock, level: int, reason: str) -> NoReturn:
        """The message does not run now, for want of the lock store: it is enqueued again
        after ``reschedule_delay``, its retries and reschedules untouched."""
        message = lock.message
        # Never sooner than a heartbeat: the store is seen to answer again, or to have healed, at one.
        liveness = lock.liveness
        delay = max(lock.config.reschedule_delay, liveness.heartbeat_interval if liveness is not None else 0)
        self.logger.log(
            level,
            "Message %r of actor %r is enqueued again to start in %d ms: %s",
            message.message_id,
            message.actor_name,
            delay,
            reason,
        )
        # The copy keeps the message_id, so it keeps the enqueue lock the message holds.
        broker.enqueue(message.copy(), delay=delay)
        raise SkipMessage(f"The message is enqueued again: {reason}.")

    def _dead_letter(self, message: MessageProxy, outcome: EnqueueOutcome) -> NoReturn:
        """A message marked rejected (its ``outcome``) goes to the dead-letter queue unrun."""
        self.logger.info(
            "Message %r of actor %r is dead-lettered without running: %s.",
            message.message_id,
            message.actor_name,
            outcome.reason,
        )
        message.fail()
        raise SkipMessage("The message was rejected as a duplicate.")
