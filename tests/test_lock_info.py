"""A lock shows what job it is (issue 34, point 3): an actor with ``lock_info`` keeps each
holder's call in its lock, through the steps that write the holder again (a lease's renewal, the
start's swap, a line's handoff), against a real redis-server with real Workers; an actor without
it writes its records as before."""

from __future__ import annotations

import importlib
import json
import sys
import threading

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import InvalidLockOptions, Locks, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.keys import enqueue_key, run_key

from .support import Env, wait_for
from .test_cli import cli, ok


@pytest.fixture
def leased_env(redis_client):
    """RedisBroker and RedisBackend, with leases short enough to be renewed within a test."""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=1500, heartbeat_interval=300))
    with env.running():
        yield env


def holders(env: Env, message) -> list[tuple[str, str, str | None]]:
    """The places of the message's digest: (kind, state, call) of each, enqueue lock first."""
    locks = Locks.from_middleware(env.middleware).get(enqueue_outcome(message).digest)
    return [(lock.kind, h.state, h.call) for lock in locks for h in lock.holders]


@pytest.mark.parametrize("value", ["yes", 0, 19, 1001, 1.5, None, [120]])
def test_an_invalid_lock_info_is_refused_when_the_actor_is_declared(stub_env, value):
    with pytest.raises(InvalidLockOptions) as raised:

        @dramatiq.actor(lock="until_executed", lock_info=value)
        def reindex(tenant, batch):
            pass

    assert str(raised.value) == (
        f"Actor 'reindex' has an invalid lock_info={value!r}: it must be True (the holder's call, up to 120 "
        "characters), False (none), or an integer from 20 to 1000 (characters)."
    )
    assert "reindex" not in stub_env.broker.actors


def test_the_call_is_kept_through_the_renewals_of_a_running_holder_and_its_start(leased_env, redis_client):
    env, started, done = leased_env, threading.Event(), threading.Event()

    @env.actor(lock="until_and_while_executing", lock_info=True)
    def reindex(tenant, batch):
        started.set()
        done.wait(20)

    message = reindex.send("acme", 200)
    digest = enqueue_outcome(message).digest
    assert holders(env, message) == [("enqueue", "queued", "reindex('acme', 200)")]
    env.worker(threads=1)
    try:
        assert started.wait(10)
        # The swap took the run lock with the call and gave the enqueue place up.
        assert holders(env, message) == [("run", "running", "reindex('acme', 200)")]
        (lock,) = Locks.from_middleware(env.middleware).get(digest)
        first_expiry = lock.holders[0].expires_at
        assert first_expiry is not None

        def renewed() -> bool:
            (lock,) = Locks.from_middleware(env.middleware).get(digest)
            return (lock.holders[0].expires_at or 0) > first_expiry

        wait_for(renewed, timeout=10)
        assert holders(env, message) == [("run", "running", "reindex('acme', 200)")]
        # As stored: the seventh field of the holder.
        assert redis_client.get(run_key("dramatiq-unique", digest)).decode().endswith("|reindex('acme', 200)")
    finally:
        done.set()
    env.join(reindex)
    assert holders(env, message) == []


def test_a_long_call_is_cut_at_the_bound_with_an_ellipsis(redis_env):
    @redis_env.actor(lock="until_executed", lock_info=40)
    def export(text, *, fmt="csv"):
        pass

    long = export.send("x" * 300, fmt="csv")
    ((_, _, call),) = holders(redis_env, long)
    assert call == "export('" + "x" * 31 + "…"
    assert len(call) == 40
    short = export.send("y", fmt="csv|%*")
    assert holders(redis_env, short) == [("enqueue", "queued", "export('y', fmt='csv|%*')")]


def test_a_place_a_line_hands_on_keeps_the_call_of_its_message(redis_env):
    runs, first_started, release = [], threading.Event(), {"a": threading.Event(), "b": threading.Event()}

    @redis_env.actor(
        lock="until_executed", on_conflict="wait", lock_info=True, lock_args_method=lambda name, part: [name]
    )
    def publish(name, part):
        runs.append(part)
        first_started.set()
        release[part].wait(20)

    redis_env.worker(threads=1)
    try:
        first = publish.send("report", "a")
        assert first_started.wait(10)
        second = publish.send("report", "b")
        assert enqueue_outcome(second).status == "waiting"
        # An operator frees a's place while a runs: the line hands it to b, enqueued, and the
        # one worker thread is busy with a. b's place as the line and the broker recorded it:
        locks = Locks.from_middleware(redis_env.middleware)
        assert locks.unlock(enqueue_outcome(first).digest, first.message_id)
        assert holders(redis_env, second) == [("enqueue", "queued", "publish('report', 'b')")]
        release["a"].set()
        wait_for(lambda: runs == ["a", "b"])
        # b started: its claim recorded it running, with its call.
        assert holders(redis_env, second) == [("enqueue", "running", "publish('report', 'b')")]
    finally:
        release["a"].set()
        release["b"].set()
    redis_env.join(publish)
    assert first.message_id != second.message_id


