"""Cost of one orphan reaper cycle over 100,000 live locks with 100 orphans (SPEC P5).

The live locks are half enqueue locks of messages that exist in a RedisBroker queue (the
reaper asks the broker about each), half run locks of a live worker; the orphans are half
run locks of a dead worker, half enqueue locks of messages that are gone. They are written
straight into Redis in the format the scripts use, which is much faster than taking them.
Run: python benchmarks/reaper.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import logging
import time
import uuid

import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import RedisBackend
from dramatiq_unique.backends import Holder
from dramatiq_unique.backends.base import format_record
from dramatiq_unique.keys import registry_key
from dramatiq_unique.reaper import Reaper

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

LIVE = 100_000
ORPHANS = 100
PREFIX = "dramatiq-unique"


def plant(client: redis.Redis, now: int) -> None:
    client.zadd(registry_key(PREFIX), {"live:1:a": now + 30_000, "dead:2:b": now - 600_000})
    pipe = client.pipeline(transaction=False)
    for i in range(LIVE + ORPHANS):
        orphan = i >= LIVE
        digest = uuid.uuid4().hex
        if i % 2:
            worker = "dead:2:b" if orphan else "live:1:a"
            key, owner = f"{PREFIX}:{{{digest}}}:run", uuid.uuid4().hex
            holder = Holder(f"m{i}", "sync", "default", "while_executing", "running", worker_id=worker)
            expires_at: int | None = now + 600_000
        else:
            rid = str(uuid.uuid4())
            key, owner = f"{PREFIX}:{{{digest}}}", f"m{i}"
            holder = Holder(owner, "settle", "default", "until_executed", "queued", redis_message_id=rid)
            expires_at = None
            if not orphan:
                pipe.hset("dramatiq:default.msgs", rid, b"{}")
        record = format_record(
            expires_at=expires_at, token=i + 1, acquired_at=now - 60_000, holder=holder.encode(owner)
        )
        pipe.hset(key, mapping={"fence": i + 1, owner: record})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    with redis_url() as url:
        client = redis.Redis.from_url(url)
        client.flushdb()
        backend = RedisBackend(client=client)
        now = backend.heartbeats(registry_key(PREFIX))[0]
        plant(client, now)
        broker = RedisBroker(client=client)
        print(f"One reaper cycle over {LIVE:,} live locks and {ORPHANS} orphans (the second run finds none left):")
        for batch in (500, 2000):
            for key in client.scan_iter(f"{PREFIX}:reaper*"):
                client.delete(key)
            backend.heartbeat(registry_key(PREFIX), "live:1:a", ttl=30_000)  # the live worker is still alive
            reaper = Reaper(backend, prefix=PREFIX, logger=logging.getLogger("reaper"), batch=batch)
            started = time.perf_counter()
            report = reaper.run(broker=broker)
            elapsed = time.perf_counter() - started
            print(
                f"  batch {batch:>5}: {elapsed:.2f} s, {report.passes} passes ({elapsed / report.passes * 1000:.1f} ms "
                f"each), {report.inspected:,} places inspected, {report.released} released"
            )
        client.flushdb()


if __name__ == "__main__":
    main()
