"""Leases under ``dramatiq-gevent``: a job that keeps the gevent hub busy for longer than the
lease period keeps its run lock (issue 19, point 1).

The workers are real ``dramatiq-gevent`` processes (monkey-patched by the command, as in
production) against a real redis-server. Each run records its start and end in Redis, apart from
the library: the test counts overlaps from that record.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import dramatiq_unique

from .support import wait_for
from .test_concurrency import processes  # noqa: F401 (fixture)

pytest.importorskip("gevent")

LEASE = 1500
HEARTBEAT = 500
#: Three lease periods of a CPU-bound loop: the gevent hub of its process runs nothing else meanwhile.
BUSY = 3 * LEASE / 1000

WORKER_SCRIPT = f"""
import os, time
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
record = redis.Redis.from_url(URL)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        record.rpush("test:ready", os.getpid())


broker = RedisBroker(url=URL)
broker.add_middleware(
    UniqueJobs(backend=RedisBackend(url=URL), lease_period={LEASE}, heartbeat_interval={HEARTBEAT}), before=TimeLimit
)
broker.add_middleware(Ready())


@dramatiq.actor(
    broker=broker, queue_name="crunch", max_retries=0, lock="while_executing", lock_args_method=lambda key, n, s: [key]
)
def crunch(key, n, seconds):
    # The independent record: how many run at once when this one starts, and when it ends.
    record.rpush("test:started", f"{{n}} {{record.incr('test:running')}} {{os.getpid()}}")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # CPU-bound: never yields to the gevent hub
        pass
    record.decr("test:running")
    record.rpush("test:finished", n)
"""


def start_gevent_workers(processes, tmp_path, redis_url, client, *, count):  # noqa: F811
    """Start `dramatiq-gevent crunching:broker` with ``count`` worker processes of one greenlet each."""
    (tmp_path / "crunching.py").write_text(WORKER_SCRIPT)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    command = str(Path(sys.executable).parent / "dramatiq-gevent")
    cli = processes(
        [command, "crunching:broker", "--processes", str(count), "--threads", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
    )

    def ready() -> bool:
        if cli.poll() is not None:
            cli.log.seek(0)
            raise AssertionError(f"dramatiq-gevent exited with {cli.returncode}: {cli.log.read().decode()}")
        return client.llen("test:ready") == count

    wait_for(ready, timeout=30)
    return cli


def send(client, n, seconds):
    """Enqueue ``crunch("acct", n, seconds)`` the way ``crunch.send`` in another process would."""
    from dramatiq import Message
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(client=client)
    broker.declare_queue("crunch")
    broker.enqueue(Message(queue_name="crunch", actor_name="crunch", args=("acct", n, seconds), kwargs={}, options={}))


@pytest.mark.slow
def test_a_cpu_bound_job_under_gevent_keeps_its_run_lock_for_three_lease_periods(
    redis_url,
    redis_client,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 19, point 1: two dramatiq-gevent worker processes; the first runs a job that keeps its
    # hub busy for three lease periods, the second takes the duplicates sent meanwhile, each one
    # after the first's lease would have lapsed without a renewal.
    client = redis_client
    cli = start_gevent_workers(processes, tmp_path, redis_url, client, count=2)
    send(client, 1, BUSY)
    wait_for(lambda: client.llen("test:started") == 1)
    for n, wait in ((2, 1.7), (3, 1.0), (4, 1.0)):  # 1.7, 2.7 and 3.7 s into the first run of 4.5 s
        time.sleep(wait)
        send(client, n, 0)
    wait_for(lambda: client.lrange("test:finished", 0, -1) != [], timeout=30)
    time.sleep(1.0)  # a duplicate that runs now would still be recorded
    started = [line.decode().split() for line in client.lrange("test:started", 0, -1)]
    at_once = max(int(running) for _, running, _ in started)
    cli.log.seek(0)
    log = cli.log.read().decode()
    print(f"\nruns started: {started}; most at once: {at_once}")
    assert at_once == 1, f"a duplicate ran beside the first run: {started}\n{log}"
    assert [n for n, _, _ in started] == ["1"], f"only the first run may run: {started}\n{log}"
    # Once the first run is over, the lock is free: the next send runs.
    send(client, 5, 0)
    wait_for(lambda: client.llen("test:started") == 2)
    assert client.lindex("test:started", 1).decode().split()[:2] == ["5", "1"]
    assert "lapsed" not in log and "ERROR" not in log, log
