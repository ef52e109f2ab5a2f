"""A gevent worker: a CPU-bound job keeps its run lock while it keeps the gevent hub
busy.

    pip install gevent
    python examples/gevent_worker.py   # set REDIS_URL to use your own server

This module is both the sender (run it) and the worker's module: it starts two
``dramatiq-gevent`` processes on its own ``broker``, each with one greenlet. The first
takes ``crunch("acct-1")``, which computes for three lease periods without yielding to
the hub; the second takes each duplicate sent meanwhile. Every run records its start in
Redis, so the count of runs and of runs at once comes from a record of its own. It
touches only keys under ``example-gevent:`` and deletes them at the end.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import Locks, RedisBackend, UniqueJobs

PREFIX = "example-gevent"
LEASE_PERIOD = 1500  # ms: a worker that stops renewing loses its run locks this soon

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
# A plain redis:// URL: under gevent the leases are renewed from a native thread on
# connections of its own.
unique = UniqueJobs(
    backend=RedisBackend(url=redis_url()),
    lock_prefix=f"{PREFIX}:lock",
    lease_period=LEASE_PERIOD,
    heartbeat_interval=500,
)
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)
record = redis.Redis.from_url(redis_url())


# One run at a time per account, however long it computes.
@dramatiq.actor(
    queue_name="reports",
    lock="while_executing",
    lock_args_method=lambda account_id, seconds: [account_id],
    max_retries=0,
)
def crunch(account_id, seconds):
    # How many copies run now, counted apart from the lock.
    record.rpush(f"{PREFIX}:runs", record.incr(f"{PREFIX}:running"))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # CPU-bound: this process's gevent hub waits
        pass
    record.decr(f"{PREFIX}:running")


def start_workers():
    """``dramatiq-gevent gevent_worker:broker``: two processes of one greenlet each."""
    command = Path(sys.executable).with_name("dramatiq-gevent")
    here = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "REDIS_URL": redis_url(),
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [str(command), "gevent_worker:broker", "--processes", "2", "--threads", "1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_for(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(
                "the dramatiq-gevent workers did not do their part in time"
            )
        time.sleep(0.05)


def main():
    busy = 3 * LEASE_PERIOD / 1000
    workers = start_workers()
    try:
        locks = Locks.from_middleware(unique)
        wait_for(lambda: sum(worker.alive for worker in locks.workers()[1]) == 2)
        print("Two dramatiq-gevent worker processes are up, one greenlet each.")
        crunch.send("acct-1", busy)
        three_times = f"three times its lease_period of {LEASE_PERIOD} ms"
        print(f"crunch('acct-1') computes for {busy} s, {three_times}.")
        wait_for(lambda: record.llen(f"{PREFIX}:runs") == 1)
        started = time.monotonic()
        # Each one after an unrenewed lease would have lapsed, and long enough before
        # the run ends for the other worker process, which polls an empty queue up to
        # once a second, to take it.
        for at in (1.7, 2.2, 2.7):
            time.sleep(max(0.0, started + at - time.monotonic()))
            crunch.send("acct-1", 0)
            print(f"  a duplicate sent {at} s in")
        wait_for(lambda: record.get(f"{PREFIX}:running") == b"0")
        time.sleep(1.0)  # a duplicate that ran late would be counted by now
        runs = [int(n) for n in record.lrange(f"{PREFIX}:runs", 0, -1)]
        print(f"crunch('acct-1') ran {len(runs)} time(s), at most {max(runs)} at once.")
    finally:
        os.killpg(
            workers.pid, signal.SIGTERM
        )  # a warm shutdown: the workers leave the registry
        workers.wait(30)
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
