"""Redis round trips per message lifecycle, per lock type (SPEC P1).

Counted from the Redis server's own command statistics. The messages go through
a StubBroker, so every command the server sees comes from the lock backend.
Run: python benchmarks/round_trips.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import logging
import time

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

MESSAGES = 200

#: SPEC P1's targets, without lock_ttl.
TARGETS = {
    "until_executing": 2,
    "until_executed": 2,
    "while_executing": 2,
    "until_and_while_executing": 3,
    "until_expired": 1,
}


#: What the lock scripts run inside Redis; any other command would be an extra round trip.
SCRIPT_COMMANDS = {
    # Whether new places are refused while the store heals after a loss of its data.
    "exists",
    # The lock, then its hash slot's format key (with the last token), the refusal and the mark.
    "get",
    "mget",
    "time",
    # The lock (with a lock_ttl, SET ... PXAT), and with the slot's last token in one MSET without.
    "set",
    "mset",
    # The last holder left: the key goes.
    "del",
    "pexpireat",
    "srem",
    "sadd",
    "pexpire",
    "hdel",
    # A step that frees a place where messages wait in line hands it to the head of the line.
    "lindex",
}


def round_trips(client: redis.Redis) -> int:
    """Script calls since the last reset; fails if any other command reached the server."""
    calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in client.info("commandstats").items()}
    # This script's own calls, the handshake of a connection the pool opens, and a new backend's
    # load of the library of lock functions (answered at once: the server has it).
    for own in ("info", "config|resetstat", "hello", "client|setinfo", "function|load"):
        calls.pop(own, None)
    scripts = calls.pop("fcall", 0) + calls.pop("evalsha", 0)
    assert set(calls) <= SCRIPT_COMMANDS, f"commands outside the lock scripts: {sorted(set(calls) - SCRIPT_COMMANDS)}"
    return scripts


def measure(url: str, lock: str, lock_ttl: int | None) -> float:
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = StubBroker()
    backend = RedisBackend(client=client)
    middleware = UniqueJobs(backend=backend)
    broker.add_middleware(middleware, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock=lock, lock_ttl=lock_ttl, actor_name=f"noop_{lock}")
    def noop(i):
        pass

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    # Loads the scripts. Sent once the worker runs, so that its heartbeat thread flushes the
    # activity counts (every 5 s, never per message) instead of a thread of the sending process.
    noop.send(-1)
    broker.join(noop.queue_name)
    worker.join()
    settle(middleware)
    client.config_resetstat()
    for i in range(MESSAGES):
        noop.send(i)
    broker.join(noop.queue_name)
    worker.join()
    settle(middleware)
    calls = round_trips(client)
    worker.stop()
    broker.close()
    return calls / MESSAGES


def settle(middleware: UniqueJobs) -> None:
    """Wait until the worker's release thread has sent every release handed to it."""
    while middleware.releases is not None and not middleware.releases.idle:
        time.sleep(0.001)


def measure_all(url: str) -> dict[str, tuple[float, float]]:
    """Round trips per message for each lock type: without lock_ttl (NaN where it needs one), with 60 s."""
    return {
        lock: (measure(url, lock, None) if lock != "until_expired" else float("nan"), measure(url, lock, 60_000))
        for lock in TARGETS
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_url() as url:
        counts = measure_all(url)
    print(f"Redis round trips per message lifecycle, {MESSAGES} messages each:")
    print(f"{'lock':<28}{'lock_ttl=None':>14}{'lock_ttl=60s':>14}{'SPEC P1':>9}")
    for lock, (without_ttl, with_ttl) in counts.items():
        print(f"{lock:<28}{without_ttl:>14.2f}{with_ttl:>14.2f}{TARGETS[lock]:>9}")


if __name__ == "__main__":
    main()
