"""Dramatiq's Results middleware and duplicates (issue 19, point 4): nothing is stored for a
duplicate dropped at send(), so get_result() on it raises ResultTimeout; the documented path is to
check enqueue_outcome() first and fetch the holder's result under the holder's message_id."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.results import ResultMissing, Results, ResultTimeout
from dramatiq.results.backends import RedisBackend as RedisResultBackend

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome


@pytest.fixture
def results_broker(redis_client):
    broker = RedisBroker(client=redis_client)
    broker.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    broker.add_middleware(Results(backend=RedisResultBackend(client=redis_client)))
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


def test_a_duplicates_outcome_names_the_holder_whose_result_it_can_wait_for(results_broker):
    broker = results_broker
    runs = []

    @dramatiq.actor(broker=broker, lock="until_executed", store_results=True)
    def settle_payment(event_id):
        runs.append(event_id)
        return {"settled": event_id}

    first = settle_payment.send("evt_123")
    message = settle_payment.send("evt_123")
    outcome = enqueue_outcome(message)
    assert (outcome.status, outcome.enqueued, outcome.holder) == ("duplicate", False, first.message_id)

    # Nothing will ever be stored under the duplicate's own message_id.
    with pytest.raises(ResultMissing):
        message.get_result()
    with pytest.raises(ResultTimeout):
        message.get_result(block=True, timeout=200)

    # The path the docs show: wait for the holder instead.
    if not outcome.enqueued:
        message = message.copy(message_id=outcome.holder)
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        assert message.get_result(block=True, timeout=10_000) == {"settled": "evt_123"}
    finally:
        worker.stop()
    assert runs == ["evt_123"]
