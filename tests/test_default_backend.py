"""UniqueJobs() with no backend= chooses its lock store when it meets its broker (issue 19, point 2):
DRAMATIQ_UNIQUE_URL, which works without Django too, else a RedisBroker's own Redis; nothing named
stops the declaration of the first actor with an error that says what to set. The Django setting
and django_dramatiq's dotted path are proven with a real Django project in tests/test_django.py.
"""

from __future__ import annotations

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique import InvalidBackendOptions, Locks, RedisBackend, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.errors import UniqueError

from .support import scan_all

NO_LOCK_STORE = (
    "UniqueJobs was given no lock backend, and its broker, a StubBroker, is no RedisBroker whose Redis could "
    "hold the locks. To name the Redis of the locks, set the DRAMATIQ_UNIQUE_URL environment variable to a "
    'Redis URL; or, in a Django project, set DRAMATIQ_UNIQUE = {"BACKEND_OPTIONS": {"url": "redis://..."}} '
    "in its settings; or pass UniqueJobs(backend=RedisBackend(url=...))."
)


@pytest.fixture(autouse=True)
def _no_url_variable(monkeypatch):
    monkeypatch.delenv("DRAMATIQ_UNIQUE_URL", raising=False)


def with_db(redis_url: str, db: int) -> str:
    return redis_url.rpartition("/")[0] + f"/{db}"


def declare(broker: dramatiq.Broker) -> dramatiq.Actor:
    @dramatiq.actor(broker=broker, lock="until_executed")
    def send_receipt(order_id):
        pass

    return send_receipt


def sent_twice(actor: dramatiq.Actor) -> list[str]:
    return [enqueue_outcome(actor.send(42)).status for _ in range(2)]


def test_the_url_variable_names_the_lock_store_without_django(monkeypatch, redis_url):
    locks_url = with_db(redis_url, 1)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_URL", locks_url)
    broker = StubBroker(middleware=[UniqueJobs()])

    assert sent_twice(declare(broker)) == ["enqueued", "duplicate"]
    held = [h.actor for lock in Locks(RedisBackend(url=locks_url)).list() for h in lock.holders]
    assert held == ["send_receipt"]


def test_a_redis_broker_lends_its_own_redis(redis_client):
    unique = UniqueJobs()
    broker = RedisBroker(client=redis_client, middleware=[unique])

    assert sent_twice(declare(broker)) == ["enqueued", "duplicate"]
    assert isinstance(unique.backend, RedisBackend) and unique.backend.client is broker.client
    assert len(scan_all(unique.backend)) == 1


def test_the_url_variable_wins_over_the_brokers_redis(monkeypatch, redis_client, redis_url):
    locks_url = with_db(redis_url, 1)
    monkeypatch.setenv("DRAMATIQ_UNIQUE_URL", locks_url)
    broker = RedisBroker(client=redis_client, middleware=[UniqueJobs()])

    assert sent_twice(declare(broker)) == ["enqueued", "duplicate"]
    assert len(scan_all(RedisBackend(url=locks_url))) == 1
    assert scan_all(RedisBackend(client=redis_client)) == []


def test_no_lock_store_stops_the_first_declaration_and_says_what_to_set():
    unique = UniqueJobs()
    broker = StubBroker(middleware=[unique])

    with pytest.raises(InvalidBackendOptions) as raised:
        declare(broker)
    assert str(raised.value) == NO_LOCK_STORE
    with pytest.raises(UniqueError, match="has not chosen one yet"):
        unique.backend  # noqa: B018


def test_no_lock_store_stops_a_worker_without_actors():
    broker = StubBroker(middleware=[UniqueJobs()])
    worker = Worker(broker, worker_timeout=100)

    with pytest.raises(InvalidBackendOptions, match="no lock backend"):
        worker.start()


def test_a_backend_given_is_kept(monkeypatch, redis_url):
    monkeypatch.setenv("DRAMATIQ_UNIQUE_URL", redis_url)
    backend = StubBackend()
    unique = UniqueJobs(backend=backend)
    broker = StubBroker(middleware=[unique])

    assert sent_twice(declare(broker)) == ["enqueued", "duplicate"]
    assert unique.backend is backend and unique.resolve_backend(broker) is backend
    assert len(scan_all(backend)) == 1
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_the_runtime_of_a_worker_uses_the_chosen_backend(monkeypatch, redis_url):
    # The heartbeat thread, built before the backend was known, registers the worker in it.
    monkeypatch.setenv("DRAMATIQ_UNIQUE_URL", redis_url)
    broker = StubBroker(middleware=[UniqueJobs(reaper=False)])
    broker.emit_after("process_boot")
    locks = Locks(RedisBackend(url=redis_url))
    worker = Worker(broker, worker_timeout=100)
    worker.start()
    try:
        assert len(locks.workers()[1]) == 1
    finally:
        worker.stop()
    assert locks.workers()[1] == ()
