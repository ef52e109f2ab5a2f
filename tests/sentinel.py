"""A real primary, two replicas and three Redis Sentinels for the failover tests (issue 13).

Six processes of the server that the other tests use (``redis-server`` from PATH, else the
Valkey server of the test extra; ``--sentinel`` is the same binary) on free ports in a temporary
directory, started for each test that uses ``replicated_redis``, since the test kills its primary.
The sentinels notice a dead primary within ``DOWN_AFTER`` ms, promote a replica, and make the
other one replicate the new primary: after the failover, the new primary has a replica again.

:meth:`ReplicatedRedis.lag` makes the replicas miss writes the way a slow network or a busy
replica does: they are stopped (SIGSTOP), and a large value written to the primary fills the
replication sockets, so that the writes after it stay in the primary's output buffers, where
they die with it. The replicas are resumed (SIGCONT) when the primary is killed, so that one
can be promoted: without the data they missed.

When the servers cannot start, the tests using them are skipped, except in CI (``CI`` set),
where they fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from dramatiq_unique import RedisBackend

from .cluster import _die_with_parent, _executables, _free_ports

SERVICE = "locks"
#: How long a primary may not answer before a sentinel thinks it is down (ms). More than the
#: sentinels' ping period (1 s): a sentinel pings a just-promoted primary first a ping period
#: after it started watching it, and with 1000 ms or less it sometimes took that primary for
#: down before the first answer came, and failed over a second time.
DOWN_AFTER = 1500
#: The sentinels' failover-timeout (ms): how soon a failover that got stuck is tried again.
FAILOVER_TIMEOUT = 2000
START_TIMEOUT = 20.0
FAILOVER_WAIT = 20.0
#: The value that fills the replication socket of a stopped replica (bytes); larger than the
#: kernel's socket buffers, smaller than the primary's replica output buffer limit.
FILLER = 32 * 1024 * 1024


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def wait_until(condition, what: str, timeout: float, logs=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"Timed out after {timeout} s waiting for {what}.\n{logs()}")
        time.sleep(0.02)


REPLICAS = ("replica-1", "replica-2")


class ReplicatedRedis:
    """A primary, its two replicas and three sentinels that monitor it as ``SERVICE``."""

    def __init__(self, executable: str, directory: Path, *, replica_environment: dict[str, str] | None = None):
        self.executable = executable
        self.directory = directory
        self.replica_environment = replica_environment
        self.processes: dict[str, subprocess.Popen] = {}
        # All at once: ports asked for apart could be the same.
        primary, *replicas, s1, s2, s3 = _free_ports(1 + len(REPLICAS) + 3)
        self.ports = {"primary": primary, **dict(zip(REPLICAS, replicas, strict=True))}
        self.sentinel_ports = [s1, s2, s3]
        #: The replica the sentinels promoted, once they did.
        self.promoted: str | None = None

    # Processes -------------------------------------------------------------

    def _spawn(self, name: str, arguments: list[str], environment: dict[str, str] | None = None) -> None:
        log = open(self.directory / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        self.processes[name] = subprocess.Popen(
            [self.executable, *arguments],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            env=environment,
        )
        log.close()

    def _server_arguments(self, name: str) -> list[str]:
        directory = self.directory / name
        directory.mkdir()
        return [
            *("--port", str(self.ports[name]), "--bind", "127.0.0.1", "--dir", str(directory)),
            *("--save", "", "--appendonly", "no"),
            # The filler must not get the stopped replica dropped (the default soft limit is 64 MB for 60 s).
            *("--client-output-buffer-limit", "replica 256mb 256mb 0"),
            # A replica's full sync starts at once, not after the default 5 s wait for more replicas.
            *("--repl-diskless-sync-delay", "0"),
        ]

    def start(self) -> None:
        self._spawn("primary", self._server_arguments("primary"))
        environment = {**os.environ, **self.replica_environment} if self.replica_environment else None
        for name in REPLICAS:
            replica = self._server_arguments(name) + ["--replicaof", "127.0.0.1", str(self.ports["primary"])]
            self._spawn(name, replica, environment)
        self._wait(lambda: all(_pings(self.node(name)) for name in self.ports), "the servers to start")
        self._wait(lambda: all(self._linked(name, "primary") for name in REPLICAS), "replication")
        self._wait(lambda: self._acknowledged("primary", len(REPLICAS)), "both replicas to acknowledge a write")
        # Each sentinel is told its peers and the replicas in its configuration, as a sentinel
        # writes them there itself: it needs not wait for INFO and hello messages to find them.
        ids = [os.urandom(20).hex() for _ in self.sentinel_ports]
        for i, port in enumerate(self.sentinel_ports):
            lines = [
                f"port {port}",
                "bind 127.0.0.1",
                f"dir {self.directory}",
                f"sentinel myid {ids[i]}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.ports['primary']} 2",
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER}",
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT}",
                f"sentinel parallel-syncs {SERVICE} 2",
                *(f"sentinel known-replica {SERVICE} 127.0.0.1 {self.ports[name]}" for name in REPLICAS),
                *(
                    f"sentinel known-sentinel {SERVICE} 127.0.0.1 {other} {ids[j]}"
                    for j, other in enumerate(self.sentinel_ports)
                    if j != i
                ),
            ]
            config = self.directory / f"sentinel-{i}.conf"
            config.write_text("\n".join(lines) + "\n")
            self._spawn(f"sentinel-{i}", [str(config), "--sentinel"])
        self._wait(self._sentinels_ready, "the sentinels to know the replicas and each other")

    def _acknowledged(self, primary: str, replicas: int) -> bool:
        # A replica acknowledges writes only once it loaded the primary's data, a moment after
        # its link is up.
        client = self.node(primary)
        client.set("fixture:probe", 1)  # WAIT counts the replicas that have the last write of its connection
        client.delete("fixture:probe")
        return client.execute_command("WAIT", replicas, 100) == replicas

    def _linked(self, replica: str, primary: str) -> bool:
        info = self.node(replica).info("replication")
        return info["master_link_status"] == "up" and int(info["master_port"]) == self.ports[primary]

    def _sentinels_ready(self) -> bool:
        for sentinel in self.sentinels():
            try:
                master = sentinel.sentinel_master(SERVICE)
                if master["num-other-sentinels"] < 2 or master["num-slaves"] < len(REPLICAS):
                    return False
            except redis.RedisError:
                return False
        return True

    def _wait(self, condition, what: str, timeout: float = START_TIMEOUT) -> None:
        def checked() -> bool:
            for name, process in self.processes.items():
                code = process.poll()
                if code is not None and not (name == "primary" and code == -signal.SIGKILL):
                    raise RuntimeError(f"{name} exited with {code}:\n{self.logs()}")
            try:
                return bool(condition())
            except redis.RedisError:
                return False

        wait_until(checked, what, timeout, self.logs)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.directory.glob("*.log")))

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a stopped process does not die of SIGKILL until resumed
                process.kill()
        for process in self.processes.values():
            process.wait(timeout=10)

    # Clients -----------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    def backend(self, *, min_replicas: int, replica_timeout: int) -> RedisBackend:
        """A RedisBackend that finds the primary through the sentinels, with short socket timeouts."""
        return RedisBackend(
            sentinels=self.sentinel_addresses,
            service_name=SERVICE,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            socket_timeout=1,
            socket_connect_timeout=0.2,
        )

    def sentinels(self) -> list[redis.Redis]:
        return [redis.Redis(port=port, socket_timeout=1, decode_responses=True) for port in self.sentinel_ports]

    def node(self, name: str) -> redis.Redis:
        return redis.Redis(port=self.ports[name], socket_timeout=5)

    # What the tests do ------------------------------------------------------------

    def lag(self) -> None:
        """Stop the replicas and fill their replication sockets: from now on they miss every
        write (until :meth:`kill_primary`), and WAIT on the primary counts no replica."""
        for name in REPLICAS:
            self.processes[name].send_signal(signal.SIGSTOP)
        self.node("primary").set("filler", b"x" * FILLER)

    def kill_primary(self) -> None:
        """SIGKILL the primary, resume the replicas, and wait until the sentinels promoted one
        and the other replicates it."""
        self.processes["primary"].kill()
        self.processes["primary"].wait()
        for name in REPLICAS:
            self.processes[name].send_signal(signal.SIGCONT)

        def promoted() -> bool:
            addresses = {tuple(s.sentinel_get_master_addr_by_name(SERVICE) or ()) for s in self.sentinels()}
            if len(addresses) != 1:
                return False
            (address,) = addresses
            names = [name for name in REPLICAS if address and int(address[1]) == self.ports[name]]
            if not names or self.node(names[0]).info("replication")["role"] != "master":
                return False
            (other,) = set(REPLICAS) - set(names)
            self.promoted = names[0]
            return self._linked(other, names[0]) and self._acknowledged(names[0], 1)

        self._wait(promoted, "the sentinels to promote a replica and the other to replicate it", FAILOVER_WAIT)

    @property
    def new_primary(self) -> redis.Redis:
        """The promoted replica, after :meth:`kill_primary`."""
        assert self.promoted is not None, "no failover yet"
        return self.node(self.promoted)


def _start(tmp_path_factory, replica_environment=None, executables=None) -> ReplicatedRedis:
    failures = []
    for executable in executables or _executables():
        servers = ReplicatedRedis(
            executable, tmp_path_factory.mktemp("sentinel"), replica_environment=replica_environment
        )
        try:
            servers.start()
            return servers
        except (OSError, RuntimeError, AssertionError, redis.RedisError) as e:
            servers.stop()
            failures.append(f"{executable}: {e}")
    if os.environ.get("CI"):
        raise RuntimeError("Could not start a primary, two replicas and three sentinels:\n" + "\n".join(failures))
    pytest.skip("Could not start a primary, two replicas and three sentinels: " + "; ".join(failures))


@pytest.fixture
def replicated_redis(tmp_path_factory):
    """A primary, two replicas and three sentinels, for one test; skipped (failed in CI) if they cannot start."""
    servers = _start(tmp_path_factory)
    try:
        yield servers
    finally:
        servers.stop()
