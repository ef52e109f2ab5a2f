"""Worker throughput with and without locks (SPEC P2, P3), printed as ratios from one run.

P3: a RedisBroker worker processing no-op messages, with until_executed on every message,
    against the same worker without the middleware.
P2: the per-message overhead of while_executing against wrapping the actor body in
    Dramatiq's own ConcurrentRateLimiter(limit=1) mutex, both over a run without any lock.
Run: python benchmarks/overhead.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import logging
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend as RateLimitBackend

from dramatiq_unique import RedisBackend, UniqueJobs

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

MESSAGES = 3000
THREADS = 8


def throughput(url: str, variant: str) -> float:
    """Messages per second for one variant: "plain", "until_executed", "while_executing" or "mutex"."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = RedisBroker(client=client, namespace=f"bench-{variant}")
    options = {}
    if variant in ("until_executed", "while_executing"):
        broker.add_middleware(UniqueJobs(backend=RedisBackend(client=client)), before=TimeLimit)
        options["lock"] = variant
    mutexes = RateLimitBackend(client=client)

    @dramatiq.actor(broker=broker, max_retries=0, **options)
    def noop(i):
        if variant == "mutex":
            # One mutex per message, as a hand-rolled per-job lock would be.
            with ConcurrentRateLimiter(mutexes, f"noop-{i}", limit=1).acquire():
                pass

    for i in range(MESSAGES):
        noop.send(i)
    worker = dramatiq.Worker(broker, worker_threads=THREADS, worker_timeout=100)
    started = time.perf_counter()
    worker.start()
    broker.join(noop.queue_name)
    elapsed = time.perf_counter() - started
    worker.stop()
    client.close()
    return MESSAGES / elapsed


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_url() as url:
        rates = {
            variant: throughput(url, variant) for variant in ("plain", "until_executed", "while_executing", "mutex")
        }
        print(f"{MESSAGES} no-op messages, RedisBroker, one worker with {THREADS} threads:")
        for variant, rate in rates.items():
            print(f"  {variant:<16} {rate:8.0f} messages/s")
        per_message = {variant: 1 / rate for variant, rate in rates.items()}
        p3 = rates["until_executed"] / rates["plain"]
        lock_cost = per_message["while_executing"] - per_message["plain"]
        mutex_cost = per_message["mutex"] - per_message["plain"]
        print(f"P3 until_executed throughput / no middleware: {p3:.0%} (target >= 80%)")
        print(
            f"P2 while_executing overhead / ConcurrentRateLimiter mutex overhead: {lock_cost / mutex_cost:.2f} "
            "(target <= 0.50)"
        )


if __name__ == "__main__":
    main()
