"""The background work of a process (issue 18): started once per booted Worker and stopped once
per Worker that booted, told apart by identity; safe across fork(); at most two threads of this
library in a worker process and one in a process that only sends."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import pytest
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

import dramatiq_unique
from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique import metrics as metrics_module
from dramatiq_unique import runtime as runtime_module

from .support import Env, assert_stop_is_bounded, resume_after_bounded_stop, stub_env_on, wait_for
from .test_outages import server  # noqa: F401 (fixture)

#: Short leases, so that a lease that is not renewed lapses within the test.
LEASE = 300
HEARTBEAT = 100
#: A lease that only a heartbeat that stopped lets lapse: fifteen heartbeat intervals, more than a
#: loaded machine stalls a thread.
LONG_LEASE = 1500


def _lease_env(redis_client, lease: int):
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=lease, heartbeat_interval=HEARTBEAT))
    yield from env.run()


@pytest.fixture
def lease_env(redis_client):
    yield from _lease_env(redis_client, LEASE)


@pytest.fixture
def long_lease_env(redis_client):
    yield from _lease_env(redis_client, LONG_LEASE)


def start_worker(env: Env, queue: str, threads: int = 2) -> Worker:
    worker = Worker(env.broker, worker_timeout=100, worker_threads=threads, queues={queue})
    worker.start()
    env.workers.append(worker)
    return worker


@pytest.mark.parametrize("wrong_stop", ["stopped twice", "never started"])
def test_a_wrong_stop_of_another_worker_leaves_the_heartbeat_of_a_running_worker(long_lease_env, wrong_stop):
    # Issue 18, defect 1: the heartbeat thread counted Worker boots and shutdowns, so a Worker
    # stopped twice, or one that never started, stopped the heartbeat of another Worker of the
    # process: its while_executing run lock lapsed after one lease period and a copy ran beside it.
    env = long_lease_env
    runs: list[tuple[str, float, float]] = []
    finish = threading.Event()

    @env.actor(queue_name="sync", lock="while_executing", lock_args_method=lambda account_id, copy: [account_id])
    def sync(account_id, copy):
        started = time.monotonic()
        if copy == "first":
            finish.wait(10)
        runs.append((copy, started, time.monotonic()))

    @env.actor(queue_name="other")
    def other_job():
        pass

    start_worker(env, "sync")
    first = sync.send("42", "first")
    if wrong_stop == "stopped twice":
        other = start_worker(env, "other", threads=1)
        other.stop()
        other.stop()
    else:
        Worker(env.broker, worker_timeout=100, queues={"other"}).stop()
    digest = enqueue_outcome(first).digest
    # How soon the first starts is not what this test is about: CI's loaded machine once took 10 s.
    wait_for(lambda: not env.is_free(digest, run=True), timeout=60)
    # Copies of the job come while the first runs, over two lease periods.
    deadline = time.monotonic() + 2 * LONG_LEASE / 1000
    copies = 0
    while time.monotonic() < deadline:
        sync.send("42", f"copy {copies}")
        copies += 1
        time.sleep(HEARTBEAT / 1000)
    still_held = not env.is_free(digest, run=True)
    finish.set()
    env.join(sync)

    (first_run,) = [run for run in runs if run[0] == "first"]
    beside = [run for run in runs if run[0] != "first" and run[1] < first_run[2]]
    assert not beside, f"{len(beside)} copies ran beside the first one: its lease was not renewed"
    assert still_held, "the first run lock lapsed while it ran"
    assert env.seen.skipped and len(runs) == 1


def test_a_worker_in_a_forked_child_releases_its_finished_locks(redis_env, redis_client):
    # Issue 18, defect 2: a child forked while a Worker runs in the parent inherited the parent's
    # release thread as "running": the releases of its until_executed messages were handed to a
    # thread that does not exist in the child, and its warm stop() sent none of them. With no
    # lock_ttl, the job was blocked for ever.
    env = redis_env

    @env.actor(queue_name="child", lock="until_executed")
    def settle(event_id):
        redis_client.rpush("test:done", event_id)

    @env.actor(queue_name="parent")
    def parent_job():
        pass

    start_worker(env, "parent", threads=1)
    message = settle.send("e1")
    digest = enqueue_outcome(message).digest
    reading, writing = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
        pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(reading)
            worker = Worker(env.broker, worker_timeout=100, worker_threads=1, queues={"child"})
            worker.start()
            done = redis_client.blpop(["test:done"], timeout=10) is not None
            deadline = time.monotonic() + 5
            while not (released := env.is_free(digest)) and time.monotonic() < deadline:
                time.sleep(0.01)
            worker.stop()
            report = {"done": done, "released while running": released, "released after stop": env.is_free(digest)}
            os.write(writing, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(writing)
    with os.fdopen(reading) as pipe:
        report = json.loads(pipe.read() or "null")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == {"done": True, "released while running": True, "released after stop": True}
    again = settle.send("e1")
    assert enqueue_outcome(again).status == "enqueued", "the child's finished message still holds its lock"


def _fork_while_held(mutex, use) -> int | None:
    """Fork while a thread of this process holds ``mutex``; the child calls ``use()`` and exits 0
    when it returns True. The child's exit code, or ``None`` when it did not exit within 30 s."""
    held, done = threading.Event(), threading.Event()

    def hold():
        with mutex:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if use() else 2
            except BaseException:
                traceback.print_exc()  # pytest shows it with the child's exit code
            finally:
                os._exit(code)
    finally:
        done.set()
        holder.join()
    deadline = time.monotonic() + 30
    while (answer := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        time.sleep(0.01)
    return os.waitstatus_to_exitcode(answer[1])


#: Each mutex of the middleware that a thread may hold when the process forks, and what in the
#: child takes it first.
FORK_HELD_MUTEXES = {
    "the choice of the lock backend": (lambda unique: unique._choosing, "declare"),
    "the subscribers of lock events": (lambda unique: unique.events._mutex, "subscribe"),
    "the message option checks": (lambda unique: unique.client_side._check_message_options._warned._mutex, "misspell"),
    "the prefixes of the orphan reaper": (lambda unique: unique.reaper._mutex, "prefix"),
    "the Prometheus counters": (lambda unique: unique.metrics._mutex, "send"),
    "the Prometheus counters of a registry": (lambda unique: metrics_module._BUILT_MUTEX, "send"),
    "the check of the eviction policy": (lambda unique: unique._eviction_check._mutex, "send"),
    "the choice of the lock scripts": (lambda unique: unique.backend._scripts._choosing, "send"),
}


@pytest.mark.parametrize("held", FORK_HELD_MUTEXES)
def test_a_child_forked_while_a_thread_holds_a_mutex_of_the_middleware_can_use_it(redis_client, held):
    # Issue 32 (8): a child forked while another thread held the mutex of the lock events, of the
    # message option checks, of the orphan reaper or of the metrics inherited it held, by a thread
    # the child does not have: its first send, declaration or subscription waited for ever.
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    # No lock backend given: the middleware chooses the broker's Redis when it first meets an actor.
    unique = UniqueJobs(metrics=True)
    env = Env("redis", broker, RedisBackend(client=redis_client), unique)
    runs = env.run()
    next(runs)
    try:
        mutex, use = FORK_HELD_MUTEXES[held]
        if use != "declare":

            @env.actor(lock="until_executed")
            def settle(event_id):
                pass

        def in_the_child() -> bool:
            if use == "declare":

                @env.actor(lock="until_executed")
                def sync(account_id):
                    pass

                return enqueue_outcome(sync.send("a1")).status == "enqueued"
            if use == "subscribe":
                unique.subscribe("acquired", print)
                return True
            if use == "misspell":
                message = settle.send_with_options(args=("e1",), lock_tll=60_000)
                return enqueue_outcome(message).status == "enqueued"
            if use == "prefix":

                @env.actor(lock="until_executed", lock_prefix="billing")
                def invoice(number):
                    pass

                return enqueue_outcome(invoice.send(1)).status == "enqueued"
            return enqueue_outcome(settle.send("e1")).status == "enqueued"

        code = _fork_while_held(mutex(unique), in_the_child)
        assert code is not None, "the child waited for ever for a mutex held by a thread of its parent"
        assert code == 0
    finally:
        unique.resolve_backend(broker)  # in the parent too, whose Env ends with it
        next(runs, None)


def test_the_last_worker_stops_while_its_heartbeat_waits_for_a_lock_backend_that_does_not_answer(
    server,  # noqa: F811
    monkeypatch,
    caplog,
):
    # The last Worker's stop() joined the heartbeat thread without a bound: with the lock
    # backend's redis-server stopped (not down: it accepts and never answers, and the client has
    # no socket_timeout), the heartbeat waited for it, and so did the worker's shutdown, for ever.
    monkeypatch.setattr(runtime_module, "MIN_STOP_WAIT", 200)
    env = stub_env_on(server.port, lease_period=LEASE, heartbeat_interval=HEARTBEAT)
    runs = env.run()
    next(runs)
    stopper = threading.Thread(target=env.worker().stop)
    try:
        server.proc.send_signal(signal.SIGSTOP)
        time.sleep(2 * HEARTBEAT / 1000)  # a heartbeat waits for the server now
        assert_stop_is_bounded(stopper, caplog)
    finally:
        resume_after_bounded_stop(server, stopper, runs)


#: A process that sends, and then either stops (a sender) or boots two Workers at once, stops
#: them and sends again (a worker); a thread samples the threads of this library meanwhile and
#: prints the most seen in each phase.
THREADS_SCRIPT = """
import json, sys, threading, time
import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

url = sys.argv[1]
broker = RedisBroker(url=url)
unique = UniqueJobs(
    backend=RedisBackend(url=url), lease_period=300, heartbeat_interval=100, reaper=True, reaper_interval=200
)
broker.add_middleware(unique, before=TimeLimit)


@dramatiq.actor(broker=broker, lock="until_executed")
def settle(i):
    pass


@dramatiq.actor(broker=broker, lock="while_executing")
def sync(i):
    time.sleep(0.4)  # outlives two heartbeats: its lease is renewed


phase, most, done = "sending", {}, threading.Event()


def sample():
    while not done.is_set():
        names = sorted(t.name for t in threading.enumerate() if t.name.startswith("dramatiq-unique"))
        if len(names) > len(most.get(phase, [])):
            most[phase] = names
        time.sleep(0.002)


sampler = threading.Thread(target=sample)
sampler.start()
for i in range(20):
    settle.send(i)
if sys.argv[2] == "sender":
    time.sleep(0.3)  # the counts are flushed
else:
    # Workers boot while the thread that flushes the counts of the sends runs.
    phase = "working"
    workers = [Worker(broker, worker_timeout=100, worker_threads=4) for _ in range(2)]
    for worker in workers:
        worker.start()
    for i in range(50):
        settle.send(i)
    for i in range(4):
        sync.send(i)
    broker.join(settle.queue_name)
    for worker in workers:
        worker.join()
    time.sleep(0.5)  # heartbeats, the reaper's trigger
    for worker in workers:
        worker.stop()
    phase = "stopped"
    for i in range(20):
        settle.send(i)
    time.sleep(0.3)
done.set()
sampler.join()
print(json.dumps(most))
"""


@pytest.mark.parametrize("process", ["sender", "worker"])
def test_a_worker_process_runs_two_threads_of_the_library_and_a_sender_one(redis_url, process, tmp_path):
    script = tmp_path / "threads.py"
    script.write_text(THREADS_SCRIPT)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, str(script), redis_url, process],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stderr
    # Nothing escapes as the interpreter exits: a weak reference's callback once did, on 3.13.
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr
    most = json.loads(result.stdout.splitlines()[-1])
    # A process that sends flushes its activity counts from the periodic thread.
    assert most["sending"] == ["dramatiq-unique-periodic"]
    if process == "worker":
        # The thread that flushed the sends' counts is the workers' periodic thread now.
        assert most["working"] == ["dramatiq-unique-periodic", "dramatiq-unique-releases"]
        assert most["stopped"] == ["dramatiq-unique-periodic"]


