"""A busy worker's throughput with and without locks (SPEC P2, P3), from interleaved runs.

Each run fills a RedisBroker queue with no-op messages first, then starts one worker
(queue_prefetch 512) and times the steady state only: the rate between two counts of
processed messages, well after start-up and well before the queue runs dry. The compared
variants run in turn (A B C A B C ...) and each figure is the median over the rounds of the
ratio within a round, so that the noise of a shared machine cancels out as far as it can.

P3: until_executed on every message, against the same worker without the middleware, with
    1, 8 and 16 worker threads, locks on the broker's Redis and on another server.
P2: the extra time per message of while_executing, against Dramatiq's own
    ConcurrentRateLimiter(limit=1) used as a mutex, both keyed per resource: the messages
    are about 1,000 accounts, so each key is used again and again, as a per-account mutex is.
Run: python benchmarks/overhead.py  (uses REDIS_URL and LOCKS_REDIS_URL, else starts servers)
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.rate_limits import ConcurrentRateLimiter
from dramatiq.rate_limits.backends import RedisBackend as RateLimitBackend

from dramatiq_unique import RedisBackend, UniqueJobs, require_current_lock
from dramatiq_unique.runtime import RELEASE_THREAD

try:
    from ._server import redis_urls
except ImportError:
    from _server import redis_urls

ROUNDS = 5
PREFETCH = 512
#: Processed messages before the clock starts (start-up) and counted while it runs.
WARM_UP = 500
#: Messages left in the queue when the clock stops: the worker never waits for the broker.
LEFT_OVER = PREFETCH + 400
#: The resources that the P2 messages are about.
ACCOUNTS = 1000


@dataclass
class Meter:
    """Counts processed messages and times the steady state, from inside the actor."""

    start: int
    stop: int
    started: float = 0.0
    stopped: float = 0.0
    #: CPU seconds of the process and of the release thread at the start and at the stop.
    cpu_started: tuple[float, float] = (0.0, 0.0)
    cpu_stopped: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        self._count = itertools.count(1)
        self.done = threading.Event()

    def tick(self) -> None:
        n = next(self._count)
        if n == self.start:
            self.started = time.perf_counter()
            self.cpu_started = (time.process_time(), thread_cpu(RELEASE_THREAD))
        elif n == self.stop:
            self.stopped = time.perf_counter()
            self.cpu_stopped = (time.process_time(), thread_cpu(RELEASE_THREAD))
            self.done.set()

    @property
    def rate(self) -> float:
        return (self.stop - self.start) / (self.stopped - self.started)

    @property
    def release_cpu_share(self) -> float:
        """The release thread's share of the process's CPU time while the clock ran: its share
        of the interpreter lock is at most that, as it gives the lock up in each system call."""
        process = self.cpu_stopped[0] - self.cpu_started[0]
        return (self.cpu_stopped[1] - self.cpu_started[1]) / process if process else 0.0


def thread_cpu(name: str) -> float:
    """CPU seconds (user and system) that the live thread called ``name`` used so far, from
    /proc (Linux); 0 without such a thread."""
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                # After the command name in parentheses: the state is field 3, utime 14, stime 15.
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def worker_rate(
    broker_url: str,
    locks_url: str,
    *,
    threads: int,
    counted: int,
    lock: str | None = None,
    mutex: bool = False,
    accounts: bool = False,
    background_releases: bool = True,
    windows: list[float] | None = None,
    release_cpu: list[float] | None = None,
) -> float:
    """Messages per second in the steady state of a busy worker.

    Parameters:
      lock(str): The messages' lock type; ``None`` for a worker without the middleware.
      mutex(bool): Whether the actor takes a ConcurrentRateLimiter(limit=1) on its account.
      accounts(bool): Whether the messages are about ACCOUNTS accounts, else all different.
      background_releases(bool): The middleware's option of that name.
      windows(list): If given, gets the time between the end of each counted message's actor
        and the answer to its lock's release, in seconds.
      release_cpu(list): If given, gets the release thread's share of the process's CPU time
        in the steady state.
    """
    client = redis.Redis.from_url(broker_url)
    locks = redis.Redis.from_url(locks_url)
    client.flushdb()
    locks.flushdb()
    broker = RedisBroker(client=client, namespace=f"bench-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {}
    ended: dict[str, float] = {}
    if lock is not None:
        middleware = UniqueJobs(backend=RedisBackend(client=locks), background_releases=background_releases)
        broker.add_middleware(middleware, before=TimeLimit)
        options["lock"] = lock
        if windows is not None:

            def released(event: Any) -> None:
                end = ended.pop(event.message_id, None)
                if end is not None:
                    windows.append(time.perf_counter() - end)

            middleware.subscribe("released", released)
    mutexes = RateLimitBackend(client=client)
    meter = Meter(start=WARM_UP, stop=WARM_UP + counted)
    failures = itertools.count()

    @dramatiq.actor(broker=broker, max_retries=0, actor_name="noop", **options)
    def noop(i: int) -> None:
        if mutex:
            try:
                with ConcurrentRateLimiter(mutexes, f"account-{i}", limit=1).acquire():
                    pass
            except dramatiq.RateLimitExceeded:
                next(failures)
        if windows is not None and meter.started and not meter.stopped:
            ended[require_current_lock().message_id] = time.perf_counter()
        meter.tick()

    for i in range(WARM_UP + counted + LEFT_OVER):
        noop.send(i % ACCOUNTS if accounts else i)
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    worker.queue_prefetch = PREFETCH
    worker.start()
    try:
        if not meter.done.wait(timeout=120):
            raise RuntimeError(
                f"The worker ({lock=}, {mutex=}) did not process {meter.stop} messages within 2 minutes."
            )
    finally:
        worker.stop()
        broker.close()
    if next(failures):
        raise RuntimeError("Two messages of one account ran at once: the mutex benchmark is not measuring a mutex.")
    client.flushdb()
    locks.flushdb()
    client.close()
    locks.close()
    if release_cpu is not None:
        release_cpu.append(meter.release_cpu_share)
    return meter.rate


def interleaved(runs: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Each named run once per round, in turn; their results by name."""
    results: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            results[name].append(run())
    return results


