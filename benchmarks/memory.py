"""Redis memory per held lock (SPEC P4): 100,000 until_executed enqueue locks, taken through the
real acquire script, measured with MEMORY USAGE and with the server's used_memory, and the
encoding Redis chose for their hashes; then the memory of the fence a released lock keeps for
RedisBackend's fence_retention.
Run: python benchmarks/memory.py  (uses REDIS_URL, else a bundled server)
"""

from __future__ import annotations

import hashlib
import random
import uuid
from dataclasses import dataclass

import redis

from dramatiq_unique import RedisBackend
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

LOCKS = 100_000
BATCH = 1_000
SAMPLE = 1_000


@dataclass
class Figures:
    usage: float  # MEMORY USAGE per held lock, bytes
    growth: float  # used_memory growth per held lock, bytes
    encoding: str  # of a held lock's hash
    record: dict[str, str]  # one held lock's hash
    fence: float  # MEMORY USAGE per released lock's fence, bytes
    fence_encoding: str
    fence_retention: int  # ms


def measure(url: str, locks: int = LOCKS) -> Figures:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    backend = RedisBackend(client=client)
    before = client.info("memory")["used_memory"]
    keys, owners = [], {}
    for start in range(0, locks, BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, start + BATCH):
            digest = hashlib.sha256(str(i).encode()).hexdigest()
            message_id = str(uuid.uuid4())
            holder = Holder(
                message_id=message_id,
                actor="settle_payment",
                queue="payments",
                lock="until_executed",
                state="queued",
                redis_message_id=str(uuid.uuid4()),
            )
            key = enqueue_key("dramatiq-unique", digest)
            # The backend's own acquire script, pipelined: 100,000 round trips would take minutes.
            backend._scripts.pipeline_call(pipe, "acquire", [key], [message_id, 1, 0, 0, holder.encode(message_id)])
            keys.append(key)
            owners[key] = message_id
        pipe.execute()
    after = client.info("memory")["used_memory"]
    sample = random.sample(keys, SAMPLE)
    usage = sum(client.memory_usage(key, samples=0) for key in sample) / SAMPLE
    encoding = client.object("encoding", keys[0])
    record = client.hgetall(keys[0])
    pipe = client.pipeline(transaction=False)
    for key in sample:
        backend._scripts.pipeline_call(pipe, "release", [key], [owners[key]])
    pipe.execute()
    fence = sum(client.memory_usage(key, samples=0) for key in sample) / SAMPLE
    fence_encoding = client.object("encoding", sample[0])
    client.flushdb()
    client.close()
    return Figures(usage, (after - before) / locks, encoding, record, fence, fence_encoding, backend.fence_retention)


def main() -> None:
    with redis_url() as url:
        figures = measure(url)
    print(f"{LOCKS} held until_executed locks (RedisBroker message ids recorded):")
    print(f"  MEMORY USAGE per lock key: {figures.usage:.0f} bytes (target <= 200), encoded as {figures.encoding}")
    print(f"  used_memory growth per lock: {figures.growth:.0f} bytes")
    print(f"  one lock: {figures.record}")
    print(
        f"  MEMORY USAGE per released lock's fence, kept {figures.fence_retention} ms: {figures.fence:.0f} bytes, "
        f"encoded as {figures.fence_encoding}"
    )


if __name__ == "__main__":
    main()
