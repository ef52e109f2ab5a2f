"""The seed stories and the retry, delay and dead-letter paths on RabbitmqBroker + RedisBackend
with real Workers (SPEC L2, L4, L6, C1, C6, D2).

RabbitMQ differs from the Redis broker where locks are concerned: a retry is published to the
delay queue and published again when due, so ``before_enqueue`` runs three times for one
message_id, and dead letters go to the ``.XQ`` queue through RabbitMQ's dead-letter routing.
"""

from __future__ import annotations

import time

from dramatiq_unique import current_lock, enqueue_outcome

from .support import Gate, unique_warnings, wait_for


def test_syncs_serialize_per_account(rabbitmq_env):
    # L4 + D2 + C1: every send is queued; a sync meeting a running one of its account is dropped.
    env = rabbitmq_env
    gate, recorder = Gate(), env.seen

    @env.actor(lock="while_executing", lock_args_method=lambda account_id, requested_at: [account_id])
    def sync_account_balance(account_id, requested_at):
        gate.enter(account_id)

    messages = [sync_account_balance.send(42, f"10:00:0{i}") for i in range(3)]
    messages += [sync_account_balance.send(43, f"10:00:0{i}") for i in range(2)]
    assert all(enqueue_outcome(m).enqueued for m in messages)
    wait_for(lambda: env.waiting(sync_account_balance) == 5)  # the seed's pitfall: duplicates queue

    env.worker(threads=8)
    wait_for(lambda: gate.running.get(42) == 1 and gate.running.get(43) == 1)  # accounts in parallel
    wait_for(lambda: len(recorder.skipped) == 3)
    gate.open()
    env.join(sync_account_balance)

    assert sorted(gate.runs) == [42, 43]
    assert gate.max_running == {42: 1, 43: 1}
    assert sorted(m.args[0] for m in recorder.skipped) == [42, 42, 43]
    assert env.dead_letters(sync_account_balance) == []
    sync_account_balance.send(42, "10:05:00")  # the run lock went with the run
    env.join(sync_account_balance)
    assert sorted(gate.runs) == [42, 42, 43]


def test_settle_payment_runs_once_per_event(rabbitmq_env):
    # L2 + C6: redeliveries while the first is queued or running are dropped and name the holder.
    env = rabbitmq_env
    gate, runs = Gate(), []

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id, payload=None: [event_id])
    def settle_payment(event_id, payload=None):
        runs.append((event_id, payload))
        gate.enter(event_id)

    first = settle_payment.send("evt_123", {"amount": 100})
    redeliveries = [settle_payment.send("evt_123", {"amount": 100, "delivery": 2})]
    assert enqueue_outcome(settle_payment.send("evt_456")).enqueued
    wait_for(lambda: env.waiting(settle_payment) == 2)

    env.worker(threads=4)
    wait_for(lambda: gate.count("evt_123") == 1)
    redeliveries.append(settle_payment.send("evt_123", {"amount": 100, "delivery": 3}))
    gate.open()
    env.join(settle_payment)

    assert [enqueue_outcome(r).status for r in redeliveries] == ["duplicate", "duplicate"]
    assert {enqueue_outcome(r).holder for r in redeliveries} == {first.message_id}
    assert sorted(runs) == [("evt_123", {"amount": 100}), ("evt_456", None)]
    assert env.is_free(enqueue_outcome(first).digest)
    later = settle_payment.send("evt_123", {"amount": 100, "delivery": 4})
    assert enqueue_outcome(later).enqueued
    env.join(settle_payment)
    assert len(runs) == 3


def test_a_retry_through_the_delay_queue_passes_its_own_lock(rabbitmq_env, caplog):
    # L6: the retry is published to the delay queue and again when due, under the same
    # message_id; both re-enqueues pass the lock the message holds, and redeliveries do not.
    env = rabbitmq_env
    recorder = env.seen
    attempts, held = [], []

    @env.actor(
        queue_name="payments",
        lock="until_executed",
        lock_args_method=lambda event_id, payload=None: [event_id],
        min_backoff=300,
        max_backoff=300,
    )
    def settle_payment(event_id, payload=None):
        attempts.append(payload)
        held.append(current_lock())
        if len(attempts) == 1:
            raise RuntimeError("provider timeout")

    first = settle_payment.send("evt_123", {"amount": 100})
    digest = enqueue_outcome(first).digest
    env.worker(threads=4)
    wait_for(lambda: any(delay for _, delay in recorder.enqueues))
    assert len(attempts) == 1  # the backoff is 150-300 ms: the retry waits in the delay queue
    redelivery = settle_payment.send("evt_123", {"delivery": 2})
    assert not env.is_free(digest)
    # Env.join alone can return while the due retry travels from the delay queue back to RabbitMQ.
    wait_for(lambda: len(attempts) == 2)
    env.join(settle_payment)

    assert attempts == [{"amount": 100}] * 2
    assert enqueue_outcome(redelivery).status == "duplicate"
    assert enqueue_outcome(redelivery).holder == first.message_id
    # Sent, published to the delay queue, published again when due: one message, one lock place.
    assert [mid for mid, _ in recorder.enqueues] == [first.message_id] * 3
    assert [bool(delay) for _, delay in recorder.enqueues] == [False, True, False]
    assert [h.message_id for h in held] == [first.message_id] * 2
    assert held[0].token == held[1].token
    assert unique_warnings(caplog) == []
    assert env.dead_letters(settle_payment) == []
    assert env.is_free(digest)


def test_a_delayed_message_holds_its_lock_through_the_delay(rabbitmq_env):
    # L6: the lock's TTL is extended by the delay, so it outlives lock_ttl while the message waits.
    env = rabbitmq_env
    runs = []

    @env.actor(queue_name="payments", lock="until_executed", lock_ttl=100)
    def settle_payment(event_id):
        runs.append((event_id, time.monotonic()))

    sent_at = time.monotonic()
    delayed = settle_payment.send_with_options(args=("evt_123",), delay=600)
    digest = enqueue_outcome(delayed).digest
    assert enqueue_outcome(delayed).enqueued
    env.worker(threads=4)
    time.sleep(max(0.0, sent_at + 0.25 - time.monotonic()))  # past lock_ttl, well before the delay ends
    duplicate = settle_payment.send("evt_123")
    assert runs == []
    assert enqueue_outcome(duplicate).status == "duplicate"
    assert enqueue_outcome(duplicate).holder == delayed.message_id

    wait_for(lambda: len(runs) == 1)
    env.join(settle_payment)
    assert [event_id for event_id, _ in runs] == ["evt_123"]
    assert runs[0][1] - sent_at >= 0.55  # it ran when due, not before
    assert env.is_free(digest)
    assert enqueue_outcome(settle_payment.send("evt_123")).enqueued


def test_a_final_failure_dead_letters_the_message_and_frees_the_lock(rabbitmq_env):
    # L2: the message ends in the .XQ queue and gives its lock up; the event can be sent again.
    env = rabbitmq_env
    attempts = []

    @env.actor(queue_name="payments", lock="until_executed", max_retries=1)
    def settle_payment(event_id):
        attempts.append(event_id)
        raise RuntimeError("card declined")

    message = settle_payment.send("evt_123")
    env.worker(threads=4)
    wait_for(lambda: len(attempts) == 2)
    env.join(settle_payment)

    assert attempts == ["evt_123"] * 2
    assert [m.message_id for m in env.dead_letters(settle_payment)] == [message.message_id]
    assert env.is_free(enqueue_outcome(message).digest)
    assert enqueue_outcome(settle_payment.send("evt_123")).enqueued
