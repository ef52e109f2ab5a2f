"""The Python UniqueJobs spends per until_executed message: in a worker's hooks, and in send().

A StubBroker and a StubBackend whose lock operations cost nothing: what is left is the
middleware's own Python, the part of a busy worker's or sender's cost that no round trip hides.

* measure(): the two hooks a worker thread runs around each message
  (before_process_message, after_process_message), called directly around the actor's
  function (which UniqueJobs wraps, to be told when it returns), with the process's
  release thread running as in a booted worker: the hooks hand each release over to it. The
  clock is the worker thread's CPU time: the release thread's turns on the interpreter lock,
  and the machine's other processes, are not the hooks' Python.
* measure_send(): send() of an until_executed actor, less send() of the same actor on a
  broker without the middleware, in interleaved rounds.

Run: python benchmarks/hooks.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import StubBackend, UniqueJobs
from dramatiq_unique.backends import Acquisition

MESSAGES = 10_000
#: send(): rounds of each kind, and sends per round.
SEND_ROUNDS = 15
SENDS_PER_ROUND = 2_000


class FreeReleases(StubBackend):
    """A StubBackend whose releases, and the start's claim of the enqueue lock, cost nothing:
    only the hooks are timed (each is the round trip a real backend makes)."""

    def claim(self, key: str, owner: str, **options: Any) -> str:
        return "held"

    def release(self, key: str, owner: str) -> bool:
        return True

    def release_many(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        return [True] * len(places)


class FreeAcquisitions(FreeReleases):
    """A StubBackend whose acquisitions cost nothing either: each is the round trip a real
    backend makes, and only the middleware's Python around it is timed."""

    _taken = Acquisition(acquired=True, token=1)

    def acquire(self, key: str, owner: str, **options: Any) -> Acquisition:
        return self._taken


def measure(messages: int = MESSAGES) -> float:
    """Microseconds of the worker thread's CPU time in the two worker hooks per until_executed
    message, the process's background threads running as in a booted worker."""
    broker = StubBroker()
    # No heartbeat within the measurement.
    middleware = UniqueJobs(backend=FreeReleases(), activity=True, heartbeat_interval=60_000, lease_period=180_000)
    broker.add_middleware(middleware, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="settle_payment")
    def settle_payment(i: int) -> None:
        pass

    proxies = [MessageProxy(settle_payment.send(i)) for i in range(messages)]
    worker = object()  # what the runtime tells Workers apart by
    middleware.runtime.worker_booted(worker)
    try:
        started = time.thread_time()
        for proxy in proxies:
            middleware.before_process_message(broker, proxy)
            # The actor's function, as UniqueJobs wraps it: told when it returns.
            settle_payment.fn(*proxy.args)
            middleware.after_process_message(broker, proxy, result=None)
        elapsed = time.thread_time() - started
    finally:
        middleware.runtime.worker_stopped(worker)
        broker.close()
    return elapsed / messages * 1e6


def measure_send(messages: int = SENDS_PER_ROUND, rounds: int = SEND_ROUNDS) -> float:
    """Microseconds of UniqueJobs' Python per send() of an until_executed actor: the median of
    ``rounds`` rounds of ``messages`` sends, less the median of as many sends without it."""
    locked_broker = StubBroker()
    locked_broker.add_middleware(UniqueJobs(backend=FreeAcquisitions(), activity=True), before=TimeLimit)
    plain_broker = StubBroker()

    @dramatiq.actor(broker=locked_broker, lock="until_executed", actor_name="settle_payment")
    def locked(i: int) -> None:
        pass

    @dramatiq.actor(broker=plain_broker, actor_name="settle_payment")
    def plain(i: int) -> None:
        pass

    def per_send(broker: StubBroker, send: Callable[[int], Any]) -> float:
        started = time.perf_counter()
        for i in range(messages):
            send(i)
        elapsed = time.perf_counter() - started
        broker.flush_all()
        return elapsed / messages * 1e6

    with_lock: list[float] = []
    without: list[float] = []
    for _ in range(rounds):
        with_lock.append(per_send(locked_broker, locked.send))
        without.append(per_send(plain_broker, plain.send))
    locked_broker.close()
    plain_broker.close()
    return statistics.median(with_lock) - statistics.median(without)


def main() -> None:
    print(f"UniqueJobs' worker hooks: {measure():.1f} us of Python per until_executed message")
    print(f"UniqueJobs' send(): {measure_send():.1f} us of Python per until_executed send")


if __name__ == "__main__":
    main()
