"""A lock store that may evict locks is reported at start-up (issue 20, eviction): a worker's boot
and a process's first send read its maxmemory-policy with INFO and log one WARNING, before any
lock is taken, so before any can be lost. The servers are real redis-servers (and the bundled
Valkey server) started with ``--maxmemory 20mb --maxmemory-policy <policy>``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import EvictionRisk
from dramatiq_unique.eviction import eviction_warning

from .cluster import _executables
from .support import Env, unique_warnings
from .test_outages import RedisProcess

LOGGER = "dramatiq_unique"

ALLKEYS_WARNING = (
    "The lock store's Redis ({server}) has maxmemory-policy allkeys-lru: when its data reaches maxmemory "
    "(20mb), it evicts any lock, and a duplicate of the message that held it can be enqueued and run. "
    "Set maxmemory-policy to noeviction (CONFIG SET maxmemory-policy noeviction, and the same in redis.conf; "
    "on a managed service, in its parameter group), or accept the risk with "
    "RedisBackend(accepted_eviction_policy='allkeys-lru')."
)
VOLATILE_WARNING = (
    "The lock store's Redis ({server}) has maxmemory-policy volatile-lru: when its data reaches maxmemory "
    "(20mb), it evicts the locks that expire: every run lock, and the enqueue locks of messages with a lock_ttl, "
    "and a duplicate of the message that held it can be enqueued and run. "
    "Set maxmemory-policy to noeviction (CONFIG SET maxmemory-policy noeviction, and the same in redis.conf; "
    "on a managed service, in its parameter group), or accept the risk with "
    "RedisBackend(accepted_eviction_policy='volatile-lru')."
)
WARNINGS = {"allkeys-lru": ALLKEYS_WARNING, "volatile-lru": VOLATILE_WARNING}


@pytest.fixture(params=_executables(), ids=lambda path: Path(path).name)
def executable(request) -> str:
    """The tests' redis-server, and the bundled Valkey server when it is another one."""
    return request.param


@pytest.fixture
def start_server(tmp_path, executable):
    started: list[RedisProcess] = []

    def start(*options: str) -> RedisProcess:
        server = RedisProcess(tmp_path / str(len(started)), executable=executable, options=options)
        server.directory.mkdir()
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


