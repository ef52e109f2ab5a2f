"""What cancel_in_progress costs, and what the actors without it pay: nothing.

Two figures from the same run, the variants taking turns round after round:

* per lifecycle of a ``while_executing`` actor with ``on_conflict="wait"``, ``"reject"`` and
  ``"cancel_in_progress"``: the lock server's script calls and their time (INFO commandstats),
  over MESSAGES no-op messages of distinct keys through a StubBroker worker, so that every
  command the server sees comes from the lock backend;
* per heartbeat, with RUNNING messages of such an actor running: the leases renewed and the
  renewal calls (counted by the backend), and the lock server's time of every script call in the
  window, the worker's heartbeats included (the same for each variant). The lease period is six
  heartbeat intervals, as with the defaults (30 s and 5 s): a lease is renewed when due, except
  an actor's with cancel_in_progress, renewed at every heartbeat so that a request to stop
  reaches it within one interval.

Run: python benchmarks/cancel.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import LockBackendError, RedisBackend, UniqueJobs
from dramatiq_unique.backends import Lease

try:
    from ._server import redis_url
    from .lines import not_about_persistence
    from .renewals import not_seconds_like
    from .server_time import SCRIPT_CALLS, commandstats, spent
except ImportError:
    from _server import redis_url
    from lines import not_about_persistence
    from renewals import not_seconds_like
    from server_time import SCRIPT_CALLS, commandstats, spent

ROUNDS = 5
MESSAGES = 500
RUNNING = 64
#: Six heartbeats a lease, as the defaults have, on a shorter scale.
HEARTBEAT_INTERVAL = 200
LEASE_PERIOD = 6 * HEARTBEAT_INTERVAL
#: How long the renewals are watched, in seconds.
WATCH = 3.0
STRATEGIES = ("wait", "reject", "cancel_in_progress")


class _Counting(RedisBackend):
    """A RedisBackend that counts its heartbeats and the leases it renews."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.beats = 0
        self.renewals: list[int] = []

    def heartbeat(self, *args: Any, **kwargs: Any) -> int:
        self.beats += 1
        return super().heartbeat(*args, **kwargs)

    def renew_many(self, leases: Sequence[Lease]) -> list[int | None | LockBackendError]:
        self.renewals.append(len(leases))
        return super().renew_many(leases)


@dataclass
class Figures:
    """Per strategy, one value a round."""

    calls: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STRATEGIES})
    lifecycle_us: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STRATEGIES})
    leases_per_beat: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STRATEGIES})
    renewals_per_beat: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STRATEGIES})
    beat_us: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STRATEGIES})

    @property
    def renewal_ratio(self) -> list[float]:
        """Leases renewed per heartbeat without cancel_in_progress ÷ with it, per round."""
        leases = self.leases_per_beat
        return [a / b for a, b in zip(leases["wait"], leases["cancel_in_progress"], strict=True)]

    @property
    def spread(self) -> list[float]:
        """Script calls per lifecycle, the most of the three strategies − the least, per round:
        0 where none pays for a command the others do not send."""
        return [max(values) - min(values) for values in zip(*self.calls.values(), strict=True)]


def _worker(url: str, threads: int, **options: int) -> tuple[redis.Redis, _Counting, StubBroker, Any, dramatiq.Worker]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    backend = _Counting(client=client)
    broker = StubBroker()
    logger = logging.getLogger("dramatiq_unique.middleware.UniqueJobs")
    logger.addFilter(not_seconds_like)  # a short lease is on purpose
    try:
        middleware = UniqueJobs(backend=backend, **options)
    finally:
        logger.removeFilter(not_seconds_like)
    broker.add_middleware(middleware, before=TimeLimit)
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=100)
    return client, backend, broker, middleware, worker


def lifecycles(url: str, strategy: str, messages: int = MESSAGES) -> tuple[float, float]:
    """Script calls and server µs per lifecycle of a no-op ``while_executing`` message, with the
    default heartbeat: one of its calls seldom falls within the messages' run."""
    client, _, broker, middleware, worker = _worker(url, 4)

    @dramatiq.actor(broker=broker, lock="while_executing", on_conflict=strategy, actor_name=f"noop_{strategy}")
    def noop(i: int) -> None:
        pass

    worker.start()
    try:
        noop.send(-1)  # loads the scripts
        broker.join(noop.queue_name)
        worker.join()
        _settle(middleware)
        before = commandstats(client)
        for i in range(messages):
            noop.send(i)
        broker.join(noop.queue_name)
        worker.join()
        _settle(middleware)
        calls, usec = spent(before, commandstats(client), SCRIPT_CALLS)
    finally:
        worker.stop()
        broker.close()
        client.close()
    return calls / messages, usec / messages


