"""Prometheus counters of lock events (issue 10, O3): read from a registry after a scripted
scenario; on the endpoint of Dramatiq's Prometheus middleware in a real `dramatiq` worker
process (its multiprocess mode); and the middleware order that keeps Dramatiq's in-progress
gauge right."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path

import prometheus_client  # imported before any test sets PROMETHEUS_MULTIPROC_DIR: values stay in memory
import pytest
from dramatiq.middleware.prometheus import Prometheus
from prometheus_client.parser import text_string_to_metric_families

import dramatiq_unique
from dramatiq_unique import InvalidLockOptions, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import Holder
from dramatiq_unique.digest import compute_digest, lock_arguments
from dramatiq_unique.keys import run_key

from .support import Gate, plant_dead_workers_run_lock, wait_for
from .test_concurrency import processes, wait_until_ready  # noqa: F401 (fixture)

PREFIX = "dramatiq-unique"

COUNTERS = (
    "dramatiq_unique_acquisitions_total",
    "dramatiq_unique_conflicts_total",
    "dramatiq_unique_releases_total",
    "dramatiq_unique_reaped_total",
    "dramatiq_unique_backend_errors_total",
    "dramatiq_unique_leases_lost_total",
    "dramatiq_unique_data_losses_total",
    "dramatiq_unique_lost_waiting_messages_total",
    "dramatiq_unique_waits_total",
    "dramatiq_unique_cancellations_total",
    "dramatiq_unique_handoffs_total",
)


def test_counters_after_a_scripted_scenario(make_env):
    registry = prometheus_client.CollectorRegistry()
    env = make_env(metrics=registry)
    gate = Gate()

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    @env.actor(lock="while_executing")
    def sync(key):
        gate.enter(key)

    @env.actor(lock="until_executed", on_conflict="wait")
    def post(key):
        pass

    for event_id in ("e1", "e1", "e1", "e2"):
        settle.send(event_id)
    post.send("a")
    post.send("a")
    env.worker()
    sync.send("k")
    wait_for(lambda: gate.count("k") == 1)
    sync.send("k")
    env.wait_for_skips(1)
    gate.open()
    env.join(settle, sync, post)
    plant_dead_workers_run_lock(env.backend, "orphan")
    env.middleware.reaper.run(broker=env.broker)

    def value(name: str, actor: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"queue_name": "default", "actor_name": actor, **labels})

    assert value("dramatiq_unique_acquisitions_total", "settle") == 2
    assert value("dramatiq_unique_conflicts_total", "settle", side="client", strategy="log") == 2
    assert value("dramatiq_unique_releases_total", "settle") == 2
    assert value("dramatiq_unique_acquisitions_total", "sync") == 1
    assert value("dramatiq_unique_conflicts_total", "sync", side="server", strategy="log") == 1
    assert value("dramatiq_unique_releases_total", "sync") == 1
    assert value("dramatiq_unique_reaped_total", "sync") == 1
    assert value("dramatiq_unique_backend_errors_total", "settle") is None
    assert value("dramatiq_unique_waits_total", "post", side="client") == 1
    assert value("dramatiq_unique_handoffs_total", "post") == 1
    # Never a digest: the label sets stay bounded by actors, queues and strategies.
    labels = {
        name
        for family in registry.collect()
        for sample in family.samples
        if sample.name.startswith("dramatiq_unique_")
        for name in sample.labels
    }
    assert labels == {"queue_name", "actor_name", "side", "strategy"}
    assert {family.name + "_total" for family in registry.collect()} == set(COUNTERS)


def test_metrics_true_counts_in_the_default_registry(make_env):
    # Without Dramatiq's Prometheus middleware: prometheus_client's own registry, built on first use.
    env = make_env(metrics=True)

    @env.actor(lock="until_executed", actor_name="counted_in_the_default_registry")
    def settle(event_id):
        pass

    def conflicts() -> float:
        labels = {"queue_name": "default", "actor_name": settle.actor_name, "side": "client", "strategy": "log"}
        return prometheus_client.REGISTRY.get_sample_value("dramatiq_unique_conflicts_total", labels) or 0.0

    before = conflicts()
    settle.send("e1")
    settle.send("e1")
    assert conflicts() == before + 1


@pytest.mark.parametrize("metrics", ["yes", 1, object()])
def test_metrics_must_be_a_bool_or_a_registry(metrics):
    with pytest.raises(InvalidLockOptions, match=r"invalid metrics=.*valid choices are True .*, False, or a"):
        UniqueJobs(backend=StubBackend(), metrics=metrics)


def test_metrics_without_prometheus_client_fail_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if it were not installed
    with pytest.raises(
        InvalidLockOptions,
        match=r"prometheus_client is not installed: .*'prometheus' extra \(see https://.*getting-started.html#extras\)",
    ):
        UniqueJobs(backend=StubBackend(), metrics=True)


# With Dramatiq's Prometheus middleware ------------------------------------------------------


def inprogress(prometheus: Prometheus, actor: str) -> float:
    (family,) = prometheus.inprogress_messages.collect()
    return sum(s.value for s in family.samples if s.labels["actor_name"] == actor)


@pytest.mark.parametrize("order", ["prometheus_first", "prometheus_last"])
def test_prometheus_before_unique_jobs_keeps_its_in_progress_gauge_right(
    stub_env, monkeypatch, caplog, tmp_path, order
):
    # Skipped and rescheduled duplicates never reach a middleware after UniqueJobs in
    # before_process_message, but every middleware sees them in after_skip_message.
    env = stub_env
    # Prometheus switches prometheus_client to its multiprocess mode through the environment,
    # restored after the test; this process imported prometheus_client already, so its values
    # stay in memory.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("prometheus_multiproc_dir", str(tmp_path))
    prometheus = Prometheus()
    if order == "prometheus_first":
        env.broker.add_middleware(prometheus, before=UniqueJobs)
    else:
        env.broker.add_middleware(prometheus)
    prometheus.after_process_boot(env.broker)
    gate = Gate()

    @env.actor(lock="while_executing", actor_name=f"gauged_{order}")
    def sync(key):
        gate.enter(key)

    with caplog.at_level(logging.WARNING):
        env.worker()
    sync.send("k")
    wait_for(lambda: gate.count("k") == 1)
    assert inprogress(prometheus, sync.actor_name) == 1
    for _ in range(3):
        sync.send("k")
    env.wait_for_skips(3)
    gate.open()
    env.join(sync)
    warnings = [
        r.getMessage() for r in caplog.records if "Prometheus middleware comes after UniqueJobs" in r.getMessage()
    ]
    if order == "prometheus_first":
        assert inprogress(prometheus, sync.actor_name) == 0
        assert warnings == []
    else:
        assert inprogress(prometheus, sync.actor_name) == -3
        assert warnings and "broker.add_middleware(Prometheus(), before=UniqueJobs)" in warnings[0]


#: A `dramatiq` worker process with Dramatiq's Prometheus middleware and metrics=True.
METERED_SCRIPT = """
import os
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq.middleware.prometheus import Prometheus
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
client = redis.Redis.from_url(URL)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        client.rpush("test:ready", os.getpid())


