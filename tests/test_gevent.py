"""Leases under ``dramatiq-gevent``: a job that keeps the gevent hub busy for longer than the
lease period keeps its run lock (issue 19, point 1).

The workers are real ``dramatiq-gevent`` processes (monkey-patched by the command, as in
production) against a real redis-server. Each run records its start and end in Redis, apart from
the library: the test counts overlaps from that record.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dramatiq_unique

from .support import wait_for
from .test_concurrency import processes  # noqa: F401 (fixture)
from .test_outages import RedisProcess

pytest.importorskip("gevent")

LEASE = 1500
HEARTBEAT = 500
#: Three lease periods of a CPU-bound loop: the gevent hub of its process runs nothing else meanwhile.
BUSY = 3 * LEASE / 1000

#: How the worker process's lock backend reaches Redis: a plain URL, which a native thread can
#: use with sockets of its own, and a client of a connection class of the application's own, which
#: the library cannot copy (its leases are then renewed from a greenlet).
BACKENDS = {
    "native": "RedisBackend(url=URL)",
    "greenlet": (
        "RedisBackend(client=redis.Redis(connection_pool="
        "redis.ConnectionPool.from_url(URL, connection_class=AppConnection)))"
    ),
    # A lock store of its own, apart from the broker's Redis: a test empties it alone.
    "store": 'RedisBackend(url=os.environ["UNIQUE_TEST_STORE_URL"])',
}

WORKER_SCRIPT = """
import ctypes, ctypes.util, os, time
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
record = redis.Redis.from_url(URL)


class AppConnection(redis.Connection):
    pass


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        record.rpush("test:ready", os.getpid())


broker = RedisBroker(url=URL)
unique = UniqueJobs(backend=BACKEND, lease_period=LEASE, heartbeat_interval=HEARTBEAT)
unique.subscribe("lease_lost", lambda event: record.rpush("test:lease_lost", event.message_id))
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(
    broker=broker,
    queue_name="crunch",
    max_retries=0,
    lock="while_executing",
    lock_args_method=lambda key, n, s, gil=False: [key],
)
def crunch(key, n, seconds, gil=False):
    # The independent record: how many run at once when this one starts, and when it ends.
    record.rpush("test:started", f"{n} {record.incr('test:running')} {os.getpid()}")
    if gil:  # a C call that keeps the GIL: no thread of the process runs meanwhile
        ctypes.PyDLL(ctypes.util.find_library("c")).usleep(int(seconds * 1_000_000))
        time.sleep(1.0)  # yields: the periodic thread's next round finds the lost lease first
    deadline = time.monotonic() + (0 if gil else seconds)
    while time.monotonic() < deadline:  # CPU-bound: never yields to the gevent hub
        pass
    record.decr("test:running")
    record.rpush("test:finished", n)
