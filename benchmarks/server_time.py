"""The Redis server's own time per until_executed lifecycle, against redis-py's Lock.

A lifecycle is what the lock server does for one message: the acquire at send() and the release
after the actor ran. It is measured two ways, each from the lock server's INFO commandstats read
before and after:

* in a worker: N messages go through a RedisBroker with UniqueJobs and are processed by a real
  Worker, the locks on a server of their own so that the broker's commands do not mix in (the
  worker's release thread may release several messages in one call);
* in a loop: RedisBackend's acquire and release of an until_executed lock on a new key, N times,
  one after the other.

The anchor is redis-py's ``Lock`` (a SET NX and a release script) acquired and released N times
on a new key on the same server. The three run in turn, round after round; each figure is the
median over the rounds of the ratio within a round.
Run: python benchmarks/server_time.py  (uses REDIS_URL and LOCKS_REDIS_URL, else starts servers)
"""

from __future__ import annotations

import logging
import statistics
import time
import uuid
from dataclasses import dataclass

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key

try:
    from ._server import redis_urls
except ImportError:
    from _server import redis_urls

ROUNDS = 5
MESSAGES = 1_000

#: The commands that run a script or a function. Commands a script calls are counted in
#: commandstats too, and their time again inside the script's: only these are summed.
SCRIPT_CALLS = ("eval", "eval_ro", "evalsha", "evalsha_ro", "fcall", "fcall_ro")


def commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Calls and microseconds of each command since the server started (or its last RESETSTAT)."""
    return {
        name.removeprefix("cmdstat_"): (int(stat["calls"]), int(stat["usec"]))
        for name, stat in client.info("commandstats").items()
    }


def spent(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], commands: tuple[str, ...]
) -> tuple[int, int]:
    """Calls and microseconds of ``commands`` between two readings of commandstats.

    Differences of readings, not CONFIG RESETSTAT: a managed server may refuse CONFIG.
    """
    calls = usec = 0
    for command in commands:
        calls += after.get(command, (0, 0))[0] - before.get(command, (0, 0))[0]
        usec += after.get(command, (0, 0))[1] - before.get(command, (0, 0))[1]
    return calls, usec


@dataclass
class Figures:
    lifecycle: list[float]  # server µs per until_executed lifecycle through a worker, per round
    loop: list[float]  # server µs per RedisBackend acquire + release in a loop, per round
    redis_py_lock: list[float]  # server µs per redis-py Lock acquire + release, per round
    scripts: list[float]  # script calls per lifecycle through a worker, per round

    @property
    def ratio(self) -> list[float]:
        """Through a worker ÷ redis-py's Lock, per round."""
        return [a / b for a, b in zip(self.lifecycle, self.redis_py_lock, strict=True)]

    @property
    def loop_ratio(self) -> list[float]:
        """In a loop ÷ redis-py's Lock, per round."""
        return [a / b for a, b in zip(self.loop, self.redis_py_lock, strict=True)]


def lifecycles(broker_url: str, locks_url: str, messages: int) -> tuple[float, float]:
    """Server µs and script calls per until_executed lifecycle, over ``messages`` messages."""
    client = redis.Redis.from_url(broker_url)
    locks = redis.Redis.from_url(locks_url)
    client.flushdb()
    locks.flushdb()
    broker = RedisBroker(client=client, namespace=f"bench-{uuid.uuid4().hex[:8]}")
    middleware = UniqueJobs(backend=RedisBackend(client=locks))
    broker.add_middleware(middleware, before=TimeLimit)

    @dramatiq.actor(broker=broker, max_retries=0, actor_name="noop", lock="until_executed")
    def noop(i: int) -> None:
        pass

    worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)
    worker.start()
    try:
        # Loads the scripts (a first EVALSHA of each fails with NOSCRIPT) and lets the worker's
        # start-up calls pass before the server is read.
        noop.send(-1)
        wait(broker, worker, middleware, noop.queue_name)
        before = commandstats(locks)
        for i in range(messages):
            noop.send(i)
        wait(broker, worker, middleware, noop.queue_name)
        after = commandstats(locks)
    finally:
        worker.stop()
        broker.close()
    locks.flushdb()
    client.flushdb()
    client.close()
    locks.close()
    calls, usec = spent(before, after, SCRIPT_CALLS)
    return usec / messages, calls / messages


def wait(broker: RedisBroker, worker: dramatiq.Worker, middleware: UniqueJobs, queue: str) -> None:
    """Until every message sent ran and its lock's release has been answered."""
    broker.join(queue)
    worker.join()
    while middleware.releases is not None and not middleware.releases.idle:
        time.sleep(0.001)


