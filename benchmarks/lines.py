"""What waiting in line costs: Redis round trips per message, and how long a key's backlog takes
to drain, against the workaround it replaces (``while_executing`` + ``reschedule``).

Round trips are counted from the Redis server's own command statistics; the messages go through a
StubBroker, so every command the server sees comes from the lock backend. The drain times of the
variants are taken in interleaved rounds (the machine is shared and noisy), and printed as ratios.
Run: python benchmarks/lines.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs

try:
    from ._server import redis_url
    from .round_trips import settle
except ImportError:
    from _server import redis_url
    from round_trips import settle

#: Messages of one key per measurement, each running this long (s).
MESSAGES = 40
WORK = 0.002
ROUNDS = 5
#: The workaround's polling delay: far below the 5 s default, to be fair to it.
RESCHEDULE_DELAY = 100

#: Each variant: its actor options, and how its messages are sent (all of one key).
VARIANTS: dict[str, dict[str, Any]] = {
    "wait (until_executed, in line at send)": {"lock": "until_executed", "on_conflict": "wait"},
    "wait (while_executing, in line in the worker)": {"lock": "while_executing", "on_conflict": {"server": "wait"}},
    "keep_latest (until_executed)": {"lock": "until_executed", "on_conflict": "keep_latest"},
    "while_executing + reschedule": {
        "lock": "while_executing",
        "on_conflict": {"server": "reschedule"},
        "reschedule_delay": RESCHEDULE_DELAY,
    },
}


@dataclass
class Run:
    round_trips: float
    seconds: float
    runs: int


def measure(url: str, name: str, options: dict[str, Any]) -> Run:
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = StubBroker()
    broker.emit_after("process_boot")
    middleware = UniqueJobs(backend=RedisBackend(client=client))
    broker.add_middleware(middleware, before=TimeLimit)
    ran = []

    @dramatiq.actor(broker=broker, actor_name="post", lock_args_method=lambda seq: [], max_retries=0, **options)
    def post(seq: int) -> None:
        time.sleep(WORK)
        ran.append(seq)

    worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=10)
    worker.start()
    try:
        post.send(-1)  # loads the scripts
        wait(lambda: ran == [-1])
        settle(middleware)
        client.config_resetstat()
        ran.clear()
        started = time.monotonic()
        for seq in range(MESSAGES):
            post.send(seq)
        expected = 2 if "keep_latest" in name else MESSAGES
        wait(lambda: len(ran) >= expected)
        seconds = time.monotonic() - started
        broker.join(post.queue_name)
        worker.join()
        settle(middleware)
        stats = client.info("commandstats")
        calls = sum(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)) for command in ("fcall", "evalsha"))
    finally:
        worker.stop()
        broker.close()
    return Run(round_trips=calls / MESSAGES, seconds=seconds, runs=len(ran))


def wait(condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the messages did not run in time")
        time.sleep(0.001)


def measure_all(url: str) -> dict[str, list[Run]]:
    """Every variant once a round, interleaved, for ROUNDS rounds."""
    results: dict[str, list[Run]] = {name: [] for name in VARIANTS}
    worker_threads = logging.getLogger("dramatiq.worker.WorkerThread")
    middleware = logging.getLogger("dramatiq_unique.middleware.UniqueJobs")
    worker_threads.addFilter(not_skipped)
    middleware.addFilter(not_about_persistence)
    try:
        for _ in range(ROUNDS):
            for name, options in VARIANTS.items():
                results[name].append(measure(url, name, options))
    finally:
        worker_threads.removeFilter(not_skipped)
        middleware.removeFilter(not_about_persistence)
    return results


def not_skipped(record: logging.LogRecord) -> bool:
    """Drops the worker's warning of a skipped message: the workaround's reschedules skip hundreds
    a run on purpose, and their warnings would bury the figures."""
    return record.msg != "Message %s was skipped."


def not_about_persistence(record: logging.LogRecord) -> bool:
    """Drops the boot warning of a lock store that keeps nothing on disk: the benchmark's servers
    keep nothing on purpose, and the worker of every run would say so again."""
    return "keeps nothing on disk" not in record.msg


def describe(results: dict[str, list[Run]]) -> list[str]:
    baseline = "while_executing + reschedule"
    lines = [
        f"{MESSAGES} messages of one key sent at once, each running {WORK * 1000:.0f} ms, a Worker of 4 threads on a "
        f"StubBroker; round trips per message sent, and the time until they ran (keep_latest: until the first and "
        f"the one successor ran), ÷ {baseline} with reschedule_delay={RESCHEDULE_DELAY} ms:"
    ]
    base = statistics.median(r.seconds for r in results[baseline])
    for name, runs in results.items():
        trips = statistics.median(r.round_trips for r in runs)
        seconds = [r.seconds for r in runs]
        ratios = [s / b.seconds for s, b in zip(seconds, results[baseline], strict=True)]
        lines.append(
            f"  {name}: {trips:.2f} round trips a message, {statistics.median(seconds) * 1000:.0f} ms "
            f"(÷ baseline {statistics.median(ratios):.2f}, lowest {min(ratios):.2f}, highest {max(ratios):.2f}; "
            f"baseline {base * 1000:.0f} ms)"
        )
    return lines


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    with redis_url() as url:
        results = measure_all(url)
    print("\n".join(describe(results)))


if __name__ == "__main__":
    main()
