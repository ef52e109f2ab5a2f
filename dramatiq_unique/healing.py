"""What a worker does once it found that the lock store lost its data.

The worker that finds the loss first takes again the enqueue locks of the messages
that a ``RedisBroker`` still keeps: those waiting in their queue or delay queue, each
recorded with its lock's digest, and, of those in workers' hands, the ones whose lock
type holds the enqueue lock while the message runs. A message in a worker's hands
whose lock type gives the enqueue lock up when it starts may be running, so its lock is
left alone. Other brokers cannot be read: their queued messages' locks are not rebuilt.
(Each worker takes the run locks of its own running messages again: see
:class:`~dramatiq_unique.liveness.Liveness`.)
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

from dramatiq import Broker, Message
from dramatiq.common import dq_name

from .backends import Holder, LockBackend
from .errors import InvalidLockOptions, LockBackendError
from .in_hand import held_by_live_workers
from .keys import healing_key, registry_key
from .lock import LockFactory
from .options import ActorConfigs
from .outcome import ENQUEUED, enqueue_outcome
from .reaper import QueueCounter, needs_messages_in_hand

#: How long the worker that rebuilds holds the lock that keeps the others from doing it too (ms):
#: every worker finds the same loss within one heartbeat interval.
HEALING_TTL = 60_000


class Healing:
    """Rebuilds the enqueue locks of the messages the broker keeps, after a loss of the store's data.

    Parameters:
      backend(LockBackend): The lock store.
      prefix(str): The middleware's lock prefix.
      configs(ActorConfigs): The lock options of actors and messages.
      locks(LockFactory): Builds a message's locks.
      logger(logging.Logger): Where to report.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        configs: ActorConfigs,
        locks: LockFactory,
        logger: logging.Logger,
    ):
        self.backend = backend
        self.key = healing_key(prefix)
        self.registry = registry_key(prefix)
        self.configs = configs
        self.locks = locks
        self.logger = logger
        #: The broker of this process's Workers, once one booted.
        self.broker: Broker | None = None

    def __call__(self) -> None:
        from dramatiq.brokers.redis import RedisBroker

        broker = self.broker
        owner = uuid.uuid4().hex
        holder = Holder(message_id=owner, actor="", queue="", lock="healing", state="running")
        try:
            if not self.backend.acquire(self.key, owner, limit=1, ttl=HEALING_TTL, holder=holder).acquired:
                return  # another worker found the same loss first
            if not isinstance(broker, RedisBroker):
                self._say_what_is_left(broker)
                return
            taken, duplicates, in_hand = self._rebuild(broker)
        except LockBackendError as e:
            self.logger.error("The enqueue locks of the queued messages could not be taken again: %s", e)
            return
        self.logger.warning(
            "After the lock store lost its data, this worker took again the enqueue locks of %d messages that "
            "RedisBroker keeps. %d were taken meanwhile by a duplicate, which may run too. %d, in workers' hands, "
            "may be running and have given their lock up, so theirs were left alone.",
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

    def _rebuild(self, broker: Any) -> tuple[int, int, int]:
        taken = duplicates = in_hand = 0
        for message, waiting in _kept_messages(broker):
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
            acquisition = self.locks.build(message, config, outcome).acquire_enqueue(may_replace=False)
            if acquisition.acquired:
                taken += 1
            else:
                duplicates += 1
        return taken, duplicates, in_hand


def _kept_messages(broker: Any) -> Iterator[tuple[Message[Any], bool]]:
    """Every message RedisBroker keeps in a queue or delay queue, and whether it waits
    there, not yet fetched by a worker."""
    client, namespace = broker.client, broker.namespace
    for queue in sorted(broker.get_declared_queues()):
        # The delay queue first: a due message moves to its queue before it leaves the delay queue.
        for name in (dq_name(queue), queue):
            waiting = set(client.lrange(f"{namespace}:{name}", 0, -1))
            for redis_id, payload in client.hscan_iter(f"{namespace}:{name}.msgs"):
                yield Message.decode(payload), redis_id in waiting
