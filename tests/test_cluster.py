"""RedisBackend on a real three-master Redis Cluster (SPEC S5, with S1, S2, L10).

The shared backend suite and the seed stories run on the cluster too (test_backends.py,
test_seeds.py); here is what only a cluster has: locks spread over masters, scripts confined to
one hash slot, a library of lock functions lost by each node, and slots moving between masters while locks are held.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import threading
import time
import uuid
from collections import Counter

import dramatiq
import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from dramatiq_unique import LockBackendError, LockStoreHealing, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import Holder, Lease
from dramatiq_unique.digest import DIGEST_BYTES
from dramatiq_unique.keys import enqueue_key, format_key, run_key

from .cluster import Cluster, _executables
from .support import pop_script_calls, unique_warnings
from .test_backends import SCRIPT_COMMANDS

PREFIX = "dramatiq-unique"
#: What a script of the lock's hash slot may call: those of one node, and the GET, SET and MSET
#: of the lock's value and of the slot's format key (issue 33).
CLUSTER_SCRIPT_COMMANDS = SCRIPT_COMMANDS | {"get", "set", "mset"}


def holder(message_id: str, state: str = "queued") -> Holder:
    return Holder(message_id=message_id, actor="settle", queue="payments", lock="until_executed", state=state)


def swap(backend, key: str, run: str, owner: str, run_owner: str):
    """until_and_while_executing at start: ``owner``'s place in ``key`` for one in ``run``."""
    return backend.swap(
        release_key=key,
        release_owner=owner,
        replaced_key=key + ":replaced",
        acquire_key=run,
        owner=run_owner,
        limit=1,
        ttl=None,
        holder=holder(owner, "running"),
    )


def slot_of(digest: str) -> int:
    return key_slot(enqueue_key(PREFIX, digest).encode())


def digests(count: int, *, slot: int | None = None, seed: str = "") -> list[str]:
    """``count`` digests like the middleware's (the first 128 bits of a SHA-256, base64url), all
    in ``slot`` when given."""
    found = []
    for i in itertools.count():
        digest = base64.urlsafe_b64encode(hashlib.sha256(f"{seed}{i}".encode()).digest()[:DIGEST_BYTES])
        digest = digest.rstrip(b"=").decode()
        if slot is None or slot_of(digest) == slot:
            found.append(digest)
            if len(found) == count:
                return found
    raise AssertionError  # pragma: no cover


def one_digest_per_master(cluster) -> list[str]:
    """A digest served by each master, in the order of ``cluster.nodes``."""
    by_master = {}
    for digest in digests(200):
        by_master.setdefault(cluster.nodes.index(cluster.owner_of(slot_of(digest))), digest)
    return [by_master[i] for i in range(len(cluster.nodes))]


def slot_format_key(slot: int) -> str:
    """The format key of ``slot`` under PREFIX: the format of its locks and the last token issued
    there, in that slot (issue 33)."""
    tag = next(str(n) for n in itertools.count() if key_slot(str(n).encode()) == slot)
    return format_key(PREFIX, tag)


def assert_only_format_keys_left(cluster, slots: set[int]) -> None:
    """No key of a lock is left once its last holder left (the value goes with it), and each slot
    that issued a token keeps its format key, the last token, on the slot's master."""
    assert cluster.keys_per_master(f"{PREFIX}:{{*") == [[] for _ in cluster.nodes]
    left = cluster.keys_per_master(f"{PREFIX}:format:*")
    assert sorted(key.decode() for keys in left for key in keys) == sorted(slot_format_key(s) for s in slots)
    for node, keys in zip(cluster.nodes, left, strict=True):
        for key in keys:
            assert cluster.owner_of(key_slot(key)) is node
            assert node.ttl(key) == -1
            number, _, token = node.get(key).decode().split(" ")
            assert number == "1" and int(token) > 0


def command_calls(node) -> Counter:
    stats = node.info("commandstats")
    calls = Counter({name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()})
    for bookkeeping in ("info", "config|resetstat", "ping", "cluster|slots", "cluster|shards", "cluster|nodes"):
        calls.pop(bookkeeping, None)
    return calls


def error_count(node, error: str) -> int:
    stat = node.info("errorstats").get(f"errorstat_{error}", {})
    # redis-py 5 leaves the line unparsed: "count=3".
    if isinstance(stat, str):
        stat = dict(pair.split("=") for pair in stat.split(","))
    return int(stat.get("count", 0))