def lock_store_env(server: RedisProcess, **backend_options) -> Env:
    """A StubBroker whose UniqueJobs keeps its locks on ``server``, with two actors."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=server.client(), **backend_options)
    env = Env("stub", broker, backend, UniqueJobs(backend=backend))

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    @env.actor(lock="while_executing")
    def sync(account_id):
        pass

    env.settle, env.sync = settle, sync
    return env


@pytest.fixture
def make_env():
    runs = []

    def make(server: RedisProcess, **backend_options) -> Env:
        env = lock_store_env(server, **backend_options)
        runs.append(env.run())
        next(runs[-1])
        return env

    yield make
    for run in runs:
        next(run, None)


def lock_keys(server: RedisProcess) -> int:
    return len(server.client().keys("dramatiq-unique:{*"))


class KeysWhenLogged(logging.Handler):
    """Counts the lock keys on the server at the moment each WARNING of the library is logged."""

    def __init__(self, server: RedisProcess):
        super().__init__(logging.WARNING)
        self.server = server
        self.keys: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.keys.append(lock_keys(self.server))


@pytest.fixture
def keys_when_logged():
    handlers = []

    def watch(server: RedisProcess) -> KeysWhenLogged:
        handler = KeysWhenLogged(server)
        logging.getLogger(LOGGER).addHandler(handler)
        handlers.append(handler)
        return handler

    yield watch
    for handler in handlers:
        logging.getLogger(LOGGER).removeHandler(handler)


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_a_worker_boot_warns_once_of_a_policy_that_evicts_locks(
    policy, start_server, make_env, keys_when_logged, caplog
):
    server = start_server("--maxmemory", "20mb", "--maxmemory-policy", policy)
    env = make_env(server)
    seen = keys_when_logged(server)
    caplog.set_level(logging.INFO, logger=LOGGER)
    env.worker()
    assert unique_warnings(caplog) == [WARNINGS[policy].format(server=f"localhost:{server.port}")]
    # Work, a second Worker of the process and a send after the boot say nothing more.
    for i in range(5):
        env.settle.send(f"evt_{i}")
        env.sync.send(i)
    env.worker()
    env.join(env.settle, env.sync)
    assert unique_warnings(caplog) == [WARNINGS[policy].format(server=f"localhost:{server.port}")]
    assert seen.keys == [0], "the warning came after a lock was taken"


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_the_first_send_of_a_process_that_only_sends_warns_once_before_its_lock(
    policy, start_server, make_env, keys_when_logged, caplog
):
    server = start_server("--maxmemory", "20mb", "--maxmemory-policy", policy)
    env = make_env(server)
    seen = keys_when_logged(server)
    caplog.set_level(logging.INFO, logger=LOGGER)
    client = server.client()
    client.config_resetstat()
    for i in range(10):
        env.settle.send(f"evt_{i}")
    assert unique_warnings(caplog) == [WARNINGS[policy].format(server=f"localhost:{server.port}")]
    assert seen.keys == [0], "the warning came after the first lock was taken"
    assert lock_keys(server) == 10
    # One INFO for ten sends: the sends after the first cost no round trip more.
    assert client.info("commandstats")["cmdstat_info"]["calls"] == 1


@pytest.mark.parametrize(
    "options",
    [
        ("--maxmemory", "20mb", "--maxmemory-policy", "noeviction"),
        # Without maxmemory nothing is ever evicted, whatever the policy says.
        ("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"),
    ],
    ids=["noeviction", "maxmemory-0"],
)
def test_a_store_that_evicts_nothing_says_nothing(options, start_server, make_env, caplog):
    server = start_server(*options)
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    client = server.client()
    client.config_resetstat()
    env = make_env(server)
    env.settle.send("evt_1")
    env.worker()
    env.join(env.settle)
    assert unique_warnings(caplog) == []
    assert not [r for r in caplog.records if "maxmemory" in r.getMessage()]
    assert client.info("commandstats")["cmdstat_info"]["calls"] == 1, "the policy was not read"


def test_an_accepted_policy_is_not_logged_and_another_one_is(start_server, make_env, caplog):
    volatile = start_server("--maxmemory", "20mb", "--maxmemory-policy", "volatile-lru")
    allkeys = start_server("--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
    caplog.set_level(logging.INFO, logger=LOGGER)
    accepted = make_env(volatile, accepted_eviction_policy="volatile-lru")
    accepted.settle.send("evt_1")
    accepted.worker()
    assert unique_warnings(caplog) == []
    # Accepting volatile-lru does not accept a store that evicts every lock.
    other = make_env(allkeys, accepted_eviction_policy="volatile-lru")
    other.settle.send("evt_1")
    assert unique_warnings(caplog) == [ALLKEYS_WARNING.format(server=f"localhost:{allkeys.port}")]


def test_a_policy_that_cannot_be_read_stops_neither_a_boot_nor_a_send(start_server, make_env, caplog):
    server = start_server("--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
    # A user that may run the lock scripts, but not INFO.
    server.client().acl_setuser("locks", enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-info"])
    client = redis.Redis(port=server.port, username="locks", password="secret", socket_timeout=1)
    caplog.set_level(logging.INFO, logger=LOGGER)
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=client)
    env = Env("stub", broker, backend, UniqueJobs(backend=backend))
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        env.worker()
        message = settle.send("evt_1")
        env.join(settle)
    finally:
        next(runs, None)
    assert enqueue_outcome(message).token is not None, "the send went on without its lock"
    assert unique_warnings(caplog) == []
    [line] = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert line.startswith("The lock store's maxmemory-policy could not be read (")
    assert "NoPermissionError" in line and "Make sure it is noeviction" in line
    assert "secret" not in caplog.text


@pytest.mark.parametrize("value", ["noeviction", "allkeys_lru", True, 3])
def test_an_invalid_accepted_eviction_policy_fails_in_the_constructor(value):
    with pytest.raises(ValueError) as raised:
        RedisBackend(accepted_eviction_policy=value)
    assert str(raised.value) == (
        f"RedisBackend has an invalid accepted_eviction_policy={value!r}: it must be None or the maxmemory-policy "
        "you accept, one of 'allkeys-lru', 'allkeys-lfu', 'allkeys-random', 'volatile-lru', 'volatile-lfu', "
        "'volatile-random', 'volatile-ttl'."
    )


def test_from_url_keeps_the_accepted_policy(start_server):
    server = start_server("--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
    url = f"redis://127.0.0.1:{server.port}/0"
    assert RedisBackend.from_url(url, accepted_eviction_policy="allkeys-lru").eviction_risks() == ()
    assert RedisBackend.from_url(url).eviction_risks() == (
        EvictionRisk(server=f"127.0.0.1:{server.port}", policy="allkeys-lru", maxmemory=20 * 1024 * 1024),
    )


def test_every_master_of_a_cluster_is_read(redis_cluster, cluster_client, caplog):
    masters = redis_cluster.nodes
    policies = ["allkeys-lru", "volatile-lru", "allkeys-lru"]
    try:
        for node, policy in zip(masters, policies, strict=True):
            node.config_set("maxmemory", "20mb")
            node.config_set("maxmemory-policy", policy)
        names = [f"127.0.0.1:{port}" for port in redis_cluster.ports]
        backend = RedisBackend(client=cluster_client)
        assert set(backend.eviction_risks()) == {
            EvictionRisk(server=name, policy=policy, maxmemory=20 * 1024 * 1024)
            for name, policy in zip(names, policies, strict=True)
        }
        caplog.set_level(logging.INFO, logger=LOGGER)
        broker = StubBroker()
        broker.emit_after("process_boot")
        env = Env("stub", broker, backend, UniqueJobs(backend=backend))
        runs = env.run()
        next(runs)
        try:
            worker = Worker(broker, worker_timeout=100, worker_threads=1)
            worker.start()
            env.workers.append(worker)
        finally:
            next(runs, None)
        lines = unique_warnings(caplog)
        assert len(lines) == 2, lines
        allkeys = ", ".join(sorted([names[0], names[2]]))
        assert lines[0].startswith(f"The lock store's Redis ({allkeys}) has maxmemory-policy allkeys-lru: ")
        assert lines[1].startswith(f"The lock store's Redis ({names[1]}) has maxmemory-policy volatile-lru: ")
    finally:
        for node in masters:
            node.config_set("maxmemory", "0")
            node.config_set("maxmemory-policy", "noeviction")


def test_the_docs_show_the_warning_as_it_is_logged():
    page = (Path(__file__).resolve().parent.parent / "docs" / "deploying-the-lock-store.md").read_text()
    risk = EvictionRisk(server="locks:6379", policy="allkeys-lru", maxmemory=20 * 1024 * 1024)
    # The page wraps the line to fit its width: the warning is the text of the block after [WARNING].
    shown = " ".join(page.split("[WARNING] ", 1)[1].split("```", 1)[0].split())
    assert shown == " ".join(eviction_warning("allkeys-lru", [risk]).split())
    assert " ".join(VOLATILE_WARNING.split("it evicts ")[1].split(", and a duplicate")[0].split()) in " ".join(
        page.split()
    )
