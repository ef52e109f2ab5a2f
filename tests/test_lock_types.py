"""Each lock type on StubBroker + StubBackend and RedisBroker + RedisBackend with
real Workers: who runs, who is dropped, and when the lock is free again (SPEC L1-L5, L8, L9, C1, C6)."""

from __future__ import annotations

import logging
import time

import pytest

from dramatiq_unique import enqueue_outcome

from .support import Gate, wait_for


def test_until_executing_frees_the_lock_when_the_message_starts(env):
    # L1: duplicates are dropped while the message waits; once it runs, a new copy may queue.
    gate = Gate()

    @env.actor(lock="until_executing")
    def sync(key):
        gate.enter(key)

    first, duplicate = sync.send(1), sync.send(1)
    assert enqueue_outcome(first).enqueued
    assert not enqueue_outcome(duplicate).enqueued
    assert enqueue_outcome(duplicate).holder == first.message_id

    env.worker()
    wait_for(lambda: gate.count(1) == 1)
    assert env.is_free(enqueue_outcome(first).digest)
    second = sync.send(1)
    assert enqueue_outcome(second).enqueued

    gate.open()
    env.join(sync)
    assert gate.runs == [1, 1]


def test_until_executing_retry_retakes_the_lock(env):
    # L1: a failed attempt whose retry is pending holds the lock again while it waits.
    attempts = []

    @env.actor(lock="until_executing", min_backoff=600, max_backoff=600)
    def flaky(key):
        attempts.append(key)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    message = flaky.send(1)
    env.worker()
    env.wait_for_retry(message)  # the retry now waits out its backoff
    assert not enqueue_outcome(flaky.send(1)).enqueued
    env.join(flaky)
    assert attempts == [1, 1]
    assert env.is_free(enqueue_outcome(message).digest)


def test_until_executed_holds_the_lock_until_success(env):
    # L2: a duplicate is dropped while the holder is queued and while it runs.
    gate = Gate()

    @env.actor(lock="until_executed")
    def settle(event_id):
        gate.enter(event_id)

    first = settle.send("evt_1")
    assert not enqueue_outcome(settle.send("evt_1")).enqueued
    assert enqueue_outcome(settle.send("evt_2")).enqueued

    env.worker()
    wait_for(lambda: gate.count("evt_1") == 1)
    during = settle.send("evt_1")
    assert not enqueue_outcome(during).enqueued
    assert enqueue_outcome(during).holder == first.message_id

    gate.open()
    env.join(settle)
    assert sorted(gate.runs) == ["evt_1", "evt_2"]
    assert env.is_free(enqueue_outcome(first).digest)
    assert enqueue_outcome(settle.send("evt_1")).enqueued


def test_until_executed_keeps_the_lock_across_retries(env):
    # L2: the retry re-enters the lock; duplicates sent while it is pending are dropped.
    attempts = []

    @env.actor(lock="until_executed", min_backoff=300, max_backoff=300)
    def settle(event_id):
        attempts.append(event_id)
        if len(attempts) < 3:
            raise RuntimeError("provider timeout")

    message = settle.send("evt_1")
    env.worker()
    wait_for(lambda: len(attempts) == 1)
    duplicates = [settle.send("evt_1") for _ in range(3)]
    wait_for(lambda: len(attempts) == 2)
    duplicates.append(settle.send("evt_1"))
    env.join(settle)

    assert attempts == ["evt_1"] * 3
    assert not any(enqueue_outcome(d).enqueued for d in duplicates)
    assert {enqueue_outcome(d).holder for d in duplicates} == {message.message_id}
    assert env.dead_letters(settle) == []
    assert env.is_free(enqueue_outcome(message).digest)


def test_until_executed_releases_on_final_failure(env):
    # L2: a message that ends in the dead-letter queue gives its lock up.
    @env.actor(lock="until_executed", max_retries=1)
    def settle(event_id):
        raise RuntimeError("always fails")

    message = settle.send("evt_1")
    env.worker()
    env.join(settle)
    assert [m.message_id for m in env.dead_letters(settle)] == [message.message_id]
    assert env.is_free(enqueue_outcome(message).digest)
    assert enqueue_outcome(settle.send("evt_1")).enqueued


