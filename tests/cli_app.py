"""A small application for the command-line tests, imported by ``dramatiq-unique explain
tests.cli_app:...`` and ``--app tests.cli_app`` in a subprocess, and by the tests themselves to
take locks. Its broker and its locks are on the Redis at ``$CLI_APP_URL``."""

from __future__ import annotations

import os
import threading
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["CLI_APP_URL"]

broker = RedisBroker(url=URL)
unique = UniqueJobs(backend=RedisBackend(url=URL))
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

#: Opened by the tests to let running messages finish.
gate = threading.Event()


def event_of(event_id: str, payload: dict[str, Any] | None = None) -> list[str]:
    return [event_id]


@dramatiq.actor(queue_name="payments", lock="until_executed", lock_args_method=event_of)
def settle_payment(event_id: str, payload: dict[str, Any] | None = None) -> None:
    pass


@dramatiq.actor(queue_name="sync", lock="while_executing", on_conflict="reschedule")
def sync_account_balance(account_id: int) -> None:
    gate.wait(600)


@dramatiq.actor(queue_name="reports", lock="until_executed", lock_limit=2)
def build_report(day: str) -> None:
    pass


@dramatiq.actor(queue_name="payments", lock="until_executed", lock_prefix="billing")
def send_invoice(number: int) -> None:
    pass


@dramatiq.actor(queue_name="payments", lock="until_executed", lock_ttl=60_000)
def send_reminder(number: int) -> None:
    pass


@dramatiq.actor(queue_name="payments")
def ping() -> None:
    pass


@dramatiq.actor(queue_name="exports", lock="until_executed", on_conflict="wait", lock_args_method=lambda day, n: [day])
def export_orders(day: str, n: int) -> None:
    broker.client.rpush("tests:exports", n)
