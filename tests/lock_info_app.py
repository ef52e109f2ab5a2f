"""An application for the command-line tests of ``lock_info``, imported by ``--app
tests.lock_info_app`` in a subprocess and by the tests themselves to send messages. Its broker
and its locks are on the Redis at ``$LOCK_INFO_APP_URL``."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["LOCK_INFO_APP_URL"]

broker = RedisBroker(url=URL)
unique = UniqueJobs(backend=RedisBackend(url=URL))
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="search", lock="until_executed", lock_info=True)
def reindex(tenant: str, batch: int) -> None:
    pass


@dramatiq.actor(queue_name="exports", lock="until_executed", lock_info=40)
def export(text: str) -> None:
    pass


@dramatiq.actor(queue_name="search", lock="until_executed")
def plain(tenant: str, batch: int) -> None:
    pass