@dataclass
class P3:
    threads: int
    same_redis: list[float]  # ratio per round, locks on the broker's Redis
    other_redis: list[float]  # ratio per round, locks on another server
    plain: list[float]  # messages/s per round
    synchronous: list[float]  # ratio per round, broker's Redis, background_releases=False (8 threads only)
    release_cpu: list[float]  # the release thread's share of the process's CPU per round, broker's Redis


@dataclass
class P2:
    ratios: list[float]
    lock_cost: list[float]  # s per message over plain
    mutex_cost: list[float]
    plain: list[float]


def counted_for(threads: int) -> int:
    # About a second of steady state at this machine's rates.
    return 1500 if threads == 1 else 3000


def measure_p3(
    broker_url: str,
    other_url: str,
    rounds: int = ROUNDS,
    threads: tuple[int, ...] = (1, 8, 16),
    *,
    other: bool = True,
    synchronous: bool = True,
) -> list[P3]:
    """The P3 figures for each of ``threads``; without ``other``, no run with the locks on
    another server (other_redis is empty), without ``synchronous`` no run with
    background_releases=False (synchronous is empty)."""
    figures = []
    runs: dict[str, Any] = {}
    release_cpu: dict[int, list[float]] = {n: [] for n in threads}
    for n in threads:
        config = {"threads": n, "counted": counted_for(n)}
        runs[f"plain/{n}"] = lambda c=config: worker_rate(broker_url, broker_url, **c)
        runs[f"same/{n}"] = lambda c=config, shares=release_cpu[n]: worker_rate(
            broker_url, broker_url, lock="until_executed", release_cpu=shares, **c
        )
        if other:
            runs[f"other/{n}"] = lambda c=config: worker_rate(broker_url, other_url, lock="until_executed", **c)
        if n == 8 and synchronous:
            runs["sync/8"] = lambda c=config: worker_rate(
                broker_url, broker_url, lock="until_executed", background_releases=False, **c
            )
    results = interleaved(runs, rounds)
    for n in threads:
        plain = results[f"plain/{n}"]
        figures.append(
            P3(
                threads=n,
                same_redis=[a / b for a, b in zip(results[f"same/{n}"], plain, strict=True)],
                other_redis=[a / b for a, b in zip(results.get(f"other/{n}", []), plain, strict=False)],
                plain=plain,
                synchronous=[a / b for a, b in zip(results.get(f"sync/{n}", []), plain, strict=False)],
                release_cpu=release_cpu[n],
            )
        )
    return figures


