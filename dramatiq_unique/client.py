"""The client side: every enqueue passes here, a new send, a re-enqueue or Dramatiq's own.

A new send takes the enqueue lock, or meets a conflict that its strategy
resolves; Dramatiq re-enqueuing a message that took its lock before (a retry,
a reschedule, a due delayed message) re-enters that lock; where Dramatiq
itself enqueues a new message (a pipeline's next step, a callback), nobody
could see an error, so a message that cannot take its lock tries again later.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, NoReturn, cast

from dramatiq import Broker, Message
from dramatiq.broker import MessageProxy

from .backends import Acquisition
from .conflicts import TRY_AGAIN, conflict_of, strategy_for, waited_in_line
from .digest import encodes_as_utf8
from .errors import EnqueueCancelled, LockArgumentsError, LockBackendError
from .events import BACKEND_ERROR, CONFLICT
from .events import RESCHEDULED as RESCHEDULED_EVENT
from .keys import ENQUEUE
from .lock import LockFactory, MessageLock
from .options import ActorConfigs, LockConfig, MessageOptionsCheck
from .outage import Outage
from .outcome import (
    DUPLICATE,
    ENQUEUED,
    OUTCOME_OPTION,
    REJECTED,
    RESCHEDULED,
    UNLOCKED,
    WAITING,
    EnqueueOutcome,
    enqueue_outcome,
    has_followers,
    record_outcome,
    send_later,
)
from .strategies import CLIENT

#: The options of Dramatiq's Callbacks and Retries that name an actor sent when a message ends.
_CALLBACK_OPTIONS = ("on_success", "on_failure", "on_retry_exhausted")


class _Thread(threading.local):
    """What the client side knows about the thread that enqueues."""

    #: The MessageLock whose enqueue lock the enqueue under way has just taken.
    taken: MessageLock | None = None
    #: Whether this is a consumer thread: it enqueues only to move due delayed messages to their queues.
    consumer = False


class ClientSide:
    """The ``broker.enqueue`` guard and ``before_enqueue``.

    Parameters:
      configs(ActorConfigs): The lock options of actors and messages.
      locks(LockFactory): Builds a message's locks.
      outage(Outage): What a backend failure does.
      processed(collections.abc.Callable): The worker side's answer to which
        message this thread processes, and its locks (``None``, ``None`` outside a worker thread).
      check_store(collections.abc.Callable): Checks the lock store's eviction policy the first
        time it is called, before the first enqueue lock is taken; later calls cost nothing.
      logger(logging.Logger): The middleware's logger.
      interrupted(collections.abc.Callable): Whether a message was interrupted because its
        holder was asked to stop: Dramatiq's retry of it is dropped.
    """

    def __init__(
        self,
        *,
        configs: ActorConfigs,
        locks: LockFactory,
        outage: Outage,
        processed: Callable[[], tuple[MessageProxy | None, MessageLock | None]],
        check_store: Callable[[], None],
        logger: logging.Logger,
        interrupted: Callable[[str], bool] = lambda message_id: False,
    ):
        self.interrupted = interrupted
        self.configs = configs
        self.lock_for = locks.build
        self.outage = outage
        self.processed = processed
        self.check_store = check_store
        self.logger = logger
        self._check_message_options = MessageOptionsCheck(logger)
        self._guarded_brokers: weakref.WeakSet[Broker] = weakref.WeakSet()
        self._thread = _Thread()

    # What the thread does ------------------------------------------------------

    def consumer_thread(self) -> None:
        """This thread is one of a worker's consumer threads."""
        self._thread.consumer = True

    # The broker.enqueue guard ----------------------------------------------------

    def guard(self, broker: Broker) -> bool:
        """Wrap the broker's ``enqueue`` so that a duplicate dropped in
        ``before_enqueue`` makes ``send()`` return normally, and an
        enqueue that fails after its lock was taken gives the lock up.

        Dramatiq offers no other way: ``before_enqueue`` can only stop an
        enqueue by raising through ``send()`` (dramatiq#276).

        Returns:
          bool: Whether the broker was not guarded before.
        """
        if broker in self._guarded_brokers:
            return False
        self._guarded_brokers.add(broker)
        enqueue = broker.enqueue

        def guarded_enqueue(message: Message[Any], *, delay: int | None = None) -> Message[Any]:
            thread = self._thread
            outer, thread.taken = thread.taken, None
            try:
                return enqueue(message, delay=self._delay(message, delay))
            except EnqueueCancelled as e:
                # Raised in before_enqueue, so about a message being sent, never a worker's proxy.
                return cast("Message[Any]", e.message)
            except BaseException:
                taken = thread.taken
                if taken is not None:
                    self.outage.release(MessageLock.release_enqueue, taken, "after its enqueue failed")
                raise
            finally:
                thread.taken = outer

        broker.enqueue = guarded_enqueue  # type: ignore[method-assign]
        return True

    def _delay(self, message: Message[Any], delay: int | None) -> int | None:
        """The delay of ``message``: a new send of a debounced actor waits its quiet period, or
        the caller's longer delay. Chosen before the broker picks the delay queue; Dramatiq's
        re-enqueues, which carry the outcome of their first send, keep theirs.

        Raises:
          InvalidLockOptions: If the message's own options are not valid.
        """
        if OUTCOME_OPTION in message.options:
            return delay
        config = self.configs.for_message(message)
        if config is None or config.debounce is None:
            return delay
        return max(delay or 0, config.debounce)

    # before_enqueue ----------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        """Sort the enqueue of ``message`` and take, re-enter or pass its lock.

        Raises:
          EnqueueCancelled: The message is not enqueued; ``send()`` returns it.
          UniqueError: ``send()`` raises it.
        """
        self._check_message_options(broker, message)
        config = self.configs.for_message(message)
        if config is None:
            return
        if self.interrupted(message.message_id) and self._drops_retry_of_cancelled(message):
            raise EnqueueCancelled("The message was cancelled: it is not retried.", message)
        outcome = enqueue_outcome(message)
        if self._passes_unlocked(outcome, delay):
            return
        if outcome.status == WAITING and outcome.handoff is not None:
            self._hand_over(message, config)
            return
        if self._is_reenqueue(message, outcome):
            if config.lock.locks_at_enqueue:
                self._reenter(message, config, delay)
            return
        self._send(broker, message, config, outcome, delay)

    def _send(
        self, broker: Broker, message: Message[Any], config: LockConfig, outcome: EnqueueOutcome, delay: int | None
    ) -> None:
        # Dramatiq's own enqueues (_is_internal_enqueue, asked only on the paths that could
        # raise) have no caller to raise to: an exception would wedge a consumer or stop a
        # pipeline.
        try:
            _check_recordable(message)
            lock = self.lock_for(message, config, outcome)
        except LockArgumentsError as e:
            if not self._is_internal_enqueue(broker, message):
                # Bad lock arguments fail the send for every lock type.
                raise LockArgumentsError(f"{e} The message was not enqueued and no lock was taken.") from e.__cause__
            self.logger.error(
                "Message %r of actor %r is enqueued without a lock: %s", message.message_id, message.actor_name, e
            )
            return
        if not config.lock.locks_at_enqueue:
            lock.record_enqueued()
            return
        # A process that only sends meets the lock store here first.
        self.check_store()
        try:
            acquisition = lock.acquire_enqueue(delay, may_wait=True)
        except LockBackendError as e:
            lock.emit(BACKEND_ERROR, reason="acquisition at enqueue", error=e)
            # The script may have run and only its answer been lost: give the place back.
            lock.forget_enqueue_after_failure()
            if not self.outage.allows and self._is_internal_enqueue(broker, message):
                self._try_again_later(broker, lock, delay, f"the lock backend failed ({e})")
            self.outage.failed(message, "enqueued", e)  # raises, unless on_backend_error="allow"
            lock.record_enqueued(status=UNLOCKED)
            return
        if acquisition.acquired:
            self._thread.taken = lock
            return
        if acquisition.waiting:
            self._wait_in_line(lock, acquisition)
        self._conflict(broker, message, lock, acquisition.holders, delay)

    def _wait_in_line(self, lock: MessageLock, acquisition: Acquisition) -> NoReturn:
        message = lock.message
        holder = acquisition.holders[0] if acquisition.holders else message.message_id
        record_outcome(
            message,
            EnqueueOutcome(
                status=WAITING,
                digest=lock.digest,
                holder=holder,
                replaced=acquisition.displaced,
                position=acquisition.waiting,
                line=ENQUEUE,
            ),
        )
        waited_in_line(lock, acquisition, CLIENT)
        raise EnqueueCancelled("The message waits in the lock's line.", message)

    def _conflict(
        self, broker: Broker, message: Message[Any], lock: MessageLock, holders: tuple[str, ...], delay: int | None
    ) -> None:
        conflict = conflict_of(lock, broker=broker, holders=holders, side=CLIENT, delay=delay)
        strategy = strategy_for(message, lock.config.client_strategy)
        internal = self._is_internal_enqueue(broker, message)
        if internal and strategy.fails_send:
            strategy = TRY_AGAIN
        lock.emit(CONFLICT, side=CLIENT, strategy=strategy.name, holders=holders)
        try:
            strategy.on_client_conflict(conflict)
        except EnqueueCancelled:
            raise
        except Exception as e:
            if not internal:
                raise
            self._try_again_later(broker, lock, delay, f"its conflict strategy {strategy.name!r} raised {e!r}")

    # Sorting an enqueue --------------------------------------------------------------

    def _drops_retry_of_cancelled(self, message: Message[Any]) -> bool:
        """Whether this is Dramatiq's retry of the message this worker thread processed, which
        was interrupted because its holder was asked to stop: it is dropped."""
        processed = self.processed()[0]
        if processed is None or processed.message_id != message.message_id:
            return False
        self.logger.info(
            "Message %r of actor %r is not retried: it was cancelled.", message.message_id, message.actor_name
        )
        return True

    @staticmethod
    def _passes_unlocked(outcome: EnqueueOutcome, delay: int | None) -> bool:
        """A rejected message goes to its dead-letter queue holding no lock; a
        rescheduled one holds none on its way to the delay queue."""
        return outcome.status == REJECTED or (outcome.status == RESCHEDULED and delay is not None)

    def _is_reenqueue(self, message: Message[Any], outcome: EnqueueOutcome) -> bool:
        """Whether this is Dramatiq enqueuing a message again that took its
        lock before: a retry, or a reschedule, from the worker
        thread processing it; a due delayed message moved by a consumer; a
        publish retried by the broker. Anything else is a new send, also
        a dead-lettered message enqueued again by hand."""
        thread, message_id = self._thread, message.message_id
        for lock in (self.processed()[1], thread.taken):
            if lock is not None and lock.message_id == message_id:
                return True
        return thread.consumer and outcome.status == ENQUEUED and bool(outcome.digest) and outcome.holder == message_id

    def _is_internal_enqueue(self, broker: Broker, message: Message[Any]) -> bool:
        """Whether Dramatiq itself enqueues this new message: a consumer moving
        a due delayed message, or a worker enqueuing a pipeline's next step, a
        group's completion callback, or an ``on_success``, ``on_failure`` or
        ``on_retry_exhausted`` callback of the message it processed."""
        if self._thread.consumer:
            return True
        processed = self.processed()[0]
        if processed is None:
            return False
        options = processed.options
        followers = [options.get("pipe_target") or {}, *(options.get("group_completion_callbacks") or ())]
        if any(follower.get("message_id") == message.message_id for follower in followers):
            return True
        actor_options = broker.actors[processed.actor_name].options if processed.actor_name in broker.actors else {}
        return any((options.get(name) or actor_options.get(name)) == message.actor_name for name in _CALLBACK_OPTIONS)

    # Re-entry and trying again ----------------------------------------------------------

    def _hand_over(self, message: Message[Any], config: LockConfig) -> None:
        """A message that waited in line was handed a place, and is enqueued: it records where
        it is. It is enqueued whatever the backend answers: its place waits for it."""
        lock: MessageLock | None = None
        try:
            lock = self.lock_for(message, config)
            if lock.cut_off:
                return  # its place waits for it as the line recorded it
            lock.take_handed_place()
        except Exception as e:
            if lock is not None and isinstance(e, LockBackendError):
                lock.emit(BACKEND_ERROR, reason="hand-over", error=e)
            self.logger.warning(
                "Message %r of actor %r, handed a place by the line it waited in, is enqueued without recording it: %s",
                message.message_id,
                message.actor_name,
                e,
            )

    def _reenter(self, message: Message[Any], config: LockConfig, delay: int | None) -> None:
        # Never raises, but to drop a stale retry: an exception here would lose a retry or wedge a consumer.
        lock: MessageLock | None = None
        try:
            lock = self.lock_for(message, config)
            if lock.cut_off:
                return  # it keeps its locks as they are: it cannot take them again
            # A re-enqueue never takes another message's place.
            acquisition = lock.acquire_enqueue(delay, may_replace=False)
        except Exception as e:
            if lock is not None and isinstance(e, LockBackendError):
                lock.emit(BACKEND_ERROR, reason="acquisition at enqueue", error=e)
            self.logger.warning(
                "Message %r of actor %r is enqueued again without its lock: %s",
                message.message_id,
                message.actor_name,
                e,
                exc_info=self.logger.isEnabledFor(logging.DEBUG),
            )
            return
        if acquisition.acquired:
            return
        holders = ", ".join(map(repr, acquisition.holders))
        if config.client_strategy.replaces_queued_holders and not has_followers(message):
            # The newest message runs: an older one coming back from a retry gives way to it.
            self.logger.info(
                "Message %r of actor %r is not enqueued again: newer message %s took its lock %r (strategy 'replace').",
                message.message_id,
                message.actor_name,
                holders,
                lock.digest,
            )
            lock.emit(CONFLICT, side=CLIENT, strategy=config.client_strategy.name, holders=acquisition.holders)
            record_outcome(message, EnqueueOutcome(status=DUPLICATE, digest=lock.digest, holder=acquisition.holders[0]))
            raise EnqueueCancelled("A newer message holds the lock.", message)
        self.logger.warning(
            "Message %r of actor %r is enqueued again although its lock %r is now held by message %s: "
            "Dramatiq's own re-enqueues are never blocked.",
            message.message_id,
            message.actor_name,
            lock.digest,
            holders,
        )

    def _try_again_later(self, broker: Broker, lock: MessageLock, delay: int | None, reason: str) -> NoReturn:
        """Enqueue a message that Dramatiq itself enqueues, and that could not
        take its lock, again after ``reschedule_delay``: it tries again then."""
        message, wait = lock.message, max(delay or 0, lock.config.reschedule_delay)
        self.logger.warning(
            "Message %r of actor %r could not take its lock %r because %s; it tries again in %d ms.",
            message.message_id,
            message.actor_name,
            lock.digest,
            reason,
            wait,
        )
        lock.emit(RESCHEDULED_EVENT, delay=wait, reason=reason)
        # Not counted against max_reschedules: it met no holder.
        reschedules = enqueue_outcome(message).reschedules
        send_later(broker, message, digest=lock.digest, holder=message.message_id, reschedules=reschedules, delay=wait)


def _check_recordable(message: Message[Any]) -> None:
    """Check that the fields of ``message`` that its lock records can be stored: as UTF-8 text.

    Raises:
      LockArgumentsError: Naming the field that holds a lone surrogate (a message built by hand).
    """
    for field in ("message_id", "actor_name", "queue_name"):
        value = getattr(message, field)
        if isinstance(value, str) and not encodes_as_utf8(value):
            raise LockArgumentsError(
                f"Message {message.message_id!r} of actor {message.actor_name!r} has {field}={value!r}, which holds "
                "a lone surrogate: UTF-8 cannot encode it, and the lock store records it as UTF-8 text."
            )
