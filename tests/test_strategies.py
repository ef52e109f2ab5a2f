"""Conflict strategies, on both sides, for every lock type (SPEC C1-C8), on Stub and Redis brokers."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from pathlib import Path

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from dramatiq_unique import (
    ConflictStrategy,
    DuplicateMessage,
    EnqueueCancelled,
    EnqueueOutcome,
    InvalidLockOptions,
    Locks,
    current_lock,
    enqueue_outcome,
    record_outcome,
    register_strategy,
)
from dramatiq_unique.outcome import DUPLICATE
from dramatiq_unique.strategies import STRATEGIES

from .support import Gate, wait_for

CLIENT_LOCKS = ["until_executing", "until_executed", "until_expired", "until_and_while_executing"]
SERVER_LOCKS = ["while_executing", "until_and_while_executing"]
CLIENT_CASES = [
    (lock, strategy)
    for lock in CLIENT_LOCKS
    for strategy in ("log", "raise", "reject", "replace", "reschedule")
    if not (lock == "until_expired" and strategy == "replace")
]
SERVER_CASES = [(lock, strategy) for lock in SERVER_LOCKS for strategy in ("log", "raise", "reject", "reschedule")]


def declare_job(env, gate: Gate, lock: str, on_conflict, **options):
    """An actor locked on its key alone, so copies with different labels collide."""
    if lock == "until_expired":
        options.setdefault("lock_ttl", 400)

    @env.actor(
        lock=lock,
        on_conflict=on_conflict,
        lock_args_method=lambda key, label: [key],
        reschedule_delay=50,
        max_retries=50,
        **options,
    )
    def job(key, label):
        gate.enter(label)

    return job


def unique_lines(caplog, *fragments) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("dramatiq_unique") and all(f in r.getMessage() for f in fragments)
    ]


@pytest.mark.parametrize(("lock", "strategy"), CLIENT_CASES)
def test_client_conflicts(env, caplog, lock, strategy):
    # A holder A is queued; a duplicate B is sent. What send() returns, what runs,
    # what is dead-lettered, per strategy (C1-C6).
    caplog.set_level(logging.INFO)
    gate = Gate()
    job = declare_job(env, gate, lock, {"client": strategy})
    first = job.send("k", "A")
    digest = enqueue_outcome(first).digest

    if strategy == "raise":
        with pytest.raises(DuplicateMessage) as excinfo:
            job.send("k", "B")
        assert (excinfo.value.digest, excinfo.value.holder) == (digest, first.message_id)
        duplicate = None
    else:
        duplicate = job.send("k", "B")
        outcome = enqueue_outcome(duplicate)

    expected_status = {"log": "duplicate", "reject": "rejected", "replace": "enqueued", "reschedule": "rescheduled"}
    if duplicate is not None:
        assert outcome.status == expected_status[strategy]
        assert outcome.digest == digest
        if strategy == "replace":
            assert outcome.enqueued and outcome.replaced == first.message_id
        else:
            assert not outcome.enqueued and outcome.holder == first.message_id
    # Every strategy says what it did in one line naming the actor, the digest and the holder.
    assert unique_lines(caplog, "'job'", digest, first.message_id, strategy)

    gate.open()
    env.worker()
    if strategy == "reschedule":
        wait_for(lambda: sorted(gate.runs) == ["A", "B"], timeout=10)
    env.join(job)

    expected_runs = {"log": ["A"], "raise": ["A"], "reject": ["A"], "replace": ["B"], "reschedule": ["A", "B"]}
    assert sorted(gate.runs) == expected_runs[strategy]
    dead = env.dead_letters(job)
    if strategy == "reject":
        assert [m.message_id for m in dead] == [duplicate.message_id]
        dead_outcome = enqueue_outcome(dead[0])
        assert dead_outcome.status == "rejected" and dead_outcome.holder == first.message_id
        assert first.message_id in dead_outcome.reason
    else:
        assert dead == []
    if lock != "until_expired":
        assert env.is_free(digest) and env.is_free(digest, run=True)


@pytest.mark.parametrize(("lock", "strategy"), SERVER_CASES)
def test_server_conflicts(env, caplog, lock, strategy):
    # A runs; B reaches a worker meanwhile and meets the run lock (C1-C5, server side).
    caplog.set_level(logging.INFO)
    gate = Gate()
    job = declare_job(env, gate, lock, {"server": strategy})
    first = job.send("k", "A")
    env.worker(threads=4)
    wait_for(lambda: gate.count("A") == 1)
    second = job.send("k", "B")
    assert enqueue_outcome(second).enqueued  # nothing holds the enqueue lock while A runs
    digest = enqueue_outcome(second).digest
    wait_for(lambda: unique_lines(caplog, "'job'", second.message_id, digest, first.message_id))
    gate.open()
    if strategy in ("raise", "reschedule"):
        wait_for(lambda: sorted(gate.runs) == ["A", "B"], timeout=10)
    env.join(job)

    expected_runs = {"log": ["A"], "raise": ["A", "B"], "reject": ["A"], "reschedule": ["A", "B"]}
    assert sorted(gate.runs) == expected_runs[strategy]
    dead = env.dead_letters(job)
    if strategy == "reject":
        assert [m.message_id for m in dead] == [second.message_id]
        assert enqueue_outcome(dead[0]).status == "rejected"
        assert enqueue_outcome(dead[0]).holder == first.message_id
    else:
        assert dead == []
    assert gate.max_running["A"] == gate.max_running.get("B", 1) == 1
    assert env.is_free(digest) and env.is_free(digest, run=True)


def test_server_raise_uses_retries(env):
    # C2: LockConflict takes the exception path: Retries enqueues the copy again with a backoff.
    gate = Gate()

    @env.actor(lock="while_executing", on_conflict="raise", max_retries=50)
    def job(key):
        gate.enter(key)

    job.send("k")
    env.worker(threads=2)
    wait_for(lambda: gate.count("k") == 1)
    second = job.send("k")
    env.wait_for_retry(second)  # LockConflict went down the exception path and Retries re-enqueued it
    gate.open()
    wait_for(lambda: gate.count("k") == 2, timeout=10)
    env.join(job)


def test_server_reschedule_does_not_use_up_retries(env):
    # C5: a rescheduled message keeps max_retries=0 intact and still runs.
    gate = Gate()
    options_seen = []

    @env.actor(
        lock="while_executing",
        on_conflict="reschedule",
        reschedule_delay=30,
        max_retries=0,
        lock_args_method=lambda key, label: [key],
    )
    def job(key, label):
        options_seen.append((label, current_lock().message_id))
        gate.enter(label)

    job.send("k", "A")
    env.worker(threads=2)
    wait_for(lambda: gate.count("A") == 1)
    second = job.send("k", "B")
    env.wait_for_skips(2)  # B is rescheduled, and again
    gate.open()
    wait_for(lambda: gate.count("B") == 1, timeout=10)
    env.join(job)
    assert sorted(gate.runs) == ["A", "B"]
    assert ("B", second.message_id) in options_seen  # the same message, rescheduled
    assert env.dead_letters(job) == []


def test_reschedule_under_load_runs_every_message_once_and_never_two_of_a_key(env):
    # C5: 8 worker threads, 50 messages on 5 keys; measured, not assumed.
    runs = Counter()
    running = Counter()
    peak = Counter()
    mutex = threading.Lock()

    @env.actor(
        lock="while_executing", on_conflict="reschedule", reschedule_delay=20, lock_args_method=lambda key, n: [key]
    )
    def sync(key, n):
        with mutex:
            runs[(key, n)] += 1
            running[key] += 1
            peak[key] = max(peak[key], running[key])
        time.sleep(0.01)
        with mutex:
            running[key] -= 1

    for n in range(50):
        sync.send(f"account-{n % 5}", n)
    env.worker(threads=8)
    wait_for(lambda: sum(runs.values()) == 50, timeout=60)
    env.join(sync)
    assert sorted(n for _, n in runs) == list(range(50))
    assert set(runs.values()) == {1}
    assert set(peak.values()) == {1}


def test_replace_burst_leaves_only_the_newest(env):
    # C4: ten sends for one key while none runs: exactly one run, the newest.
    gate = Gate()
    job = declare_job(env, gate, "until_executed", {"client": "replace"})
    messages = [job.send("k", f"v{i}") for i in range(10)]
    assert all(enqueue_outcome(m).enqueued for m in messages)
    assert [enqueue_outcome(m).replaced for m in messages[1:]] == [m.message_id for m in messages[:-1]]
    gate.open()
    env.worker()
    env.join(job)
    assert gate.runs == ["v9"]
    assert env.is_free(enqueue_outcome(messages[-1]).digest)


def test_replace_never_replaces_a_running_holder(env):
    # C4: the holder already runs: the new message is dropped as with log.
    gate = Gate()
    job = declare_job(env, gate, "until_executed", {"client": "replace"})
    first = job.send("k", "A")
    env.worker()
    wait_for(lambda: gate.count("A") == 1)
    late = job.send("k", "B")
    assert enqueue_outcome(late).status == DUPLICATE
    assert enqueue_outcome(late).holder == first.message_id
    gate.open()
    env.join(job)
    assert gate.runs == ["A"]


def test_max_reschedules_then_reject(env, caplog):
    # C7: never an endless silent loop.
    gate = Gate()
    job = declare_job(env, gate, "until_executed", "reschedule", max_reschedules=2)
    first = job.send("k", "A")
    second = job.send("k", "B")
    assert enqueue_outcome(second).reschedules == 1
    env.worker()  # A runs and blocks: B comes back twice more and is rejected
    wait_for(lambda: len(env.dead_letters(job)) == 1, timeout=10)
    gate.open()
    env.join(job)
    assert gate.runs == ["A"]
    dead = env.dead_letters(job)
    assert [m.message_id for m in dead] == [second.message_id]
    assert enqueue_outcome(dead[0]).status == "rejected"
    assert enqueue_outcome(dead[0]).reschedules == 2
    assert unique_lines(caplog, "max_reschedules", second.message_id)
    assert env.is_free(enqueue_outcome(first).digest)


@pytest.mark.parametrize("lock", ["while_executing", "until_and_while_executing"])
def test_max_reschedules_caps_server_side_reschedules(env, caplog, lock):
    # C7 on the server: the count travels with the message through every re-enqueue.
    caplog.set_level(logging.INFO)
    gate = Gate()
    job = declare_job(env, gate, lock, "reschedule", max_reschedules=3)
    job.send("k", "A")
    env.worker(threads=2)
    wait_for(lambda: gate.count("A") == 1)
    second = job.send("k", "B")
    wait_for(lambda: len(env.dead_letters(job)) == 1, timeout=10)
    gate.open()
    env.join(job)
    assert gate.runs == ["A"]
    dead = env.dead_letters(job)
    assert [m.message_id for m in dead] == [second.message_id]
    assert enqueue_outcome(dead[0]).reschedules == 3
    assert len(unique_lines(caplog, second.message_id, "rescheduled in")) == 3


def test_replace_cannot_be_chosen_per_message(env):
    # A message that does not record its start could be replaced while it runs.
    gate = Gate()
    job = declare_job(env, gate, "until_executed", "log")
    with pytest.raises(InvalidLockOptions, match="whole actor"):
        job.send_with_options(args=("k", "A"), on_conflict={"client": "replace"})
    assert enqueue_outcome(job.send_with_options(args=("k", "A"), on_conflict="raise")).enqueued


def test_until_and_while_reschedule_keeps_the_only_queued_copy(env):
    # C5 + L5: the copy waiting for the running one keeps its enqueue lock while rescheduled.
    gate = Gate()
    job = declare_job(env, gate, "until_and_while_executing", "reschedule")
    job.send("k", "A")
    env.worker(threads=2)
    wait_for(lambda: gate.count("A") == 1)
    waiting = job.send("k", "B")
    assert enqueue_outcome(waiting).enqueued
    env.wait_for_skips(1)  # B met the run lock and was rescheduled, holding its enqueue lock
    third = job.send("k", "C")
    assert enqueue_outcome(third).status == "rescheduled"
    assert enqueue_outcome(third).holder == waiting.message_id
    gate.open()
    wait_for(lambda: sorted(gate.runs) == ["A", "B", "C"], timeout=10)
    env.join(job)


class DropAndCount(ConflictStrategy):
    """A strategy of the user's own: drop the duplicate, count it."""

    name = "drop_and_count"

    def __init__(self):
        self.dropped = []

    def on_client_conflict(self, conflict):
        self.dropped.append(conflict.message.message_id)
        record_outcome(
            conflict.message, EnqueueOutcome(status=DUPLICATE, digest=conflict.digest, holder=conflict.holders[0])
        )
        raise EnqueueCancelled("Dropped and counted.", conflict.message)

    def on_server_conflict(self, conflict):
        self.dropped.append(conflict.message.message_id)
        raise SkipMessage("Dropped and counted.")