def measure_p2(url: str, rounds: int = ROUNDS, threads: int = 8) -> P2:
    config = {"threads": threads, "counted": counted_for(threads), "accounts": True}
    results = interleaved(
        {
            "plain": lambda: worker_rate(url, url, **config),
            "while_executing": lambda: worker_rate(url, url, lock="while_executing", **config),
            "mutex": lambda: worker_rate(url, url, mutex=True, **config),
        },
        rounds,
    )
    plain = results["plain"]
    lock_cost = [1 / a - 1 / p for a, p in zip(results["while_executing"], plain, strict=True)]
    mutex_cost = [1 / a - 1 / p for a, p in zip(results["mutex"], plain, strict=True)]
    return P2(
        ratios=[a / b for a, b in zip(lock_cost, mutex_cost, strict=True)],
        lock_cost=lock_cost,
        mutex_cost=mutex_cost,
        plain=plain,
    )


@dataclass
class ReleaseWindow:
    """How long a finished message still holds its lock: from the end of its actor to the
    answer to its release, busy worker, 8 threads (seconds, every counted message)."""

    background: list[float]
    synchronous: list[float]


def measure_release_window(url: str, threads: int = 8) -> ReleaseWindow:
    windows: dict[bool, list[float]] = {True: [], False: []}
    for background in (True, False):
        worker_rate(
            url,
            url,
            threads=threads,
            counted=counted_for(threads),
            lock="until_executed",
            background_releases=background,
            windows=windows[background],
        )
    return ReleaseWindow(background=windows[True], synchronous=windows[False])


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread(values: list[float], fmt: str = "{:.0%}") -> str:
    """The median, and the lowest and highest value."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_urls(2) as (url, other_url):
        print(f"One RedisBroker worker kept busy (queue_prefetch {PREFETCH}), no-op messages, {ROUNDS} rounds:")
        for p3 in measure_p3(url, other_url):
            print(
                f"  {p3.threads:>2} threads: until_executed / no middleware {spread(p3.same_redis)} with locks on "
                f"the broker's Redis, {spread(p3.other_redis)} on another; "
                f"no middleware {statistics.median(p3.plain):.0f} messages/s"
            )
            if p3.synchronous:
                print(f"  {p3.threads:>2} threads, releases in the worker threads: {spread(p3.synchronous)}")
        window = measure_release_window(url)
        for name, values in (("background", window.background), ("synchronous", window.synchronous)):
            print(
                f"  8 threads, {name} releases: a finished message holds its lock {quantile(values, 0.5) * 1e6:.0f} us "
                f"(median), {quantile(values, 0.99) * 1e6:.0f} us (99th percentile), {max(values) * 1e6:.0f} us (max)"
            )
        p2 = measure_p2(url)
        us = "{:.0f} us"
        print(
            f"  8 threads: while_executing {spread([c * 1e6 for c in p2.lock_cost], us)} per message over no "
            f"middleware, ConcurrentRateLimiter mutex {spread([c * 1e6 for c in p2.mutex_cost], us)}: "
            f"ratio {spread(p2.ratios, '{:.2f}')} (target <= 0.50)"
        )


if __name__ == "__main__":
    main()
