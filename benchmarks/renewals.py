"""Lease renewals per heartbeat with 64 running ``while_executing`` messages: the script calls
(round trips) that one heartbeat of a worker sends to renew the leases of their run locks.

Counted by the Redis server itself: its MONITOR shows each script call with the script's SHA, so
the renewals are told apart from the heartbeats that mark the ticks. The messages go through a
StubBroker. For comparison, the same worker with a backend that renews the leases one by one
(``LockBackend.renew_many``'s default, which a backend of your own gets).
Run: python benchmarks/renewals.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import LockBackend, LockBackendError, RedisBackend, UniqueJobs
from dramatiq_unique.backends import Lease

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

MESSAGES = 64
#: Short leases, so that a few seconds hold many renewals: each lease is due every heartbeat or two.
LEASE_PERIOD = 600
HEARTBEAT_INTERVAL = 200
#: How long the renewals are watched, in seconds.
WATCH = 3.0


class _OneByOne(RedisBackend):
    """A RedisBackend that renews leases one by one, as a backend without ``renew_many`` does."""

    def renew_many(self, leases: Sequence[Lease]) -> list[int | None | LockBackendError]:
        return LockBackend.renew_many(self, leases)


def _watch(url: str, ids: dict[str, str], seconds: float) -> dict[str, list[tuple[float, int]]]:
    """The calls of each script of ``ids`` (name -> function or SHA) that reach the server within
    ``seconds``: when, and how many keys."""
    names = {script: name for name, script in ids.items()}
    calls: dict[str, list[tuple[float, int]]] = {name: [] for name in ids}
    client = redis.Redis.from_url(url)
    with client.monitor() as monitor:
        # The worker's heartbeats come every HEARTBEAT_INTERVAL: one ends the watch after the deadline.
        deadline = time.monotonic() + seconds
        while True:
            command = monitor.next_command()
            if time.monotonic() >= deadline:
                break
            if command["client_type"] != "lua" and command["command"].startswith(("EVALSHA ", "FCALL ")):
                _, script, keys, *_ = command["command"].split(" ", 3)
                if script in names:
                    calls[names[script]].append((command["time"], int(keys)))
    client.close()
    return calls


def measure(url: str, backend_class: type[RedisBackend]) -> dict[str, float]:
    """Renewal calls and leases renewed per heartbeat, with ``MESSAGES`` messages running."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = StubBroker()
    backend = backend_class(client=client)
    # Its short lease is on purpose: the warning of a seconds-like lease_period would say so each run.
    middleware_logger = logging.getLogger("dramatiq_unique.middleware.UniqueJobs")
    middleware_logger.addFilter(not_seconds_like)
    try:
        middleware = UniqueJobs(backend=backend, lease_period=LEASE_PERIOD, heartbeat_interval=HEARTBEAT_INTERVAL)
    finally:
        middleware_logger.removeFilter(not_seconds_like)
    broker.add_middleware(middleware, before=TimeLimit)
    finish = threading.Event()
    running: list[int] = []

    @dramatiq.actor(broker=broker, lock="while_executing", actor_name=f"sync_{backend_class.__name__}")
    def sync(account: int) -> None:
        running.append(account)
        finish.wait(WATCH + 30)

    worker = dramatiq.Worker(broker, worker_threads=MESSAGES, worker_timeout=100)
    worker.start()
    try:
        for account in range(MESSAGES):
            sync.send(account)
        while len(running) < MESSAGES:
            time.sleep(0.01)
        # One renewal first, so that the scripts are loaded: a call the server lacked would count twice.
        time.sleep(LEASE_PERIOD / 1000)
        scripts = {name: backend._scripts.called_as(name) for name in ("heartbeat", "renew", "renew_many")}
        calls = _watch(url, scripts, WATCH)
    finally:
        finish.set()
        broker.join(sync.queue_name)
        worker.join()
        worker.stop()
        broker.close()
        client.close()
    ticks = len(calls["heartbeat"])
    renewals = calls["renew"] + calls["renew_many"]
    return {
        "ticks": ticks,
        "calls_per_tick": len(renewals) / ticks,
        "leases_per_tick": sum(keys for _, keys in renewals) / ticks,
        "most_calls_in_a_tick": _most_in_a_tick([at for at, _ in calls["heartbeat"]], [at for at, _ in renewals]),
    }


def _most_in_a_tick(beats: list[float], renewals: list[float]) -> int:
    """The most renewal calls between two heartbeats."""
    bounds = [*sorted(beats), float("inf")]
    return max((sum(1 for at in renewals if start < at < end) for start, end in itertools.pairwise(bounds)), default=0)


def measure_renewals(url: str) -> dict[str, Any]:
    """Lease renewals per heartbeat with ``MESSAGES`` running ``while_executing`` messages, counted
    by the server at ``url``: for RedisBackend (one script call for every lease due), and for a
    backend that renews them one by one.

    Returns:
      dict: ``messages``, and for ``"batched"`` and ``"one_by_one"``: the heartbeats watched
      (``ticks``), the renewal calls per heartbeat (``calls_per_tick``, and the most in one:
      ``most_calls_in_a_tick``) and the leases they renewed (``leases_per_tick``).
    """
    return {"messages": MESSAGES, "batched": measure(url, RedisBackend), "one_by_one": measure(url, _OneByOne)}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_url() as url:
        result = measure_renewals(url)
    print(f"Lease renewals per heartbeat, {result['messages']} running while_executing messages:")
    print(f"{'backend':<12}{'ticks':>7}{'calls/tick':>12}{'most calls':>12}{'leases/tick':>13}")
    for name in ("batched", "one_by_one"):
        row = result[name]
        print(
            f"{name:<12}{row['ticks']:>7}{row['calls_per_tick']:>12.2f}"
            f"{row['most_calls_in_a_tick']:>12}{row['leases_per_tick']:>13.2f}"
        )


if __name__ == "__main__":
    main()


def not_seconds_like(record: logging.LogRecord) -> bool:
    """Drops the warning of a middleware duration that looks like seconds."""
    return "is in milliseconds, so" not in record.msg
