"""Redis memory per held lock, and what a released lock leaves.

LOCKS until_executed enqueue locks of queued RedisBroker messages, taken through the real
acquire script, then released by the backend's release_many (as a worker's release thread
releases them). Nothing here assumes a record format: the keys are found by scanning the lock
prefix, before, while the locks are held and after their release, and the figures are

* held: the MEMORY USAGE of every key the locks added under the prefix, per lock, and the
  growth of the server's used_memory per lock;
* after release: the keys left under the prefix per released lock, their MEMORY USAGE per
  released lock (0 B where none is left), and used_memory's growth over the server before the
  locks were taken, per lock;

with the type and encoding of whatever keys there are.
Run: python benchmarks/memory.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import base64
import collections
import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from dramatiq_unique import RedisBackend
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

LOCKS = 50_000
#: The calls that a holder of an actor with lock_info keeps: a short one, and one cut to 120 characters.
LOCK_INFO_CALLS = ("settle_payment('evt_123')", "settle_payment('" + "x" * 103 + "…")
BATCH = 1_000
PREFIX = "dramatiq-unique"


@dataclass
class Keys:
    """What a set of keys under the lock prefix takes, per lock."""

    locks: int
    keys: float  # keys per lock
    usage: float  # MEMORY USAGE per lock, bytes
    used_memory: float  # the server's used_memory growth per lock over the server before, bytes
    kinds: dict[str, int] = field(default_factory=dict)  # "type/encoding" -> keys

    def describe_kinds(self) -> str:
        """The keys per lock by type and encoding, e.g. ``"1 hash/listpack"``; ``"no key"``."""
        return ", ".join(f"{count / self.locks:g} {kind}" for kind, count in sorted(self.kinds.items())) or "no key"


@dataclass
class Figures:
    locks: int
    held: Keys
    released: Keys
    example: dict[str, str]  # one held lock's keys: name -> type and value

    @property
    def usage(self) -> float:
        return self.held.usage


def scan(client: redis.Redis, prefix: str = PREFIX) -> set[str]:
    """Every key under ``prefix``."""
    return set(client.scan_iter(match=f"{prefix}:*", count=BATCH))


def chunks(items: list[str], size: int = BATCH) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def measured(client: redis.Redis, keys: set[str], locks: int, used_memory: int) -> Keys:
    """MEMORY USAGE, type and encoding of ``keys``, per lock of ``locks``."""
    usage = 0
    kinds: collections.Counter[str] = collections.Counter()
    for chunk in chunks(sorted(keys)):
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key, samples=0)
            pipe.type(key)
            pipe.object("encoding", key)
        replies = pipe.execute()
        for size, kind, encoding in zip(replies[0::3], replies[1::3], replies[2::3], strict=True):
            usage += size or 0
            kinds[f"{kind}/{encoding}"] += 1
    growth = client.info("memory")["used_memory"] - used_memory
    return Keys(locks=locks, keys=len(keys) / locks, usage=usage / locks, used_memory=growth / locks, kinds=dict(kinds))


def a_digest(number: int) -> str:
    """A digest as the middleware makes them: 128 bits in base64url."""
    return base64.urlsafe_b64encode(hashlib.sha256(str(number).encode()).digest()[:16]).rstrip(b"=").decode()


def show(client: redis.Redis, key: str) -> str:
    kind = client.type(key)
    value: object = kind
    if kind == "hash":
        value = client.hgetall(key)
    elif kind == "string":
        value = client.get(key)
    return f"{kind} {value}"


def measure(url: str, locks: int = LOCKS, *, call: str | None = None) -> Figures:
    """The figures of ``locks`` held locks; with ``call``, each holder keeps it (``lock_info``)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    backend = RedisBackend(client=client)
    # A lock taken and released first: the scripts are loaded, and whatever a backend writes once
    # (and what that lock leaves) is there before the first reading.
    warm = Holder(message_id="warm", actor="settle_payment", queue="payments", lock="until_executed", state="queued")
    backend.acquire(enqueue_key(PREFIX, "warm"), "warm", limit=1, ttl=None, holder=warm)
    backend.release(enqueue_key(PREFIX, "warm"), "warm")
    before_keys = scan(client)
    before = client.info("memory")["used_memory"]
    owners = {}
    for start in range(0, locks, BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, start + BATCH):
            digest = a_digest(i)
            message_id = str(uuid.uuid4())
            holder = Holder(
                message_id=message_id,
                actor="settle_payment",
                queue="payments",
                lock="until_executed",
                state="queued",
                redis_message_id=str(uuid.uuid4()),
                call=call,
            )
            key = enqueue_key(PREFIX, digest)
            # The arguments of RedisBackend.acquire, pipelined: 100,000 round trips would take minutes.
            keys = [key, *backend._place_keys(key)]
            backend._scripts.pipeline_call(pipe, "acquire", keys, [message_id, 1, 0, 0, holder.encode(message_id)])
            owners[key] = message_id
        pipe.execute()
    held_keys = scan(client) - before_keys
    held = measured(client, held_keys, locks, before)
    first = enqueue_key(PREFIX, a_digest(0))
    example = {key: show(client, key) for key in sorted(held_keys) if key.startswith(first)}
    for chunk in chunks(list(owners)):
        backend.release_many([(key, owners[key]) for key in chunk])
    released = measured(client, scan(client) - before_keys, locks, before)
    client.flushdb()
    client.close()
    return Figures(locks, held, released, example)


def main() -> None:
    with redis_url() as url:
        figures = measure(url)
    held, released = figures.held, figures.released
    print(f"{figures.locks} held until_executed locks (RedisBroker message ids recorded):")
    print(
        f"  MEMORY USAGE per lock: {held.usage:.0f} bytes in {held.describe_kinds()} a lock (target <= 160); "
        f"used_memory growth per lock: {held.used_memory:.0f} bytes"
    )
    print(f"  one lock: {figures.example}")
    print(
        f"  after release, per lock: {released.describe_kinds()} left, MEMORY USAGE {released.usage:.0f} bytes "
        f"(target 0); used_memory growth {released.used_memory:.0f} bytes"
    )
    for call in LOCK_INFO_CALLS:
        with redis_url() as url:
            kept = measure(url, call=call)
        print(
            f"  with lock_info, a call of {len(call)} characters: MEMORY USAGE per lock {kept.usage:.0f} bytes "
            f"(+{kept.usage - held.usage:.0f}); used_memory growth per lock {kept.held.used_memory:.0f} bytes"
        )


if __name__ == "__main__":
    main()