def test_keys_of_one_digest_share_a_slot_and_digests_spread_over_all_slots():
    # S4 + S5: the hash tag is the digest, so swap's two keys are in one slot, whatever the prefix
    # (braces are refused in lock_prefix), and the locks of many digests spread over the cluster.
    many = digests(2000)
    for prefix in (PREFIX, "billing:locks", "a"):
        for digest in many:
            assert key_slot(enqueue_key(prefix, digest).encode()) == key_slot(run_key(prefix, digest).encode())
    slots = {slot_of(d) for d in many}
    assert len(slots) > 1800
    assert min(slots) < 1000 and max(slots) > 15000


@pytest.mark.parametrize("env", ["cluster"], indirect=True)
def test_locks_spread_over_every_master_and_hold_on_each(env, redis_cluster):
    # S5: sixty jobs, sixty digests, their locks on all three masters; each master's locks
    # stop duplicates, and every one is released after its run.
    runs = Counter()

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs[event_id] += 1

    firsts = [settle.send(i) for i in range(60)]
    assert all(enqueue_outcome(m).enqueued for m in firsts)
    slots = {slot_of(enqueue_outcome(m).digest) for m in firsts}
    per_master = redis_cluster.keys_per_master(f"{PREFIX}:{{*")
    assert all(len(keys) >= 5 for keys in per_master), [len(k) for k in per_master]
    assert sum(len(keys) for keys in per_master) == 60
    for node, keys in zip(redis_cluster.nodes, per_master, strict=True):
        assert all(redis_cluster.owner_of(key_slot(key)) is node for key in keys)

    duplicates = [settle.send(i) for i in range(60)]
    assert [enqueue_outcome(m).holder for m in duplicates] == [m.message_id for m in firsts]
    assert env.waiting(settle) == 60

    env.worker(threads=8)
    env.join(settle)
    assert runs == {i: 1 for i in range(60)}
    # No holder is left and no key of a lock: the last token of each slot is in the slot's
    # format key, on the slot's master (issue 33).
    assert_only_format_keys_left(redis_cluster, slots)


def test_a_lifecycle_is_one_script_call_per_transition_on_the_digests_master(cluster_client, redis_cluster):
    # S1 + S5: acquire, swap and release are one EVALSHA each, sent to the master of the digest's
    # slot and nowhere else; a script touching a key of another slot would fail with CROSSSLOT.
    backend = RedisBackend(client=cluster_client)
    digest = one_digest_per_master(redis_cluster)[1]
    key, run = enqueue_key(PREFIX, digest), run_key(PREFIX, digest)

    def lifecycle(owner):
        assert backend.acquire(key, owner, limit=1, ttl=None, holder=holder(owner)).acquired
        swapped = swap(backend, key, run, owner, f"run-{owner}")
        assert swapped.acquired
        assert backend.release(run, f"run-{owner}")

    lifecycle("warm")  # loads the scripts and the client's slot map
    for node in redis_cluster.nodes:
        node.config_resetstat()
    lifecycle("m1")

    calls = [command_calls(node) for node in redis_cluster.nodes]
    assert calls[0] == calls[2] == Counter()
    assert pop_script_calls(calls[1]) == 3
    assert set(calls[1]) <= CLUSTER_SCRIPT_COMMANDS


def test_functions_are_loaded_again_on_every_master_that_lost_them(cluster_client, redis_cluster):
    # S1: a master restarted without its data, or given a slot it never served, has no lock
    # functions; a call meets "Function not found", and the client loads the library on the
    # masters and calls again. Each master in turn loses its functions.
    backend = RedisBackend(client=cluster_client)
    spread = one_digest_per_master(redis_cluster)
    for i, digest in enumerate(spread):
        assert backend.acquire(enqueue_key(PREFIX, digest), f"m{i}", limit=1, ttl=None, holder=holder(f"m{i}")).acquired
    for i, (node, digest) in enumerate(zip(redis_cluster.nodes, spread, strict=True)):
        for each in redis_cluster.nodes:
            each.config_resetstat()
        node.function_flush()
        key = enqueue_key(PREFIX, digest)
        duplicate = backend.acquire(key, "dup", limit=1, ttl=None, holder=holder("dup"))
        assert (duplicate.acquired, duplicate.holders) == (False, (f"m{i}",))
        swapped = swap(backend, key, run_key(PREFIX, digest), f"m{i}", f"t{i}")
        assert swapped.acquired
        assert backend.release(run_key(PREFIX, digest), f"t{i}")
        assert backend.acquire(key, "next", limit=1, ttl=None, holder=holder("next")).acquired
        # One library holds all three scripts; it goes to every master once (see the test below).
        assert [command_calls(each)["function|load"] for each in redis_cluster.nodes] == [1, 1, 1]


