"""What the conflict trail costs: a send that meets no lock, a send that meets one, and the write.

- The commands per send of an until_executed actor whose locks are all free, with the trail on
  and off, counted by the server (INFO commandstats): the trail adds none.
- The Python per duplicate send (its lock held, strategy "log"), with the trail on and off, on
  a StubBackend: the difference is what noting the entry costs.
- The server time of one write of the trail (a heartbeat interval's entries, and the reads of
  up to 8 locks that name their holders), per write and per entry.

The rounds of the trail on and off are interleaved. Run: python benchmarks/trail.py (uses
REDIS_URL, else a bundled server).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import dataclass, field

import dramatiq
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, StubBackend, UniqueJobs
from dramatiq_unique.keys import history_key

try:
    from ._server import redis_url
except ImportError:
    from _server import redis_url

#: Sends of free locks a round, counted by the server.
FREE_SENDS = 500
#: Duplicate sends a round, timed.
DUPLICATES = 5_000
#: Entries a write of the trail adds, over this many digests.
ENTRIES_PER_WRITE = 100
DIGESTS_PER_WRITE = 10
ROUNDS = 5


@dataclass
class Figures:
    """Per round: commands per free send with the trail on and off, Python µs per duplicate send
    on and off, server µs per write and per entry."""

    commands_on: list[float] = field(default_factory=list)
    commands_off: list[float] = field(default_factory=list)
    duplicate_on: list[float] = field(default_factory=list)
    duplicate_off: list[float] = field(default_factory=list)
    write_us: list[float] = field(default_factory=list)
    entry_us: list[float] = field(default_factory=list)
    write_calls: list[int] = field(default_factory=list)

    @property
    def extra_commands(self) -> list[float]:
        return [on - off for on, off in zip(self.commands_on, self.commands_off, strict=True)]

    @property
    def conflict_us(self) -> list[float]:
        return [on - off for on, off in zip(self.duplicate_on, self.duplicate_off, strict=True)]


def _commands(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    own = ("cmdstat_info", "cmdstat_config|resetstat")
    return sum(stat["calls"] for name, stat in stats.items() if name not in own)


def free_sends(url: str, *, history: bool) -> float:
    """Commands the server saw per send of a free lock (the broker is a StubBroker: every command
    is the lock backend's). The activity counts are off, so that nothing else writes."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = StubBroker()
    broker.add_middleware(
        UniqueJobs(backend=RedisBackend(client=client), activity=False, history=history), before=TimeLimit
    )

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="reindex")
    def reindex(n: int) -> None:
        pass

    reindex.send(-1)  # the first send checks the store's eviction policy and loads the scripts
    client.config_resetstat()
    for n in range(FREE_SENDS):
        reindex.send(n)
    commands = _commands(client)
    broker.close()
    client.close()
    return commands / FREE_SENDS


def duplicate_sends(*, history: bool) -> float:
    """Microseconds per send that meets a held lock and is dropped, on a StubBackend."""
    broker = StubBroker()
    unique = UniqueJobs(backend=StubBackend(), activity=False, history=history)
    broker.add_middleware(unique, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="reindex")
    def reindex(tenant: str, batch: int) -> None:
        pass

    reindex.send("acme", 200)
    started = time.perf_counter()
    for _ in range(DUPLICATES):
        reindex.send("acme", 200)
    elapsed = time.perf_counter() - started
    if unique.activity is not None:
        unique.activity.close()  # the entries go to the StubBackend, after the timing
    broker.close()
    return elapsed / DUPLICATES * 1e6


def write(url: str) -> tuple[float, int]:
    """Server µs of one write of :data:`ENTRIES_PER_WRITE` entries over :data:`DIGESTS_PER_WRITE`
    held locks (their holders read, and the entries added), and its round trips (script calls)."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    broker = StubBroker()
    unique = UniqueJobs(backend=RedisBackend(client=client), activity=False)
    broker.add_middleware(unique, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="reindex")
    def reindex(tenant: str, batch: int) -> None:
        pass

    for n in range(DIGESTS_PER_WRITE):
        reindex.send("acme", n)
    for n in range(ENTRIES_PER_WRITE):
        reindex.send("acme", n % DIGESTS_PER_WRITE)
    assert unique.history is not None and unique.activity is not None
    client.config_resetstat()
    unique.activity.flush()
    stats = client.info("commandstats")
    usec = sum(stat["usec"] for name, stat in stats.items() if name not in ("cmdstat_config|resetstat",))
    calls = sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "evalsha"))
    assert client.xlen(history_key("dramatiq-unique")) == ENTRIES_PER_WRITE
    unique.activity.close()
    broker.close()
    client.close()
    return float(usec), calls


def measure(url: str, rounds: int = ROUNDS) -> Figures:
    figures = Figures()
    for _ in range(rounds):
        # On and off in turn, in each round.
        figures.commands_on.append(free_sends(url, history=True))
        figures.commands_off.append(free_sends(url, history=False))
        figures.duplicate_on.append(duplicate_sends(history=True))
        figures.duplicate_off.append(duplicate_sends(history=False))
        usec, calls = write(url)
        figures.write_calls.append(calls)
        figures.write_us.append(usec)
        figures.entry_us.append(usec / ENTRIES_PER_WRITE)
    return figures


def describe(figures: Figures) -> list[str]:
    med = statistics.median
    return [
        f"The conflict trail, {len(figures.write_us)} interleaved rounds:",
        f"  commands per send of a free lock: trail on {med(figures.commands_on):.2f}, "
        f"off {med(figures.commands_off):.2f} ({FREE_SENDS} sends a round, INFO commandstats)",
        f"  Python per duplicate send (log): trail on {med(figures.duplicate_on):.1f} µs, "
        f"off {med(figures.duplicate_off):.1f} µs: {med(figures.conflict_us):.1f} µs per conflict",
        f"  server time of one write ({ENTRIES_PER_WRITE} entries, {DIGESTS_PER_WRITE} locks read for their "
        f"holders): {med(figures.write_us):.0f} µs, {med(figures.entry_us):.1f} µs per entry, in "
        f"{max(figures.write_calls)} round trips",
    ]


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    with redis_url() as url:
        figures = measure(url)
    print("\n".join(describe(figures)))


if __name__ == "__main__":
    main()
