"""The middleware: it turns Dramatiq's hooks into lock operations."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, cast

from dramatiq import Broker, Message, Middleware
from dramatiq.actor import Actor
from dramatiq.broker import MessageProxy
from dramatiq.logging import get_logger
from dramatiq.middleware import Retries, SkipMessage

from .backends import LockBackend
from .crash import ALLOW, RAISE, CrashSafety, check_crash_options
from .current import _set_current_lock
from .errors import EnqueueCancelled, InvalidLockOptions, LockArgumentsError, LockBackendError
from .events import BACKEND_ERROR, CONFLICT, Events, Subscriber
from .events import RESCHEDULED as RESCHEDULED_EVENT
from .keys import reaper_schedule_key
from .liveness import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LEASE_PERIOD
from .lock import MessageLock
from .metrics import PrometheusMetrics, check_metrics_option, warn_if_prometheus_follows
from .options import (
    DEFAULT_LOCK_PREFIX,
    DEFAULT_RESCHEDULE_DELAY,
    DEFAULTS,
    MESSAGE_OPTIONS,
    LockConfig,
    MessageOptionsCheck,
    resolve,
)
from .outcome import (
    DUPLICATE,
    ENQUEUED,
    REJECTED,
    RESCHEDULED,
    UNLOCKED,
    AnyMessage,
    EnqueueOutcome,
    enqueue_outcome,
    has_followers,
    record_outcome,
)
from .reaper import DEFAULT_REAPER_INTERVAL, Reaper, ReaperTrigger, declare_reaper_actor
from .runtime import Runtime
from .strategies import CLIENT, SERVER, Conflict, ConflictStrategy
from .strategies.reject import dead_letter_if_rejected
from .strategies.reschedule import Reschedule, send_later

#: The options of Dramatiq's Callbacks and Retries that name an actor sent when a message ends.
_CALLBACK_OPTIONS = ("on_success", "on_failure", "on_retry_exhausted")

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: What becomes of a message that must not be dropped and cannot take its lock
#: now: a redelivery meeting its own earlier attempt, a message that a group or
#: a pipeline waits for, a message that Dramatiq itself enqueues.
_TRY_AGAIN_STRATEGY = Reschedule()


class UniqueJobs(CrashSafety, Middleware):
    """Middleware that gives actors job-uniqueness locks.

    Add it to the broker before declaring actors, ahead of ``TimeLimit``, so
    that it sees Retries' verdict and its own calls are never interrupted::

        broker.add_middleware(UniqueJobs(backend=RedisBackend(url=...)), before=TimeLimit)

    The keyword arguments from ``lock`` to ``max_reschedules`` are also actor
    options (``@dramatiq.actor(lock=...)``) and, except ``lock_args_method``,
    message options (``send_with_options``); the message's value wins over the
    actor's, which wins over the one given here. Those from ``lease_period`` on
    are options of the middleware only: crash safety (see docs/crash-safety.md)
    and lock events (see docs/events-and-metrics.md).

    Parameters:
      backend(LockBackend): Where locks are stored.
      lock(str): The lock type: ``"until_executing"``, ``"until_executed"``,
        ``"until_expired"``, ``"while_executing"`` or ``"until_and_while_executing"``.
        ``None`` (the default) leaves actors without uniqueness.
      on_conflict(str|dict): The conflict strategy, or ``{"client": ..., "server": ...}``.
      lock_limit(int): How many messages of one digest may hold the lock at once.
      lock_ttl(int): Milliseconds after which a lock lapses; ``None`` for never.
      lock_args_method(collections.abc.Callable): Called with a message's arguments, returns
        the JSON value that decides uniqueness. Defaults to all arguments.
      lock_prefix(str): The prefix of every key.
      unique_across_queues(bool): Leave the queue out of the digest.
      unique_across_actors(bool): Leave the actor out of the digest.
      reschedule_delay(int): Milliseconds before a rescheduled duplicate tries again.
      max_reschedules(int): How often a duplicate may be rescheduled; ``None`` for no limit.
      lease_period(int): Milliseconds a run lock is held without a renewal: a
        worker renews the run locks of the messages it runs, and a dead
        worker's run locks are free again within this time.
      heartbeat_interval(int): Milliseconds between two heartbeats of a worker
        process; at most a third of ``lease_period``.
      on_backend_error(str): What happens when the lock backend cannot be
        reached: ``"raise"`` (``send()`` raises ``LockBackendError``;
        in a worker the message fails and is retried) or ``"allow"`` (log a
        warning and go on without the lock).
      reaper(bool): Declare the orphan reaper actor on the broker, and let
        workers send it every ``reaper_interval``.
      reaper_interval(int): Milliseconds between two runs of the reaper,
        across all workers; ``None`` to schedule ``reaper_actor`` yourself.
      reaper_queue(str): The queue of the reaper actor.
      background_releases(bool): In a worker, give up a finished message's
        enqueue lock from a thread of the process, many in one round trip,
        so that the worker thread goes on to its next message at once. The
        lock is then held a little longer (see docs/crash-safety.md); a
        ``send()`` in the same process never meets such a release of its lock.
      metrics(bool|prometheus_client.CollectorRegistry): Count lock events in Prometheus
        counters: ``True`` for prometheus_client's default registry, or the
        registry to use. Needs ``pip install 'dramatiq-unique[prometheus]'``.
      activity(bool): Count lock events per minute in the lock backend, for
        ``read_activity()``; each process adds its counts once per heartbeat interval.
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
        background_releases: bool = True,
        metrics: bool | CollectorRegistry = False,
        activity: bool = True,
    ):
        self.logger: logging.Logger = get_logger(__name__, type(self))  # type: ignore[no-untyped-call]
        self.backend = backend
        check_crash_options(
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            on_backend_error=on_backend_error,
            reaper_interval=reaper_interval,
        )
        check_metrics_option(metrics)
        self.on_backend_error = on_backend_error
        #: The lock events of this middleware's messages, its heartbeat thread and its reaper.
        self.events = Events(logger=self.logger)
        self.reaper = Reaper(backend, prefix=lock_prefix, logger=self.logger, events=self.events)
        if not isinstance(background_releases, bool):
            raise InvalidLockOptions(
                f"UniqueJobs has an invalid background_releases={background_releases!r}: it must be True or False."
            )
        self.metrics = None if metrics is False else PrometheusMetrics(None if metrics is True else metrics)
        if self.metrics is not None:
            self.events.subscribe(PrometheusMetrics.kinds, self.metrics)
        self.reaper_enabled = reaper
        self.reaper_interval = reaper_interval
        self.reaper_queue = reaper_queue
        self.reaper_actor: Actor[Any, Any] | None = None
        periodic_tasks: list[Callable[[int], None]] = []
        if reaper and reaper_interval is not None:
            periodic_tasks.append(
                ReaperTrigger(
                    backend,
                    schedule_key=reaper_schedule_key(lock_prefix),
                    interval=reaper_interval,
                    queue_name=reaper_queue,
                    actor=lambda: self.reaper_actor,
                )
            )
        #: The process's background work: its threads, and what they look after.
        self.runtime = Runtime(
            backend,
            prefix=lock_prefix,
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            logger=self.logger,
            events=self.events,
            background_releases=background_releases,
            activity=bool(activity),
            periodic_tasks=periodic_tasks,
        )
        #: The parts of the runtime that each message's locks use.
        self.liveness = self.runtime.liveness
        self.releases = self.runtime.releases
        #: The lock activity counter, ``None`` with ``activity=False``.
        self.activity = self.runtime.activity
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
        self._check_message_options = MessageOptionsCheck(self.logger)
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

    @property
    def lock_prefixes(self) -> tuple[str, ...]:
        """Every lock prefix in use, the middleware's and those of the actors declared with their own."""
        return self.reaper.prefixes

    def lock_config(self, actor_name: str) -> LockConfig | None:
        """The resolved lock options of an actor, as its messages use them
        unless one overrides them; ``None`` when it has no lock."""
        return self._actors.get(actor_name, (self.defaults, self._default_config))[1]

    # Lock events -------------------------------------------------------------

    def subscribe(self, kind: str | Iterable[str], callback: Subscriber) -> None:
        """Call ``callback`` with a :class:`~dramatiq_unique.events.LockEvent`
        for every lock event of ``kind`` (one of
        :data:`~dramatiq_unique.EVENT_KINDS`, or several) in this
        process. A callback that raises is logged; locking goes on.

        Raises:
          ValueError: If a kind is unknown.
        """
        self.events.subscribe(kind, callback)

    def unsubscribe(self, kind: str | Iterable[str], callback: Subscriber) -> None:
        """Stop calling ``callback`` for ``kind``."""
        self.events.unsubscribe(kind, callback)

    # Actor declaration -------------------------------------------------------

    def before_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        self._declare(broker, actor)

    def after_declare_actor(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        # Broker.add_middleware replays this hook for actors declared earlier.
        self._declare(broker, actor)

    def _declare(self, broker: Broker, actor: Actor[Any, Any]) -> None:
        count = sum(isinstance(m, UniqueJobs) for m in broker.middleware)
        if count > 1:
            # Each would take every lock, and each would meet the other's: while_executing
            # messages would be rescheduled forever.
            raise InvalidLockOptions(
                f"UniqueJobs was added to this broker {count} times. Add it once, and give actors that "
                "need other lock options their own options in @dramatiq.actor(...)."
            )
        options = {**self.defaults, **{k: v for k, v in actor.options.items() if k in DEFAULTS}}
        config = resolve(f"Actor {actor.actor_name!r}", options)
        self._actors[actor.actor_name] = (options, config)
        # Workers are known alive, and orphans reaped, under every lock prefix in use (issue 8, defect 4).
        self.liveness.add_prefix(options["lock_prefix"])
        self.reaper.add_prefix(options["lock_prefix"])
        self._guard_enqueue(broker)

    def _guard_enqueue(self, broker: Broker) -> None:
        """Wrap the broker's ``enqueue`` so that a duplicate dropped in
        ``before_enqueue`` makes ``send()`` return normally, and an
        enqueue that fails after its lock was taken gives the lock up.

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

    def _enqueue(self, enqueue: Callable[..., Message[Any]], message: Message[Any], delay: int | None) -> Message[Any]:
        outer, self._local.taken = getattr(self._local, "taken", None), None
        try:
            return enqueue(message, delay=delay)
        except EnqueueCancelled as e:
            # Raised in before_enqueue, so about a message being sent, never a worker's proxy.
            return cast("Message[Any]", e.message)
        except BaseException:
            taken = self._local.taken
            if taken is not None:
                self._release(taken.release_enqueue, taken, "after its enqueue failed")
            raise
        finally:
            self._local.taken = outer

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        warn_if_prometheus_follows(broker, self, self.logger)
        if self.metrics is not None:
            # In a worker process, after Dramatiq's Prometheus middleware chose where values go.
            self.metrics.setup()
        if self.reaper_enabled:
            self.declare_reaper(broker)
        # Before the consumers start: the worker is in the registry before it holds any run lock.
        self.runtime.worker_booted(worker)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # After the worker threads finished their messages: the leases were renewed until then.
        self.runtime.worker_stopped(worker)

    def declare_reaper(self, broker: Broker) -> Actor[Any, Any]:
        """Declare the orphan reaper actor on ``broker`` (once) and return it.

        Send it yourself to run a reaper cycle, e.g. from a scheduler: it
        accepts ``max_passes`` (``None``: until every lock was inspected) and
        logs its report in one line. Only one runs at a time. With Dramatiq's
        ``Results`` middleware on the broker, it also returns the report as a dict.
        """
        if self.reaper_actor is None:
            self.reaper_actor = declare_reaper_actor(broker, self.reaper, queue_name=self.reaper_queue)
        return self.reaper_actor

    def after_consumer_thread_boot(self, broker: Broker, thread: Any) -> None:
        # Consumer threads enqueue only to move due delayed messages to their queues.
        self._local.consumer = True

    # Client side -------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        self._check_message_options(broker, message)
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
        # Dramatiq's own enqueues (_is_internal_enqueue, asked only on the paths that could
        # raise) have no caller to raise to: an exception would wedge a consumer or stop a
        # pipeline (L6).
        try:
            lock = self._lock_for(message, config, outcome)
        except LockArgumentsError as e:
            if not self._is_internal_enqueue(broker, message):
                # Bad lock arguments fail the send for every lock type (D6).
                raise LockArgumentsError(f"{e} The message was not enqueued and no lock was taken.") from e.__cause__
            self.logger.error(
                "Message %r of actor %r is enqueued without a lock: %s", message.message_id, message.actor_name, e
            )
            return
        if not config.lock.locks_at_enqueue:
            lock.record_enqueued()
            return
        try:
            acquisition = lock.acquire_enqueue(delay)
        except LockBackendError as e:
            lock.emit(BACKEND_ERROR, reason="acquisition at enqueue", error=e)
            # The script may have run and only its answer been lost: give the place back.
            lock.forget_enqueue_after_failure()
            if self.on_backend_error != ALLOW and self._is_internal_enqueue(broker, message):
                self._try_again_later(broker, lock, delay, f"the lock backend failed ({e})")
            self._backend_failed(message, "enqueued", e)  # raises, unless on_backend_error="allow"
            lock.record_enqueued(status=UNLOCKED)
            return
        if acquisition.acquired:
            self._local.taken = lock
            return
        conflict = Conflict(broker, message, lock, acquisition.holders, CLIENT, self.logger, delay=delay)
        strategy = self._strategy_for(message, config.client_strategy)
        internal = self._is_internal_enqueue(broker, message)
        if internal and strategy.fails_send:
            strategy = _TRY_AGAIN_STRATEGY
        lock.emit(CONFLICT, side=CLIENT, strategy=strategy.name, holders=acquisition.holders)
        try:
            strategy.on_client_conflict(conflict)
        except EnqueueCancelled:
            raise
        except Exception as e:
            if not internal:
                raise
            self._try_again_later(broker, lock, delay, f"its conflict strategy {strategy.name!r} raised {e!r}")

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        processing = getattr(self._local, "processing", None)
        if processing is not None and processing.message.message_id == message.message_id:
            processing.requeued = True

    def _is_reenqueue(self, message: Message[Any], outcome: EnqueueOutcome) -> bool:
        """Whether this is Dramatiq enqueuing a message again that took its
        lock before: a retry, or a reschedule, from the worker
        thread processing it; a due delayed message moved by a consumer; a
        publish retried by the broker. Anything else is a new send, also
        a dead-lettered message enqueued again by hand."""
        local = self._local
        for lock in (getattr(local, "processing", None), getattr(local, "taken", None)):
            if lock is not None and lock.message.message_id == message.message_id:
                return True
        return (
            getattr(local, "consumer", False)
            and outcome.status == ENQUEUED
            and bool(outcome.digest)
            and outcome.holder == message.message_id
        )

    def _is_internal_enqueue(self, broker: Broker, message: Message[Any]) -> bool:
        """Whether Dramatiq itself enqueues this new message: a consumer moving
        a due delayed message, or a worker enqueuing a pipeline's next step, a
        group's completion callback, or an ``on_success``, ``on_failure`` or
        ``on_retry_exhausted`` callback of the message it processed."""
        if getattr(self._local, "consumer", False):
            return True
        processed = getattr(self._local, "message", None)
        if processed is None:
            return False
        options = processed.options
        followers = [options.get("pipe_target") or {}, *(options.get("group_completion_callbacks") or ())]
        if any(follower.get("message_id") == message.message_id for follower in followers):
            return True
        actor_options = broker.actors[processed.actor_name].options if processed.actor_name in broker.actors else {}
        return any((options.get(name) or actor_options.get(name)) == message.actor_name for name in _CALLBACK_OPTIONS)

    @staticmethod
    def _strategy_for(message: AnyMessage, strategy: ConflictStrategy) -> ConflictStrategy:
        # A group or a pipeline waits for this message: dropping it would leave the
        # group incomplete and stop the pipeline, so it waits for the lock instead.
        if strategy.drops_duplicates and has_followers(message):
            return _TRY_AGAIN_STRATEGY
        return strategy

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

    @staticmethod
    def _passes_unlocked(outcome: EnqueueOutcome, delay: int | None) -> bool:
        """A rejected message goes to its dead-letter queue holding no lock; a
        rescheduled one holds none on its way to the delay queue."""
        return outcome.status == REJECTED or (outcome.status == RESCHEDULED and delay is not None)

    def _reenter(self, message: Message[Any], config: LockConfig, delay: int | None) -> None:
        # Never raises, but to drop a stale retry: an exception here would lose a retry or wedge a consumer.
        lock: MessageLock | None = None
        try:
            lock = self._lock_for(message, config)
            # A re-enqueue never takes another message's place (C4).
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

    # Server side -------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._local.processing = None
        # Every message, locked or not: its pipeline's next step is enqueued from here.
        self._local.message = message
        config = self._config_for(message)
        if config is None:
            return
        outcome = enqueue_outcome(message)
        dead_letter_if_rejected(message, self.logger, outcome)
        lock = self._lock_for(message, config, outcome)
        self._local.processing = lock
        try:
            acquisition = config.lock.start(lock)
        except LockBackendError as e:
            lock.emit(BACKEND_ERROR, reason="start", error=e)
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
            strategy = self._strategy_for(message, config.server_strategy)
            if message.message_id in acquisition.holders:
                # A redelivery met the run lock of its own earlier attempt, whose worker died or
                # which the broker gave up on: it is no duplicate to drop, so it tries again
                # once that attempt has finished or its lease has run out (SPEC L7, R1).
                strategy = _TRY_AGAIN_STRATEGY
            lock.emit(CONFLICT, side=SERVER, strategy=strategy.name, holders=acquisition.holders)
            strategy.on_server_conflict(conflict)
        _set_current_lock(lock.held())

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        self._finish(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._finish(message)

    def _finish(self, message: MessageProxy) -> None:
        _set_current_lock(None)
        self._local.message = None
        lock, self._local.processing = getattr(self._local, "processing", None), None
        if lock is None or lock.message.message_id != message.message_id:
            # An earlier middleware skipped the message before we saw it
            # (AgeLimit): it gives up the enqueue lock it recorded, if any.
            config = self._config_for(message)
            if config is None or not enqueue_outcome(message).digest:
                return
            lock = self._lock_for(message, config)
        self._release(lambda: lock.config.lock.end(lock, requeued=lock.requeued), lock, "after it was processed")

    # Helpers -----------------------------------------------------------------

    def _lock_for(self, message: AnyMessage, config: LockConfig, outcome: EnqueueOutcome | None = None) -> MessageLock:
        return MessageLock.for_message(
            backend=self.backend,
            config=config,
            message=message,
            logger=self.logger,
            liveness=self.liveness,
            events=self.events,
            releases=self.releases,
            outcome=outcome,
        )

    def _config_for(self, message: AnyMessage) -> LockConfig | None:
        options, config = self._actors.get(message.actor_name, (self.defaults, self._default_config))
        message_options = message.options
        if MESSAGE_OPTIONS.isdisjoint(message_options):  # nearly always: no per-message lock options
            return config
        overrides = {name: message_options[name] for name in MESSAGE_OPTIONS if name in message_options}
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

    def _release(self, release: Callable[[], None], lock: MessageLock, when: str) -> None:
        message = lock.message
        try:
            release()
        except LockBackendError as e:
            lock.emit(BACKEND_ERROR, reason="release", error=e)
            self.logger.warning(
                "The lock of message %r of actor %r could not be released %s: %s. %s",
                message.message_id,
                message.actor_name,
                when,
                e,
                "This worker tries again; the lock's lease or its lock_ttl frees it if that fails too."
                if self.liveness.running
                else "The orphan reaper or the lock's lock_ttl frees it.",
                exc_info=self.logger.isEnabledFor(logging.DEBUG),
            )
