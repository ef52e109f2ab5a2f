"""How late a debounced message runs after it is due, with a real `dramatiq` worker process.

A debounced message is a Dramatiq delayed message: once due, it waits for the worker to move it
from the delay queue to its queue, then for the worker to fetch it. An idle RedisBroker consumer
polls Redis with a backoff of up to the worker timeout (1 s by default), once for each of the two
queues. This script measures that lateness, and what ``debounce_cap`` bounds in a stream of sends:

- lone sends, ``debounce`` = 2 s: how long after ``send + debounce`` each run starts;
- a send every second, ``debounce`` = 2 s, ``debounce_cap`` = 10 s: how long after each send the
  first run with its payload or a newer one starts, and how far apart the runs start.

Run: python benchmarks/debounce_lateness.py  (uses REDIS_URL, else a server it starts; about 90 s)
"""

from __future__ import annotations

import itertools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

import dramatiq_unique
from dramatiq_unique import UniqueJobs

try:
    from ._server import describe, redis_url
except ImportError:
    from _server import describe, redis_url

DEBOUNCE = 2000
CAP = 10_000
LONE_SENDS = 12
STREAM_SECONDS = 45
EVERY = 1.0

#: The worker's module: the actor records when each run starts, with the payload it ran.
WORKER = f"""
import os, time
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import UniqueJobs

record = redis.Redis.from_url(os.environ["REDIS_URL"])
broker = RedisBroker(url=os.environ["REDIS_URL"])
broker.add_middleware(UniqueJobs(), before=TimeLimit)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        record.rpush("bench:ready", 1)


broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, queue_name="bench", lock="until_executed", on_conflict={{"client": "replace"}},
                lock_args_method=lambda key, seq: [key], debounce={DEBOUNCE}, debounce_cap={CAP}, max_retries=0)
def push(key, seq):
    record.rpush("bench:runs", f"{{key}} {{seq}} {{time.time() * 1000:.1f}}")
"""


def sender(url: str) -> dramatiq.Actor:  # type: ignore[type-arg]
    broker = RedisBroker(url=url)
    broker.add_middleware(UniqueJobs(), before=TimeLimit)
    return dramatiq.actor(
        lambda key, seq: None,
        actor_name="push",
        broker=broker,
        queue_name="bench",
        lock="until_executed",
        on_conflict={"client": "replace"},
        lock_args_method=lambda key, seq: [key],
        debounce=DEBOUNCE,
        debounce_cap=CAP,
        max_retries=0,
    )


def runs(client: redis.Redis, key: str) -> list[tuple[int, float]]:
    """(seq, start in epoch ms) of each run of ``key``."""
    found = []
    for line in client.lrange("bench:runs", 0, -1):
        run_key, seq, started = line.decode().split()
        if run_key == key:
            found.append((int(seq), float(started)))
    return found


def wait_until(condition, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the worker did not run the message in time")
        time.sleep(0.01)


def lone_sends(client: redis.Redis, push: dramatiq.Actor) -> list[float]:  # type: ignore[type-arg]
    """How late each lone send runs after it is due, in ms."""
    late = []
    for i in range(LONE_SENDS):
        time.sleep(random.uniform(0, 1.5))  # any phase of the worker's polling
        key = f"lone-{i}"
        sent = time.time() * 1000
        push.send(key, 0)
        wait_until(lambda key=key: runs(client, key), timeout=30)
        late.append(runs(client, key)[0][1] - (sent + DEBOUNCE))
    return late


def stream(client: redis.Redis, push: dramatiq.Actor) -> tuple[list[float], list[float]]:  # type: ignore[type-arg]
    """A send every EVERY seconds: how long after each send the first run with its payload or a
    newer one starts, and how far apart the runs start, in ms."""
    sends = []
    start = time.monotonic()
    seq = 0
    while time.monotonic() - start < STREAM_SECONDS:
        sends.append((seq, time.time() * 1000))
        push.send("stream", seq)
        seq += 1
        time.sleep(EVERY)
    wait_until(lambda: runs(client, "stream") and runs(client, "stream")[-1][0] == seq - 1, timeout=30)
    done = runs(client, "stream")
    to_run = []
    for sent_seq, sent_at in sends:
        # The first run that carries this send's payload or a newer one.
        to_run.append(next(started for ran_seq, started in done if ran_seq >= sent_seq) - sent_at)
    gaps = [later - earlier for (_, earlier), (_, later) in itertools.pairwise(done)]
    return to_run, gaps


def summary(values: list[float]) -> str:
    return f"median {statistics.median(values):.0f} ms, max {max(values):.0f} ms (n={len(values)})"


def main() -> None:
    with redis_url() as url, tempfile.TemporaryDirectory() as directory:
        client = redis.Redis.from_url(url)
        client.flushdb()
        (Path(directory) / "bench_worker.py").write_text(WORKER)
        path = os.pathsep.join([directory, str(Path(dramatiq_unique.__file__).parents[1])])
        worker = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "bench_worker:broker", "--processes", "1", "--threads", "2"],
            cwd=directory,
            env={**os.environ, "REDIS_URL": url, "PYTHONPATH": path},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: client.llen("bench:ready") == 1, timeout=30)
            push = sender(url)
            late = lone_sends(client, push)
            to_run, gaps = stream(client, push)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        print(f"{describe(url)}, Dramatiq {dramatiq.__version__}, default worker timeout (1000 ms)")
        print(f"lone sends, debounce {DEBOUNCE} ms: each run starts after send + debounce by {summary(late)}")
        print(f"a send every {EVERY:.0f} s, debounce {DEBOUNCE} ms, debounce_cap {CAP} ms:")
        print(f"  from a send to the first run with its payload or a newer one: {summary(to_run)}")
        print(f"  between two runs: {summary(gaps)}")


if __name__ == "__main__":
    main()
