"""The two user stories of the seeds, end to end with real Workers (SPEC L2, L4, L6, C1, C5, C6, D2).

"Serialize per resource": ``sync_account_balance`` with ``while_executing`` never runs twice at
once for one account, while different accounts run in parallel; with ``on_conflict="reschedule"``,
as the seed has it, a copy that meets a running sync runs later instead of being dropped (with
the default ``log``, it is dropped). "Process exactly once": ``settle_payment`` with
``until_executed`` drops every redelivery of an event until the first delivery has succeeded.
Both stories also run with their locks on a Redis Cluster (SPEC S5).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from dramatiq_unique import current_lock, enqueue_outcome

from .support import Gate, unique_warnings, wait_for

pytestmark = pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)


class Overlap:
    """Records, while actors run, how many runs of one key and how many distinct keys overlap."""

    def __init__(self):
        self._mutex = threading.Lock()
        self.running: Counter = Counter()
        self.max_per_key: Counter = Counter()
        self.max_keys = 0
        self.runs: list = []

    def run(self, key, seconds: float) -> None:
        with self._mutex:
            self.runs.append(key)
            self.running[key] += 1
            self.max_per_key[key] = max(self.max_per_key[key], self.running[key])
            self.max_keys = max(self.max_keys, sum(1 for n in self.running.values() if n))
        try:
            threading.Event().wait(seconds)
        finally:
            with self._mutex:
                self.running[key] -= 1


# Serialize per resource ---------------------------------------------------------------------


def test_syncs_of_one_account_never_overlap_and_accounts_run_in_parallel(env):
    # L4 + C1: the first sync of each account runs; copies reaching a worker meanwhile are dropped.
    gate, recorder = Gate(), env.seen

    @env.actor(lock="while_executing")
    def sync_account_balance(account_id):
        gate.enter(account_id)

    for _ in range(4):
        sync_account_balance.send(42)
        sync_account_balance.send(43)
    env.worker(threads=8)  # a thread for every copy: only the lock keeps them apart

    # Both accounts are inside the actor at the same moment: they do not wait for each other.
    wait_for(lambda: gate.running.get(42) == 1 and gate.running.get(43) == 1)
    wait_for(lambda: len(recorder.skipped) == 6)
    gate.open()
    env.join(sync_account_balance)

    assert sorted(gate.runs) == [42, 43]
    assert gate.max_running == {42: 1, 43: 1}
    assert Counter(m.args[0] for m in recorder.skipped) == {42: 3, 43: 3}
    assert env.dead_letters(sync_account_balance) == []

    # The run locks went with the runs: a later sync of 42 runs.
    sync_account_balance.send(42)
    env.join(sync_account_balance)
    assert sorted(gate.runs) == [42, 42, 43]


def test_rescheduled_syncs_all_run_one_at_a_time_per_account(env):
    # L4 + C5, the seed as written (while_executing, on_conflict=reschedule): a copy that meets a
    # running sync of its account is enqueued again and runs later, so every sync is delivered.
    overlap, ran = Overlap(), []

    @env.actor(lock="while_executing", on_conflict="reschedule", reschedule_delay=20)
    def sync_account_balance(account_id):
        ran.append(current_lock().message_id)
        overlap.run(account_id, 0.05)

    sent = [sync_account_balance.send(account_id) for _ in range(4) for account_id in (42, 43)]
    env.worker(threads=8)  # a thread for every copy: only the lock keeps them apart
    env.join(sync_account_balance)

    # Every sync ran, each exactly once, under the message_id send() returned.
    assert Counter(ran) == Counter(m.message_id for m in sent)
    assert overlap.max_per_key == {42: 1, 43: 1}
    assert overlap.max_keys == 2  # the two accounts did sync side by side
    # Copies did meet the lock: each skip was a reschedule (a delayed enqueue of the same message).
    rescheduled = [message_id for message_id, delay in env.seen.enqueues if delay]
    assert rescheduled
    assert sorted(m.message_id for m in env.seen.skipped) == sorted(rescheduled)
    assert set(rescheduled) <= {m.message_id for m in sent}
    assert env.dead_letters(sync_account_balance) == []


def test_syncs_stay_serialized_per_account_under_a_stream_of_sends(env):
    # L4: runs that start and end while others arrive; no account ever has two at once.
    overlap = Overlap()

    @env.actor(lock="while_executing")
    def sync_account_balance(account_id):
        overlap.run(account_id, 0.03)

    accounts = [1, 2, 3, 4]
    env.worker(threads=8)
    for _ in range(5):
        for account_id in accounts:
            sync_account_balance.send(account_id)
        threading.Event().wait(0.02)
    env.join(sync_account_balance)

    assert set(overlap.runs) == set(accounts)
    assert all(overlap.max_per_key[a] == 1 for a in accounts), overlap.max_per_key
    assert overlap.max_keys >= 2  # accounts did run side by side


def test_lock_args_method_serializes_on_the_account_alone(env):
    # D2: only account_id feeds the digest, so syncs with different requested_at still collide.
    gate, recorder = Gate(), env.seen
    digests = {}

    @env.actor(lock="while_executing", lock_args_method=lambda account_id, requested_at: [account_id])
    def sync_account_balance(account_id, requested_at):
        digests[account_id] = current_lock().digest
        gate.enter(account_id)

    @env.actor(lock="while_executing")
    def sync_on_all_arguments(account_id, requested_at):
        gate.enter(("all", account_id))

    sync_account_balance.send(42, "2024-05-01T10:00:00")
    sync_account_balance.send(42, "2024-05-01T10:00:01")
    sync_account_balance.send(43, "2024-05-01T10:00:00")
    # The contrast: keyed on every argument, two syncs of 42 are two different locks.
    sync_on_all_arguments.send(42, "2024-05-01T10:00:00")
    sync_on_all_arguments.send(42, "2024-05-01T10:00:01")
    env.worker(threads=8)

    wait_for(lambda: gate.running.get(42) == 1 and gate.running.get(43) == 1)
    wait_for(lambda: gate.running.get(("all", 42)) == 2)
    wait_for(lambda: len(recorder.skipped) == 1)
    gate.open()
    env.join(sync_account_balance, sync_on_all_arguments)

    assert [(m.actor_name, m.args[0]) for m in recorder.skipped] == [("sync_account_balance", 42)]
    assert Counter(gate.runs) == {42: 1, 43: 1, ("all", 42): 2}
    assert gate.max_running[42] == 1
    assert digests[42] != digests[43]


def test_while_executing_does_not_stop_duplicate_enqueues(env):
    # L4, the seed's pitfall: nothing is locked at enqueue, so ten sends queue ten messages.
    overlap = Overlap()

    @env.actor(lock="while_executing")
    def sync_account_balance(account_id):
        overlap.run(account_id, 0.001)

    messages = [sync_account_balance.send(42) for _ in range(10)]
    outcomes = [enqueue_outcome(m) for m in messages]
    # Ten copies of one job, each queued under its own id, none holding an enqueue lock.
    assert len({o.digest for o in outcomes}) == 1
    assert all(o.enqueued and o.holder == m.message_id for o, m in zip(outcomes, messages, strict=True))
    assert all(o.token is None for o in outcomes)
    assert env.waiting(sync_account_balance) == 10

    env.worker(threads=1)  # one thread: they run one after another, none meets a running copy
    env.join(sync_account_balance)
    assert overlap.runs == [42] * 10
    assert overlap.max_per_key[42] == 1


# Process exactly once -----------------------------------------------------------------------


def declare_settle_payment(env, gate: Gate, runs: list, **options):
    @env.actor(
        queue_name="payments",
        lock="until_executed",
        lock_args_method=lambda event_id, payload=None: [event_id],
        **options,
    )
    def settle_payment(event_id, payload=None):
        runs.append((event_id, payload))
        gate.enter(event_id)

    return settle_payment


def test_a_redelivered_event_is_dropped_while_the_first_is_queued_or_running(env):
    # L2 + C1 + C6: send() returns normally for the redelivery and names the holder.
    gate, runs = Gate(), []
    settle_payment = declare_settle_payment(env, gate, runs)

    first = settle_payment.send("evt_123", {"amount": 100})
    queued_redelivery = settle_payment.send("evt_123", {"amount": 100, "delivery": 2})
    other_event = settle_payment.send("evt_456")
    assert first.queue_name == "payments"
    assert enqueue_outcome(first).enqueued
    outcome = enqueue_outcome(queued_redelivery)
    assert outcome.status == "duplicate"
    assert outcome.holder == first.message_id
    assert outcome.digest == enqueue_outcome(first).digest
    assert enqueue_outcome(other_event).enqueued
    assert enqueue_outcome(other_event).digest != enqueue_outcome(first).digest
    assert env.waiting(settle_payment) == 2

    env.worker(threads=4)
    wait_for(lambda: gate.count("evt_123") == 1)
    running_redelivery = settle_payment.send("evt_123", {"amount": 100, "delivery": 3})
    assert enqueue_outcome(running_redelivery).status == "duplicate"
    assert enqueue_outcome(running_redelivery).holder == first.message_id

    gate.open()
    env.join(settle_payment)
    assert sorted(runs) == [("evt_123", {"amount": 100}), ("evt_456", None)]
    assert env.is_free(enqueue_outcome(first).digest)

    # Once settled, the lock lifted: a later delivery is a fresh job and runs again.
    later = settle_payment.send("evt_123", {"amount": 100, "delivery": 4})
    assert enqueue_outcome(later).enqueued
    assert enqueue_outcome(later).holder == later.message_id
    env.join(settle_payment)
    assert runs.count(("evt_123", {"amount": 100, "delivery": 4})) == 1
    assert len(runs) == 3
    assert env.is_free(enqueue_outcome(first).digest)


def test_a_settle_that_fails_then_succeeds_runs_once_to_success(env, caplog):
    # L2 + L6: the failed attempt keeps the lock, its retry re-enters it, and redeliveries
    # sent while it runs or while the retry waits are all dropped.
    attempt_gate, recorder = Gate(), env.seen
    attempts, settled, held = [], [], []

    @env.actor(
        queue_name="payments",
        lock="until_executed",
        lock_args_method=lambda event_id, payload=None: [event_id],
        min_backoff=300,
        max_backoff=300,
    )
    def settle_payment(event_id, payload=None):
        attempts.append((event_id, payload))
        held.append(current_lock())
        if len(attempts) == 1:
            attempt_gate.enter(event_id)
            raise RuntimeError("provider timeout")
        settled.append((event_id, payload))

    first = settle_payment.send("evt_123", {"amount": 100})
    digest = enqueue_outcome(first).digest
    env.worker(threads=4)
    wait_for(lambda: attempt_gate.count("evt_123") == 1)
    redeliveries = [settle_payment.send("evt_123", {"delivery": 2})]  # while the failing attempt runs
    attempt_gate.open()

    # The retry is scheduled: from here until it runs, the message waits out its backoff.
    wait_for(lambda: any(mid == first.message_id and delay for mid, delay in recorder.enqueues))
    assert len(attempts) == 1  # the backoff is 150-300 ms: the retry has not started yet
    redeliveries.append(settle_payment.send("evt_123", {"delivery": 3}))
    assert not env.is_free(digest)
    env.join(settle_payment)

    assert attempts == [("evt_123", {"amount": 100})] * 2
    assert settled == [("evt_123", {"amount": 100})]
    assert [enqueue_outcome(r).status for r in redeliveries] == ["duplicate"] * len(redeliveries)
    assert {enqueue_outcome(r).holder for r in redeliveries} == {first.message_id}
    # The retry ran as the same message holding the same place in the lock, not a re-taken one.
    assert [h.message_id for h in held] == [first.message_id] * 2
    assert held[0].token == held[1].token
    assert unique_warnings(caplog) == []  # e.g. "enqueued again although its lock ... is now held by"
    assert env.dead_letters(settle_payment) == []
    assert env.is_free(digest)
