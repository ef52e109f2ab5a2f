"""Lease renewals: a worker renews the leases of all its running messages together, in one
script call per heartbeat on one Redis, and one per hash slot on a Redis Cluster, counted by the
servers themselves (MONITOR); and the leases keep their locks.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from dramatiq.brokers.redis import RedisBroker
from redis.crc import key_slot

from dramatiq_unique import LockEvent, RedisBackend, UniqueJobs
from dramatiq_unique.keys import registry_key

from .support import Env, wait_for

#: Short leases, renewed every heartbeat or two, so that a test sees several renewals of each.
LEASE = 300
HEARTBEAT = 100
#: Leases for a test that makes a master fail their renewals until it sees one fail, then lets
#: it answer again: the leases of its locks would lapse more than two seconds after that, so the
#: master answers first even when a loaded machine stalls the test's threads.
SLOW_LEASE = 3000
SLOW_HEARTBEAT = 400
#: 16 accounts, each locked by four messages at once (lock_limit): 64 leases in 16 locks.
ACCOUNTS = 16
PLACES = 4


class ScriptCalls:
    """The script calls (FCALL or EVALSHA) that reach some Redis servers, as their MONITOR shows
    them: (time, function or SHA, keys, args)."""

    def __init__(self, nodes):
        self.calls: list[tuple[float, str, list[str], list[str]]] = []
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._nodes = nodes
        self._threads = [threading.Thread(target=self._watch, args=(node,), daemon=True) for node in nodes]
        self._started = threading.Barrier(len(nodes) + 1)

    def __enter__(self) -> ScriptCalls:
        for thread in self._threads:
            thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for node in self._nodes:
            node.ping()  # a command for each MONITOR to read, after which it stops
        for thread in self._threads:
            thread.join(10)

    def _watch(self, node) -> None:
        with node.monitor() as monitor:
            self._started.wait(10)
            while not self._stop.is_set():
                command = monitor.next_command()
                if command["client_type"] != "lua" and command["command"].startswith(("EVALSHA ", "FCALL ")):
                    _, script, count, *rest = command["command"].split(" ")
                    with self._mutex:
                        self.calls.append((command["time"], script, rest[: int(count)], rest[int(count) :]))

    def of(self, script: str) -> list[tuple[float, list[str], list[str]]]:
        with self._mutex:
            return sorted((at, keys, args) for at, called, keys, args in self.calls if called == script)


@pytest.fixture(params=["redis", "cluster"])
def lease_env(request, redis_client):
    """Messages on one Redis; locks on that Redis, or on a three-master Redis Cluster. Yields the
    Env and the clients of the servers that hold the locks. An indirect parameter may be
    ``(where, lease_period, heartbeat_interval)``."""
    where, lease, heartbeat = request.param if isinstance(request.param, tuple) else (request.param, LEASE, HEARTBEAT)
    if where == "cluster":
        backend = RedisBackend(client=request.getfixturevalue("cluster_client"))
        nodes = request.getfixturevalue("redis_cluster").nodes
    else:
        backend = RedisBackend(client=redis_client)
        nodes = [redis_client]
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=lease, heartbeat_interval=heartbeat))
    for built in env.run():
        yield built, nodes


def test_the_leases_of_64_running_messages_are_renewed_in_one_call_per_heartbeat(lease_env):
    env, nodes = lease_env
    started: list[tuple[str, int]] = []
    finish = threading.Event()

    @env.actor(
        queue_name="sync", lock="while_executing", lock_limit=PLACES, lock_args_method=lambda account, copy: [account]
    )
    def sync(account, copy):
        started.append((account, copy))
        finish.wait(20)

    # The library of lock functions is loaded by the first send: no renewal is sent twice.
    env.worker(threads=ACCOUNTS * PLACES + 8)
    try:
        for account in range(ACCOUNTS):
            for copy in range(PLACES):
                sync.send(f"a{account}", copy)
        wait_for(lambda: len(started) == ACCOUNTS * PLACES)
        with ScriptCalls(nodes) as calls:
            # Three lease periods: only renewals keep the run locks of the messages that run.
            time.sleep(3 * LEASE / 1000)
            for account in range(ACCOUNTS):
                sync.send(f"a{account}", PLACES)
            env.wait_for_skips(ACCOUNTS)
            time.sleep(2 * HEARTBEAT / 1000)
    finally:
        finish.set()
    env.join(sync)

    # Every duplicate met four messages that still held their places, long after their first lease ran out.
    assert len(started) == ACCOUNTS * PLACES
    assert len(env.seen.skipped) == ACCOUNTS
    backend = env.backend
    assert calls.of(backend._scripts.called_as("renew")) == [], "a lease was renewed on its own"
    renewals = calls.of(backend._scripts.called_as("renew_many"))
    beats = [at for at, _, _ in calls.of(backend._scripts.called_as("heartbeat"))]
    assert len(beats) >= 5
    renewed = {(key, owner) for _, keys, args in renewals for key, owner in zip(keys, args[::3], strict=True)}
    assert len(renewed) == ACCOUNTS * PLACES, "every lease was renewed"
    # The renewals of one round come between its heartbeat and the next one.
    rounds = [[keys for at, keys, _ in renewals if start < at < end] for start, end in itertools.pairwise(beats)]
    assert sum(1 for keys in rounds if keys) >= 3
    for calls_of_round in rounds:
        if len(nodes) == 1:
            assert len(calls_of_round) <= 1, f"{len(calls_of_round)} renewal calls in one round"
            continue
        # A script's keys share one hash slot, and each slot's leases go in one call.
        slots = [{key_slot(key.encode()) for key in keys} for keys in calls_of_round]
        assert all(len(slot) == 1 for slot in slots)
        assert len(set.union(set(), *slots)) == len(slots), f"{len(slots)} renewal calls for fewer slots in one round"


@pytest.mark.parametrize("lease_env", [("cluster", SLOW_LEASE, SLOW_HEARTBEAT)], indirect=True)
def test_a_master_that_fails_the_renewals_of_its_locks_leaves_the_other_masters_renewed(lease_env, caplog):
    # A master out of memory refuses the renewals of the locks it serves: each of those is told
    # (a WARNING, a backend_error event), the locks on the other masters are renewed meanwhile,
    # and once the master is back every lock is held still.
    env, nodes = lease_env
    started: list[str] = []
    finish = threading.Event()
    errors: list[LockEvent] = []
    env.middleware.subscribe("backend_error", errors.append)

    @env.actor(queue_name="sync", lock="while_executing", lock_args_method=lambda account, copy: [account])
    def sync(account, copy):
        started.append(account)
        finish.wait(20)

    env.worker(threads=ACCOUNTS + 8)
    # The registry and the marks of the store's data stay writable: heartbeats go on.
    registry_master = env.backend._primary_for(registry_key("dramatiq-unique"))
    port = registry_master.connection_pool.connection_kwargs["port"]
    master = next(node for node in nodes if node.connection_pool.connection_kwargs["port"] != port)
    try:
        for account in range(ACCOUNTS):
            sync.send(f"a{account}", 0)
        wait_for(lambda: len(started) == ACCOUNTS)
        on_master = {key.decode() for key in master.scan_iter(match="dramatiq-unique:{*}:run")}
        assert on_master and len(on_master) < ACCOUNTS
        caplog.clear()
        master.config_set("maxmemory", 1)
        try:
            wait_for(lambda: any("could not be renewed" in r.getMessage() for r in caplog.records))
        finally:
            master.config_set("maxmemory", 0)
        failed = {r.args[0] for r in caplog.records if "could not be renewed" in r.getMessage()}
        # A lease that the master answering again did not renew would lapse meanwhile.
        time.sleep((SLOW_LEASE + SLOW_HEARTBEAT) / 1000)
        for account in range(ACCOUNTS):
            sync.send(f"a{account}", 1)
        env.wait_for_skips(ACCOUNTS)
    finally:
        finish.set()
    env.join(sync)

    assert failed <= on_master, "only the locks of the failing master failed"
    renewals = [error for error in errors if error.reason == "renewal"]
    assert renewals and all("maxmemory" in str(error.error) for error in renewals)
    assert {error.digest for error in renewals} <= {key.split("{")[1].split("}")[0] for key in on_master}
    assert sorted(started) == sorted(f"a{account}" for account in range(ACCOUNTS)), "a duplicate ran"