"""


def start_gevent_workers(processes, tmp_path, redis_url, client, *, count, backend="native", **env):  # noqa: F811
    """Start `dramatiq-gevent crunching:broker` with ``count`` worker processes of one greenlet each,
    with ``env`` added to their environment."""
    script = WORKER_SCRIPT.replace("BACKEND", BACKENDS[backend])
    script = script.replace("LEASE", str(LEASE)).replace("HEARTBEAT", str(HEARTBEAT))
    (tmp_path / "crunching.py").write_text(script)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    command = str(Path(sys.executable).parent / "dramatiq-gevent")
    cli = processes(
        [command, "crunching:broker", "--processes", str(count), "--threads", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
        **env,
    )

    def ready() -> bool:
        if cli.poll() is not None:
            cli.log.seek(0)
            raise AssertionError(f"dramatiq-gevent exited with {cli.returncode}: {cli.log.read().decode()}")
        return client.llen("test:ready") == count

    wait_for(ready, timeout=30)
    return cli


def send(client, n, seconds, gil=False):
    """Enqueue ``crunch("acct", n, seconds, gil)`` the way ``crunch.send`` in another process would."""
    from dramatiq import Message
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(client=client)
    broker.declare_queue("crunch")
    broker.enqueue(
        Message(queue_name="crunch", actor_name="crunch", args=("acct", n, seconds, gil), kwargs={}, options={})
    )


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
    started, at_once, log = busy_run_with_duplicates(client, cli)
    assert at_once == 1, f"a duplicate ran beside the first run: {started}\n{log}"
    assert [n for n, _, _ in started] == ["1"], f"only the first run may run: {started}\n{log}"
    # Once the first run is over, the lock is free: the next send runs.
    send(client, 5, 0)
    wait_for(lambda: client.llen("test:started") == 2)
    assert client.lindex("test:started", 1).decode().split()[:2] == ["5", "1"]
    assert log.count("was dropped without running") == 3, log  # each duplicate met the held lock
    assert "[ERROR]" not in log and "UniqueJobs] [WARNING]" not in log, log
    assert client.llen("test:lease_lost") == 0


@pytest.mark.slow
def test_a_gevent_worker_whose_leases_cannot_be_kept_says_so_loudly(
    redis_url,
    redis_client,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 19, point 1: where the library cannot renew from a native thread (a client it cannot
    # copy), the worker warns at boot, and a lease lost to a busy hub is an ERROR naming the cause
    # and the fix, and a lease_lost event (before, the log said nothing).
    client = redis_client
    cli = start_gevent_workers(processes, tmp_path, redis_url, client, count=2, backend="greenlet")
    started, at_once, log = busy_run_with_duplicates(client, cli)
    print(log)
    assert log.count("its lock backend cannot be reached from a native thread") == 2  # one per worker process
    first = [line for line in log.splitlines() if "[ERROR]" in line]
    assert len(first) == 1 and "renewed no lease for" in first[0] and "gevent.sleep(0)" in first[0], log
    assert client.llen("test:lease_lost") == 1
    assert at_once == 2  # what the ERROR warns of: the measurement, not a promise


def busy_run_with_duplicates(client, cli):
    """Run ``crunch`` for three lease periods, and send duplicates 1.7, 2.2 and 2.7 s into its run:
    each after an unrenewed lease would have lapsed, and each long enough before the run ends for
    the other worker process, which polls an empty queue up to once a second, to take it meanwhile.

    Returns:
      The runs started (number, how many ran at once then, pid), the most at once, the CLI's log.
    """
    send(client, 1, BUSY)
    wait_for(lambda: client.llen("test:started") == 1)
    for n, wait in ((2, 1.7), (3, 0.5), (4, 0.5)):
        time.sleep(wait)
        send(client, n, 0)
    wait_for(lambda: b"1" in client.lrange("test:finished", 0, -1), timeout=30)
    time.sleep(1.0)  # a duplicate that runs now would still be recorded
    started = [line.decode().split() for line in client.lrange("test:started", 0, -1)]
    at_once = max(int(running) for _, running, _ in started)
    cli.log.seek(0)
    log = cli.log.read().decode()
    print(f"\nruns started: {started}; most at once: {at_once}")
    return started, at_once, log


@pytest.mark.slow
def test_a_gevent_job_that_holds_the_gil_loses_its_lease_with_an_error_and_an_event(
    redis_url,
    redis_client,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 19, point 1: what even a native thread cannot ride out, a C call that keeps the GIL
    # for three lease periods, is one ERROR naming the cause, and a lease_lost event that reaches
    # its subscriber, which records it with the worker's own gevent client (in the worker's hub).
    client = redis_client
    cli = start_gevent_workers(processes, tmp_path, redis_url, client, count=1)
    send(client, 1, BUSY, gil=True)
    wait_for(lambda: client.llen("test:lease_lost") == 1, timeout=30)
    wait_for(lambda: client.llen("test:finished") == 1)
    time.sleep(3 * HEARTBEAT / 1000)  # a second report would come by now
    cli.log.seek(0)
    log = cli.log.read().decode()
    errors = [line for line in log.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "renewed no lease for" in errors[0] and "holds the GIL" in errors[0], log
    assert client.llen("test:lease_lost") == 1


@pytest.mark.slow
def test_a_gevent_worker_heals_a_lock_store_that_lost_its_data(
    redis_url,
    redis_client,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 20 under dramatiq-gevent: the periodic thread (a native thread) finds the loss, and the
    # healing, which reads the broker through the hub's sockets, runs in the hub: new locks are
    # refused meanwhile, then taken again, and a job sent after that runs.
    (tmp_path / "store").mkdir()
    store = RedisProcess(tmp_path / "store")
    store.start()
    try:
        cli = start_gevent_workers(
            processes,
            tmp_path,
            redis_url,
            redis_client,
            count=1,
            backend="store",
            UNIQUE_TEST_STORE_URL=f"redis://127.0.0.1:{store.port}/0",
        )
        wait_for(lambda: store.client().exists("dramatiq-unique:epoch"), timeout=10)
        store.client().flushall()

        def log() -> str:
            cli.log.seek(0)
            return cli.log.read().decode()

        wait_for(lambda: "The lock store takes new locks again" in log(), timeout=15)
        assert log().count("The lock store lost its data:") == 1, log()
        assert "Healing the lock store after it lost its data failed" not in log(), log()
        send(redis_client, 1, 0)
        wait_for(lambda: redis_client.llen("test:finished") == 1, timeout=10)
    finally:
        store.kill()


INTERRUPT_SCRIPT = """
from gevent import monkey

