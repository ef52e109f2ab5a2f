"""Review of issue 18's runtime: the background work of a process at the seams of its lifecycle."""

from __future__ import annotations

import threading

from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import RedisBackend, UniqueJobs
from dramatiq_unique.activity import read_activity
from dramatiq_unique.errors import LockBackendError

from .support import Env, wait_for


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