def test_leases_of_many_slots_are_renewed_in_one_call_per_slot_and_a_failing_slot_fails_alone(
    cluster_client, redis_cluster
):
    # A worker's leases spread over every master: one renewal call per hash slot, each on the
    # slot's master. A master that lost its lock functions still renews; a lock whose key
    # cannot be read as one fails its lease alone, with LockBackendError.
    backend = RedisBackend(client=cluster_client)
    by_master: dict[int, list[str]] = {}
    for digest in digests(300, seed="renewals"):
        by_master.setdefault(redis_cluster.nodes.index(redis_cluster.owner_of(slot_of(digest))), []).append(digest)
    spread = [run_key(PREFIX, digest) for i in range(len(redis_cluster.nodes)) for digest in by_master[i][:3]]
    broken = run_key(PREFIX, by_master[0][3])
    for key in spread:
        for owner in ("t1", "t2"):
            assert backend.acquire(key, owner, limit=2, ttl=1_000, holder=holder(owner, "running")).acquired
    cluster_client.rpush(broken, "no lock")  # a lock is a string: a list cannot be read as one
    leases = [Lease(key, owner, 60_000) for key in spread for owner in ("t1", "t2")]
    backend.renew_many(leases)  # loads the script and the client's slot map
    redis_cluster.nodes[1].function_flush()
    for node in redis_cluster.nodes:
        node.config_resetstat()
    now = backend.time()

    answers = backend.renew_many([*leases, Lease(broken, "t1", 60_000)])

    assert all(isinstance(answer, int) and answer >= now + 60_000 for answer in answers[:-1])
    assert isinstance(answers[-1], LockBackendError) and f"left key {broken!r} as it is" in str(answers[-1])
    calls = [command_calls(node)["fcall"] for node in redis_cluster.nodes]
    # One call a slot, three slots a master and the broken lock's on the first, in one pipeline
    # each. A call that failed is tried again on its own: the broken lock's once, and the second
    # master's three after "Function not found", the first of which loads the library again on
    # every master (the others answer that they have it).
    assert calls == [3 + 1 + 1, 3 + 3 + 1, 3]
    assert [command_calls(node)["function|load"] for node in redis_cluster.nodes] == [1, 1, 1]


def test_a_cluster_client_with_decoded_responses(redis_cluster):
    client = redis_cluster.client(decode_responses=True)
    try:
        backend = RedisBackend(client=client)
        key = enqueue_key(PREFIX, digests(1, seed="decoded")[0])
        assert backend.acquire(key, "m1", limit=1, ttl=None, holder=holder("m1")).acquired
        assert backend.acquire(key, "m2", limit=1, ttl=None, holder=holder("m2")).holders == ("m1",)
        assert backend.release(key, "m1")
    finally:
        client.delete(key)
        client.close()


