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

from dramatiq_unique import InvalidLockOptions, Locks, RedisBackend, StubBackend, UniqueJobs
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
