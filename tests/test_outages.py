"""Redis outages (SPEC S6, S1): the lock backend's redis-server is stopped and started again
around a send, a start and a release, with both on_backend_error policies.

The broker is a StubBroker, so only the lock backend loses Redis. The server is our own
redis-server process, which saves its data on SHUTDOWN and loads it on start: locks held
before the outage are still there after it, and so is the library of lock functions, which
the server saves with its data.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import time

import pytest
import redis
from dramatiq.brokers.stub import StubBroker
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_unique import LockBackendError, RedisBackend, UniqueJobs, enqueue_outcome

from .conftest import redis_server_executable
from .support import Env, Gate, unique_warnings, wait_for


class RedisProcess:
    """A redis-server we can stop and start again on the same port, keeping its data; started by
    ``executable`` (the tests' redis-server by default) with more command-line ``options``."""

    def __init__(self, directory, *, executable: str | None = None, options: tuple[str, ...] = ()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.directory = directory
        self.executable = executable or redis_server_executable()
        self.options = options
        self.proc: subprocess.Popen | None = None

    def client(self) -> redis.Redis:
        # No client-side retries: an outage must show at once, not after seconds of backoff.
        return redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1, retry=Retry(NoBackoff(), 0))

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.executable,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
                *("--save", "", "--appendonly", "no", "--dbfilename", "dump.rdb"),
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        probe = self.client()
        wait_for(lambda: _answers(probe), timeout=10)

    def stop(self) -> None:
        try:
            self.client().shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes
        self.proc.wait(timeout=10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _answers(client: redis.Redis) -> bool:
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


@pytest.fixture
def server(tmp_path):
    process = RedisProcess(tmp_path)
    process.start()
    yield process
    process.kill()


@pytest.fixture(params=["raise", "allow"])
def outage_env(request, server):
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=server.client())
    middleware = UniqueJobs(backend=backend, on_backend_error=request.param, lease_period=3000, heartbeat_interval=100)
    env = Env("stub", broker, backend, middleware)
    env.policy = request.param
    yield from env.run()


def test_redis_down_at_send(outage_env, server, caplog):
    env = outage_env

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    server.stop()
    if env.policy == "raise":
        # Fail closed: send() raises and nothing is enqueued; the exception is the one report.
        with caplog.at_level(logging.DEBUG), pytest.raises(LockBackendError):
            settle.send("evt_1")
        assert env.waiting(settle) == 0
        assert unique_warnings(caplog) == []
    else:
        # Fail open: enqueued without a lock, with one WARNING line and no traceback.
        with caplog.at_level(logging.INFO):
            message = settle.send("evt_1")
        assert enqueue_outcome(message).enqueued and enqueue_outcome(message).token is None
        assert enqueue_outcome(message).status == "unlocked"
        assert env.waiting(settle) == 1
        [line] = unique_warnings(caplog)
        assert "is enqueued without its lock" in line
    assert not [r for r in caplog.records if r.name.startswith("dramatiq_unique") and r.exc_info]


def test_a_failed_send_logs_one_line_per_event_and_tracebacks_only_at_debug(outage_env, server, caplog):
    env = outage_env

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    server.stop()
    with caplog.at_level(logging.DEBUG, logger="dramatiq_unique"):
        for i in range(3):
            try:
                settle.send(f"evt_{i}")
            except LockBackendError:
                pass
    lines = unique_warnings(caplog)
    assert len(lines) == (0 if env.policy == "raise" else 3)
    assert not any("could not be released" in line for line in lines)


def test_redis_down_when_a_message_starts(outage_env, server, caplog):
    env = outage_env
    runs = []

    @env.actor(lock="while_executing", max_retries=1000)
    def sync(key):
        runs.append(time.monotonic())

    server.stop()
    sync.send("acct_1")  # while_executing takes nothing at send()
    with caplog.at_level(logging.WARNING):
        env.worker(threads=1)
        time.sleep(0.5)
        if env.policy == "raise":
            # Fail closed: the message fails and is retried until Redis is back.
            assert runs == []
            server.start()
        env.join(sync)
    assert len(runs) == 1
    if env.policy == "allow":
        assert any("is run without its lock" in line for line in unique_warnings(caplog))
        server.start()


def test_a_release_that_fails_during_an_outage_is_retried_after_the_restart(outage_env, server, caplog):
    # S6: "a release that failed is retried, never forgotten". An until_executed lock has no
    # TTL: only the retried release can free it.
    env = outage_env
    gate = Gate()
    client = server.client()

    @env.actor(lock="until_executed")
    def settle(event_id):
        gate.enter(event_id)

    digest = enqueue_outcome(settle.send("evt_1")).digest
    env.worker(threads=1)
    wait_for(lambda: gate.runs == ["evt_1"])
    server.stop()  # the lock is saved with the data
    with caplog.at_level(logging.WARNING):
        gate.open()
        env.join(settle)
    [line] = [line for line in unique_warnings(caplog) if "could not be released" in line]
    assert "This worker tries again" in line
    assert not [r for r in caplog.records if r.name.startswith("dramatiq_unique") and r.exc_info]

    server.start()
    assert client.exists(f"dramatiq-unique:{{{digest}}}")  # still held after the restart
    wait_for(lambda: not client.exists(f"dramatiq-unique:{{{digest}}}"), timeout=5)  # released: the key goes
    assert enqueue_outcome(settle.send("evt_1")).enqueued
    env.join(settle)
    assert gate.runs == ["evt_1", "evt_1"]


@contextlib.contextmanager
def failing_run_lock_release(server, caplog, *, lease_period: int, level: int):
    """A worker whose lock store stops while a while_executing job runs: the release of the job's
    run lock fails. Yields the Env, the actor, its Gate and the Worker, caplog at ``level``."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=server.client())
    unique = UniqueJobs(backend=backend, lease_period=lease_period, heartbeat_interval=100)
    with Env("stub", broker, backend, unique).running() as env:
        gate = Gate()

        @env.actor(lock="while_executing")
        def sync(account_id):
            gate.enter(account_id)

        sync.send("acct_1")
        worker = env.worker(threads=1)
        wait_for(lambda: gate.runs == ["acct_1"])
        server.stop()  # the run lock is saved with the data
        with caplog.at_level(level):
            gate.open()
            wait_for(lambda: any("could not be released" in line for line in unique_warnings(caplog)))
            yield env, sync, gate, worker


def test_a_run_lock_whose_release_fails_is_released_by_the_heartbeat_once_the_store_answers(server, caplog):
    # Issue 32 (8): the failed release of a run lock logged "This worker tries again", yet nothing
    # tried it again: the lock stayed held until its lease ran out, up to lease_period after the
    # message ended, and the next copy of a while_executing job met it all that time.
    with failing_run_lock_release(server, caplog, lease_period=60_000, level=logging.INFO) as (env, sync, gate, _):
        [line] = [line for line in unique_warnings(caplog) if "could not be released" in line]
        assert line.endswith(
            "This worker tries again at each heartbeat until the lock backend answers; no longer renewed, "
            "the lock's lease frees it within lease_period (60000 ms) anyway."
        ), line
        server.start()
        wait_for(lambda: any("was released on a later attempt" in r.getMessage() for r in caplog.records))
        sync.send("acct_1")
        env.join(sync)
        assert gate.runs == ["acct_1", "acct_1"]


def test_the_failed_release_of_a_run_lock_is_not_tried_again_once_its_lease_ran_out(server, caplog):
    # Issue 32 (8): the heartbeat tries a run lock's failed release again only while its lease
    # lasts; after that, the place has freed itself, and a release sent then would say "released
    # on a later attempt" of a lock that lapsed.
    lease = 1000
    with failing_run_lock_release(server, caplog, lease_period=lease, level=logging.INFO) as (env, sync, gate, worker):
        time.sleep(2 * lease / 1000)  # the lease, no longer renewed, runs out during the outage
        server.start()
        worker.stop()  # its last work tries the failed releases once more
        assert not [r.getMessage() for r in caplog.records if "later attempt" in r.getMessage()]
        assert not [line for line in unique_warnings(caplog) if "before this worker stopped" in line]
        env.worker(threads=1)
        sync.send("acct_1")
        env.join(sync)
        assert gate.runs == ["acct_1", "acct_1"]


def test_a_worker_that_stops_before_the_failed_release_of_a_run_lock_worked_says_its_lease_frees_it(server, caplog):
    # Issue 32 (8): the run lock's failed release, now tried again, is still failing when the
    # worker stops: what frees it is its lease, not the orphan reaper or a lock_ttl it may not have.
    with failing_run_lock_release(server, caplog, lease_period=60_000, level=logging.WARNING) as (_, _, _, worker):
        worker.stop()
    [line] = [line for line in unique_warnings(caplog) if "before this worker stopped" in line]
    assert line.endswith("its lease, no longer renewed, frees it within lease_period (60000 ms)."), line


@pytest.mark.parametrize("outage_env", ["raise"], indirect=True)
def test_a_rescheduled_message_that_comes_due_during_an_outage_tries_again_later(outage_env, server, caplog):
    # L6: the move out of the delay queue used to raise LockBackendError in the consumer thread:
    # the consumer crashed and the message never ran. It tries its lock again later instead.
    env = outage_env
    gate = Gate()

    @env.actor(lock="until_executed", on_conflict="reschedule", reschedule_delay=300)
    def settle(event_id):
        gate.enter(event_id)

    settle.send("evt_1")
    assert enqueue_outcome(settle.send("evt_1")).status == "rescheduled"
    env.worker(threads=2)
    wait_for(lambda: gate.runs == ["evt_1"])
    with caplog.at_level(logging.WARNING):
        server.stop()
        wait_for(lambda: any("it tries again in 300 ms" in line for line in unique_warnings(caplog)))
        server.start()
        gate.open()
        env.join(settle)
    assert gate.runs == ["evt_1", "evt_1"]
    assert gate.max_running["evt_1"] == 1
    assert not any("Consumer encountered" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("outage_env", ["raise"], indirect=True)
def test_a_message_that_starts_during_an_outage_logs_no_traceback_per_attempt(outage_env, server, caplog):
    # S6 / issue 9 item 5: the LockBackendError raised at start is no Retry, so Dramatiq's
    # worker logs "Failed to process message ... with unhandled exception" at ERROR with a full
    # traceback on every attempt of every message for as long as the outage lasts.
    env = outage_env

    @env.actor(lock="while_executing", max_retries=1000)
    def sync(key):
        pass

    env.worker(threads=1)
    server.stop()
    with caplog.at_level(logging.INFO):
        sync.send("acct_1")
        wait_for(lambda: len([r for r in caplog.records if "Retrying message" in r.getMessage()]) >= 3)
        server.start()
        env.join(sync)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


def test_an_outage_logs_the_failed_heartbeat_once(outage_env, server, caplog):
    # One line per event: a worker whose heartbeats fail for the whole outage says so once (and
    # once more when they go through again), not every heartbeat_interval of the outage.
    env = outage_env
    env.worker(threads=1)
    with caplog.at_level(logging.WARNING):
        server.stop()
        time.sleep(1.0)  # ten heartbeat intervals
        server.start()
        time.sleep(0.3)
    lines = [line for line in unique_warnings(caplog) if "could not send its heartbeat" in line]
    assert len(lines) == 1, lines
