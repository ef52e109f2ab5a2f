"""Review of issue 18's runtime: the background work of a process at the seams of its lifecycle."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import RedisBackend, UniqueJobs
from dramatiq_unique import runtime as runtime_module
from dramatiq_unique.activity import read_activity
from dramatiq_unique.errors import LockBackendError

from .support import Env, assert_stop_is_bounded, resume_after_bounded_stop, stub_env_on, wait_for
from .test_outages import server  # noqa: F401 (fixture)

#: A script that sends its last job from an exit handler, as a script or a cron job may.
SENDS_AT_EXIT = """
import atexit
import sys
import threading

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

broker = RedisBroker(url=sys.argv[1])
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=sys.argv[1])), before=TimeLimit)


@dramatiq.actor(broker=broker, lock="until_executed", queue_name="at-exit")
def settle(event_id):
    pass


def refuse_threads(*args):
    raise RuntimeError("can't create new thread at interpreter shutdown")


def last_job():
    if sys.version_info < (3, 12):
        # Python 3.12 and later start no thread from an exit handler: this interpreter is told to do the same.
        threading._start_new_thread = refuse_threads
    settle.send("e1")


atexit.register(last_job)
"""


class CountsRefused(RedisBackend):
    """A real Redis that refuses the activity counts while ``refusing`` is set."""

    def __init__(self, **options):
        super().__init__(**options)
        self.refusing = threading.Event()

    def add_counts(self, counts, *, ttl):
        if self.refusing.is_set():
            raise LockBackendError("the counts are refused")
        super().add_counts(counts, ttl=ttl)


def test_counts_left_by_a_failed_flush_at_the_last_workers_stop_are_flushed_by_the_process_that_goes_on(
    redis_client,
):
    # Issue 18: the periodic thread of a process that only sends started only when a count was
    # made while none waited. The last flush of a stopping Worker failed and left counts waiting:
    # no later count started a thread, and the process's counts reached the backend at exit only.
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = CountsRefused(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=300, heartbeat_interval=100))
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        backend.refusing.set()
        worker = Worker(broker, worker_timeout=100, worker_threads=1)
        worker.start()
        settle.send("e1")
        env.join(settle)
        worker.stop()
        assert env.middleware.activity is not None and env.middleware.activity.pending
        backend.refusing.clear()
        # The process goes on sending, as a web process that ran a Worker for a while does.
        settle.send("e2")
        wait_for(lambda: read_activity(backend, minutes=2).totals().get("settle", {}).get("acquired") == 2, timeout=5)
    finally:
        next(runs, None)


def test_a_job_sent_from_an_exit_handler_of_a_process_that_only_sends_is_locked_without_an_error(
    redis_url, redis_client
):
    # Issue 18: the first lock event of a process that only sends starts its periodic thread, which
    # Python refuses at interpreter shutdown: the RuntimeError escaped before_enqueue (Dramatiq logged
    # it as a CRITICAL "Unexpected failure") after the lock was taken, and the lock's event was lost.
    done = subprocess.run(
        [sys.executable, "-c", SENDS_AT_EXIT, redis_url], capture_output=True, text=True, check=True, timeout=60
    )
    assert "Unexpected failure" not in done.stderr, done.stderr
    assert redis_client.llen("dramatiq:at-exit") == 1, "the job was not enqueued"
    assert read_activity(RedisBackend(client=redis_client), minutes=2).totals() == {"settle": {"acquired": 1}}


def test_the_last_worker_stops_while_its_release_thread_waits_for_a_lock_backend_that_does_not_answer(
    server,  # noqa: F811
    monkeypatch,
    caplog,
):
    # Issue 18: the last Worker's stop() joined the release thread without a bound. With the lock
    # backend's redis-server stopped (it accepts and never answers, and the client has no
    # socket_timeout) while a finished message's release was on its way, the release thread waited
    # for it, and so did the worker's shutdown, for ever: the bound given to the heartbeat's wait
    # did not cover it.
    monkeypatch.setattr(runtime_module, "MIN_STOP_WAIT", 200)
    env = stub_env_on(server.port, lease_period=150, heartbeat_interval=50)
    runs = env.run()
    next(runs)
    gate, running = threading.Event(), threading.Event()

    @env.actor(lock="until_executed")
    def settle(event_id):
        running.set()
        gate.wait(10)

    stopper = threading.Thread(target=env.worker(threads=1).stop)
    try:
        settle.send("e1")
        assert running.wait(10)
        server.proc.send_signal(signal.SIGSTOP)
        gate.set()  # the message finishes: its release goes to the release thread, which waits for the server
        wait_for(lambda: not env.middleware.releases.idle)
        time.sleep(0.1)
        assert_stop_is_bounded(stopper, caplog)
    finally:
        resume_after_bounded_stop(server, stopper, runs)


def test_the_last_worker_stops_right_after_the_lock_backend_stopped_answering(
    server,  # noqa: F811
    monkeypatch,
    caplog,
):
    # Issue 18: the bounded wait at shutdown covered a heartbeat already waiting for the lock
    # backend. When the backend stopped answering between two heartbeats, the periodic thread
    # stopped at once, and the worker's own last flush and its departure from the registry waited
    # for the backend, for ever.
    monkeypatch.setattr(runtime_module, "MIN_STOP_WAIT", 200)
    env = stub_env_on(server.port, lease_period=1500, heartbeat_interval=500)
    runs = env.run()
    next(runs)
    stopper = threading.Thread(target=env.worker().stop)
    try:
        server.proc.send_signal(signal.SIGSTOP)  # before the first round of the periodic thread
        assert_stop_is_bounded(stopper, caplog)
    finally:
        resume_after_bounded_stop(server, stopper, runs)