def test_an_actor_without_lock_info_writes_the_record_it_wrote_before(redis_env, redis_client):
    @redis_env.actor(lock="until_executed")
    def plain(tenant, batch):
        pass

    message = plain.send("acme", 200)
    outcome = enqueue_outcome(message)
    value = redis_client.get(enqueue_key("dramatiq-unique", outcome.digest)).decode()
    owner, token, late, lifetime, flags, worker, broker_id, actor, queue, message_id = value.split("|")
    assert (owner, int(token), late, lifetime, flags, worker) == (message.message_id, outcome.token, "", "", "qe", "")
    assert (len(broker_id), actor, queue, message_id) == (22, "plain", "default", "")
    assert holders(redis_env, message) == [("enqueue", "queued", None)]


@pytest.fixture
def app(redis_url, monkeypatch):
    """tests/lock_info_app.py on the test server."""
    monkeypatch.setenv("LOCK_INFO_APP_URL", redis_url)
    module = importlib.reload(sys.modules["tests.lock_info_app"]) if "tests.lock_info_app" in sys.modules else None
    if module is None:
        import tests.lock_info_app as module
    try:
        yield module
    finally:
        module.broker.flush_all()


def calls_listed(*args: str) -> dict[str, list[str | None]]:
    """``list --json`` run as the command: each lock's calls, by its actor."""
    listed = json.loads(ok(cli(*args, "list", "--json")))
    return {lock["actor"]: [holder["call"] for holder in lock["holders"]] for lock in listed}


def test_list_and_show_print_the_call_that_a_lock_keeps(app, redis_url):
    message = app.reindex.send("acme", 200)
    app.export.send("x" * 300)
    cut = "export('" + "x" * 31 + "…"
    assert calls_listed("--url", redis_url) == {"reindex": ["reindex('acme', 200)"], "export": [cut]}
    digest = enqueue_outcome(message).digest
    shown = ok(cli("--url", redis_url, "show", digest))
    assert f"  call of message {message.message_id!r}: reindex('acme', 200)\n" in shown
    (lock,) = json.loads(ok(cli("--url", redis_url, "show", digest, "--json")))
    assert lock["holders"][0]["call"] == "reindex('acme', 200)"


def test_without_lock_info_the_call_is_read_from_the_broker_with_the_app(app, redis_url):
    message = app.plain.send("acme", 200)
    digest = enqueue_outcome(message).digest
    # Without the application, no broker tells it.
    assert calls_listed("--url", redis_url) == {"plain": [None]}
    assert "call of message" not in ok(cli("--url", redis_url, "show", digest))
    assert calls_listed("--app", "tests.lock_info_app") == {"plain": ["plain('acme', 200)"]}
    shown = ok(cli("--app", "tests.lock_info_app", "show", digest))
    assert f"  call of message {message.message_id!r}: plain('acme', 200)\n" in shown
    # A message that left the broker (here: deleted from its queue's hash) tells none.
    app.broker.client.delete(f"{app.broker.namespace}:search.msgs")
    assert calls_listed("--app", "tests.lock_info_app") == {"plain": [None]}


def test_a_stub_broker_gives_the_call_of_a_message_not_yet_fetched(stub_env):
    @stub_env.actor(lock="until_executed")
    def plain(tenant, batch):
        pass

    @stub_env.actor(lock="while_executing")
    def runs(tenant):
        pass

    message = plain.send("acme", 200)
    locks = Locks.from_middleware(stub_env.middleware)
    found = locks.get(enqueue_outcome(message).digest)
    assert [h.call for lock in found for h in lock.holders] == [None]
    assert [h.call for lock in locks.with_calls(found, stub_env.broker) for h in lock.holders] == ["plain('acme', 200)"]
    assert [h.call for lock in locks.with_calls(found, None) for h in lock.holders] == [None]
