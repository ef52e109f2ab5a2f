"""What a worker does once it found that the lock store lost its data.

The worker that finds the loss first heals the store: it has new places refused, takes
again the enqueue locks of the messages that a ``RedisBroker`` still keeps (those waiting
in their queue or delay queue, each recorded with its lock's digest, and, of those in
workers' hands, the ones whose lock type holds the enqueue lock while the message runs),
and has new places taken again once every live worker has had a heartbeat since the loss:
each takes again the run locks of its own running messages at the heartbeat that finds it
(see :class:`~dramatiq_unique.liveness.Liveness`). A message in a worker's hands whose
lock type gives the enqueue lock up when it starts may be running, so its lock is left
alone. Other brokers cannot be read: their queued messages' locks are not rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from dramatiq import Broker, Message
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.errors import DecodeError

from .backends import Holder, LockBackend
from .backends.base import UNHEALED_REFUSAL
from .errors import InvalidLockOptions, LockBackendError
from .forks import reset_in_child
from .in_hand import held_by_live_workers
from .keys import healed_key, healing_key, rebuilding_key, rebuilt_key, registry_key
from .lock import LockFactory
from .options import ActorConfigs, LockConfig
from .outcome import ENQUEUED, EnqueueOutcome, enqueue_outcome
from .reaper import QueueCounter, needs_messages_in_hand

#: How long the worker that heals holds the lock that keeps the others from doing it too, in
#: heartbeat intervals: it holds it again each round, and a worker that found the same loss
#: takes over once a healer that stopped has let it lapse.
HEALING_LOCK_INTERVALS = 3
#: How long a healed loss is remembered (ms): a worker that finds it late does not heal it again.
HEALED_TTL = 3_600_000


class Healing:
    """Heals the lock store after a loss of its data: new places are refused until the
    enqueue locks of the messages the broker keeps are rebuilt, and every live worker
    had a heartbeat since, at which it took again the run locks of its running messages.

    Parameters:
      backend(LockBackend): The lock store.
      prefix(str): The middleware's lock prefix; :meth:`add_prefix` adds others.
      heartbeat_interval(int): Milliseconds between two heartbeats of a worker.
      configs(ActorConfigs): The lock options of actors and messages.
      locks(LockFactory): Builds a message's locks.
      logger(logging.Logger): Where to report.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        heartbeat_interval: int,
        configs: ActorConfigs,
        locks: LockFactory,
        logger: logging.Logger,
    ):
        self.backend = backend
        self.prefix = prefix
        self.prefixes: tuple[str, ...] = (prefix,)
        self.key = healing_key(prefix)
        self.healed_key = healed_key(prefix)
        self.registry = registry_key(prefix)
        self.heartbeat_interval = heartbeat_interval
        self.configs = configs
        self.locks = locks
        self.logger = logger
        #: The broker of this process's Workers, once one booted.
        self.broker: Broker | None = None
        self._forget()
        self._reset_rounds()
        reset_in_child(self._reset_in_child)

    def _reset_in_child(self) -> None:
        """In a forked child: none of the parent's healing, or of its rounds, is this process's."""
        self._forget()
        self._reset_rounds()

    def _forget(self) -> None:
        """No healing: none begun, or (in a forked child) none of this process's."""
        #: While this worker heals: its place in the healing lock, the marks of the loss it
        #: heals, when it began and when new places are taken again (our monotonic clock, s).
        self._owner: str | None = None
        self._marks = ""
        self._began: float | None = None
        self._resumes_at = 0.0
        #: Whether the enqueue locks were rebuilt, or what is left uncovered said, since it began.
        self._rebuilt = False
        #: Whether this worker found a loss that another heals: it takes over if that one stops.
        self._watching = False

    def _reset_rounds(self) -> None:
        #: Whether a round runs now, whether a loss was found meanwhile, and whether the last
        #: worker of the process stops: the healing is handed over as that round ends.
        self._busy = False
        self._lost_meanwhile = False
        self._stopping = False

    def add_prefix(self, prefix: str) -> None:
        """Refuse new places under ``prefix`` too while the store heals: the lock prefix of an actor."""
        if prefix not in self.prefixes:
            self.prefixes = (*self.prefixes, prefix)

    def __call__(self, data_lost: bool) -> bool:
        """One round of the periodic thread of a worker that found a loss of the store's data
        (``data_lost``), or heals it, or watches another heal it. Returns whether it is to be
        called again next round."""
        if self._busy:
            # Under gevent each round runs in a greenlet of the hub: one round at a time heals,
            # and a loss found meanwhile is the next round's.
            self._lost_meanwhile = self._lost_meanwhile or data_lost
            return True
        self._busy = True
        try:
            again = self._round(data_lost or self._take_lost_meanwhile())
        finally:
            self._busy = False
            if self._stopping:
                self._hand_over_now()
        return again or self._lost_meanwhile

    def _take_lost_meanwhile(self) -> bool:
        lost, self._lost_meanwhile = self._lost_meanwhile, False
        return lost

    def _round(self, data_lost: bool) -> bool:
        try:
            if data_lost:
                self._watching = True
                if self._owner is not None:
                    return self._begin_again()
            if self._owner is not None:
                return self._go_on()
            if self._watching:
                return self._heal_unless_healed()
            return False
        except LockBackendError as e:
            self.logger.error("Healing the lock store after it lost its data failed: %s. This worker tries again.", e)
            return True
        except Exception:
            self.logger.exception("Healing the lock store after it lost its data failed; this worker tries again.")
            return True

    def hand_over(self) -> None:
        """The last worker of this process stops: a healing it began is left to the other workers
        that found the loss (they take over at once), or else ends within a few heartbeat intervals.
        A round that runs now (in the gevent hub) hands it over as it ends."""
        self._stopping = True
        if not self._busy:
            self._hand_over_now()

    def _hand_over_now(self) -> None:
        self._stopping = False
        if self._owner is None:
            self._forget()
            return
        ttl = HEALING_LOCK_INTERVALS * self.heartbeat_interval
        try:
            self._refuse(ttl=ttl)
            self._release(watch=False)
        except LockBackendError as e:
            self.logger.warning("This worker could not hand over the healing of the lock store: %s", e)
            self._forget()
            return
        self.logger.warning(
            "This worker stops before it has healed the lock store: another worker that found the loss takes "
            "over, or new locks are taken again in %d ms.",
            ttl,
        )

    def _heal_unless_healed(self) -> bool:
        """Heal the loss this worker found, unless another worker heals it (it watches on, and
        rebuilds the locks of its own broker's messages) or did."""
        owner = uuid.uuid4().hex
        if not self._hold(owner):
            self._rebuild_this_broker()
            return True
        try:
            marks = self._read_marks()
            healed = self.backend.get_value(self.healed_key) == marks
        except BaseException:
            self.backend.release(self.key, owner)
            raise
        if healed:
            # Healed already, by another worker; this one took its running messages' run locks again.
            self.backend.release(self.key, owner)
            self._watching = False
            return False
        self._owner, self._marks = owner, marks
        self._begin()
        return True

    def _begin_again(self) -> bool:
        """A new loss while this worker heals: the healing lock went with the data too."""
        assert self._owner is not None
        if not self._hold(self._owner):
            self._release(watch=True)  # another worker took it first, and heals
            return True
        self._marks = self._read_marks()
        self._begin()
        return True

    def _read_marks(self) -> str:
        return json.dumps(self.backend.epochs(self.prefix), sort_keys=True)

    def _begin(self) -> None:
        began = time.monotonic()
        self._began = self._began or began
        # Every live worker finds the loss at a heartbeat within one interval of it, which came before this one.
        self._resumes_at = began + 2 * self.heartbeat_interval / 1000
        self._rebuilt = False
        self._refuse()
        self._rebuild_once()

    def _go_on(self) -> bool:
        assert self._owner is not None
        if not self._hold(self._owner):
            # This worker stalled past its hold, and another may heal now: it only watches.
            self._release(watch=True)
            return True
        if time.monotonic() < self._resumes_at or not self._rebuilt:
            self._refuse()
            if not self._rebuilt:
                self._rebuild_once()
            return True
        for prefix in self.prefixes:
            self.backend.accept_new_places(prefix)
        self.backend.set_value(self.healed_key, self._marks, ttl=HEALED_TTL)
        self.logger.warning(
            "The lock store takes new locks again: this worker refused them for %d ms while it healed the store.",
            int((time.monotonic() - (self._began or 0)) * 1000),
        )
        self._release(watch=False)
        return False

    def _refuse(self, *, ttl: int = UNHEALED_REFUSAL) -> None:
        for prefix in self.prefixes:
            self.backend.refuse_new_places(prefix, ttl=ttl)

    def _hold(self, owner: str, key: str | None = None) -> bool:
        """Take, or keep, the healing lock, or the lock at ``key`` of the same kind (a broker's rebuild)."""
        holder = Holder(message_id=owner, actor="", queue="", lock="healing", state="running")
        ttl = HEALING_LOCK_INTERVALS * self.heartbeat_interval
        return self.backend.acquire(key or self.key, owner, limit=1, ttl=ttl, holder=holder).acquired

    def _release(self, *, watch: bool) -> None:
        """Stop healing, and give the healing lock up; ``watch``: take over if another heals and stops."""
        owner = self._owner
        self._forget()
        self._watching = watch
        if owner is not None:
            self.backend.release(self.key, owner)

    def _rebuild_once(self) -> None:
        broker = self.broker
        if not isinstance(broker, RedisBroker):
            self._say_what_is_left(broker)
            self._rebuilt = True
        else:
            # Not yet, while another worker of the same broker rebuilds: the next round looks again.
            self._rebuilt = self._rebuild_broker(broker, self._marks)

    def _rebuild_this_broker(self) -> None:
        """While another worker heals the store: take again the enqueue locks of the messages
        of this worker's broker, unless a worker of the same broker does or did for this loss.
        The worker that heals rebuilds those of its own broker only, and an application with
        another RedisBroker may share the lock prefix."""
        if isinstance(self.broker, RedisBroker):
            self._rebuild_broker(self.broker, self._read_marks())

    def _rebuild_broker(self, broker: RedisBroker, marks: str) -> bool:
        """Take again the enqueue locks of the messages of ``broker`` after the loss of the marks
        ``marks``, holding the lock that keeps the other workers of that broker from doing it too.

        Returns:
          bool: Whether they are taken again, by this worker or another.
        """
        fingerprint = _fingerprint(broker)
        if self.backend.get_value(rebuilt_key(self.prefix, fingerprint)) == marks:
            return True
        key, owner = rebuilding_key(self.prefix, fingerprint), uuid.uuid4().hex
        if not self._hold(owner, key):
            return False  # another worker of this broker rebuilds now
        try:
            self._rebuild_and_say(broker, keep=lambda: self._hold(owner, key))
            self.backend.set_value(rebuilt_key(self.prefix, fingerprint), marks, ttl=HEALED_TTL)
        finally:
            self.backend.release(key, owner)
        return True

    def _rebuild_and_say(self, broker: RedisBroker, *, keep: Callable[[], object]) -> None:
        taken, duplicates, in_hand = self._rebuild(broker, keep=keep)
        self.logger.warning(
            "After the lock store lost its data, this worker took again the enqueue locks of %d messages that "
            "RedisBroker keeps. %d were taken meanwhile by a duplicate, which may run too. %d, in workers' "
            "hands, may be running and have given their lock up, so theirs were left alone.",
            taken,
            duplicates,
            in_hand,
        )

    def _say_what_is_left(self, broker: Broker | None) -> None:
        counted = ""
        if broker is not None and needs_messages_in_hand(broker):  # RabbitMQ counts what waits in each queue
            try:
                with QueueCounter(broker) as counter:
                    waiting = sum(counter.waiting(queue) for queue in broker.get_declared_queues())
            except Exception:
                self.logger.debug("The messages waiting in the broker's queues could not be counted.", exc_info=True)
            else:
                # The rest are in workers' hands, which each worker publishes with its heartbeat.
                _, alive_until, published = self.backend.messages_in_hand(self.registry)
                held = len(held_by_live_workers(alive_until, published))
                counted = (
                    f" {waiting} messages, locked or not, wait in its queues and delay queues now, and "
                    f"{held} locked ones are in workers' hands."
                )
        self.logger.warning(
            "The enqueue locks of the messages queued before the lock store lost its data are not taken again: "
            "%s cannot be read message by message.%s Until those messages have run, a duplicate of each may be "
            "enqueued.",
            type(broker).__name__,
            counted,
        )

    def _rebuild(self, broker: Any, *, keep: Callable[[], object]) -> tuple[int, int, int]:
        taken = duplicates = in_hand = 0
        renew_at = time.monotonic() + self.heartbeat_interval / 1000

        def keep_alive() -> None:
            # A long rebuild keeps, once a heartbeat interval, its lock and what a round keeps.
            nonlocal renew_at
            if time.monotonic() >= renew_at:
                keep()
                if self._owner is not None:
                    self._hold(self._owner)
                    self._refuse()
                renew_at = time.monotonic() + self.heartbeat_interval / 1000

        # Where a newer message takes a queued one's place (replace, debounce), the copies of a
        # digest take their places again in the order they took them (their tokens increase),
        # each newer one replacing the one before as it did, so that the newest run and the
        # others are skipped: the broker's hash returns them in no order.
        replacing: dict[tuple[str | None, str], list[tuple[Message[Any], bool, LockConfig, EnqueueOutcome]]] = {}
        for message, waiting in _kept_messages(broker):
            keep_alive()
            try:
                config = self.configs.for_message(message)
            except InvalidLockOptions:
                continue
            outcome = enqueue_outcome(message)
            if config is None or not outcome.digest or outcome.status != ENQUEUED:
                continue
            lock_type = config.lock
            if not lock_type.locks_at_enqueue:
                continue
            if not waiting and not (lock_type.holds_enqueue_lock_while_running or lock_type.outlives_message):
                in_hand += 1
                continue
            if config.client_strategy.replaces_queued_holders:
                replacing.setdefault((config.lock_prefix, outcome.digest), []).append(
                    (message, waiting, config, outcome)
                )
                continue
            lock = self.locks.build(message, config, outcome)
            # One in a worker's hands may be running: a newer message never takes its place (replace).
            holder = None if waiting else lock.holder_in_hand()
            acquisition = lock.acquire_enqueue(may_replace=False, holder=holder, healing=True)
            if acquisition.acquired:
                taken += 1
            else:
                duplicates += 1
        for copies in replacing.values():
            copies.sort(key=lambda copy: (copy[3].token or 0, copy[0].message_timestamp))
            for i, (message, waiting, config, outcome) in enumerate(copies):
                keep_alive()
                lock = self.locks.build(message, config, outcome)
                # The newest keep their places; one of them in a worker's hands may be running,
                # so no newer message may take its place.
                newest = i >= len(copies) - config.lock_limit
                holder = lock.holder_in_hand() if newest and not waiting else None
                acquisition = lock.acquire_enqueue(holder=holder, healing=True)
                if acquisition.acquired:
                    # The copy it replaced holds no place any more.
                    taken += 0 if acquisition.replaced else 1
                else:
                    duplicates += 1
        return taken, duplicates, in_hand


def _fingerprint(broker: RedisBroker) -> str:
    """What tells a RedisBroker's messages apart from another's: its server, database and namespace."""
    connection = broker.client.connection_pool.connection_kwargs
    where = [connection.get(name) for name in ("host", "port", "path", "db")]
    return hashlib.sha1(json.dumps([*where, broker.namespace], default=str).encode()).hexdigest()[:16]


def _kept_messages(broker: Any) -> Iterator[tuple[Message[Any], bool]]:
    """Every message RedisBroker keeps in a queue or delay queue, and whether it waits
    there, not yet fetched by a worker."""
    client, namespace = broker.client, broker.namespace
    for queue in sorted(broker.get_declared_queues()):
        # The delay queue first: a due message moves to its queue before it leaves the delay queue.
        for name in (dq_name(queue), queue):
            waiting = set(client.lrange(f"{namespace}:{name}", 0, -1))
            for redis_id, payload in client.hscan_iter(f"{namespace}:{name}.msgs"):
                try:
                    message = Message.decode(payload)
                except DecodeError:
                    continue  # no worker can run it either: Dramatiq dead-letters it when it is fetched
                yield message, redis_id in waiting
