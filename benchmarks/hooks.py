"""The Python a worker spends in UniqueJobs' hooks per until_executed message.

A StubBroker, a StubBackend whose releases cost nothing, and the two hooks a worker thread runs
around each message (before_process_message, after_process_message), called directly: what is
left is the middleware's own Python, the part of a busy worker's cost that no round trip hides.
Run: python benchmarks/hooks.py
"""

from __future__ import annotations

import time

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import StubBackend, UniqueJobs

MESSAGES = 10_000


class FreeReleases(StubBackend):
    """A StubBackend whose releases cost nothing: only the hooks are timed."""

    def release(self, key: str, owner: str) -> bool:
        return True


def measure(messages: int = MESSAGES) -> float:
    """Microseconds of the two worker hooks per until_executed message."""
    broker = StubBroker()
    middleware = UniqueJobs(backend=FreeReleases(), activity=True)
    broker.add_middleware(middleware, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="settle_payment")
    def settle_payment(i: int) -> None:
        pass

    proxies = [MessageProxy(settle_payment.send(i)) for i in range(messages)]
    started = time.perf_counter()
    for proxy in proxies:
        middleware.before_process_message(broker, proxy)
        middleware.after_process_message(broker, proxy, result=None)
    elapsed = time.perf_counter() - started
    broker.close()
    return elapsed / messages * 1e6


def main() -> None:
    print(f"UniqueJobs' worker hooks: {measure():.1f} us of Python per until_executed message")


if __name__ == "__main__":
    main()