class Traffic:
    """Client threads taking, swapping and releasing locks of a few digests, nonstop, recording
    what a user of the locks would notice: errors, two holders at once, a token going back."""

    def __init__(self, backend: RedisBackend, churn: list[str], held: dict[str, str], threads: int = 4):
        self.backend = backend
        self.churn = churn
        self.held = held  # enqueue key -> the message_id that must keep holding it
        self.errors: list[BaseException] = []
        self.wrong: list[str] = []
        keys = [key for d in churn for key in (enqueue_key(PREFIX, d), run_key(PREFIX, d))]
        self.tokens: dict[str, list[int]] = {key: [] for key in keys}
        self.inside: Counter = Counter()
        self.operations = 0
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def __enter__(self):
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _enter(self, key: str, token: int) -> None:
        with self._mutex:
            self.inside[key] += 1
            if self.inside[key] > 1:
                self.wrong.append(f"two holders of {key}")
            # Holders of one key follow each other, so tokens are recorded in acquisition order.
            self.tokens[key].append(token)
            self.operations += 1

    def _leave(self, key: str) -> None:
        with self._mutex:
            self.inside[key] -= 1

    def _run(self, index: int) -> None:
        backend = self.backend
        try:
            for i in itertools.count(index):
                if self._stop.is_set():
                    return
                digest = self.churn[i % len(self.churn)]
                key, run = enqueue_key(PREFIX, digest), run_key(PREFIX, digest)
                owner = uuid.uuid4().hex
                taken = backend.acquire(key, owner, limit=1, ttl=10_000, holder=holder(owner))
                if taken.acquired:
                    self._enter(key, taken.token)
                    self._leave(key)
                    swapped = backend.swap(
                        release_key=key,
                        release_owner=owner,
                        replaced_key=key + ":replaced",
                        acquire_key=run,
                        owner=f"run-{owner}",
                        limit=1,
                        ttl=10_000,
                        holder=holder(owner, "running"),
                    )
                    if swapped.acquired:
                        self._enter(run, swapped.token)
                        self._leave(run)
                        if not backend.release(run, f"run-{owner}"):
                            self.wrong.append(f"lost the run lock of {digest}")
                    elif not backend.release(key, owner):
                        self.wrong.append(f"lost the enqueue lock of {digest}")
                for held_key, message_id in self.held.items():
                    intruder = backend.acquire(held_key, "intruder", limit=1, ttl=None, holder=holder("intruder"))
                    if intruder.acquired or intruder.holders != (message_id,):
                        self.wrong.append(f"{held_key} held by {intruder.holders}, not {message_id}")
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            self.errors.append(e)


def test_locks_held_while_their_slot_moves_to_another_master_are_not_lost(cluster_client, redis_cluster):
    # S5 + S2 + L10: a slot full of held locks is resharded (IMPORTING/MIGRATING, MIGRATE key by
    # key, SETSLOT NODE) while client threads keep taking and releasing locks in it. Calls meet
    # ASK, TRYAGAIN and MOVED on the way; redis-py follows them, and no lock is lost or doubled.
    backend = RedisBackend(client=cluster_client)
    slot = slot_of(digests(1, seed="moving")[0])
    in_slot = digests(10, slot=slot, seed="moving")
    held_digests, churn = in_slot[:6], in_slot[6:]
    source = redis_cluster.owner_of(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)

    held, held_runs, tokens = {}, {}, {}
    for i, digest in enumerate(held_digests):
        key, run = enqueue_key(PREFIX, digest), run_key(PREFIX, digest)
        held[key], held_runs[run] = f"m{i}", f"t{i}"
        tokens[key] = backend.acquire(key, f"m{i}", limit=1, ttl=60_000, holder=holder(f"m{i}")).token
        tokens[run] = backend.acquire(run, f"t{i}", limit=1, ttl=None, holder=holder(f"m{i}", "running")).token
    for node in redis_cluster.nodes:
        node.config_resetstat()

    def owners_still_hold():
        # Re-entry keeps the place and its token (L6), so a moved record is the very same place.
        for key, owner in {**held, **held_runs}.items():
            again = backend.acquire(key, owner, limit=1, ttl=60_000 if key in held else None, holder=holder(owner))
            assert (again.acquired, again.token) == (True, tokens[key]), key
            duplicate = backend.acquire(key, "dup", limit=1, ttl=None, holder=holder("dup"))
            assert not duplicate.acquired, key

    with Traffic(backend, churn, held) as traffic:
        time.sleep(0.1)
        moved = redis_cluster.move_slot(slot, target, between_keys=owners_still_hold)
        owners_still_hold()
        time.sleep(0.1)

    assert traffic.errors == []
    assert traffic.wrong == []
    assert traffic.operations > 20
    for key, seen in traffic.tokens.items():
        assert seen == sorted(seen) and len(set(seen)) == len(seen), key
    # The held locks and their slot's format key now live on the target, and nothing is left on the source.
    assert moved >= len(held) + len(held_runs)
    assert source.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
    assert all(target.exists(key) for key in [*held, *held_runs])
    assert redis_cluster.owner_of(slot) is target
    assert error_count(source, "ASK") > 0 and error_count(source, "MOVED") > 0

    for key, owner in {**held, **held_runs}.items():
        assert backend.release(key, owner)
        assert not backend.release(key, owner)
        fresh = backend.acquire(key, "later", limit=1, ttl=None, holder=holder("later"))
        assert fresh.acquired and fresh.token > tokens[key]