def test_a_lease_lost_while_a_c_extension_holds_the_gil_is_an_error_naming_the_cause(lease_env, caplog):
    # Issue 19, point 1: a job that holds the GIL for longer than the lease period (a C call that
    # does not release it: here libc's sleep called through ctypes.PyDLL, which keeps the GIL)
    # stops the periodic thread, and its run lock lapses. Before, nothing was said when the job
    # ended before the next renewal; now one ERROR names the cause and the fix, and the lease_lost
    # event is told.
    env = lease_env
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    lost: list[str] = []
    env.middleware.subscribe("lease_lost", lambda event: lost.append(event.message_id))
    caplog.set_level(logging.WARNING, logger="dramatiq_unique")

    @env.actor(lock="while_executing", queue_name="gil")
    def crunch(key):
        libc.usleep(4 * LEASE * 1000)  # four lease periods with the GIL held

    start_worker(env, "gil", threads=1)
    message = crunch.send("k")
    env.join(crunch)
    wait_for(lambda: lost)
    time.sleep(3 * HEARTBEAT / 1000)  # a second report would come by now
    assert lost == [message.message_id]
    reports = [r for r in caplog.records if r.name.startswith("dramatiq_unique") and "lapsed" in r.getMessage()]
    assert [r.levelname for r in reports] == ["ERROR"]
    assert "renewed no lease for" in reports[0].getMessage() and "holds the GIL" in reports[0].getMessage()