monkey.patch_all()

import logging, time
import gevent
from dramatiq_unique import Cancelled
from dramatiq_unique.cancellation import Cancellations, interrupter
from dramatiq_unique.events import EventSubject
from dramatiq_unique.native import NativeEvent, NativeThread

cancellations = Cancellations(logger=logging.getLogger("test"))
runs = []


def subject(message_id):
    return EventSubject("deploy", "default", "digest", message_id, "while_executing")


def from_native_thread(function):
    # As the heartbeat does: from an OS thread, while the greenlets wait on their hub or compute.
    thread = NativeThread(name="heartbeat", target=lambda stop: function(), stop=NativeEvent())
    thread.start()
    return thread


def message(message_id, seconds, *, busy=0.0, asked=None):
    held, target = [True], interrupter()
    if asked is not None:
        asked[message_id] = (target, held)
    runs.append(f"start {message_id}")
    try:
        until = time.monotonic() + busy
        while time.monotonic() < until:  # keeps the hub from running: no greenlet switch
            pass
        if seconds:
            gevent.sleep(seconds)
        runs.append(f"done {message_id}")
    except Cancelled:
        runs.append(f"cancelled {message_id}")
    finally:
        held[0] = False  # gives its lease up


# One message waits on the hub: the native thread has its hub throw Cancelled into it at once.
asked = {}
first = gevent.spawn(message, "a", 60, asked=asked)
gevent.sleep(0.1)
started = time.monotonic()
target, held = asked["a"]
from_native_thread(lambda: cancellations.interrupt(target, subject("a"), lambda: held[0], "message x"))
first.join(5)
runs.append(f"a took {time.monotonic() - started:.3f}")


# The greenlet asked to stop leaves its message before its hub runs the throw, and takes another:
# the next message is not interrupted, and the first is not left recorded as interrupted.
def ask_b():
    while "b" not in asked:
        native_sleep(0.01)
    target, held = asked["b"]
    cancellations.interrupt(target, subject("b"), lambda: held[0], "message x")
    asking.append(f"asked b while it ran: {held[0]}")


def worker_thread():
    message("b", 0, busy=0.5, asked=asked)  # computes, without yielding, for half a second
    message("c", 0.5)


native_sleep, asking = monkey.get_original("time", "sleep"), []
from_native_thread(ask_b)
gevent.spawn(worker_thread).join(5)
runs += asking
runs.append(f"b interrupted: {cancellations.interrupted('b')}")
print(" | ".join(runs))
"""


def test_a_greenlet_asked_to_stop_is_killed_by_its_hub_and_never_the_next_message_it_runs(tmp_path):
    """Issue 35, point 2: under gevent, the heartbeat's native thread has the message's hub throw
    Cancelled into its greenlet; when the greenlet left that message before the hub ran the
    throw, the message it runs next is not interrupted."""
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT_SCRIPT)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": path},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    runs = done.stdout.strip().split(" | ")
    assert runs[:2] == ["start a", "cancelled a"], runs
    assert float(runs[2].split()[-1]) < 0.5, runs  # not the 60 s the message waits
    assert runs[3:] == [
        "start b",
        "done b",
        "start c",
        "done c",
        "asked b while it ran: True",
        "b interrupted: False",
    ], runs