def test_a_swap_while_its_slot_moves_waits_for_the_move_instead_of_failing(cluster_client, redis_cluster):
    # S5 + S1: mid-move, the enqueue lock is on one master and the free run lock on none, so
    # the swap script (two keys) gets TRYAGAIN until the slot has moved; redis-py gives up
    # after ~0.4 s, RedisBackend keeps trying (cluster_retry_seconds) and the swap goes through.
    backend = RedisBackend(client=cluster_client)
    digest = digests(1, seed="swap-moving")[0]
    key, run = enqueue_key(PREFIX, digest), run_key(PREFIX, digest)
    assert backend.acquire(key, "m1", limit=1, ttl=None, holder=holder("m1")).acquired
    source = redis_cluster.owner_of(slot_of(digest))
    target = next(node for node in redis_cluster.nodes if node is not source)
    source.config_resetstat()
    target.config_resetstat()
    outcome = {}

    def swap_in_thread():
        try:
            outcome["swap"] = swap(backend, key, run, "m1", "t1")
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            outcome["error"] = e

    swapper = threading.Thread(target=swap_in_thread)

    def swap_mid_move():
        if swapper.is_alive() or "swap" in outcome:
            return  # once, with the slot half moved (the lock and its slot's format key are two keys)
        swapper.start()
        time.sleep(1.0)  # longer than redis-py's own TRYAGAIN retries
        assert outcome == {}  # still waiting: the slot is half moved

    redis_cluster.move_slot(slot_of(digest), target, between_keys=swap_mid_move)
    swapper.join(10)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["swap"].acquired
    # Answered by the source or the target, as the lock or its slot's format key moved first.
    assert error_count(source, "TRYAGAIN") + error_count(target, "TRYAGAIN") > 0
    assert backend.acquire(key, "m2", limit=1, ttl=None, holder=holder("m2")).acquired  # the enqueue lock was given up
    assert backend.acquire(run, "t2", limit=1, ttl=None, holder=holder("m2", "running")).holders == ("m1",)


def test_a_swap_that_cannot_run_for_cluster_retry_seconds_raises_and_changes_nothing(cluster_client, redis_cluster):
    # S6 "raise": the wait is bounded; a slot stuck half moved ends in LockBackendError, and the
    # swap, refused every time, took nothing and released nothing.
    backend = RedisBackend(client=cluster_client)
    backend.cluster_retry_seconds = 0.2
    digest = digests(1, seed="stuck")[0]
    key, run = enqueue_key(PREFIX, digest), run_key(PREFIX, digest)
    backend.acquire(key, "m1", limit=1, ttl=None, holder=holder("m1"))
    source = redis_cluster.owner_of(slot_of(digest))
    target = next(node for node in redis_cluster.nodes if node is not source)
    raised = []

    def swap_when_stuck():
        if raised:
            return  # once, with the slot half moved (the lock and its slot's format key are two keys)
        with pytest.raises(LockBackendError, match="TTL exhausted") as excinfo:
            swap(backend, key, run, "m1", "t1")
        raised.append(excinfo.value)

    redis_cluster.move_slot(slot_of(digest), target, between_keys=swap_when_stuck)
    assert len(raised) == 1
    assert backend.acquire(key, "m2", limit=1, ttl=None, holder=holder("m2")).holders == ("m1",)
    assert backend.acquire(run, "t2", limit=1, ttl=None, holder=holder("m2", "running")).acquired


@pytest.mark.parametrize("env", ["cluster"], indirect=True)
def test_workers_keep_every_lock_while_slots_move(env, redis_cluster, caplog):
    # S5 end to end: real worker threads start and finish until_and_while_executing messages
    # (enqueue lock, swap to the run lock, release) while slots holding their locks move
    # between masters. Every job runs once, none fails, duplicates are dropped, nothing is left.
    runs = Counter()

    @env.actor(lock="until_and_while_executing", max_retries=0)
    def rebuild(customer_id):
        runs[customer_id] += 1
        time.sleep(0.02)

    firsts = [rebuild.send(i) for i in range(150)]
    duplicates = [rebuild.send(i) for i in range(150)]
    assert all(enqueue_outcome(m).enqueued for m in firsts)
    assert not any(enqueue_outcome(m).enqueued for m in duplicates)
    # Slots of messages further down the queue: they start, and swap, while their slot moves.
    slots = list(dict.fromkeys(slot_of(enqueue_outcome(m).digest) for m in firsts[40::8]))

    used = {slot_of(enqueue_outcome(m).digest) for m in firsts}
    env.worker(threads=8)
    moved = 0
    for slot in slots:
        source = redis_cluster.nodes.index(redis_cluster.owner_of(slot))
        target = redis_cluster.nodes[(source + 1) % len(redis_cluster.nodes)]
        moved += redis_cluster.move_slot(slot, target, between_keys=lambda: time.sleep(0.02))
    env.join(rebuild)

    assert moved > 0
    assert runs == {i: 1 for i in range(150)}
    assert env.dead_letters(rebuild) == []
    assert unique_warnings(caplog) == []
    # No holder is left and no key of a lock; each slot's format key, moved with its slot,
    # keeps its last token on the slot's master now (issue 33).
    assert_only_format_keys_left(redis_cluster, used)


