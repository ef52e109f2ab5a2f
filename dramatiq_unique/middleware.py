"""The middleware: it turns Dramatiq's hooks into lock operations."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from dramatiq import Broker, Message, Middleware
from dramatiq.actor import Actor
from dramatiq.broker import MessageProxy
from dramatiq.logging import get_logger
from dramatiq.middleware import Retries

from .backends import LockBackend
from .client import ClientSide
from .default_backend import default_backend
from .errors import Cancelled, InvalidLockOptions, UniqueError
from .events import Events, Subscriber
from .eviction import EvictionCheck
from .forks import reset_in_child
from .handoffs import Handoffs
from .healing import Healing
from .history import DEFAULT_HISTORY_LIMIT, DEFAULT_HISTORY_RETENTION, check_history_options
from .keys import reaper_schedule_key
from .lock import LockFactory
from .metrics import PrometheusMetrics, warn_if_prometheus_follows
from .options import (
    ALLOW,
    DEFAULT_ACTIVITY,
    DEFAULT_BACKGROUND_RELEASES,
    DEFAULT_DEBOUNCE,
    DEFAULT_DEBOUNCE_CAP,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_LEASE_PERIOD,
    DEFAULT_LINE_LIMIT,
    DEFAULT_LOCK,
    DEFAULT_LOCK_ARGS_METHOD,
    DEFAULT_LOCK_INFO,
    DEFAULT_LOCK_LIMIT,
    DEFAULT_LOCK_PREFIX,
    DEFAULT_LOCK_TTL,
    DEFAULT_MAX_RESCHEDULES,
    DEFAULT_METRICS,
    DEFAULT_ON_BACKEND_ERROR,
    DEFAULT_ON_CONFLICT,
    DEFAULT_REAPER,
    DEFAULT_REAPER_INTERVAL,
    DEFAULT_REAPER_QUEUE,
    DEFAULT_RESCHEDULE_DELAY,
    DEFAULT_UNIQUE_ACROSS_ACTORS,
    DEFAULT_UNIQUE_ACROSS_QUEUES,
    DEFAULTS,
    ActorConfigs,
    LockConfig,
    check_middleware_options,
    lock_defaults,
    warn_if_seconds_like,
)
from .outage import Outage
from .persistence import warn_if_lines_unpersisted
from .reaper import Reaper, ReaperTrigger, declare_reaper_actor, needs_messages_in_hand
from .retold import install as leave_out_retold_lines
from .runtime import Runtime
from .undeclared import give_up_places
from .worker import WorkerSide

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


class UniqueJobs(Middleware):
    """Middleware that gives actors job-uniqueness locks.

    Add it to the broker before declaring actors, ahead of ``TimeLimit``, so
    that it sees Retries' verdict and its own calls are never interrupted::

        broker.add_middleware(UniqueJobs(backend=RedisBackend(url=...)), before=TimeLimit)

    The keyword arguments from ``lock`` to ``lock_info`` are also actor
    options (``@dramatiq.actor(lock=...)``) and, except ``lock_args_method``,
    message options (``send_with_options``); the message's value wins over the
    actor's, which wins over the one given here. Those from ``lease_period`` on
    are options of the middleware only: crash safety (see
    :doc:`Crash safety </crash-safety>` and :doc:`The orphan reaper </orphan-reaper>`)
    and lock events (see :doc:`Events and metrics </events-and-metrics>`).

    Parameters:
      backend(LockBackend): Where locks are stored. Leave it out, as django_dramatiq
        does with a dotted path, and the middleware chooses one when it meets its
        broker: see :meth:`~dramatiq_unique.UniqueJobs.resolve_backend`.
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
      line_limit(int): How many duplicates may wait in a lock's line (``on_conflict="wait"``).
      debounce(int): Milliseconds of quiet before a debounced message runs: a newer send
        starts them again and takes its place. ``None`` for no debounce. See
        :doc:`Options </options>`.
      debounce_cap(int): Milliseconds after which a send of a series of debounced sends is
        due at the latest, in the message that carries its arguments or newer ones; ``None``
        for no bound. The message starts once a worker fetched it: see :doc:`Options </options>`.
      lock_info(bool|int): Each holder keeps its call in the lock (``reindex('acme', 200)``),
        for the command line and the web page: ``True`` up to 120 characters, an integer
        chooses that many (20 to 1000); ``False``, the default, keeps none. See
        :doc:`Options </options>`.
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
        lock is then held a little longer (see :doc:`Crash safety </crash-safety>`); a
        ``send()`` in the same process never meets such a release of its lock.
      metrics(bool|prometheus_client.CollectorRegistry): Count lock events in Prometheus
        counters: ``True`` for prometheus_client's default registry, or the
        registry to use. Needs prometheus_client, which the ``prometheus`` extra brings (see
        :doc:`Getting started </getting-started>`).
      activity(bool): Count lock events per minute in the lock backend, for
        ``read_activity()``; each process adds its counts once per heartbeat interval.
      history(bool): Keep the conflict trail in the lock backend: each message that met a held
        lock or a failing lock store, for ``Locks.history()``. See :doc:`The conflict trail
        </operations/history>`.
      history_limit(int): How many entries the trail of one lock prefix keeps at most.
      history_retention(int): Milliseconds an entry of the trail is kept.
    """

    def __init__(
        self,
        *,
        backend: LockBackend | None = None,
        lock: str | None = DEFAULT_LOCK,
        on_conflict: Any = DEFAULT_ON_CONFLICT,
        lock_limit: int = DEFAULT_LOCK_LIMIT,
        lock_ttl: int | None = DEFAULT_LOCK_TTL,
        lock_args_method: Callable[..., Any] | None = DEFAULT_LOCK_ARGS_METHOD,
        lock_prefix: str = DEFAULT_LOCK_PREFIX,
        unique_across_queues: bool = DEFAULT_UNIQUE_ACROSS_QUEUES,
        unique_across_actors: bool = DEFAULT_UNIQUE_ACROSS_ACTORS,
        reschedule_delay: int = DEFAULT_RESCHEDULE_DELAY,
        max_reschedules: int | None = DEFAULT_MAX_RESCHEDULES,
        line_limit: int = DEFAULT_LINE_LIMIT,
        debounce: int | None = DEFAULT_DEBOUNCE,
        debounce_cap: int | None = DEFAULT_DEBOUNCE_CAP,
        lock_info: bool | int = DEFAULT_LOCK_INFO,
        lease_period: int = DEFAULT_LEASE_PERIOD,
        heartbeat_interval: int = DEFAULT_HEARTBEAT_INTERVAL,
        on_backend_error: str = DEFAULT_ON_BACKEND_ERROR,
        reaper: bool = DEFAULT_REAPER,
        reaper_interval: int | None = DEFAULT_REAPER_INTERVAL,
        reaper_queue: str = DEFAULT_REAPER_QUEUE,
        background_releases: bool = DEFAULT_BACKGROUND_RELEASES,
        metrics: bool | CollectorRegistry = DEFAULT_METRICS,
        activity: bool = DEFAULT_ACTIVITY,
        history: bool = True,
        history_limit: int = DEFAULT_HISTORY_LIMIT,
        history_retention: int = DEFAULT_HISTORY_RETENTION,
    ):
        self.logger: logging.Logger = get_logger(__name__, type(self))  # type: ignore[no-untyped-call]
        # Every option is checked before anything is built: a bad one leaves no thread or hook behind.
        check_middleware_options(
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            on_backend_error=on_backend_error,
            reaper_interval=reaper_interval,
            metrics=metrics,
            background_releases=background_releases,
            reaper=reaper,
            reaper_queue=reaper_queue,
            activity=activity,
        )
        trail = check_history_options(history=history, history_limit=history_limit, history_retention=history_retention)
        self.defaults = lock_defaults(
            lock=lock,
            on_conflict=on_conflict,
            lock_limit=lock_limit,
            lock_ttl=lock_ttl,
            lock_args_method=lock_args_method,
            lock_prefix=lock_prefix,
            unique_across_queues=unique_across_queues,
            unique_across_actors=unique_across_actors,
            reschedule_delay=reschedule_delay,
            max_reschedules=max_reschedules,
            line_limit=line_limit,
            debounce=debounce,
            debounce_cap=debounce_cap,
            lock_info=lock_info,
        )
        self.configs = ActorConfigs(self.defaults, logger=self.logger)
        warn_if_seconds_like(
            self.logger,
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            reaper_interval=reaper_interval if reaper else None,
        )
        #: The lock events of this middleware's messages, its heartbeat thread and its reaper.
        self.events = Events(logger=self.logger)
        self.metrics = None if metrics is False else PrometheusMetrics(None if metrics is True else metrics)
        if self.metrics is not None:
            self.events.subscribe(PrometheusMetrics.kinds, self.metrics)
        self.reaper_enabled = reaper
        self.reaper_interval = reaper_interval
        self.reaper_queue = reaper_queue
        self.reaper_actor: Actor[Any, Any] | None = None
        self._backend: LockBackend | None = None
        self._choosing = threading.Lock()
        reset_in_child(self._reset_in_child)
        self._compose = partial(
            self._compose_parts,
            lock_prefix=lock_prefix,
            lease_period=lease_period,
            heartbeat_interval=heartbeat_interval,
            on_backend_error=on_backend_error,
            background_releases=background_releases,
            activity=activity,
            history=trail,
        )
        if backend is not None:
            self._compose(backend)

    def _reset_in_child(self) -> None:
        # A thread of the parent may have been choosing the lock backend at the fork.
        self._choosing = threading.Lock()

    def _compose_parts(
        self,
        backend: LockBackend,
        *,
        lock_prefix: str,
        lease_period: int,
        heartbeat_interval: int,
        on_backend_error: str,
        background_releases: bool,
        activity: bool,
        history: tuple[int, int] | None,
    ) -> None:
        """Build the parts that talk to the lock backend, once it is known."""
        self.reaper = Reaper(backend, prefix=lock_prefix, logger=self.logger, events=self.events)
        periodic_tasks: list[Callable[[int], None]] = []
        if self.reaper_enabled and self.reaper_interval is not None:
            periodic_tasks.append(
                ReaperTrigger(
                    backend,
                    schedule_key=reaper_schedule_key(lock_prefix),
                    interval=self.reaper_interval,
                    queue_name=self.reaper_queue,
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
            activity=activity,
            history=history,
            periodic_tasks=periodic_tasks,
            healing=lambda data_lost: self.healing(data_lost),
            hand_over_healing=lambda: self.healing.hand_over(),
            holds_back_when_cut_off=on_backend_error != ALLOW,
        )
        #: The parts of the runtime that each message's locks use.
        self.liveness = self.runtime.liveness
        self.releases = self.runtime.releases
        #: The lock activity counter, which writes the conflict trail too; ``None`` with
        #: ``activity=False`` and ``history=False``.
        self.activity = self.runtime.activity
        #: The conflict trail's recorder, ``None`` with ``history=False``.
        self.history = self.runtime.history
        locks = LockFactory(
            backend=backend, logger=self.logger, liveness=self.liveness, events=self.events, releases=self.releases
        )
        #: What a worker does once it found that the lock store lost its data.
        self.healing = Healing(
            backend,
            prefix=lock_prefix,
            heartbeat_interval=heartbeat_interval,
            configs=self.configs,
            locks=locks,
            logger=self.logger,
        )
        # The check of the lock store's eviction policy, at the worker's boot or the first send.
        self._eviction_check = EvictionCheck(backend, logger=self.logger)
        #: Whether a worker's boot checked that a lock store with lines keeps them on disk.
        self._persistence_checked = False
        outage = Outage(
            on_backend_error=on_backend_error, logger=self.logger, releases_retried=lambda: self.runtime.running
        )
        cancellations = self.runtime.cancellations
        self.worker_side = WorkerSide(
            configs=self.configs, locks=locks, outage=outage, logger=self.logger, cancellations=cancellations
        )
        self.client_side = ClientSide(
            configs=self.configs,
            locks=locks,
            outage=outage,
            processed=self.worker_side.processed,
            check_store=self._eviction_check,
            logger=self.logger,
            interrupted=cancellations.interrupted,
        )
        # Last: the parts above are complete before any thread sees the backend as chosen.
        self._backend = backend

    # The lock backend ---------------------------------------------------------

    @property
    def backend(self) -> LockBackend:
        """The lock backend, the one given or else the one chosen when the middleware
        met its broker (see :meth:`~dramatiq_unique.UniqueJobs.resolve_backend`).
        Reading it before either raises :class:`~dramatiq_unique.errors.UniqueError`."""
        if self._backend is None:
            raise UniqueError(
                "UniqueJobs was given no lock backend and has not chosen one yet: it chooses when it meets its "
                "broker (an actor declared, a worker booted, a message sent), or call resolve_backend(broker)."
            )
        return self._backend

    def resolve_backend(self, broker: Broker) -> LockBackend:
        """The lock backend: the one given to the constructor, else the one chosen
        for ``broker`` the first time the middleware met a broker: the Redis named
        by the ``DRAMATIQ_UNIQUE_URL`` environment variable, else the one of the
        Django setting ``DRAMATIQ_UNIQUE``, else the broker's own Redis when it is
        a ``RedisBroker`` (see :doc:`Backends </backends>` and
        :doc:`Django </integrations/django>`).

        Raises:
          InvalidBackendOptions: If nothing names a lock backend, saying what to set.
        """
        if self._backend is None:
            with self._choosing:
                if self._backend is None:
                    self._compose(default_backend(broker))
        return self.backend

    @property
    def actor_options(self) -> set[str]:
        return set(DEFAULTS)

    @property
    def lock_prefixes(self) -> tuple[str, ...]:
        """Every lock prefix in use, the middleware's and those of the actors declared with their own."""
        if self._backend is None:  # no actor declared yet
            return (self.defaults["lock_prefix"],)
        return self.reaper.prefixes

    def lock_config(self, actor_name: str) -> LockConfig | None:
        """The resolved lock options of an actor, as its messages use them
        unless one overrides them; ``None`` when it has no lock."""
        return self.configs.for_actor(actor_name)

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
        # The first actor declared is the start-up: a lock store that cannot be chosen stops it here.
        self.resolve_backend(broker)
        count = sum(isinstance(m, UniqueJobs) for m in broker.middleware)
        if count > 1:
            # Each would take every lock, and each would meet the other's: while_executing
            # messages would be rescheduled forever.
            raise InvalidLockOptions(
                f"UniqueJobs was added to this broker {count} times. Add it once, and give actors that "
                "need other lock options their own options in @dramatiq.actor(...)."
            )
        options = self.configs.declare(actor)
        # A running holder may be asked to stop (cancel_in_progress, an operator's cancel):
        # only while its actor runs, never in another middleware's hook after it. Only actors
        # whose lock takes the run lock pay for being told.
        config = self.configs.for_actor(actor.actor_name)
        if config is not None and config.lock.takes_run_lock:
            self.worker_side.watch_return(actor)
        # Workers are known alive, and orphans reaped, under every lock prefix in use.
        self.liveness.add_prefix(options["lock_prefix"])
        self.reaper.add_prefix(options["lock_prefix"])
        self.healing.add_prefix(options["lock_prefix"])
        if self.client_side.guard(broker):
            self._warn_if_after_retries(broker)
            # The messages their line hands a place go through this broker.
            self.backend.handoffs = Handoffs(broker, logger=self.logger, events=self.events)

    def _warn_if_after_retries(self, broker: Broker) -> None:
        retries = [i for i, m in enumerate(broker.middleware) if isinstance(m, Retries)]
        if retries and self in broker.middleware and broker.middleware.index(self) > retries[0]:
            self.logger.warning(
                "UniqueJobs was added after Retries, so it cannot see whether a failed message will be retried. "
                "Add it with broker.add_middleware(..., before=TimeLimit)."
            )

    # Worker lifecycle -------------------------------------------------------

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        self.resolve_backend(broker)
        # Before the worker takes any lock: a store that may evict them is reported while none is lost.
        self._eviction_check()
        if not self._persistence_checked:
            self._persistence_checked = True
            warn_if_lines_unpersisted(self.backend, self.configs.lines(), logger=self.logger)
        warn_if_prometheus_follows(broker, self, self.logger)
        if self.metrics is not None:
            # In a worker process, after Dramatiq's Prometheus middleware chose where values go.
            self.metrics.setup()
        if self.reaper_enabled:
            self.declare_reaper(broker)
        self.healing.broker = broker
        # A message that waits in line or was cancelled: the middleware tells it, not Dramatiq.
        leave_out_retold_lines(self.runtime.cancellations)
        # Before the consumers start: the worker is in the registry before it holds any run lock.
        self.runtime.worker_booted(worker, publish_in_hand=needs_messages_in_hand(broker))

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # After the worker threads finished their messages: the leases were renewed until then.
        if self._backend is not None:  # else the worker never booted: before_worker_boot chooses one or raises
            self.runtime.worker_stopped(worker)

    def declare_reaper(self, broker: Broker, **actor_options: Any) -> Actor[Any, Any]:
        """Declare the orphan reaper actor on ``broker`` (once) and return it.

        Send it yourself to run a reaper cycle, e.g. from a scheduler: it
        accepts ``max_passes`` (``None``: until every lock was inspected) and
        logs its report in one line. Only one runs at a time. With Dramatiq's
        ``Results`` middleware on the broker, it also returns the report as a dict.

        Parameters:
          broker(dramatiq.Broker): The broker to declare it on.
          actor_options: Options of the actor for the broker's other middleware,
            e.g. ``periodic=cron("*/10 * * * *")`` with periodiq's middleware.
            Once it is declared, a later call returns it, and may only repeat them.

        Raises:
          InvalidLockOptions: If an option is the reaper's own or no middleware
            on ``broker`` declares it, or if the actor was declared with other options.
        """
        if self.reaper_actor is None:
            self.resolve_backend(broker)
            self.reaper_actor = declare_reaper_actor(
                broker, self.reaper, queue_name=self.reaper_queue, actor_options=actor_options
            )
        elif any(self.reaper_actor.options.get(name, object()) != value for name, value in actor_options.items()):
            raise InvalidLockOptions(
                f"The reaper actor was already declared with the options {self.reaper_actor.options!r}; "
                f"declare_reaper() cannot give it {actor_options!r}. Call it once, with every option, "
                "before the worker boots."
            )
        return self.reaper_actor

    def after_consumer_thread_boot(self, broker: Broker, thread: Any) -> None:
        self.client_side.consumer_thread()

    # Client side -------------------------------------------------------------

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        if self._backend is None:  # chosen once, nearly always at the first actor's declaration
            self.resolve_backend(broker)
        self.client_side.before_enqueue(broker, message, delay)

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        self.worker_side.enqueued(message)

    # Server side -------------------------------------------------------------

    def before_delay_message(self, broker: Broker, message: MessageProxy) -> None:
        self.runtime.in_hand.delayed(message)

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self.runtime.in_hand.started(message)
        self.worker_side.start(broker, message)

    def after_process_message(
        self, broker: Broker, message: MessageProxy, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if isinstance(exception, Cancelled):
            self.worker_side.stopped(broker, message, exception)
        self.worker_side.finish(message)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self.worker_side.finish(message)

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        self.runtime.in_hand.left(message)

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        self.runtime.in_hand.left(message)
        if message.actor_name not in broker.actors:
            # Dead-lettered as it came off the queue, before any hook of ours saw it.
            give_up_places(self.backend, self.lock_prefixes, message, self.logger)