def renewals(url: str, strategy: str) -> tuple[float, float, float]:
    """Leases renewed, renewal calls and server µs per heartbeat, with ``RUNNING`` messages running."""
    client, backend, broker, middleware, worker = _worker(
        url, RUNNING, lease_period=LEASE_PERIOD, heartbeat_interval=HEARTBEAT_INTERVAL
    )
    finish = threading.Event()
    running: list[int] = []

    @dramatiq.actor(broker=broker, lock="while_executing", on_conflict=strategy, actor_name=f"sync_{strategy}")
    def sync(account: int) -> None:
        running.append(account)
        finish.wait(WATCH + 30)

    worker.start()
    try:
        for account in range(RUNNING):
            sync.send(account)
        while len(running) < RUNNING:
            time.sleep(0.01)
        time.sleep(LEASE_PERIOD / 1000)  # every lease renewed once: each due in turn from now on
        beats, renewed, calls = backend.beats, sum(backend.renewals), len(backend.renewals)
        before = commandstats(client)
        time.sleep(WATCH)
        after = commandstats(client)
        beats, renewed, calls = backend.beats - beats, sum(backend.renewals) - renewed, len(backend.renewals) - calls
    finally:
        finish.set()
        broker.join(sync.queue_name)
        worker.join()
        _settle(middleware)
        worker.stop()
        broker.close()
        client.close()
    return renewed / beats, calls / beats, spent(before, after, SCRIPT_CALLS)[1] / beats


def _settle(middleware: UniqueJobs) -> None:
    while middleware.releases is not None and not middleware.releases.idle:
        time.sleep(0.001)


def measure(url: str, rounds: int = ROUNDS) -> Figures:
    figures = Figures()
    middleware = logging.getLogger("dramatiq_unique.middleware.UniqueJobs")
    middleware.addFilter(not_about_persistence)
    try:
        _rounds(url, rounds, figures)
    finally:
        middleware.removeFilter(not_about_persistence)
    return figures


def _rounds(url: str, rounds: int, figures: Figures) -> None:
    for _ in range(rounds):
        for strategy in STRATEGIES:
            calls, usec = lifecycles(url, strategy)
            figures.calls[strategy].append(calls)
            figures.lifecycle_us[strategy].append(usec)
        for strategy in STRATEGIES:
            leases, renewal_calls, beat_us = renewals(url, strategy)
            figures.leases_per_beat[strategy].append(leases)
            figures.renewals_per_beat[strategy].append(renewal_calls)
            figures.beat_us[strategy].append(beat_us)


def _range(values: list[float], fmt: str) -> str:
    med = fmt.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def describe(figures: Figures) -> list[str]:
    rounds = len(figures.calls["wait"])
    lines = [
        f"cancel_in_progress against the strategies without it, while_executing, {rounds} interleaved rounds "
        f"(median, lowest–highest):",
        f"  {'on_conflict':<20}{'calls/lifecycle':>17}{'server µs/lifecycle':>28}"
        f"{'leases/heartbeat':>22}{'calls/heartbeat':>17}{'server µs/heartbeat':>28}",
    ]
    for strategy in STRATEGIES:
        lines.append(
            f"  {strategy:<20}{_range(figures.calls[strategy], '{:.2f}'):>17}"
            f"{_range(figures.lifecycle_us[strategy], '{:.1f}'):>28}"
            f"{_range(figures.leases_per_beat[strategy], '{:.1f}'):>22}"
            f"{_range(figures.renewals_per_beat[strategy], '{:.2f}'):>17}"
            f"{_range(figures.beat_us[strategy], '{:.0f}'):>28}"
        )
    lines.append(
        f"  ({MESSAGES} no-op messages of distinct keys a lifecycle figure; {RUNNING} running messages for "
        f"{WATCH:g} s a heartbeat figure, heartbeat {HEARTBEAT_INTERVAL} ms, lease {LEASE_PERIOD} ms; the "
        "heartbeat's server time includes the heartbeat's own call)"
    )
    return lines


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_url() as url:
        figures = measure(url)
    print("\n".join(describe(figures)))


if __name__ == "__main__":
    main()