def redis_py_locks(locks_url: str, calls: int) -> float:
    """Server µs per acquire + release of redis-py's Lock on a new key."""
    locks = redis.Redis.from_url(locks_url)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    warm = locks.lock(f"{prefix}:warm")  # loads the release script
    warm.acquire()
    warm.release()
    before = commandstats(locks)
    for i in range(calls):
        lock = locks.lock(f"{prefix}:{i}")
        lock.acquire()
        lock.release()
    after = commandstats(locks)
    locks.close()
    return spent(before, after, ("set", *SCRIPT_CALLS))[1] / calls


def queued_holders(count: int) -> list[Holder]:
    """The holders of ``count`` queued RedisBroker messages of an until_executed actor."""
    return [
        Holder(
            message_id=str(uuid.uuid4()),
            actor="settle_payment",
            queue="payments",
            lock="until_executed",
            state="queued",
            redis_message_id=str(uuid.uuid4()),
        )
        for _ in range(count)
    ]


def backend_lifecycles(backend: RedisBackend, calls: int) -> float:
    """Server µs per acquire + release of an until_executed lock on a new key, by ``backend``."""
    client = backend.client
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    # Made before the clock runs.
    holders = queued_holders(calls)
    keys = [enqueue_key(prefix, uuid.uuid4().hex * 2) for _ in holders]
    before = commandstats(client)
    for key, holder in zip(keys, holders, strict=True):
        backend.acquire(key, holder.message_id, limit=1, ttl=None, holder=holder)
        backend.release(key, holder.message_id)
    return spent(before, commandstats(client), SCRIPT_CALLS)[1] / calls


def functions_against_evalsha(locks_url: str, rounds: int = 11, calls: int = MESSAGES) -> list[float]:
    """Server time of the lock scripts called as Redis Functions ÷ called by EVALSHA, per round
    (acquire + release on new keys), EVALSHA for a user an ACL denies FUNCTION, as a managed
    server may; empty where the server has no Functions or refuses ACL SETUSER."""
    admin = redis.Redis.from_url(locks_url)
    try:
        admin.acl_setuser(
            "bench-evalsha", enabled=True, passwords=["+bench"], keys=["*"], commands=["+@all", "-function"]
        )
    except redis.ResponseError:
        return []
    functions = RedisBackend(url=locks_url)
    evalsha = RedisBackend(client=redis.Redis.from_url(locks_url, username="bench-evalsha", password="bench"))
    ratios = []
    try:
        backend_lifecycles(functions, 10)  # loads the library, and the scripts
        backend_lifecycles(evalsha, 10)
        if not functions._scripts.functions:
            return []
        for _ in range(rounds):
            ratios.append(backend_lifecycles(functions, calls) / backend_lifecycles(evalsha, calls))
    finally:
        admin.acl_deluser("bench-evalsha")
        for client in (admin, functions.client, evalsha.client):
            client.close()
    return ratios


def measure(broker_url: str, locks_url: str, rounds: int = ROUNDS, messages: int = MESSAGES) -> Figures:
    figures = Figures(lifecycle=[], loop=[], redis_py_lock=[], scripts=[])
    backend = RedisBackend(url=locks_url)
    for _ in range(rounds):
        usec, scripts = lifecycles(broker_url, locks_url, messages)
        figures.lifecycle.append(usec)
        figures.scripts.append(scripts)
        backend_lifecycles(backend, 10)  # the first calls load the scripts
        figures.loop.append(backend_lifecycles(backend, messages))
        figures.redis_py_lock.append(redis_py_locks(locks_url, messages))
    backend.client.close()
    return figures


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_urls(2) as (url, locks_url):
        figures = measure(url, locks_url)
    med = statistics.median
    print(f"Server time, {ROUNDS} rounds of {MESSAGES} until_executed lifecycles each way:")
    print(f"  redis-py Lock acquire + release {med(figures.redis_py_lock):.1f} us")
    print(
        f"  through a worker {med(figures.lifecycle):.1f} us ({med(figures.scripts):.2f} script calls): "
        f"ratio {med(figures.ratio):.2f} ({min(figures.ratio):.2f}-{max(figures.ratio):.2f})"
    )
    print(
        f"  in a loop {med(figures.loop):.1f} us: ratio {med(figures.loop_ratio):.2f} "
        f"({min(figures.loop_ratio):.2f}-{max(figures.loop_ratio):.2f})"
    )


if __name__ == "__main__":
    main()
