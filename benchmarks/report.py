"""Every performance figure of docs/performance.md, from one run, with the machine it ran on.

Ends with one table: each figure with its target and whether it met it, as the median of the
interleaved rounds with the lowest and highest value; before it, the figures behind them and,
when hiredis is installed, hiredis against redis-py's own parser, measured in the same rounds.
Run: make bench  (or python benchmarks/report.py; REDIS_URL and LOCKS_REDIS_URL name servers
to use instead of the ones started here, the second one holding the locks where a benchmark
keeps them apart from the broker's). Takes a few minutes.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass

try:
    from . import failover, hooks, latency, lines, memory, overhead, renewals, round_trips, server_time
    from ._server import describe, redis_urls
except ImportError:
    import failover
    import hooks
    import latency
    import lines
    import memory
    import overhead
    import renewals
    import round_trips
    import server_time
    from _server import describe, redis_urls

#: Rounds of the worker hooks' measurement, each of hooks.MESSAGES messages.
HOOKS_ROUNDS = 5


def machine(urls: list[str]) -> str:
    if latency.hiredis_available():
        hiredis = f"with hiredis {importlib.metadata.version('hiredis')}"
    else:
        hiredis = "without hiredis"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()} {platform.release()}), "
        f"Python {platform.python_version()}, Dramatiq {importlib.metadata.version('dramatiq')}, "
        f"redis-py {importlib.metadata.version('redis')} {hiredis}; "
        f"servers: broker {describe(urls[0])}, locks {describe(urls[1])}; load average at start {load}"
    )


def median_range(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


@dataclass
class Row:
    """One row of the table: what is measured, its values (one per round), its target."""

    name: str
    values: list[float]
    fmt: str
    target: str
    at_most: float | None = None
    at_least: float | None = None
    beside: str = ""

    @property
    def met(self) -> bool:
        median = statistics.median(self.values)
        if self.at_most is not None and median > self.at_most:
            return False
        return self.at_least is None or median >= self.at_least

    def cells(self) -> list[str]:
        measured = median_range(self.values, self.fmt) + (f"; {self.beside}" if self.beside else "")
        return [self.name, measured, self.target, "met" if self.met else "missed"]


def hiredis_lines(by_parser: dict[str, latency.Figures]) -> list[str]:
    """The hiredis comparison, or how to install hiredis."""
    if "hiredis" not in by_parser:
        return [
            "hiredis: not installed (or a version this redis-py does not use), so not compared; "
            'pip install "dramatiq-unique[hiredis]" to compare it'
        ]
    own, fast = by_parser["python"], by_parser["hiredis"]
    us = "{:.0f} µs"

    def micro(values: list[float]) -> list[float]:
        return [v * 1e6 for v in values]

    def extra(figures: latency.Figures) -> list[float]:
        return [(a - b) * 1e6 for a, b in zip(figures.send_locked, figures.send_plain, strict=True)]

    def ratio(a: list[float], b: list[float]) -> str:
        return median_range([x / y for x, y in zip(a, b, strict=True)], "{:.2f}")

    return [
        "hiredis against redis-py's own parser, one client of each, interleaved in the same rounds "
        "(own parser → hiredis; hiredis ÷ own parser within a round):",
        f"  trivial EVALSHA {median_range(micro(own.trivial), us)} → {median_range(micro(fast.trivial), us)}; "
        f"{ratio(fast.trivial, own.trivial)}",
        f"  backend acquire + release {median_range(micro(own.acquire_release), us)} → "
        f"{median_range(micro(fast.acquire_release), us)}; {ratio(fast.acquire_release, own.acquire_release)}; "
        f"÷ two trivial EVALSHA {median_range(own.p6, '{:.2f}')} → {median_range(fast.p6, '{:.2f}')}",
        f"  send() with an until_executed lock {median_range(micro(own.send_locked), us)} → "
        f"{median_range(micro(fast.send_locked), us)}; {ratio(fast.send_locked, own.send_locked)}; its extra over "
        f"no middleware {median_range(extra(own), us)} → {median_range(extra(fast), us)}",
    ]


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    parsers = ("python", "hiredis") if latency.hiredis_available() else ("python",)
    with redis_urls(2) as urls:
        url, other_url = urls
        print(machine(urls), flush=True)
        p1 = round_trips.measure_all(url)
        p4 = memory.measure(url)
        by_parser = latency.measure(url, parsers=parsers)
        # As every other benchmark's client: hiredis when redis-py would use it.
        p6 = by_parser[parsers[-1]]
        server = latency.server_time(url)
        lifecycle = server_time.measure(url, other_url)
        by_functions = server_time.functions_against_evalsha(other_url)
        hooks_us = [hooks.measure() for _ in range(HOOKS_ROUNDS)]
        send_us = hooks.measure_send()
        p3 = overhead.measure_p3(url, other_url)
        p2 = overhead.measure_p2(url)
        window = overhead.measure_release_window(url)
        waiting = lines.measure_all(url)
        renewal = renewals.measure_renewals(url)
    # Servers of its own: a primary, two replicas and three sentinels (about 15 s).
    losses, durability = failover.measure()
    eight = next(f for f in p3 if f.threads == 8)
    pct, ratio, us = "{:.0%}", "{:.2f}", "{:.0f} µs"
    print()
    print("Throughput by worker threads, until_executed ÷ no middleware (no middleware's rate):")
    for f in p3:
        print(
            f"  {f.threads:>2} threads: locks on the broker's Redis {median_range(f.same_redis, pct)}, "
            f"on another server {median_range(f.other_redis, pct)} ({statistics.median(f.plain):.0f} messages/s)"
        )
    synchronous = median_range(eight.synchronous, pct)
    print(f"   8 threads, releases in the worker threads (background_releases=False): {synchronous}")
    print(
        "  The release thread's share of the worker process's CPU time, locks on the broker's Redis "
        "(its share of the interpreter lock is at most this): "
        + ", ".join(f"{f.threads} threads {median_range(f.release_cpu, pct)}" for f in p3)
    )
    for name, values in (("background", window.background), ("in the worker threads", window.synchronous)):
        print(
            f"How long a finished message still holds its lock, 8 threads, releases {name}: "
            f"median {overhead.quantile(values, 0.5) * 1e6:.0f} µs, 99th percentile "
            f"{overhead.quantile(values, 0.99) * 1e6:.0f} µs, max {max(values) * 1e6:.0f} µs"
        )
    print(
        "Extra time per message over no middleware (8 threads): while_executing "
        f"{median_range([c * 1e6 for c in p2.lock_cost], us)}, "
        f"mutex {median_range([c * 1e6 for c in p2.mutex_cost], us)}"
    )
    print(
        f"Latency: trivial EVALSHA {statistics.median(p6.trivial) * 1e6:.0f} µs, acquire+release "
        f"{statistics.median(p6.acquire_release) * 1e6:.0f} µs, send() {statistics.median(p6.send_plain) * 1e6:.0f} µs "
        f"without the middleware and {statistics.median(p6.send_locked) * 1e6:.0f} µs with an until_executed lock"
    )
    print(
        "The middleware's Python per send() of an until_executed actor (StubBackend, acquisitions free): "
        f"{send_us:.1f} µs"
    )
    print("\n".join(hiredis_lines(by_parser)))
    print(
        f"Server time per script call: trivial {server.trivial:.1f} µs, acquire {server.acquire:.1f} µs, "
        f"release {server.release:.1f} µs"
    )
    print(
        f"Server time per until_executed lifecycle through a worker ({server_time.MESSAGES} messages a round, "
        f"locks on a server of their own): {median_range(lifecycle.lifecycle, '{:.1f} µs')} in "
        f"{statistics.median(lifecycle.scripts):.2f} script calls; redis-py Lock acquire + release "
        f"{median_range(lifecycle.redis_py_lock, '{:.1f} µs')}"
    )
    if by_functions:
        print(
            "Server time of an acquire + release called as Redis Functions ÷ called by EVALSHA, interleaved rounds: "
            + median_range(by_functions, "{:.2f}")
        )
    print(f"Memory: one held lock {p4.record}; a released lock's fence {p4.fence:.0f} B (`{p4.fence_encoding}`)")
    print(
        "Round trips per message (lock_ttl=None / 60 s): "
        + ", ".join(f"{lock} {a:.0f}/{b:.0f}".replace("nan/", "-/") for lock, (a, b) in p1.items())
    )
    print("\n".join(lines.describe(waiting)))
    print("\n".join(failover.describe(losses, durability)))
    rows = [
        Row(
            "Redis server time per until_executed lifecycle (acquire at send() + release), "
            f"{server_time.MESSAGES} messages a round through a worker, ÷ redis-py Lock's acquire + release "
            "on the same server (INFO commandstats)",
            lifecycle.ratio,
            "{:.2f}×",
            "≤ 2×",
            at_most=2,
        ),
        Row(
            "Throughput: a RedisBroker worker kept busy (queue_prefetch 512, 8 threads), no-op messages, "
            "until_executed on every one ÷ the same worker without the middleware",
            eight.same_redis,
            pct,
            "≥ 90 %",
            at_least=0.9,
        ),
        Row(
            "Worker hooks' Python per until_executed message (StubBackend, releases free)",
            hooks_us,
            "{:.1f} µs",
            "≤ 8 µs",
            at_most=8,
        ),
        Row(
            "Backend acquire + release ÷ two trivial EVALSHA round trips",
            p6.p6,
            ratio,
            "≤ 1.15",
            at_most=1.15,
            beside=f"redis-py Lock {median_range(p6.redis_py, ratio)}",
        ),
        Row(
            "while_executing's extra time per message ÷ a ConcurrentRateLimiter(limit=1) mutex's, keyed per "
            "resource, busy worker (8 threads)",
            p2.ratios,
            ratio,
            "≤ 0.5",
            at_most=0.5,
        ),
        Row(
            "Extra latency of send() with a lock ÷ one trivial EVALSHA round trip",
            p6.send,
            ratio,
            "≤ 1.5",
            at_most=1.5,
        ),
        Row(
            "Redis memory per held until_executed lock (MEMORY USAGE, 100,000 locks)",
            [p4.usage],
            "{:.0f} B",
            "≤ 160 B",
            at_most=160,
            beside=f"hash encoded as `{p4.encoding}`",
        ),
        Row(
            "Lease renewals per heartbeat with 64 running while_executing messages (round trips per tick)",
            [renewal["batched"]["calls_per_tick"]],
            "{:.2f}",
            "1",
            at_most=1,
            beside=(
                f"at most {renewal['batched']['most_calls_in_a_tick']} in one; renewed one by one "
                f"{renewal['one_by_one']['calls_per_tick']:.2f}"
            ),
        ),
    ]
    print()
    print("| | measured: median (lowest–highest) | target | |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    print()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{overhead.ROUNDS} rounds of interleaved runs for the workers, {latency.ROUNDS} for the latencies; took "
        f"{time.monotonic() - started:.0f} s; load average at end {load}"
    )


if __name__ == "__main__":
    main()
