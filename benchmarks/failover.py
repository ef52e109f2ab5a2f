"""What a failover does to the locks, with and without ``min_replicas``, and what the setting costs.

Servers: a primary, two replicas and three sentinels, started here as the tests start them
(tests/sentinel.py), once per setting. Four threads send messages of an ``until_executed``
actor (through UniqueJobs on a StubBroker: only the locks are in this Redis), each with lock
arguments of its own. The replicas are made to lag (stopped, their replication sockets
filled), the threads go on sending for a moment, the primary is SIGKILLed and the sentinels
promote a replica. Then a copy of every message that ``send()`` reported enqueued is sent
again: a copy that is enqueued is a duplicate, as its lock was lost.

Cost: acquire + release of a lock, interleaved in blocks (plain, with min_replicas=1, plain,
...) on the healthy primary; the figure is the median of the ratio within each round.
Run: python benchmarks/failover.py  (about 15 s)
"""

from __future__ import annotations

import logging
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/sentinel.py starts the servers

from dramatiq_unique import LockBackendError, RedisBackend, UniqueJobs, enqueue_outcome  # noqa: E402
from dramatiq_unique.backends import Holder  # noqa: E402
from dramatiq_unique.outcome import ENQUEUED  # noqa: E402
from tests.cluster import _executables  # noqa: E402
from tests.sentinel import ReplicatedRedis  # noqa: E402

THREADS = 4
#: How long the threads send while the replicas lag, in seconds.
LAGGING = 1.0
ROUNDS = 15
BLOCK = 200
REPLICA_TIMEOUT = 100


@dataclass
class Loss:
    min_replicas: int
    reported: int  # sends that reported the message enqueued with its lock
    refused_lagging: int  # sends that raised LockBackendError while the replicas lagged
    duplicates: int  # copies enqueued after the failover


@dataclass
class Cost:
    plain: list[float]  # seconds per acquire + release
    durable: list[float]

    @property
    def ratios(self) -> list[float]:
        return [d / p for p, d in zip(self.plain, self.durable, strict=True)]


def _servers(directory: Path) -> ReplicatedRedis:
    servers = ReplicatedRedis(_executables()[0], directory)
    servers.start()
    return servers


def _backend(servers: ReplicatedRedis, min_replicas: int) -> RedisBackend:
    return servers.backend(min_replicas=min_replicas, replica_timeout=REPLICA_TIMEOUT)


def measure_loss(min_replicas: int) -> Loss:
    with tempfile.TemporaryDirectory(prefix="dramatiq-unique-failover-") as directory:
        servers = _servers(Path(directory))
        try:
            broker = StubBroker()
            broker.add_middleware(UniqueJobs(backend=_backend(servers, min_replicas)), before=TimeLimit)

            @dramatiq.actor(broker=broker, lock="until_executed", actor_name="settle")
            def settle(event_id):
                pass

            reported: list[str] = []
            refused = 0
            stop = threading.Event()
            mutex = threading.Lock()

            def send(prefix: str) -> None:
                nonlocal refused
                for i in range(10**9):
                    if stop.is_set():
                        return
                    try:
                        message = settle.send(f"{prefix}-{i}")
                    except LockBackendError:
                        with mutex:
                            refused += 1
                        continue
                    if enqueue_outcome(message).status == ENQUEUED:
                        with mutex:
                            reported.append(message.args[0])

            threads = [threading.Thread(target=send, args=(uuid.uuid4().hex[:8],)) for _ in range(THREADS)]
            for thread in threads:
                thread.start()
            time.sleep(0.3)
            servers.lag()
            time.sleep(LAGGING)
            refused_lagging = refused
            servers.kill_primary()
            stop.set()
            for thread in threads:
                thread.join()
            duplicates = sum(enqueue_outcome(settle.send(event_id)).status == ENQUEUED for event_id in list(reported))
            broker.close()
            return Loss(min_replicas, len(reported), refused_lagging, duplicates)
        finally:
            servers.stop()


def measure_cost() -> Cost:
    holder = Holder(message_id="m", actor="settle", queue="default", lock="until_executed", state="queued")
    with tempfile.TemporaryDirectory(prefix="dramatiq-unique-failover-") as directory:
        servers = _servers(Path(directory))
        try:
            plain, durable = _backend(servers, 0), _backend(servers, 1)
            cost = Cost([], [])

            def block(backend: RedisBackend, start: int) -> float:
                began = time.perf_counter()
                for i in range(start, start + BLOCK):
                    key = f"dramatiq-unique:{{{i}}}"
                    backend.acquire(key, "m", limit=1, ttl=None, holder=holder)
                    backend.release(key, "m")
                return (time.perf_counter() - began) / BLOCK

            for backend in (plain, durable):  # connections and scripts
                block(backend, 0)
            for r in range(ROUNDS):
                cost.plain.append(block(plain, 2 * r * BLOCK))
                cost.durable.append(block(durable, (2 * r + 1) * BLOCK))
            return cost
        finally:
            servers.stop()


def measure() -> tuple[list[Loss], Cost]:
    return [measure_loss(0), measure_loss(1)], measure_cost()


def describe(losses: list[Loss], cost: Cost) -> list[str]:
    lines = [
        f"Failover, min_replicas={loss.min_replicas}: {loss.reported} sends reported their message enqueued "
        f"({loss.refused_lagging} raised LockBackendError while the replicas lagged); after the failover, "
        f"the locks of {loss.duplicates} of them were gone and their copies were enqueued"
        for loss in losses
    ]
    lines.append(
        f"acquire + release: {statistics.median(cost.plain) * 1e6:.0f} µs plain, "
        f"{statistics.median(cost.durable) * 1e6:.0f} µs with min_replicas=1 (two replicas): "
        f"{statistics.median(cost.ratios):.2f} × (median of {ROUNDS} interleaved rounds, "
        f"{min(cost.ratios):.2f}–{max(cost.ratios):.2f})"
    )
    return lines


def main() -> None:
    logging.basicConfig(level=logging.CRITICAL)  # the failover's backend errors are expected
    started = time.monotonic()
    print("\n".join(describe(*measure())))
    print(f"took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
