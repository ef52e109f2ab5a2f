"""Every performance figure of docs/performance.md, from one run, with the machine it ran on.

Run: make bench  (or python benchmarks/report.py; REDIS_URL and LOCKS_REDIS_URL name servers
to use instead of the ones started here). Takes a few minutes.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import platform
import statistics
import time

try:
    from . import failover, hooks, latency, lines, memory, overhead, round_trips
    from ._server import describe, redis_urls
except ImportError:
    import failover
    import hooks
    import latency
    import lines
    import memory
    import overhead
    import round_trips
    from _server import describe, redis_urls


def machine(urls: list[str]) -> str:
    try:
        importlib.metadata.version("hiredis")
        hiredis = "with hiredis"
    except importlib.metadata.PackageNotFoundError:
        hiredis = "without hiredis"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()} {platform.release()}), "
        f"Python {platform.python_version()}, Dramatiq {importlib.metadata.version('dramatiq')}, "
        f"redis-py {importlib.metadata.version('redis')} {hiredis}; servers: broker {describe(urls[0])}, "
        f"other {describe(urls[1])}; load average at start {load}"
    )


def median_range(values: list[float], fmt: str) -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    with redis_urls(2) as urls:
        url, other_url = urls
        print(machine(urls), flush=True)
        p1 = round_trips.measure_all(url)
        p4 = memory.measure(url)
        p6 = latency.measure(url)
        server = latency.server_time(url)
        hooks_us = hooks.measure()
        p3 = overhead.measure_p3(url, other_url)
        p2 = overhead.measure_p2(url)
        window = overhead.measure_release_window(url)
        waiting = lines.measure_all(url)
    # Servers of its own: a primary, two replicas and three sentinels (about 15 s).
    losses, durability = failover.measure()
    eight = next(f for f in p3 if f.threads == 8)
    pct, ratio = "{:.0%}", "{:.2f}"
    rows = [
        (
            "Throughput: a RedisBroker worker kept busy (queue_prefetch 512, 8 threads), no-op messages, "
            "until_executed on every one ÷ the same worker without the middleware",
            median_range(eight.same_redis, pct),
            "≥ 80 %",
        ),
        (
            "while_executing's extra time per message ÷ a ConcurrentRateLimiter(limit=1) mutex's, keyed per "
            "resource, busy worker (8 threads)",
            median_range(p2.ratios, ratio),
            "≤ 0.5",
        ),
        (
            "Redis memory per held until_executed lock (MEMORY USAGE, 100,000 locks)",
            f"{p4.usage:.0f} B, hash encoded as `{p4.encoding}`",
            "≤ 200 B",
        ),
        (
            "Backend acquire + release ÷ two trivial EVALSHA round trips",
            f"{median_range(p6.p6, ratio)} (redis-py Lock {statistics.median(p6.redis_py):.2f})",
            "≤ 1.15",
        ),
        ("Extra cost of send() with a lock ÷ one trivial EVALSHA round trip", median_range(p6.send, ratio), "≤ 1.3"),
    ]
    print()
    print("| | measured: median (lowest–highest) | target |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("Throughput by worker threads, until_executed ÷ no middleware (no middleware's rate):")
    for f in p3:
        print(
            f"  {f.threads:>2} threads: locks on the broker's Redis {median_range(f.same_redis, pct)}, "
            f"on another server {median_range(f.other_redis, pct)} ({statistics.median(f.plain):.0f} messages/s)"
        )
    synchronous = median_range(eight.synchronous, pct)
    print(f"   8 threads, releases in the worker threads (background_releases=False): {synchronous}")
    for name, values in (("background", window.background), ("in the worker threads", window.synchronous)):
        print(
            f"How long a finished message still holds its lock, 8 threads, releases {name}: "
            f"median {overhead.quantile(values, 0.5) * 1e6:.0f} µs, 99th percentile "
            f"{overhead.quantile(values, 0.99) * 1e6:.0f} µs, max {max(values) * 1e6:.0f} µs"
        )
    us = "{:.0f} µs"
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
        f"Server time per script call: trivial {server.trivial:.1f} µs, acquire {server.acquire:.1f} µs, "
        f"release {server.release:.1f} µs; worker hooks {hooks_us:.1f} µs of Python per until_executed message"
    )
    print(f"Memory: one held lock {p4.record}; a released lock's fence {p4.fence:.0f} B (`{p4.fence_encoding}`)")
    print(
        "Round trips per message (lock_ttl=None / 60 s): "
        + ", ".join(f"{lock} {a:.0f}/{b:.0f}".replace("nan/", "-/") for lock, (a, b) in p1.items())
    )
    print("\n".join(lines.describe(waiting)))
    print("\n".join(failover.describe(losses, durability)))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{overhead.ROUNDS} rounds of interleaved runs; took {time.monotonic() - started:.0f} s; "
        f"load average at end {load}"
    )


if __name__ == "__main__":
    main()
