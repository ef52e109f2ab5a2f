"""cancel_in_progress in one process, on both backends (issue 35): the interruption, what becomes
of the cancelled message (event, counter, result, no retry), validation, and what an actor without
the strategy pays: nothing."""

from __future__ import annotations

import threading
import time
from typing import Any

import prometheus_client
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import StubBackend as StubResults

from dramatiq_unique import InvalidLockOptions, Locks, RedisBackend, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import LockBackend
from dramatiq_unique.events import CANCELLED, LockEvent

from .support import Env, wait_for

#: A short heartbeat, so that a request to stop reaches the holder within a tenth of a second.
FAST = {"lease_period": 1000, "heartbeat_interval": 100}


class Runs:
    """What the actor records of its runs, apart from the locks: each start, normal end and `finally`."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        self.mutex = threading.Lock()

    def add(self, entry: str) -> None:
        with self.mutex:
            self.entries.append(entry)

    def __contains__(self, entry: str) -> bool:
        with self.mutex:
            return entry in self.entries


def long_job(runs: Runs, seconds: float) -> Any:
    def sync(account: str, seq: int) -> int:
        runs.add(f"start {seq}")
        try:
            until = time.monotonic() + (seconds if seq == 0 else 0.05)
            while time.monotonic() < until:
                time.sleep(0.005)
            runs.add(f"done {seq}")
            return seq
        finally:
            runs.add(f"end {seq}")

    return sync


def test_a_newer_message_interrupts_the_running_one_which_is_neither_retried_nor_dead_lettered(make_env):
    registry = prometheus_client.CollectorRegistry()
    env = make_env(metrics=registry, **FAST)
    results = StubResults()
    env.broker.add_middleware(Results(backend=results))
    cancelled: list[LockEvent] = []
    env.middleware.subscribe(CANCELLED, cancelled.append)
    runs = Runs()
    sync = env.actor(
        long_job(runs, 60),
        actor_name="sync",
        lock="while_executing",
        on_conflict="cancel_in_progress",
        lock_args_method=lambda account, seq: [account],
        store_results=True,
    )
    env.worker()
    first = sync.send("acme", 0)
    wait_for(lambda: "start 0" in runs)
    sent_at = time.monotonic()
    second = sync.send("acme", 1)
    wait_for(lambda: "end 0" in runs, timeout=5)
    assert time.monotonic() - sent_at < 1  # one heartbeat interval, and some
    env.join(sync)
    assert runs.entries == ["start 0", "end 0", "start 1", "done 1", "end 1"]
    (event,) = cancelled
    assert (event.message_id, event.actor_name, event.lock_kind) == (first.message_id, "sync", "run")
    assert event.cancelled_by == f"message {second.message_id}"
    sample = registry.get_sample_value(
        "dramatiq_unique_cancellations_total", {"queue_name": "default", "actor_name": "sync"}
    )
    assert sample == 1
    with pytest.raises(ResultFailure, match=f"was asked to stop by message {second.message_id}"):
        results.get_result(first, block=True, timeout=1000)
    if env.kind == "stub":
        assert env.broker.dead_letters == []
    # The conflict trail says it was cancelled, and where it ran.
    env.middleware.activity.flush()
    (entry,) = [e for e in Locks.from_middleware(env.middleware).history("sync") if e.outcome == "cancelled"]
    assert (entry.message_id, entry.call, entry.lock_kind) == (first.message_id, "sync('acme', 0)", "run")
    assert entry.cancelled_by == f"message {second.message_id}"


@pytest.mark.parametrize(
    "options, expected",
    [
        (
            {"lock": "until_executed", "on_conflict": "cancel_in_progress"},
            "Valid choices of lock there are: 'until_and_while_executing', 'while_executing'.",
        ),
        (
            {"lock": "until_and_while_executing", "on_conflict": {"client": "cancel_in_progress"}},
            "Valid choices on the server side there are: 'cancel_in_progress'.",
        ),
    ],
)
def test_cancel_in_progress_needs_a_run_lock_and_the_server_side(stub_env, options, expected):
    with pytest.raises(InvalidLockOptions, match="Actor 'deploy' uses on_conflict=") as raised:
        stub_env.actor(lambda: None, actor_name="deploy", **options)
    assert str(raised.value).endswith(expected)


class CountingBackend(RedisBackend):
    """A RedisBackend that counts the scripts it runs: each is one command to the server."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.calls: list[str] = []

    def _call(self, script: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(script)
        return super()._call(script, *args, **kwargs)

    def _call_many(self, script: str, calls: Any) -> list[Any]:
        self.calls.extend([script] * len(calls))
        return super()._call_many(script, calls)


@pytest.mark.parametrize("strategy", ["keep_latest", "cancel_in_progress"])
def test_an_actor_without_the_strategy_makes_no_extra_command(redis_client, strategy):
    # A run of 1.2 s with a lease of 1 s: renewed when due (about once) without the strategy; at
    # every heartbeat with it, so that a request to stop reaches it within one interval.
    backend = CountingBackend(client=redis_client)
    env = Env("redis", RedisBroker(client=redis_client), backend, UniqueJobs(backend=backend, **FAST))
    with env.running():
        runs = Runs()
        sync = env.actor(long_job(runs, 1.2), actor_name="sync", lock="while_executing", on_conflict=strategy)
        env.worker()
        sync.send("acme", 0)
        env.join(sync)
        assert runs.entries == ["start 0", "done 0", "end 0"]
    renewals = backend.calls.count("renew_many")
    print(strategy, renewals, "renewals")
    assert "request_stop" not in backend.calls
    if strategy == "keep_latest":
        assert renewals <= 2
    else:
        assert renewals >= 8


class WithoutRequestStop(StubBackend):
    request_stop = LockBackend.request_stop


def test_a_backend_that_cannot_ask_a_holder_to_stop_lets_it_end_and_the_newer_runs_after_it(caplog):
    # A backend of its own without request_stop: the worker's hook raised NotImplementedError out
    # of Dramatiq's before_process_message; now the newer message waits for the holder to end.
    backend = WithoutRequestStop()
    env = Env("stub", StubBroker(), backend, UniqueJobs(backend=backend, **FAST))
    with env.running():
        runs = Runs()
        sync = env.actor(
            long_job(runs, 0.5),
            actor_name="sync",
            lock="while_executing",
            on_conflict="cancel_in_progress",
            lock_args_method=lambda account, seq: [account],
        )
        env.worker()
        sync.send("acme", 0)
        wait_for(lambda: "start 0" in runs)
        sync.send("acme", 1)
        env.join(sync)
    assert runs.entries == ["start 0", "done 0", "end 0", "start 1", "done 1", "end 1"]
    assert any("cannot ask a running holder to stop" in r.getMessage() for r in caplog.records)


class SlowResults(StubResults):
    """A Results store that takes its time: the hook that stores a result runs after the actor."""

    def _store(self, message_key: str, result: Any, ttl: int) -> None:
        time.sleep(0.5)
        super()._store(message_key, result, ttl)


def test_a_request_to_stop_after_the_actor_returned_leaves_the_other_hooks_alone(make_env):
    """Review of issue 35: a newer message that asks while the holder's actor has returned, and a
    slower middleware's hook still runs for it (a Results store), interrupted that hook: the
    stored result became Cancelled, the message was dead-lettered, and with an actor that raised,
    the Cancelled escaped Dramatiq's handler and killed the worker thread, its lease renewed for
    ever. The holder is interrupted only while its actor runs."""
    env = make_env(**FAST)
    results = SlowResults()
    env.broker.add_middleware(Results(backend=results))
    cancelled: list[LockEvent] = []
    env.middleware.subscribe(CANCELLED, cancelled.append)
    runs = Runs()

    def sync(account: str, seq: int) -> int:
        runs.add(f"ran {seq}")
        if seq == 1:
            raise ValueError("a failure of its own")
        return seq

    actor = env.actor(
        sync,
        actor_name="sync",
        lock="while_executing",
        on_conflict="cancel_in_progress",
        lock_args_method=lambda account, seq: [account],
        store_results=True,
        max_retries=0,
    )
    worker = env.worker(threads=2)
    for seq in (0, 1):  # one that returns, one that raises: each is stored slowly
        first = actor.send("acme", seq)
        wait_for(lambda seq=seq: f"ran {seq}" in runs)
        time.sleep(0.1)  # its actor returned; the Results hook stores for half a second
        actor.send("acme", seq + 10)
        wait_for(lambda seq=seq: f"ran {seq + 10}" in runs, timeout=5)
        if seq == 0:
            assert results.get_result(first, block=True, timeout=2000) == 0
    env.join(actor)
    assert cancelled == []
    # Both worker threads are alive, and the lock is free: a later message runs.
    assert all(thread.is_alive() for thread in worker.workers)
    actor.send("acme", 20)
    wait_for(lambda: "ran 20" in runs, timeout=5)


def test_an_actors_own_cancelled_is_logged_as_dramatiq_logs_it(stub_env, caplog):
    """Review of issue 35: the filter that leaves out Dramatiq's lines of a message the middleware
    interrupted left out those of any message that raised Cancelled, of an actor without a lock
    too, where the middleware tells nothing."""
    from dramatiq_unique import Cancelled

    def own(seq: int) -> None:
        raise Cancelled("the actor's own")

    caplog.set_level("INFO")
    actor = stub_env.actor(own, actor_name="own", max_retries=1, min_backoff=10, max_backoff=10)
    stub_env.worker()
    message = actor.send(1)
    stub_env.join(actor)
    failed = [r for r in caplog.records if r.getMessage().startswith("Failed to process message own(1)")]
    assert len(failed) == 2 and failed[0].exc_info is not None
    assert f"Retrying message {message.message_id!r}" in caplog.text


def test_a_run_lock_given_by_a_messages_own_options_is_not_interrupted(make_env):
    """Review of issue 35: only an actor declared with a run lock has its function wrapped, to be
    interrupted only while it runs; a message whose own options give it a run lock is asked to
    stop, and runs to its end."""
    env = make_env(**FAST)
    runs = Runs()
    actor = env.actor(long_job(runs, 1.0), actor_name="sync", lock="until_executed", lock_args_method=lambda a, s: [a])
    env.worker(threads=1)
    message = actor.send_with_options(args=("acme", 0), lock="while_executing")
    wait_for(lambda: "start 0" in runs)
    digest = enqueue_outcome(message).digest
    assert Locks.from_middleware(env.middleware).cancel(digest)
    wait_for(lambda: "end 0" in runs, timeout=5)
    assert runs.entries == ["start 0", "done 0", "end 0"]
