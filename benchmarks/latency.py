"""What one lock costs a caller, in round trips (SPEC P6 and the cost of send()).

P6: RedisBackend's acquire + release of an until_executed lock, against two calls of a trivial
    script (EVALSHA of "return 1"), and redis-py's own Lock for comparison.
send(): the extra time of send() for an until_executed actor (UniqueJobs on a RedisBroker)
    over the same actor without the middleware, against one trivial EVALSHA.
Both with redis-py's pure-Python parser and, when it is installed, with hiredis': one process
compares them, each client choosing its parser.
Every operation runs in blocks, the compared ones in turn (A B C A B C ...); each figure is
the median over the rounds of the ratio within a round.
Run: python benchmarks/latency.py  (uses REDIS_URL, else starts a server)
"""

from __future__ import annotations

import logging
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis._parsers import Encoder, _HiredisParser, _RESP2Parser
from redis.connection import PythonRespSerializer
from redis.utils import HIREDIS_AVAILABLE

from dramatiq_unique import RedisBackend, UniqueJobs
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key

try:
    from ._server import redis_url
    from .server_time import SCRIPT_CALLS, commandstats, queued_holders, spent
except ImportError:
    from _server import redis_url
    from server_time import SCRIPT_CALLS, commandstats, queued_holders, spent

ROUNDS = 15
BLOCK = 300


def per_call(operation: Callable[[int], object], start: int, block: int = BLOCK) -> float:
    """Seconds per call of ``operation``, over one block of calls."""
    started = time.perf_counter()
    for i in range(start, start + block):
        operation(i)
    return (time.perf_counter() - started) / block


def rounds(operations: dict[str, Callable[[int], object]], count: int = ROUNDS) -> dict[str, list[float]]:
    """Seconds per call of each operation, per round, the operations in turn."""
    results: dict[str, list[float]] = {name: [] for name in operations}
    for r in range(count):
        for name, operation in operations.items():
            results[name].append(per_call(operation, r * BLOCK))
    return results


@dataclass
class Figures:
    trivial: list[float]  # one EVALSHA, s
    acquire_release: list[float]  # RedisBackend acquire + release, s
    redis_py_lock: list[float]  # redis-py Lock acquire + release, s
    send_plain: list[float]  # send() without the middleware, s
    send_locked: list[float]  # send() with an until_executed lock, s

    @property
    def p6(self) -> list[float]:
        return [a / (2 * t) for a, t in zip(self.acquire_release, self.trivial, strict=True)]

    @property
    def redis_py(self) -> list[float]:
        return [a / (2 * t) for a, t in zip(self.redis_py_lock, self.trivial, strict=True)]

    @property
    def send(self) -> list[float]:
        return [
            (locked - plain) / t
            for locked, plain, t in zip(self.send_locked, self.send_plain, self.trivial, strict=True)
        ]


def hiredis_available() -> bool:
    """Whether hiredis is installed in a version this redis-py uses."""
    return bool(HIREDIS_AVAILABLE)


def parser_kwargs(parser: str) -> dict[str, Any]:
    """Connection keyword arguments for redis-py's own parser (``"python"``) or hiredis.

    redis-py picks both its reply parser and its command packer per connection, and takes
    hiredis' for both whenever it is installed: the pure-Python ones are named here, so that one
    process compares the two.
    """
    if parser == "hiredis":
        return {"parser_class": _HiredisParser}
    # The packer redis-py builds itself when hiredis is absent: its buffer cutoff and encoder.
    return {
        "parser_class": _RESP2Parser,
        "command_packer": PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode),
    }


def operations(client: redis.Redis, prefix: str, count: int) -> dict[str, Callable[[int], object]]:
    """The timed operations on ``client``, by the name of their Figures field."""
    trivial = client.register_script("return 1")
    backend = RedisBackend(client=client)

    def evalsha(i: int) -> None:
        trivial(keys=[f"{prefix}:{i}"], args=[])

    # A new digest each time, as a job with its own arguments has; made before the clock runs.
    holders = queued_holders(count * BLOCK + 1)
    keys = [enqueue_key(prefix, uuid.uuid4().hex * 2) for _ in holders]

    def acquire_release(i: int) -> None:
        holder = holders[i + 1]
        backend.acquire(keys[i + 1], holder.message_id, limit=1, ttl=None, holder=holder)
        backend.release(keys[i + 1], holder.message_id)

    def redis_py_lock(i: int) -> None:
        lock = client.lock(f"{prefix}:lock:{i}")
        lock.acquire()
        lock.release()

    plain_broker = RedisBroker(client=client, namespace=f"{prefix}-plain")
    locked_broker = RedisBroker(client=client, namespace=f"{prefix}-locked")
    # A prefix of its own: the same messages sent through another parser's client must find their
    # locks free, not those of this one.
    locked_broker.add_middleware(UniqueJobs(backend=backend, lock_prefix=prefix), before=TimeLimit)

    @dramatiq.actor(broker=plain_broker, actor_name="settle_payment", queue_name="payments")
    def plain(i: int) -> None:
        pass

    @dramatiq.actor(broker=locked_broker, actor_name="settle_payment", queue_name="payments", lock="until_executed")
    def locked(i: int) -> None:
        pass

    named = {
        "trivial": evalsha,
        "acquire_release": acquire_release,
        "redis_py_lock": redis_py_lock,
        "send_plain": plain.send,
        "send_locked": locked.send,
    }
    for operation in named.values():
        operation(-1)  # loads the scripts
    return named