def test_until_expired_holds_until_the_ttl_runs_out(env):
    # L3: neither success nor failure releases; only the TTL does.
    runs = []

    @env.actor(lock="until_expired", lock_ttl=700, max_retries=0)
    def report(day, fail=False):
        runs.append(day)
        if fail:
            raise RuntimeError("fails")

    first = report.send("monday")
    failing = report.send("tuesday", fail=True)
    env.worker()
    env.join(report)
    assert sorted(runs) == ["monday", "tuesday"]
    assert not enqueue_outcome(report.send("monday")).enqueued
    assert not enqueue_outcome(report.send("tuesday", fail=True)).enqueued

    wait_for(lambda: env.is_free(enqueue_outcome(first).digest), timeout=3)
    wait_for(lambda: env.is_free(enqueue_outcome(failing).digest), timeout=3)
    assert enqueue_outcome(report.send("monday")).enqueued
    env.join(report)
    assert sorted(runs) == ["monday", "monday", "tuesday"]


def test_while_executing_drops_a_copy_that_arrives_while_one_runs(env):
    # L4 + C1 (server): nothing is locked at enqueue; a copy that starts while another runs is acked unrun.
    gate = Gate()

    @env.actor(lock="while_executing")
    def sync(account_id):
        gate.enter(account_id)

    first = sync.send(42)
    assert enqueue_outcome(sync.send(42)).enqueued  # no client lock: both are queued
    sync.send(43)
    env.worker(threads=4)
    wait_for(lambda: gate.count(42) == 1 and gate.count(43) == 1)
    env.wait_for_skips(1)  # the second copy for 42 has reached a worker thread and been dropped
    gate.open()
    env.join(sync)

    assert sorted(gate.runs) == [42, 43]
    assert env.dead_letters(sync) == []
    digest = _run_digest(env, first)
    assert env.is_free(digest, run=True)
    sync.send(42)
    env.join(sync)
    assert sorted(gate.runs) == [42, 42, 43]


def test_while_executing_releases_after_an_exception(env):
    # L4: released whatever the outcome, retry pending or final.
    attempts = []

    @env.actor(lock="while_executing", max_retries=1)
    def sync(account_id):
        attempts.append(account_id)
        raise RuntimeError("provider down")

    message = sync.send(42)
    env.worker()
    env.join(sync)
    assert attempts == [42, 42]
    assert [m.message_id for m in env.dead_letters(sync)] == [message.message_id]
    assert env.is_free(_run_digest(env, message), run=True)


def test_until_and_while_executing_allows_one_queued_and_one_running(env):
    # L5: the enqueue lock moves to the run lock at start; a copy queued meanwhile conflicts on the run lock.
    gate = Gate()

    @env.actor(lock="until_and_while_executing")
    def rebuild(index):
        gate.enter(index)

    first = rebuild.send("users")
    assert not enqueue_outcome(rebuild.send("users")).enqueued
    worker = env.worker(threads=4)
    wait_for(lambda: gate.count("users") == 1)
    digest = enqueue_outcome(first).digest
    assert env.is_free(digest)  # the enqueue lock was given up at start...
    assert not env.is_free(digest, run=True)  # ...for the run lock
    consumers = list(worker.consumers.values())
    for consumer in consumers:  # the queued copy stays queued until the next send has met its lock
        consumer.pause()
    for consumer in consumers:
        consumer.paused_event.wait()
    queued = rebuild.send("users")
    assert enqueue_outcome(queued).enqueued
    assert not enqueue_outcome(rebuild.send("users")).enqueued
    for consumer in consumers:
        consumer.resume()
    env.wait_for_skips(1)  # the queued copy reached a worker thread and met the run lock
    gate.open()
    env.join(rebuild)

    assert gate.runs == ["users"]
    assert env.is_free(digest) and env.is_free(digest, run=True)


def test_until_and_while_executing_retry_retakes_the_enqueue_lock(env):
    # L5: on a failure that will be retried, the enqueue lock is re-taken for the retry.
    attempts = []

    @env.actor(lock="until_and_while_executing", min_backoff=600, max_backoff=600)
    def rebuild(index):
        attempts.append(index)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")

    message = rebuild.send("users")
    env.worker()
    env.wait_for_retry(message)
    digest = enqueue_outcome(message).digest
    assert not enqueue_outcome(rebuild.send("users")).enqueued
    assert env.is_free(digest, run=True)
    env.join(rebuild)
    assert attempts == ["users", "users"]
    assert env.is_free(digest) and env.is_free(digest, run=True)


@pytest.mark.parametrize("lock", ["until_executing", "until_executed", "until_and_while_executing"])
def test_lock_limit_lets_that_many_copies_in(env, lock):
    # L8: up to lock_limit holders of one digest.
    @env.actor(lock=lock, lock_limit=3)
    def job(key):
        pass

    outcomes = [enqueue_outcome(job.send("k")) for _ in range(5)]
    assert [o.enqueued for o in outcomes] == [True, True, True, False, False]
    holders = {o.holder for o in outcomes if o.enqueued}
    assert {o.holder for o in outcomes if not o.enqueued} <= holders