def test_the_reaper_walks_every_master_of_a_cluster(cluster_client, redis_cluster):
    # R2 + R4 + S5: the reaper scans node by node and frees exactly the dead worker's run locks,
    # wherever their digests live; a live worker's run locks stay.
    from dramatiq_unique.keys import registry_key
    from dramatiq_unique.reaper import Reaper

    from .test_reaper import LOGGER, PREFIX, plant_orphans, scan_all

    backend = RedisBackend(client=cluster_client)
    planted = plant_orphans(backend, cluster_client, 60)
    dead_run_locks = {place for place in planted if place[0].endswith(":run")}
    backend.heartbeat(registry_key(PREFIX), "live-host:1:0000", ttl=30_000)
    live = set()
    for digest in digests(30, seed="live"):
        key, owner = run_key(PREFIX, digest), uuid.uuid4().hex
        running = Holder(
            f"m-{digest[:8]}", "sync", "default", "while_executing", "running", worker_id="live-host:1:0000"
        )
        assert backend.acquire(key, owner, limit=1, ttl=600_000, holder=running).acquired
        live.add((key, owner))
    assert all(keys for keys in redis_cluster.keys_per_master(f"{PREFIX}:{{*"))  # every master holds locks

    report = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0).run()

    assert report.complete and report.passes >= 3
    assert report.released == len(dead_run_locks) == 30
    assert scan_all(backend) == (planted - dead_run_locks) | live  # no broker given: enqueue locks stay


def test_a_cluster_that_no_node_answers_is_a_backend_error_and_send_fails_closed(tmp_path):
    # S6: with every node down, redis-py's RedisCluster raises RedisClusterException, which is no
    # RedisError: it escaped the backend, Dramatiq's before_enqueue logged it and enqueued the
    # message without its lock under on_backend_error="raise".
    cluster = Cluster(_executables()[0], tmp_path)
    cluster.start()
    try:
        backend = RedisBackend(client=cluster.client())
        broker = StubBroker()
        broker.emit_after("process_boot")
        # No activity counts: their flush would wait for the stopped cluster after the test.
        broker.add_middleware(UniqueJobs(backend=backend, activity=False), before=TimeLimit)

        @dramatiq.actor(broker=broker, lock="until_executed")
        def settle(event_id):
            pass

        assert enqueue_outcome(settle.send("evt_1")).enqueued
    finally:
        cluster.stop()
    # redis-py words it as it likes (RedisClusterException "cannot be connected" before 8, a
    # ConnectionError since): what the caller gets is the backend's own error, never redis-py's.
    with pytest.raises(LockBackendError, match="^The Redis lock backend failed: ") as failed:
        backend.scan("dramatiq-unique", "0", 10)
    assert isinstance(failed.value.__cause__, (redis.RedisError, RedisClusterException))
    with pytest.raises(LockBackendError):
        settle.send("evt_2")
    assert broker.queues["default"].qsize() == 1  # only evt_1