def measure(url: str, count: int = ROUNDS, parsers: tuple[str, ...] = ("python",)) -> dict[str, Figures]:
    """The figures with each of ``parsers`` (``"python"``, ``"hiredis"``), all their operations
    interleaved in the same rounds."""
    return measure_servers({"": url}, {"": parsers}, count)[""]


def measure_servers(
    urls: dict[str, str], parsers: dict[str, tuple[str, ...]], count: int = ROUNDS
) -> dict[str, dict[str, Figures]]:
    """The figures on each server of ``urls`` (by name) with each of its ``parsers``, every
    operation on every server interleaved in the same rounds."""
    clients = {
        (server, parser): redis.Redis.from_url(url, **parser_kwargs(parser))
        for server, url in urls.items()
        for parser in parsers[server]
    }
    for server in urls:
        clients[server, parsers[server][0]].flushdb()
    timed: dict[str, Callable[[int], object]] = {}
    for (server, parser), client in clients.items():
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        for name, operation in operations(client, prefix, count).items():
            timed[f"{server}/{parser}/{name}"] = operation
    results = rounds(timed, count)
    for server in urls:
        clients[server, parsers[server][0]].flushdb()
    for client in clients.values():
        client.close()
    return {
        server: {
            parser: Figures(**{name: results[f"{server}/{parser}/{name}"] for name in Figures.__dataclass_fields__})
            for parser in parsers[server]
        }
        for server in urls
    }


@dataclass
class ServerTime:
    """Microseconds the Redis server spends per script call (EVALSHA, FCALL...), from its INFO
    commandstats: FUNCTION STATS gives no time per function, so each script runs on its own."""

    trivial: float
    acquire: float
    release: float


def server_time(url: str, calls: int = 2000) -> ServerTime:
    """The server's own time per call of a trivial script, and of the acquire and the release of
    an until_executed lock on a new key."""
    client = redis.Redis.from_url(url)
    trivial = client.register_script("return 1")
    backend = RedisBackend(client=client)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    message_id, redis_message_id = str(uuid.uuid4()), str(uuid.uuid4())
    holder = Holder(message_id, "settle_payment", "payments", "until_executed", "queued", None, redis_message_id)
    keys = [enqueue_key(prefix, uuid.uuid4().hex * 2) for _ in range(calls)]
    trivial()  # loads the scripts
    backend.acquire(f"{prefix}:warm", holder.message_id, limit=1, ttl=None, holder=holder)
    backend.release(f"{prefix}:warm", holder.message_id)

    def per_call(operation: Callable[[str], object]) -> float:
        before = commandstats(client)
        for key in keys:
            operation(key)
        calls, usec = spent(before, commandstats(client), SCRIPT_CALLS)
        return usec / calls

    figures = ServerTime(
        trivial=per_call(lambda key: trivial()),
        acquire=per_call(lambda key: backend.acquire(key, holder.message_id, limit=1, ttl=None, holder=holder)),
        release=per_call(lambda key: backend.release(key, holder.message_id)),
    )
    client.delete(*keys, f"{prefix}:warm")
    client.close()
    return figures


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parsers = ("python", "hiredis") if hiredis_available() else ("python",)
    with redis_url() as url:
        by_parser = measure(url, parsers=parsers)
        server = server_time(url)
    us = statistics.median
    print(f"One caller, {ROUNDS} rounds of {BLOCK} calls each, parsers {' and '.join(parsers)} interleaved:")
    for parser, figures in by_parser.items():
        print(f" {parser}: trivial EVALSHA round trip {us(figures.trivial) * 1e6:.0f} us")
        print(
            f"  acquire + release {us(figures.acquire_release) * 1e6:.0f} us, / two trivial EVALSHA: "
            f"{us(figures.p6):.2f} ({min(figures.p6):.2f}-{max(figures.p6):.2f}; target <= 1.15), "
            f"redis-py Lock: {us(figures.redis_py):.2f}"
        )
        print(
            f"  send() {us(figures.send_locked) * 1e6:.0f} us with an until_executed lock, "
            f"{us(figures.send_plain) * 1e6:.0f} us without the middleware: extra / one trivial EVALSHA "
            f"{us(figures.send):.2f} ({min(figures.send):.2f}-{max(figures.send):.2f}; target <= 1.5)"
        )
    if not hiredis_available():
        print(' hiredis is not installed: pip install "dramatiq-unique[hiredis]" to compare it')
    print(
        f"  server time per call: trivial script {server.trivial:.1f} us, acquire {server.acquire:.1f} us, "
        f"release {server.release:.1f} us"
    )


if __name__ == "__main__":
    main()