def test_while_executing_lock_limit_bounds_concurrency(env):
    # L8 for run locks: two copies run at once, the third that starts meanwhile is dropped.
    gate = Gate()

    @env.actor(lock="while_executing", lock_limit=2)
    def job(key):
        gate.enter(key)

    for _ in range(3):
        job.send("k")
    env.worker(threads=4)
    wait_for(lambda: gate.count("k") == 2)
    env.wait_for_skips(1)  # the third copy met the full run lock
    gate.open()
    env.join(job)
    assert gate.runs == ["k", "k"]
    assert gate.max_running["k"] == 2


def test_a_lapsed_lock_does_not_stop_its_message(env):
    # L9: the lock lapsed before the message ran; it runs, and re-takes the lock if free.
    runs = []

    @env.actor(lock="until_executed", lock_ttl=100)
    def settle(event_id):
        runs.append(event_id)

    first = settle.send("evt_1")
    time.sleep(0.2)
    second = settle.send("evt_1")  # the first one's lock lapsed: this one is let in
    assert enqueue_outcome(second).enqueued
    env.worker(threads=1)
    env.join(settle)
    assert runs == ["evt_1", "evt_1"]
    assert enqueue_outcome(first).holder != enqueue_outcome(second).holder


def test_a_lapsed_lock_is_taken_again_when_its_message_starts(env):
    # L9: the message that outlived its lock's TTL in the queue re-takes the free lock for its run.
    gate = Gate()

    @env.actor(lock="until_executed", lock_ttl=150)
    def settle(event_id):
        gate.enter(event_id)

    message = settle.send("evt_1")
    time.sleep(0.25)
    assert env.is_free(enqueue_outcome(message).digest)  # lapsed while queued
    env.worker()
    wait_for(lambda: gate.count("evt_1") == 1)
    duplicate = settle.send("evt_1")
    assert not enqueue_outcome(duplicate).enqueued
    assert enqueue_outcome(duplicate).holder == message.message_id
    gate.open()
    env.join(settle)
    assert gate.runs == ["evt_1"]


def test_actors_without_lock_are_untouched(env):
    runs = []

    @env.actor
    def plain(x):
        runs.append(x)

    messages = [plain.send(1) for _ in range(3)]
    assert all(enqueue_outcome(m).enqueued and enqueue_outcome(m).digest is None for m in messages)
    env.worker()
    env.join(plain)
    assert runs == [1, 1, 1]


def _run_digest(env, message):
    from dramatiq_unique.digest import compute_digest

    return compute_digest(
        actor_name=message.actor_name,
        queue_name=message.queue_name,
        lock_args=[list(message.args), message.kwargs],
        unique_across_actors=False,
        unique_across_queues=False,
    )


def test_a_copy_of_a_sent_message_is_a_new_message(env):
    # Re-entrancy is by message_id: a copy under a new id does not pass the original's lock.
    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    sent = settle.send("evt_1")
    copy = env.broker.enqueue(sent.copy(message_id="another-id", queue_name=settle.queue_name))
    assert not enqueue_outcome(copy).enqueued
    assert enqueue_outcome(copy).holder == sent.message_id


@pytest.mark.parametrize("lock", ["while_executing", "until_and_while_executing"])
def test_a_redelivery_of_a_running_message_waits_for_its_earlier_attempt(env, lock, caplog):
    # L7: run locks are not re-entrant by message_id (each processing attempt has its own owner),
    # so a redelivery never runs beside its earlier attempt; and being no duplicate, it is not
    # dropped (that attempt's worker may have died): it tries again once the lock is free.
    caplog.set_level(logging.INFO)
    gate = Gate()

    @env.actor(lock=lock, reschedule_delay=50)
    def job(key):
        gate.enter(key)

    message = job.send("k")
    env.worker(threads=4)
    wait_for(lambda: gate.count("k") == 1)
    env.broker.enqueue(message)  # the broker hands the same message out again while it runs
    wait_for(lambda: len(env.seen.skipped) >= 1)
    assert gate.count("k") == 1
    gate.open()
    wait_for(lambda: gate.count("k") == 2)
    env.join(job)
    assert gate.max_running["k"] == 1
    assert {m.message_id for m in env.seen.skipped} == {message.message_id}
    # O4: the log line says what it waits for, not that it is held by a message of its own id.
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Message {message.message_id!r}")]
    assert waits and all("is held by its own earlier attempt, until that attempt finishes" in w for w in waits)
