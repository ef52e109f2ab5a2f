"""The middleware: it turns Dramatiq's hooks into lock operations."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from dramatiq import Broker, Message, Middleware
from dramatiq.actor import Actor
from dramatiq.logging import get_logger
from dramatiq.middleware import Retries, SkipMessage

from .backends import LockBackend
from .crash import RAISE, CrashSafety, check_crash_options
from .current import _set_current_lock
from .errors import EnqueueCancelled, InvalidLockOptions, LockBackendError
from .liveness import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_PERIOD, Liveness
from .lock import MessageLock
from .options import DEFAULT_LOCK_PREFIX, DEFAULT_RESCHEDULE_DELAY, DEFAULTS, MESSAGE_OPTIONS, LockConfig, resolve
from .outcome import REJECTED, RESCHEDULED, EnqueueOutcome, enqueue_outcome
from .reaper import DEFAULT_REAPER_INTERVAL, Reaper
from .strategies import CLIENT, SERVER, Conflict
from .strategies.reject import dead_letter_if_rejected
from .strategies.reschedule import Reschedule

#: What becomes of a message whose run lock is held by its own earlier attempt.
_REDELIVERY_STRATEGY = Reschedule()


class UniqueJobs(CrashSafety, Middleware):
    """Middleware that gives actors job-uniqueness locks.

    Add it to the broker before declaring actors, ahead of ``TimeLimit``, so
    that it sees Retries' verdict and its own calls are never interrupted::

        broker.add_middleware(UniqueJobs(backend=RedisBackend(url=...)), before=TimeLimit)

    Each keyword argument below is also an actor option (``@dramatiq.actor(lock=...)``)
    and, except ``lock_args_method``, a message option (``send_with_options``);
    the message's value wins over the actor's, which wins over the one given here.

    Parameters:
      backend(LockBackend): Where locks are stored.
      lock(str): The lock type: ``"until_executing"``, ``"until_executed"``,
        ``"until_expired"``, ``"while_executing"`` or ``"until_and_while_executing"``.
        ``None`` (the default) leaves actors without uniqueness.
      on_conflict(str|dict): The conflict strategy, or ``{"client": ..., "server": ...}``.
      lock_limit(int): How many messages of one digest may hold the lock at once.
      lock_ttl(int): Milliseconds after which a lock lapses; ``None`` for never.
      lock_args_method(callable): Called with a message's arguments, returns
        the JSON value that decides uniqueness. Defaults to all arguments.
      lock_prefix(str): The prefix of every key.
      unique_across_queues(bool): Leave the queue out of the digest.
      unique_across_actors(bool): Leave the actor out of the digest.
      reschedule_delay(int): Milliseconds before a rescheduled duplicate tries again.
      max_reschedules(int): How often a duplicate may be rescheduled; ``None`` for no limit.

    These are options of the middleware only (see docs/crash-safety.md):

    Parameters:
      lease_period(int): Milliseconds a run lock is held without a renewal: a
        worker renews the run locks of the messages it runs, and a dead
        worker's run locks are free again within this time (SPEC R1).
      heartbeat_interval(int): Milliseconds between two heartbeats of a worker
        process; at most a third of ``lease_period``.
      on_backend_error(str): What happens when the lock backend cannot be
        reached (SPEC S6): ``"raise"`` (``send()`` raises ``LockBackendError``;
        in a worker the message fails and is retried) or ``"allow"`` (log a
        warning and go on without the lock).
      reaper(bool): Declare the orphan reaper actor on the broker, and let
        workers send it every ``reaper_interval`` (SPEC R2).
      reaper_interval(int): Milliseconds between two runs of the reaper,
        across all workers; ``None`` to schedule ``reaper_actor`` yourself.
      reaper_queue(str): The queue of the reaper actor.
    """

    def __init__(
        self,
        *,
        backend: LockBackend,
        lock: str | None = None,
        on_conflict: Any = "log",
        lock_limit: int = 1,
        lock_ttl: int | None = None,
        lock_args_method: Callable[..., Any] | None = None,
        lock_prefix: str = DEFAULT_LOCK_PREFIX,
        unique_across_queues: bool = False,
        unique_across_actors: bool = False,
        reschedule_delay: int = DEFAULT_RESCHEDULE_DELAY,
        max_reschedules: int | None = None,
        lease_period: int = DEFAULT_LEASE_PERIOD,
        heartbeat_interval: int = DEFAULT_HEARTBEAT_INTERVAL,
        on_backend_error: str = RAISE,
        reaper: bool = False,
        reaper_interval: int | None = DEFAULT_REAPER_INTERVAL,
        reaper_queue: str = "default",
    ):
        self.logger = get_logger(__name__, type(self))
        self.backend = backend
        check_crash_options(
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            on_backend_error=on_backend_error,
            reaper_interval=reaper_interval,
        )
        self.on_backend_error = on_backend_error
        self.liveness = Liveness(
            backend,
            prefix=lock_prefix,
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            logger=self.logger,
        )
        self.reaper = Reaper(backend, prefix=lock_prefix, logger=self.logger)
        self.reaper_enabled = reaper
        self.reaper_interval = reaper_interval
        self.reaper_queue = reaper_queue
        self.reaper_actor: Actor[Any, Any] | None = None
        if reaper and reaper_interval is not None:
            self.liveness.on_tick = self._maybe_trigger_reaper
        self.defaults = {
            "lock": lock,
            "on_conflict": on_conflict,
            "lock_limit": lock_limit,
            "lock_ttl": lock_ttl,
            "lock_args_method": lock_args_method,
            "lock_prefix": lock_prefix,
            "unique_across_queues": unique_across_queues,
            "unique_across_actors": unique_across_actors,
            "reschedule_delay": reschedule_delay,
            "max_reschedules": max_reschedules,
        }
        self._default_config = resolve("UniqueJobs", self.defaults)
        #: The merged options and the resolved config of each declared actor.
        self._actors: dict[str, tuple[dict[str, Any], LockConfig | None]] = {}
        self._guarded_brokers: weakref.WeakSet[Broker] = weakref.WeakSet()
        # Per thread: .processing is the MessageLock of the message this worker
        # thread processes; .taken is the MessageLock whose enqueue lock the
        # enqueue under way has just taken.
        self._local = threading.local()

    @property
    def actor_options(self) -> set[str]:
        return set(DEFAULTS)

    # Actor declaration -------------------------------------------------------

    def before_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        self._declare(broker, actor)

    def after_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        # Broker.add_middleware replays this hook for actors declared earlier.
        self._declare(broker, actor)

    def _declare(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        options = {**self.defaults, **{k: v for k, v in actor.options.items() if k in DEFAULTS}}
        config = resolve(f"Actor {actor.actor_name!r}", options)
        self._actors[actor.actor_name] = (options, config)
        # Workers are known alive, and orphans reaped, under every lock prefix in use (issue 8, defect 4).
        self.liveness.add_prefix(options["lock_prefix"])
        self.reaper.add_prefix(options["lock_prefix"])
        self._guard_enqueue(broker)

    def _guard_enqueue(self, broker: Broker) -> None:
        """Wrap the broker's ``enqueue`` so that a duplicate dropped in
        ``before_enqueue`` makes ``send()`` return normally (SPEC C6), and an
        enqueue that fails after its lock was taken gives the lock up (SPEC R5).

        Dramatiq offers no other way: ``before_enqueue`` can only stop an
        enqueue by raising through ``send()`` (dramatiq#276).
        """
        if broker in self._guarded_brokers:
            return
        self._guarded_brokers.add(broker)
        enqueue = broker.enqueue

        def guarded_enqueue(message: Message[Any], *, delay: int | None = None) -> Message[Any]:
            return self._enqueue(enqueue, message, delay)

        broker.enqueue = guarded_enqueue  # type: ignore[method-assign]

        retries = [i for i, m in enumerate(broker.middleware) if isinstance(m, Retries)]
        if retries and self in broker.middleware and broker.middleware.index(self) > retries[0]:
            self.logger.warning(
                "UniqueJobs was added after Retries, so it cannot see whether a failed message will be retried. "
                "Add it with broker.add_middleware(..., before=TimeLimit)."
            )

    def _enqueue(self, enqueue: Callable[..., Message[Any]], message: Message[Any], delay: int | None):
        outer, self._local.taken = getattr(self._local, "taken", None), None
        try:
            return enqueue(message, delay=delay)
        except EnqueueCancelled as e:
            return e.message
        except BaseException:
            taken = self._local.taken
            if taken is not None:
                self._release(taken.release_enqueue, taken.message, "after its enqueue failed")
            raise
        finally:
            self._local.taken = outer

    # Client side -------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        config = self._config_for(message)
        if config is None:
            return
        outcome = enqueue_outcome(message)
        if self._passes_unlocked(outcome, delay):
            return
        if self._is_reenqueue(message, outcome):
            if config.lock.locks_at_enqueue:
                self._reenter(message, config, delay)
            return

        # Bad lock arguments fail the send for every lock type (SPEC D6).
        lock = MessageLock.for_message(
            backend=self.backend, config=config, message=message, logger=self.logger, liveness=self.liveness
        )
        if not config.lock.locks_at_enqueue:
            lock.record_enqueued()
            return
        try:
            acquisition = lock.acquire_enqueue(delay)
        except LockBackendError as e:
            # The script may have run and only its answer been lost.
            self._release(lock.release_enqueue, message, "after the lock backend failed to answer")
            self._backend_failed(message, "enqueued", e)  # raises, unless on_backend_error="allow"
            lock.record_enqueued()
            return
        if acquisition.acquired:
            self._local.taken = lock
            return
        conflict = Conflict(broker, message, lock, acquisition.holders, CLIENT, self.logger)
        config.client_strategy.on_client_conflict(conflict)

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        processing = getattr(self._local, "processing", None)
        if processing is not None and processing.message.message_id == message.message_id:
            processing.requeued = True

    def _is_reenqueue(self, message: Message[Any], outcome: EnqueueOutcome) -> bool:
        """Whether this is Dramatiq enqueuing a message again (a retry, a
        delay-queue move, a publish retry) rather than a new send (SPEC L6)."""
        if outcome.enqueued and outcome.digest and outcome.holder == message.message_id:
            return True
        processing = getattr(self._local, "processing", None)
        return processing is not None and processing.message.message_id == message.message_id

    @staticmethod
    def _passes_unlocked(outcome: EnqueueOutcome, delay: int | None) -> bool:
        """A rejected message goes to its dead-letter queue holding no lock; a
        rescheduled one holds none on its way to the delay queue (SPEC C3, C5)."""
        return outcome.status == REJECTED or (outcome.status == RESCHEDULED and delay is not None)

    def _reenter(self, message: Message[Any], config: LockConfig, delay: int | None) -> None:
        # Never raises: an exception here would lose a retry or wedge a consumer.
        try:
            lock = MessageLock.for_message(
                backend=self.backend, config=config, message=message, logger=self.logger, liveness=self.liveness
            )
            acquisition = lock.acquire_enqueue(delay)
        except Exception:
            self.logger.error(
                "Message %r of actor %r is enqueued again without its lock: the lock backend failed.",
                message.message_id,
                message.actor_name,
                exc_info=True,
            )
            return
        if not acquisition.acquired:
            self.logger.warning(
                "Message %r of actor %r is enqueued again although its lock %r is now held by message %s: "
                "Dramatiq's own re-enqueues are never blocked.",
                message.message_id,
                message.actor_name,
                lock.digest,
                ", ".join(map(repr, acquisition.holders)),
            )

    # Server side -------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: Message[Any]) -> None:
        self._local.processing = None
        config = self._config_for(message)
        if config is None:
            return
        dead_letter_if_rejected(message, self.logger)
        lock = MessageLock.for_message(
            backend=self.backend, config=config, message=message, logger=self.logger, liveness=self.liveness
        )
        self._local.processing = lock
        try:
            acquisition = config.lock.start(lock)
        except LockBackendError as e:
            self._backend_failed(message, "run", e)  # raises, unless on_backend_error="allow"
            acquisition = None
        if lock.superseded:
            self.logger.info(
                "Message %r of actor %r is skipped: a newer message took its place in lock %r (strategy 'replace').",
                message.message_id,
                message.actor_name,
                lock.digest,
            )
            raise SkipMessage("A newer message replaced this one.")
        if acquisition is not None and not acquisition.acquired:
            conflict = Conflict(broker, message, lock, acquisition.holders, SERVER, self.logger)
            strategy = config.server_strategy
            if set(acquisition.holders) == {message.message_id}:
                # A redelivery met the run lock of its own earlier attempt, whose worker died or
                # which the broker gave up on: it is no duplicate to drop, so it tries again
                # once that attempt has finished or its lease has run out (SPEC L7, R1).
                strategy = _REDELIVERY_STRATEGY
            strategy.on_server_conflict(conflict)
        _set_current_lock(lock.held())

    def after_process_message(
        self, broker: Broker, message: Message[Any], *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        self._finish(message)

    def after_skip_message(self, broker: Broker, message: Message[Any]) -> None:
        self._finish(message)

    def _finish(self, message: Message[Any]) -> None:
        _set_current_lock(None)
        lock, self._local.processing = getattr(self._local, "processing", None), None
        if lock is None or lock.message.message_id != message.message_id:
            # An earlier middleware skipped the message before we saw it
            # (AgeLimit): it gives up the enqueue lock it recorded, if any.
            config = self._config_for(message)
            if config is None or not enqueue_outcome(message).digest:
                return
            lock = MessageLock.for_message(
                backend=self.backend, config=config, message=message, logger=self.logger, liveness=self.liveness
            )
        self._release(lambda: lock.config.lock.end(lock, requeued=lock.requeued), message, "after it was processed")

    # Helpers -----------------------------------------------------------------

    def _config_for(self, message: Message[Any]) -> LockConfig | None:
        options, config = self._actors.get(message.actor_name, (self.defaults, self._default_config))
        overrides = {name: message.options[name] for name in MESSAGE_OPTIONS if name in message.options}
        if not overrides:
            return config
        subject = f"Actor {message.actor_name!r} (options of message {message.message_id!r})"
        overridden = resolve(subject, {**options, **overrides})
        # Every message of a replacing actor records when it starts, so that a
        # running holder is never replaced: replace is all or nothing per actor.
        if overridden and config and overridden.client_strategy is not config.client_strategy:
            if config.client_strategy.replaces_queued_holders or overridden.client_strategy.replaces_queued_holders:
                raise InvalidLockOptions(
                    f"{subject} sets on_conflict={overrides['on_conflict']!r}: the client strategy 'replace' can only "
                    "be chosen for a whole actor, in its options or the middleware's."
                )
        return overridden

    def _release(self, release: Callable[[], None], message: Message[Any], when: str) -> None:
        try:
            release()
        except LockBackendError:
            self.logger.error(
                "The lock of message %r of actor %r could not be released %s; this worker tries again, "
                "and its lease, its lock_ttl or the orphan reaper frees it if that fails too.",
                message.message_id,
                message.actor_name,
                when,
                exc_info=True,
            )
