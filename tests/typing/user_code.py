"""User code that must pass ``mypy --strict`` against the package (``make test`` checks it):
the README's examples, with what they leave out filled in."""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from prometheus_client import CollectorRegistry

from dramatiq_unique import (
    ActivityReport,
    EnqueueOutcome,
    Explanation,
    HeldLock,
    LockBackend,
    LockEvent,
    LockInfo,
    Locks,
    StubBackend,
    UniqueJobs,
    current_lock,
    enqueue_outcome,
    read_activity,
    require_current_lock,
)

backend = StubBackend()
unique = UniqueJobs(backend=backend, metrics=CollectorRegistry())
broker = StubBroker()
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)
conflicts: list[LockEvent] = []
unique.subscribe("conflict", conflicts.append)

settled: dict[str, int] = {}


def lock_on_event(event_id: str, payload: dict[str, Any] | None = None) -> list[str]:
    return [event_id]


@dramatiq.actor(queue_name="payments", lock="until_executed", lock_args_method=lock_on_event)
def settle_payment(event_id: str, payload: dict[str, Any] | None = None) -> None:
    lock: HeldLock = require_current_lock()
    settled[event_id] = lock.token


@dramatiq.actor(lock="while_executing", on_conflict="reschedule")
def sync_account_balance(account_id: int) -> None:
    lock = current_lock()
    if lock is not None:
        settled[str(account_id)] = lock.token


def send_twice() -> tuple[bool, str]:
    message = settle_payment.send("evt_123", {"amount": 100})
    again: EnqueueOutcome = enqueue_outcome(settle_payment.send("evt_123", {"amount": 100}))
    holder: str = again.holder
    return enqueue_outcome(message).enqueued and not again.enqueued, holder


def why_not_run() -> tuple[str, list[str]]:
    locks = Locks.from_middleware(unique)
    explanation: Explanation = locks.explain(settle_payment, "evt_123", {"amount": 100})
    held: list[LockInfo] = list(locks.list(actor="settle_payment", state="queued", limit=10))
    freed = locks.unlock(explanation.digest or "", message_id=None) + locks.unlock_all(actor="settle_payment")
    return explanation.on_send, [h.message_id for lock in held + list(freed) for h in lock.holders]


def conflicts_per_actor() -> dict[str, int]:
    report: ActivityReport = read_activity(backend, minutes=60)
    return {actor: counts.get("conflict", 0) for actor, counts in report.totals().items()}


def backend_of_a_dotted_path(broker: dramatiq.Broker) -> LockBackend:
    # As django_dramatiq builds it: no arguments, the backend chosen for the broker.
    chosen_later = UniqueJobs()
    return chosen_later.resolve_backend(broker)