broker = RedisBroker(url=URL)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=URL), metrics=True), before=TimeLimit)
broker.add_middleware(Prometheus(), before=UniqueJobs)
broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, queue_name="metered", lock="until_executed")
def settle(event_id):
    pass


@dramatiq.actor(broker=broker, queue_name="metered", lock="while_executing")
def sync(key):
    pass
"""


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.mark.slow
def test_counters_appear_on_the_endpoint_of_dramatiqs_prometheus_middleware(
    redis_env,
    redis_url,
    processes,  # noqa: F811
    tmp_path,
):
    env, client = redis_env, redis_env.broker.client
    (tmp_path / "metered.py").write_text(METERED_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        ["-m", "dramatiq", "metered:broker", "--processes", "1", "--threads", "2"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
        dramatiq_prom_host="127.0.0.1",
        dramatiq_prom_port=str(port),
        dramatiq_prom_db=str(tmp_path / "prometheus"),
    )
    wait_until_ready(client, [cli])

    @env.actor(actor_name="settle", queue_name="metered", lock="until_executed")
    def settle(event_id):
        raise AssertionError("runs in the worker process only")

    @env.actor(actor_name="sync", queue_name="metered", lock="while_executing")
    def sync(key):
        raise AssertionError("runs in the worker process only")

    # The run lock of sync("busy") is held elsewhere: the worker meets it and drops the message.
    busy = compute_digest(
        actor_name="sync",
        queue_name="metered",
        lock_args=lock_arguments("sync", None, ("busy",), {}),
        unique_across_actors=False,
        unique_across_queues=False,
    )
    holder = Holder("elsewhere", "sync", "metered", "while_executing", "running", worker_id="elsewhere")
    assert env.backend.acquire(run_key(PREFIX, busy), "elsewhere", limit=1, ttl=60_000, holder=holder).acquired
    for event_id in ("e1", "e2", "e3"):
        assert enqueue_outcome(settle.send(event_id)).enqueued
    sync.send("busy")
    sync.send("free")

    def label(actor: str, **extra: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"queue_name": "metered", "actor_name": actor, **extra}.items()))

    expected = {
        ("dramatiq_unique_releases_total", label("settle")): 3.0,
        ("dramatiq_unique_acquisitions_total", label("sync")): 1.0,
        ("dramatiq_unique_releases_total", label("sync")): 1.0,
        ("dramatiq_unique_conflicts_total", label("sync", side="server", strategy="log")): 1.0,
        # Dramatiq's own, on the same endpoint: the skipped duplicate left its gauge at zero.
        ("dramatiq_messages_total", label("sync")): 2.0,
        ("dramatiq_messages_inprogress", label("sync")): 0.0,
    }

    def reached() -> bool:
        try:
            samples = scrape(port)
        except OSError:
            return False  # the exposition server is not listening yet
        return all(samples.get(key) == value for key, value in expected.items())

    deadline = time.monotonic() + 30
    while not reached():
        if time.monotonic() > deadline:
            cli.log.seek(0)
            found = {k: v for k, v in scrape(port).items() if k[0].startswith("dramatiq")}
            raise AssertionError(f"not on the endpoint: {expected} in {found}\n{cli.log.read().decode()}")
        time.sleep(0.1)