def test_a_new_lock_in_a_slot_that_moves_is_taken_at_once(cluster_client, redis_cluster):
    # Issue 20 review: a script that takes a place also checks its slot's refusal key (the store
    # heals after a loss of its data), which seldom exists. While the slot moves, such a script
    # has keys on both sides and is answered TRYAGAIN: the refusal key is then looked at alone,
    # and the place taken, without waiting for the move to end.
    backend = RedisBackend(client=cluster_client)
    backend.cluster_retry_seconds = 1.0
    slot = slot_of(digests(1, seed="refusal-moves")[0])
    held, fresh = digests(2, slot=slot, seed="refusal-moves")
    source = redis_cluster.owner_of(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    source_id, target_id = redis_cluster.node_id(source), redis_cluster.node_id(target)
    assert backend.acquire(enqueue_key(PREFIX, held), "m1", limit=1, ttl=None, holder=holder("m1")).acquired
    target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    try:
        started = time.monotonic()
        assert backend.acquire(enqueue_key(PREFIX, fresh), "m2", limit=1, ttl=None, holder=holder("m2")).acquired
        assert backend.acquire(enqueue_key(PREFIX, held), "m1", limit=1, ttl=None, holder=holder("m1")).acquired
        assert time.monotonic() - started < 1.0
        # A refusal in force there is still told, from the key alone.
        backend.refuse_new_places(PREFIX, ttl=30_000)
        with pytest.raises(LockStoreHealing):
            backend.acquire(enqueue_key(PREFIX, fresh), "m3", limit=2, ttl=None, holder=holder("m3"))
    finally:
        for node in redis_cluster.nodes:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", source_id)


def test_a_lock_whose_slot_migrates_to_a_master_without_the_functions_is_still_served(cluster_client, redis_cluster):
    # Issue 22 review: while a slot moves, a key migrated already is served by the importing
    # master (ASK). One without the library (it lost it, or joined after the library was loaded
    # on the masters then known) answers "Function not found": the library goes to that master,
    # not only to the slot's owner in the client's map, which has it and asks again.
    backend = RedisBackend(client=cluster_client)
    backend.cluster_retry_seconds = 1.0
    digest = digests(1, seed="ask-functions")[0]
    slot, key = slot_of(digest), enqueue_key(PREFIX, digest)
    source = redis_cluster.owner_of(slot)
    target = next(node for node in redis_cluster.nodes if node is not source)
    source_id, target_id = redis_cluster.node_id(source), redis_cluster.node_id(target)
    assert backend.acquire(key, "m1", limit=2, ttl=60_000, holder=holder("m1")).acquired
    target.function_flush()
    target_port = target.connection_pool.connection_kwargs["port"]
    target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
    try:
        # The lock moves first; its slot's format key is still on the source.
        source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", key)
        assert source.exists(slot_format_key(slot))
        assert backend.renew(key, "m1", ttl=120_000) is not None
        assert backend.acquire(key, "m2", limit=2, ttl=None, holder=holder("m2")).acquired
    finally:
        # The rest of the slot (its format key) follows before the slot changes hands.
        while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 10):
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *keys)
        for node in redis_cluster.nodes:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)


def test_a_new_backend_serves_the_masters_that_answer_while_another_is_down(tmp_path):
    # Issue 22 review: a backend's first call loads the library on every master, and a call that
    # met "Function not found" too. A master that stopped answering (until a replica takes over,
    # or for good with cluster-require-full-coverage no) must not fail the locks of the others,
    # which it did not with scripts called by SHA; it gets the library when it serves again.
    cluster = Cluster(_executables()[0], tmp_path)
    cluster.start()
    try:
        for node in cluster.nodes:
            node.config_set("cluster-require-full-coverage", "no")
        spread = one_digest_per_master(cluster)
        cluster.kill(cluster.nodes[2])
        client = cluster.client()
        backend = RedisBackend(client=client)
        for i in (0, 1):
            key = enqueue_key(PREFIX, spread[i])
            assert backend.acquire(key, f"m{i}", limit=1, ttl=None, holder=holder(f"m{i}")).acquired
        cluster.nodes[0].function_flush()
        assert backend.release(enqueue_key(PREFIX, spread[0]), "m0")
        with pytest.raises(LockBackendError):
            backend.acquire(enqueue_key(PREFIX, spread[2]), "m2", limit=1, ttl=None, holder=holder("m2"))
        client.close()
    finally:
        cluster.stop()


def test_every_master_that_keeps_nothing_on_disk_is_named(cluster_client, redis_cluster):
    # Issue 31 (9): the boot check of a lock store with lines asks every master.
    backend = RedisBackend(client=cluster_client)
    masters = {f"127.0.0.1:{port}" for port in redis_cluster.ports}
    assert set(backend.unpersisted_servers()) == masters
    first = redis_cluster.nodes[0]
    first.config_set("appendonly", "yes")
    try:
        assert set(backend.unpersisted_servers()) == masters - {f"127.0.0.1:{redis_cluster.ports[0]}"}
    finally:
        first.config_set("appendonly", "no")
