"""The app of the data-loss load run (tests/data_loss_load.py): the worker processes run
``dramatiq tests.data_loss_workers:broker``, and the sender builds the same actors in its own process.

Payments are ``until_executed``; syncs are ``while_executing`` per account. Each run is recorded in
the broker's Redis (``<run>:runs``), not by the library: kind, key, start, end (``time.time()``),
pid and message id. Skipped messages, dead-lettered ones and the library's WARNING and ERROR lines
are recorded there too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

PAYMENT_SECONDS = 0.2
SYNC_SECONDS = 0.3
HEARTBEAT_INTERVAL = 500
LEASE_PERIOD = 3000
#: A message whose lock cannot be taken while the store is down is retried (LockBackendRetry): soon.
RETRIES: dict[str, Any] = dict(max_retries=20, min_backoff=100, max_backoff=1000)


class Record(Middleware):
    """What the worker processes did, in the broker's Redis."""

    def __init__(self, client: redis.Redis, run: str):
        self.client, self.run = client, run

    def after_worker_boot(self, broker, worker):
        self.client.rpush(f"{self.run}:ready", os.getpid())

    def after_skip_message(self, broker, message):
        self.client.rpush(f"{self.run}:skipped", message.message_id)

    def after_process_message(self, broker, message, *, result=None, exception=None):
        if message.failed:
            self.client.rpush(f"{self.run}:failed", message.message_id)


class LogRecord(logging.Handler):
    """The library's WARNING and ERROR lines, with the time and process they were logged in."""

    def __init__(self, client: redis.Redis, run: str):
        super().__init__(logging.WARNING)
        self.client, self.run = client, run

    def emit(self, record: logging.LogRecord) -> None:
        line = [record.created, os.getpid(), record.levelname, record.getMessage()]
        self.client.rpush(f"{self.run}:log", json.dumps(line))


def build(
    *,
    broker_kind: str,
    broker_url: str,
    store_url: str,
    record_url: str,
    run: str,
    sender: bool = False,
    store_client: redis.Redis | None = None,
):
    """The broker and the two actors (settle, sync); a worker process also records what it does."""
    record = redis.Redis.from_url(record_url)
    if broker_kind == "rabbitmq":
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker: dramatiq.Broker = RabbitmqBroker(url=broker_url)
    else:
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=broker_url)
    backend = RedisBackend(client=store_client) if store_client is not None else RedisBackend(url=store_url)
    unique = UniqueJobs(backend=backend, heartbeat_interval=HEARTBEAT_INTERVAL, lease_period=LEASE_PERIOD)
    broker.add_middleware(unique, before=TimeLimit)
    if not sender:
        broker.add_middleware(CurrentMessage())
        broker.add_middleware(Record(record, run))
        logging.getLogger("dramatiq_unique").addHandler(LogRecord(record, run))

    def ran(kind: str, key: Any, start: float) -> None:
        message = CurrentMessage.get_current_message()
        line = [kind, key, start, time.time(), os.getpid(), message.message_id]
        record.rpush(f"{run}:runs", json.dumps(line))

    @dramatiq.actor(broker=broker, actor_name="settle", queue_name=f"payments-{run}", lock="until_executed", **RETRIES)
    def settle(event_id):
        start = time.time()
        time.sleep(PAYMENT_SECONDS)
        ran("payment", event_id, start)

    @dramatiq.actor(
        broker=broker,
        actor_name="sync",
        queue_name=f"syncs-{run}",
        lock="while_executing",
        lock_args_method=lambda account, n: [account],
        **RETRIES,
    )
    def sync(account, n):
        start = time.time()
        time.sleep(SYNC_SECONDS)
        ran("sync", account, start)

    return broker, settle, sync


if "DATA_LOSS_RUN" in os.environ:
    broker, settle, sync = build(**json.loads(os.environ["DATA_LOSS_RUN"]))
