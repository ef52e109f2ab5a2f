"""Locks are given up on every path, and Dramatiq's own re-enqueues are never blocked (SPEC L6, R5)."""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from dramatiq_unique import StubBackend, UniqueJobs, enqueue_outcome

from .support import Gate, wait_for


def test_a_message_skipped_by_age_limit_gives_up_its_lock(env):
    # AgeLimit dead-letters the message before UniqueJobs sees it.
    runs = []

    @env.actor(lock="until_executed", max_age=50)
    def settle(event_id):
        runs.append(event_id)

    message = settle.send("evt_1")
    time.sleep(0.1)
    env.worker()
    env.join(settle)
    assert runs == []
    assert [m.message_id for m in env.dead_letters(settle)] == [message.message_id]
    assert env.is_free(enqueue_outcome(message).digest)


class SkipEverything(Middleware):
    """A middleware after UniqueJobs that skips every message, as dramatiq-abort does on cancel."""

    def before_process_message(self, broker, message):
        raise SkipMessage("cancelled")


@pytest.mark.parametrize("lock", ["while_executing", "until_and_while_executing", "until_executed"])
def test_a_message_skipped_by_a_later_middleware_gives_up_its_locks(env, lock):
    runs = []

    @env.actor(lock=lock)
    def job(key):
        runs.append(key)

    skipper = SkipEverything()
    env.broker.add_middleware(skipper)
    message = job.send("k")
    env.worker()
    env.join(job)
    assert runs == []
    digest = enqueue_outcome(message).digest
    if digest:
        assert env.is_free(digest)
    env.broker.middleware.remove(skipper)
    job.send("k")
    env.join(job)
    assert runs == ["k"]


class FailEnqueue(MiddlewareError):
    pass


class BrokenPublisher(Middleware):
    """Fails the enqueue after UniqueJobs took the lock, as a broker outage would (R5)."""

    def before_enqueue(self, broker, message, delay):
        raise FailEnqueue("the broker is down")


@pytest.mark.parametrize("lock", ["until_executing", "until_executed", "until_expired", "until_and_while_executing"])
def test_a_failed_enqueue_gives_up_the_lock_it_took(env, lock):
    # R5: nothing is lost and no lock is left behind.
    @env.actor(lock=lock, lock_ttl=60_000)
    def job(key):
        pass

    publisher = BrokenPublisher()
    env.broker.add_middleware(publisher)
    with pytest.raises(FailEnqueue):
        job.send("k")
    env.broker.middleware.remove(publisher)
    assert enqueue_outcome(job.send("k")).enqueued


def test_a_delayed_message_holds_its_lock_through_the_delay(env):
    # L6: the TTL is extended by the delay; the delay-queue move re-enters the lock.
    runs = []

    @env.actor(lock="until_executed", lock_ttl=200)
    def remind(user_id):
        runs.append(user_id)

    delayed = remind.send_with_options(args=(7,), delay=600)
    assert enqueue_outcome(delayed).enqueued
    env.worker()
    time.sleep(0.35)  # past lock_ttl, within the delay
    assert not enqueue_outcome(remind.send(7)).enqueued
    wait_for(lambda: runs == [7], timeout=5)
    env.join(remind)
    assert runs == [7]


def test_a_retry_is_never_blocked_even_when_its_lock_was_taken_meanwhile(env):
    # L6: the lock lapsed while the first attempt ran and another message took it;
    # the retry of the first message must still be enqueued and run.
    attempts = []
    second_sent = threading.Event()

    @env.actor(
        lock="until_executed",
        lock_ttl=300,
        min_backoff=50,
        max_backoff=50,
        lock_args_method=lambda event_id, attempt_of: [event_id],
    )
    def settle(event_id, attempt_of):
        attempts.append(attempt_of)
        if attempts == ["first"]:
            second_sent.wait(5)
            raise RuntimeError("provider timeout")

    settle.send("evt_1", "first")
    env.worker(threads=1)
    wait_for(lambda: attempts == ["first"])
    time.sleep(0.4)  # the first message's lock lapses while it runs...
    second = settle.send("evt_1", "second")  # ...and the second message takes it
    assert enqueue_outcome(second).enqueued
    second_sent.set()  # the first attempt fails now; its retry meets the second's lock
    env.join(settle)
    assert sorted(attempts) == ["first", "first", "second"]


