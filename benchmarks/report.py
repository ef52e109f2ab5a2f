"""Every performance figure of docs/performance.md, from one run, with the machine it ran on.

Ends with one table: each figure with its target and whether it met it, as the median of the
interleaved rounds with the lowest and highest value; before it, the figures behind them and,
when hiredis is installed, hiredis against redis-py's own parser, measured in the same rounds.
Run: make bench  (or python benchmarks/report.py; REDIS_URL and LOCKS_REDIS_URL name servers
to use instead of the ones started here, the second one holding the locks where a benchmark
keeps them apart from the broker's). Takes a few minutes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

try:
    from . import cancel, failover, hooks, latency, lines, memory, overhead, renewals, round_trips, server_time, trail
    from ._server import describe, given_urls, redis_urls, server_executables, started_urls
except ImportError:
    import cancel
    import failover
    import hooks
    import latency
    import lines
    import memory
    import overhead
    import renewals
    import round_trips
    import server_time
    import trail
    from _server import describe, given_urls, redis_urls, server_executables, started_urls

#: Rounds of the worker hooks' measurement, each of hooks.MESSAGES messages.
HOOKS_ROUNDS = 5
#: Rounds of the figures measured on every server, the servers in turn within a round.
ROUNDS = 7
#: Rounds of the figures measured on the first server only (the throughput by worker threads,
#: while_executing against a mutex, Redis Functions against EVALSHA).
FIRST_SERVER_ROUNDS = 3


@dataclass
class Server:
    """The servers of one kind that the figures ran on: one for the broker, one for the locks."""

    name: str  # its name and version, e.g. "Redis 7.0.15"
    url: str
    locks_url: str

    @property
    def lifecycle_target(self) -> float:
        """The target of the server time per lifecycle ÷ redis-py's Lock: Valkey's scripts run
        faster than Redis 7.0's (9.1's Lua engine)."""
        return 2 if self.name.startswith("Valkey") else 3


@contextlib.contextmanager
def servers() -> Iterator[list[Server]]:
    """Two servers of each kind this machine can start (redis-server from PATH, the bundled
    Valkey server), or those that REDIS_URL and LOCKS_REDIS_URL name."""
    with contextlib.ExitStack() as stack:
        if given_urls():
            kinds = [stack.enter_context(redis_urls(2))]
        else:
            kinds = [stack.enter_context(started_urls(2, executable)) for executable in server_executables()]
        yield [Server(describe(url), url, locks_url) for url, locks_url in kinds]


def machine(servers: list[Server]) -> str:
    if latency.hiredis_available():
        hiredis = f"with hiredis {importlib.metadata.version('hiredis')}"
    else:
        hiredis = "without hiredis"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    names = " and ".join(server.name for server in servers)
    return (
        f"{os.cpu_count()} cores ({platform.machine()}, {platform.system()} {platform.release()}), "
        f"Python {platform.python_version()}, Dramatiq {importlib.metadata.version('dramatiq')}, "
        f"redis-py {importlib.metadata.version('redis')} {hiredis}; "
        f"servers: {names} (two of each: the broker's, the locks'); load average at start {load}"
    )


def median_range(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def extend(into: Any, figures: Any) -> None:
    """Appends each list of the dataclass ``figures`` to the same list of ``into``: the rounds of
    one kind of server, measured in turn with those of the others."""
    for f in dataclasses.fields(figures):
        value = getattr(figures, f.name)
        if isinstance(value, list):
            getattr(into, f.name).extend(value)


def trips(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}".rstrip("0").rstrip(".")


@dataclass
class Row:
    """One row of the table: what is measured, on which server, its values (one per round), its target."""

    name: str
    server: str
    values: list[float]
    fmt: str
    target: str
    at_most: float | None = None
    at_least: float | None = None
    beside: str = ""
    #: What is printed instead of the values' median and range.
    measured: str | None = None

    @property
    def met(self) -> bool:
        median = statistics.median(self.values)
        if self.at_most is not None and median > self.at_most:
            return False
        return self.at_least is None or median >= self.at_least

    def cells(self) -> list[str]:
        measured = self.measured or median_range(self.values, self.fmt)
        measured += f"; {self.beside}" if self.beside else ""
        return [self.name, self.server, measured, self.target, "met" if self.met else "missed"]


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
    with servers() as kinds:
        first = kinds[0]
        print(machine(kinds), flush=True)
        trips_by = {s.name: round_trips.measure_all(s.url) for s in kinds}
        memory_by = {s.name: memory.measure(s.url) for s in kinds}
        # hiredis against redis-py's own parser on the first server; on the others, the client every
        # other benchmark uses (hiredis when redis-py would use it).
        latency_by = latency.measure_servers(
            {s.name: s.url for s in kinds}, {s.name: parsers if s is first else parsers[-1:] for s in kinds}
        )
        by_parser = latency_by[first.name]
        p6_by = {name: figures[parsers[-1]] for name, figures in latency_by.items()}
        lifecycle_by = {s.name: server_time.Figures([], [], [], []) for s in kinds}
        busy_by = {s.name: overhead.P3(8, [], [], [], [], []) for s in kinds}
        for _ in range(ROUNDS):
            for s in kinds:
                extend(lifecycle_by[s.name], server_time.measure(s.url, s.locks_url, rounds=1))
            for s in kinds:
                p3 = overhead.measure_p3(s.url, s.locks_url, rounds=1, threads=(8,), other=False, synchronous=False)
                extend(busy_by[s.name], p3[0])
        hooks_us = [hooks.measure() for _ in range(HOOKS_ROUNDS)]
        send_us = hooks.measure_send()
        # On the first server only.
        url, other_url = first.url, first.locks_url
        server = latency.server_time(url)
        by_functions = server_time.functions_against_evalsha(other_url, rounds=FIRST_SERVER_ROUNDS)
        p3 = overhead.measure_p3(url, other_url, rounds=FIRST_SERVER_ROUNDS)
        p2 = overhead.measure_p2(url, rounds=FIRST_SERVER_ROUNDS)
        window = overhead.measure_release_window(url)
        waiting = lines.measure_all(url)
        renewal = renewals.measure_renewals(url)
        conflicts = trail.measure(url)
        cancelling = cancel.measure(url)
    # Servers of its own: a primary, two replicas and three sentinels (about 15 s).
    losses, durability = failover.measure()
    eight = next(f for f in p3 if f.threads == 8)
    pct, ratio, us = "{:.0%}", "{:.2f}", "{:.0f} µs"
    print()
    for s in kinds:
        lifecycle, held = lifecycle_by[s.name], memory_by[s.name]
        print(f"{s.name}:")
        print(
            f"  Server time per until_executed lifecycle, {server_time.MESSAGES} a round, the locks on a server of "
            f"their own: through a worker {median_range(lifecycle.lifecycle, '{:.1f} µs')} in "
            f"{statistics.median(lifecycle.scripts):.2f} script calls, in a loop "
            f"{median_range(lifecycle.loop, '{:.1f} µs')}; redis-py Lock acquire + release "
            f"{median_range(lifecycle.redis_py_lock, '{:.1f} µs')}"
        )
        h, r = held.held, held.released
        print(
            f"  Memory a lock, {held.locks:,} until_executed locks: held {h.usage:.0f} B (MEMORY USAGE) in "
            f"{h.describe_kinds()}, used_memory +{h.used_memory:.0f} B; after release {r.usage:.0f} B in "
            f"{r.describe_kinds()} left, used_memory +{r.used_memory:.0f} B over the server before"
        )
        print(f"  One held lock: {held.example}")
        p6 = p6_by[s.name]
        med = statistics.median
        print(
            f"  Latency: trivial EVALSHA {med(p6.trivial) * 1e6:.0f} µs, acquire+release "
            f"{med(p6.acquire_release) * 1e6:.0f} µs, send() {med(p6.send_plain) * 1e6:.0f} µs without the "
            f"middleware and {med(p6.send_locked) * 1e6:.0f} µs with an until_executed lock"
        )
        print(
            "  Round trips per message (lock_ttl=None / 60 s): "
            + ", ".join(f"{lock} {trips(a)}/{trips(b)}" for lock, (a, b) in trips_by[s.name].items())
        )
        print(f"  Busy worker, 8 threads, no middleware: {statistics.median(busy_by[s.name].plain):.0f} messages/s")
    print()
    print(f"{first.name} only:")
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
        "The middleware's Python per send() of an until_executed actor (StubBackend, acquisitions free): "
        f"{send_us:.1f} µs"
    )
    print("\n".join(hiredis_lines(by_parser)))
    print(
        f"Server time per script call: trivial {server.trivial:.1f} µs, acquire {server.acquire:.1f} µs, "
        f"release {server.release:.1f} µs"
    )
    if by_functions:
        print(
            "Server time of an acquire + release called as Redis Functions ÷ called by EVALSHA, interleaved rounds: "
            + median_range(by_functions, "{:.2f}")
        )
    print("\n".join(lines.describe(waiting)))
    print("\n".join(failover.describe(losses, durability)))
    print("\n".join(trail.describe(conflicts)))
    print("\n".join(cancel.describe(cancelling)))
    rows: list[Row] = []
    lifecycle_rows = (
        (
            f"Server time per until_executed lifecycle (acquire + release) ÷ redis-py Lock's, through a "
            f"RedisBroker worker ({server_time.MESSAGES} messages a round, INFO commandstats)",
            "ratio",
        ),
        ("Server time per until_executed lifecycle ÷ redis-py Lock's, in a loop of acquire + release", "loop_ratio"),
    )
    for title, ratios in lifecycle_rows:
        for s in kinds:
            rows.append(
                Row(
                    title,
                    s.name,
                    getattr(lifecycle_by[s.name], ratios),
                    "{:.2f}×",
                    f"≤ {s.lifecycle_target:g}×",
                    at_most=s.lifecycle_target,
                )
            )
    for s in kinds:
        held = memory_by[s.name].held
        rows.append(
            Row(
                f"Memory per held until_executed lock (MEMORY USAGE of its keys, {memory_by[s.name].locks:,} locks)",
                s.name,
                [held.usage],
                "{:.0f} B",
                "≤ 160 B",
                at_most=160,
                beside=f"{held.describe_kinds()} a lock",
            )
        )
    for s in kinds:
        released = memory_by[s.name].released
        rows.append(
            Row(
                "Memory per released lock (MEMORY USAGE of the keys left under the lock prefix)",
                s.name,
                [released.usage],
                "{:.0f} B",
                "0",
                at_most=0,
                beside=f"{released.describe_kinds()} a lock left",
            )
        )
    rows.append(
        Row(
            "Worker hooks' Python per until_executed message (StubBackend, releases free)",
            "any (no server)",
            hooks_us,
            "{:.1f} µs",
            "≤ 6 µs",
            at_most=6,
        )
    )
    for s in kinds:
        rows.append(
            Row(
                "Throughput: a RedisBroker worker kept busy (queue_prefetch 512, 8 threads), no-op messages, "
                "until_executed on every one ÷ the same worker without the middleware",
                s.name,
                busy_by[s.name].same_redis,
                pct,
                "≥ 85 %",
                at_least=0.85,
            )
        )
    for s in kinds:
        rows.append(
            Row(
                "Extra latency of send() with a lock ÷ one trivial EVALSHA round trip",
                s.name,
                p6_by[s.name].send,
                ratio,
                "≤ 1.5",
                at_most=1.5,
            )
        )
    for s in kinds:
        counts = trips_by[s.name]
        within = all(max(a, b) <= round_trips.TARGETS[lock] for lock, (a, b) in counts.items() if not math.isnan(a))
        within = within and counts["until_expired"][1] <= round_trips.TARGETS["until_expired"]
        rows.append(
            Row(
                "Round trips per lifecycle, " + "/".join(counts) + " (lock_ttl=None; 60 s)",
                s.name,
                [0.0 if within else 1.0],
                "",
                "≤ " + "/".join(str(t) for t in round_trips.TARGETS.values()),
                at_most=0,
                measured="/".join(trips(a) for a, _ in counts.values())
                + "; "
                + "/".join(trips(b) for _, b in counts.values()),
            )
        )
    for s in kinds:
        p6 = p6_by[s.name]
        rows.append(
            Row(
                "Backend acquire + release ÷ two trivial EVALSHA round trips",
                s.name,
                p6.p6,
                ratio,
                "≤ 1.15",
                at_most=1.15,
                beside=f"redis-py Lock {median_range(p6.redis_py, ratio)}",
            )
        )
    rows += [
        Row(
            "while_executing's extra time per message ÷ a ConcurrentRateLimiter(limit=1) mutex's, keyed per "
            "resource, busy worker (8 threads)",
            first.name,
            p2.ratios,
            ratio,
            "≤ 0.5",
            at_most=0.5,
        ),
        Row(
            "Lease renewals per heartbeat with 64 running while_executing messages (round trips per tick)",
            first.name,
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
    rows += [
        Row(
            "The conflict trail: commands per send of a free lock, trail on − off (INFO commandstats)",
            first.name,
            conflicts.extra_commands,
            "{:.2f}",
            "0",
            at_most=0,
        ),
        Row(
            "The conflict trail: Python per send that meets a held lock, trail on − off (StubBackend, log)",
            first.name,
            conflicts.conflict_us,
            "{:.1f} µs",
            "no target",
            beside=f"a write's server time {median_range(conflicts.entry_us, '{:.1f} µs')} per entry",
        ),
    ]
    strategies = "/".join(cancel.STRATEGIES)
    rows += [
        Row(
            f"Script calls per while_executing lifecycle, {strategies}: the most − the least (INFO commandstats)",
            first.name,
            cancelling.spread,
            "{:.2f}",
            "0",
            at_most=0,
            beside="calls "
            + "/".join(f"{statistics.median(cancelling.calls[s]):.2f}" for s in cancel.STRATEGIES)
            + ", server time "
            + "/".join(f"{statistics.median(cancelling.lifecycle_us[s]):.1f}" for s in cancel.STRATEGIES)
            + " µs",
        ),
        Row(
            f"Leases renewed per heartbeat, {cancel.RUNNING} running while_executing messages, wait ÷ "
            "cancel_in_progress (renewed when due ÷ at every heartbeat)",
            first.name,
            cancelling.renewal_ratio,
            ratio,
            "no target",
            beside="server time per heartbeat "
            + "/".join(f"{statistics.median(cancelling.beat_us[s]):.0f}" for s in cancel.STRATEGIES)
            + f" µs ({strategies})",
        ),
    ]
    print()
    print("| | server | measured: median (lowest–highest) | target | |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    print()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{ROUNDS} rounds of interleaved runs on every server, {FIRST_SERVER_ROUNDS} for the figures of "
        f"{first.name} only, {latency.ROUNDS} for the latencies; took {time.monotonic() - started:.0f} s; "
        f"load average at end {load}"
    )


if __name__ == "__main__":
    main()