def test_a_registered_strategy_is_used_by_name(env):
    # C8
    strategy = DropAndCount()
    register_strategy(strategy)
    try:
        gate = Gate()
        job = declare_job(env, gate, "until_executed", "drop_and_count")
        job.send("k", "A")
        duplicate = job.send("k", "B")
        assert enqueue_outcome(duplicate).status == DUPLICATE
        assert strategy.dropped == [duplicate.message_id]
        with pytest.raises(ValueError, match="registered already"):
            register_strategy(DropAndCount())
    finally:
        del STRATEGIES["drop_and_count"]


CUSTOM_STRATEGY_PAGE = Path(__file__).resolve().parent.parent / "docs" / "conflict-resolution" / "custom-strategy.md"


def test_the_custom_strategy_recipe_runs(env):
    # The page's recipe, as a reader copies it: it counts duplicates on both sides and tells send().
    prometheus_client = pytest.importorskip("prometheus_client")
    (recipe,) = re.findall(r"```python\n(# app/strategies\.py\n.*?)```", CUSTOM_STRATEGY_PAGE.read_text(), re.DOTALL)
    namespace: dict = {}
    exec(compile(recipe, str(CUSTOM_STRATEGY_PAGE), "exec"), namespace)
    counter = namespace["DUPLICATES"]
    try:
        gate = Gate()

        @env.actor(
            queue_name="payments",
            lock="until_and_while_executing",
            on_conflict="count_and_drop",
            lock_args_method=lambda event_id, label: [event_id],
        )
        def settle_payment(event_id, label):
            gate.enter(label)

        first = settle_payment.send("evt_123", "A")
        duplicate = settle_payment.send("evt_123", "B")
        outcome = enqueue_outcome(duplicate)
        assert (outcome.status, outcome.holder) == (DUPLICATE, first.message_id)
        assert counter.labels(actor="settle_payment", side="client")._value.get() == 1
        explanation = Locks.from_middleware(env.middleware).explain(settle_payment, "evt_123", "C")
        assert explanation.on_send.startswith("A new send would be dropped and counted")

        # On the server: a copy enqueued while the enqueue lock was free meets the run lock of A.
        env.worker(threads=2)
        wait_for(lambda: gate.count("A") == 1)
        second = settle_payment.send("evt_123", "D")
        assert enqueue_outcome(second).enqueued
        wait_for(lambda: counter.labels(actor="settle_payment", side="server")._value.get() == 1)
        gate.open()
        env.join(settle_payment)
        assert gate.runs == ["A"]
    finally:
        del STRATEGIES["count_and_drop"]
        prometheus_client.REGISTRY.unregister(counter)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"lock": "until_executed", "on_conflict": "replace"}, "'replace' on the server side"),
        ({"lock": "while_executing", "on_conflict": {"server": "replace"}}, "'replace' on the server side"),
        ({"lock": "until_expired", "lock_ttl": 1000, "on_conflict": {"client": "replace"}}, "no queued holder"),
    ],
)
def test_strategies_that_make_no_sense_fail_at_declaration(stub_env, options, fragment):
    # D5
    with pytest.raises(InvalidLockOptions, match=fragment):

        @dramatiq.actor(**options)
        def job():
            pass


def test_middleware_wide_default_strategy(stub_env):
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import TimeLimit

    from dramatiq_unique import StubBackend, UniqueJobs

    broker = StubBroker()
    broker.add_middleware(UniqueJobs(backend=StubBackend(), on_conflict={"client": "raise"}), before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed")
    def job(x):
        pass

    job.send(1)
    with pytest.raises(DuplicateMessage):
        job.send(1)


@pytest.mark.parametrize(
    ("side", "lock", "strategy"),
    [
        ("client", "until_executed", "reject"),
        ("client", "until_executed", "reschedule"),
        ("server", "while_executing", "reject"),
        ("server", "until_and_while_executing", "reschedule"),
    ],
)
def test_rabbitmq_reject_and_reschedule(rabbitmq_env, caplog, side, lock, strategy):
    # Dead-letter queues and delays are broker specific: the same scenarios on RabbitMQ.
    scenario = test_client_conflicts if side == "client" else test_server_conflicts
    scenario(rabbitmq_env, caplog, lock, strategy)