def test_a_retry_extends_the_lock_over_its_backoff(env):
    # L6: a retry re-enters the lock with its delay, so duplicates stay out while it waits.
    attempts = []

    @env.actor(lock="until_executed", lock_ttl=150, min_backoff=500, max_backoff=500)
    def settle(event_id):
        attempts.append(event_id)
        if len(attempts) == 1:
            raise RuntimeError("provider timeout")

    message = settle.send("evt_1")
    env.worker()
    env.wait_for_retry(message)
    time.sleep(0.2)  # past lock_ttl since the retry was enqueued, well inside its backoff
    assert not enqueue_outcome(settle.send("evt_1")).enqueued
    env.join(settle)
    assert attempts == ["evt_1", "evt_1"]
    assert env.is_free(enqueue_outcome(message).digest)


@pytest.mark.parametrize("lock", ["until_executed", "until_executing", "until_and_while_executing"])
def test_messages_requeued_on_worker_shutdown_keep_their_locks(redis_env, lock):
    # R6: Worker.stop gives prefetched messages back to the broker without any hook:
    # they keep their enqueue locks, run on the next worker, and free them then.
    # The stopped worker leaves the worker registry.
    # (RedisBroker only: StubBroker's join never settles after a requeue.)
    env = redis_env
    gate = Gate()

    @env.actor(lock=lock)
    def settle(event_id):
        gate.enter(event_id, hold=0.05)

    messages = [settle.send(f"evt_{i}") for i in range(4)]
    worker = env.worker(threads=1)
    wait_for(lambda: len(gate.runs) == 1)
    gate.open()
    worker.stop()
    env.workers.remove(worker)
    assert env.backend.heartbeats("dramatiq-unique:workers")[1] == {}
    unstarted = [m for m in messages if f"evt_{messages.index(m)}" not in gate.runs]
    assert unstarted, "the worker was expected to stop with messages left over"
    for message in unstarted:
        assert not env.is_free(enqueue_outcome(message).digest)
        assert not enqueue_outcome(settle.send(message.args[0])).enqueued

    env.worker(threads=2)
    env.join(settle)
    assert sorted(gate.runs) == [f"evt_{i}" for i in range(4)]
    assert all(env.is_free(enqueue_outcome(m).digest) for m in messages)


def test_adding_the_middleware_after_retries_warns(caplog):
    broker = StubBroker()
    broker.add_middleware(UniqueJobs(backend=StubBackend()))

    with caplog.at_level(logging.WARNING):

        @dramatiq.actor(broker=broker, lock="until_executed")
        def job():
            pass

    assert "added after Retries" in caplog.text


def test_a_lost_answer_from_the_backend_leaves_no_lock_behind(redis_client):
    # The acquire script ran but the client gave up waiting for its answer: send()
    # raises LockBackendError, and the place the script took is given back.
    from dramatiq_unique import LockBackendError, RedisBackend

    class SlowAnswers(RedisBackend):
        def acquire(self, *args, **kwargs):
            super().acquire(*args, **kwargs)
            raise LockBackendError("The Redis lock backend failed: TimeoutError: Timeout reading from socket")

    broker = StubBroker()
    backend = SlowAnswers(client=redis_client)
    broker.add_middleware(UniqueJobs(backend=backend), before=dramatiq.middleware.TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed")
    def settle(event_id):
        pass

    with pytest.raises(LockBackendError):
        settle.send("evt_1")
    assert broker.queues[settle.queue_name].qsize() == 0
    # No lock key stays (issue 33: the last release deletes it); only the slot's last token and
    # format marker, which every lock of the prefix shares.
    assert sorted(redis_client.keys("dramatiq-unique:*")) == [b"dramatiq-unique:format"]
