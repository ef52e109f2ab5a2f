"""Correctness at the edges (issue 8): Dramatiq's own enqueues (delay-queue moves, retries,
pipeline steps, group callbacks), `replace` across actors and after a lapse, re-driven dead
letters, reschedules that keep the caller's delay, and redeliveries under `lock_limit`.

Each test runs on StubBroker + StubBackend and on RedisBroker + RedisBackend with real Workers;
those whose fix lives in the backend's scripts also with the locks on a real Redis Cluster.
"""

from __future__ import annotations

import logging
import time

import pytest
from dramatiq import group, pipeline
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis, dq_name
from dramatiq.middleware import GroupCallbacks, TimeLimit
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.rate_limits.backends import StubBackend as StubRateLimiterBackend

from dramatiq_unique import InvalidLockOptions, UniqueJobs, enqueue_outcome

from .support import Gate, wait_for

#: Stub, Redis, and the locks on a three-master Redis Cluster.
ON_EVERY_BACKEND = pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)


def enqueue_without_middleware(env, message, *, delay: int) -> None:
    """Put a delayed message on the broker as a producer without UniqueJobs would (L6)."""
    message = message.copy(queue_name=dq_name(message.queue_name), options={"eta": current_millis() + delay})
    if env.kind == "stub":
        env.broker.queues[message.queue_name].put(message.encode())
    else:
        producer = RedisBroker(client=env.broker.client)
        rid = "producer-" + message.message_id
        message = message.copy(options={"redis_message_id": rid})
        producer.do_enqueue(message.queue_name, rid, message.encode())


# Delay-queue moves never raise (L6) ------------------------------------------------


@ON_EVERY_BACKEND
def test_a_due_message_from_a_producer_without_the_middleware_is_rescheduled_not_lost(env, caplog):
    # Under on_conflict="raise" the move out of the delay queue used to raise DuplicateMessage in
    # the consumer thread: the consumer crashed and the message never ran.
    gate = Gate()

    @env.actor(lock="until_executed", on_conflict="raise", reschedule_delay=50)
    def settle(event_id):
        gate.enter(event_id)

    settle.send("evt_1")
    env.worker(threads=2)
    wait_for(lambda: gate.count("evt_1") == 1)
    with caplog.at_level(logging.INFO):
        enqueue_without_middleware(env, settle.message("evt_1"), delay=20)
        wait_for(lambda: any("is rescheduled in 50 ms" in r.getMessage() for r in caplog.records))
    assert gate.count("evt_1") == 1  # not beside the holder
    gate.open()
    wait_for(lambda: gate.count("evt_1") == 2)
    env.join(settle)
    assert gate.max_running["evt_1"] == 1
    assert not any("Consumer encountered" in r.getMessage() for r in caplog.records)


# replace (C4) ---------------------------------------------------------------------------


@ON_EVERY_BACKEND
def test_replace_never_evicts_a_message_of_an_actor_that_does_not_replace(env, caplog):
    # unique_across_actors: a `replace` actor shares the lock of a `log` actor. The log actor's
    # queued message would run anyway, so it must not be recorded as replaced.
    runs = []

    @env.actor(lock="until_executed", unique_across_actors=True)
    def import_feed(feed_id):
        runs.append(("import", feed_id))

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, unique_across_actors=True)
    def refresh_feed(feed_id):
        runs.append(("refresh", feed_id))

    first = import_feed.send("f1")
    with caplog.at_level(logging.INFO):
        second = refresh_feed.send("f1")
    assert enqueue_outcome(second).status == "duplicate"
    assert enqueue_outcome(second).holder == first.message_id
    assert not any("will be skipped" in r.getMessage() for r in caplog.records)
    env.worker()
    env.join(import_feed, refresh_feed)
    assert runs == [("import", "f1")]


@ON_EVERY_BACKEND
def test_a_running_message_whose_lock_lapsed_in_the_queue_is_never_replaced(env):
    # until_executed + replace + lock_ttl: the lapsed lock is taken again at start, as running.
    gate = Gate()

    @env.actor(
        lock="until_executed",
        on_conflict={"client": "replace"},
        lock_ttl=2000,
        lock_args_method=lambda doc_id, revision: [doc_id],
    )
    def render(doc_id, revision):
        gate.enter((doc_id, revision))

    render.send("d", 1)
    time.sleep(2.1)  # the lock lapses while the message waits
    env.worker()
    wait_for(lambda: gate.count(("d", 1)) == 1)
    newer = render.send("d", 2)
    assert enqueue_outcome(newer).status == "duplicate"
    gate.open()
    env.join(render)
    assert gate.runs == [("d", 1)]


@ON_EVERY_BACKEND
@pytest.mark.parametrize("lock", ["until_executing", "until_and_while_executing"])
def test_a_retry_of_an_older_message_never_evicts_the_newest(env, lock, caplog):
    # The docs' publish_preview(doc_id, revision): revision 1 fails while revision 2 waits;
    # revision 1's retry must not take revision 2's place: the newest revision is rendered.
    gate = Gate()
    attempts = []

    @env.actor(lock=lock, on_conflict={"client": "replace"}, lock_args_method=lambda doc_id, revision: [doc_id])
    def publish_preview(doc_id, revision):
        attempts.append(revision)
        if revision == 1:
            gate.enter(revision)
            raise RuntimeError("the renderer timed out")

    publish_preview.send("doc", 1)
    env.worker(threads=1)
    wait_for(lambda: attempts == [1])
    newest = publish_preview.send("doc", 2)
    assert enqueue_outcome(newest).enqueued
    with caplog.at_level(logging.INFO):
        gate.open()
        env.join(publish_preview)
    assert attempts == [1, 2]
    assert any("is not enqueued again: newer message" in r.getMessage() for r in caplog.records)


# reschedule keeps the caller's delay (C5) --------------------------------------------------


def test_a_rescheduled_duplicate_keeps_the_delay_it_was_sent_with(env):
    @env.actor(lock="until_executed", on_conflict="reschedule", reschedule_delay=50)
    def settle(event_id):
        pass

    settle.send("evt_1")
    later = settle.send_with_options(args=("evt_1",), delay=20_000)
    assert enqueue_outcome(later).status == "rescheduled"
    delays = [delay for message_id, delay in env.seen.enqueues if message_id == later.message_id]
    assert delays == [20_000]


# One UniqueJobs per broker -------------------------------------------------------------


def test_a_second_unique_jobs_on_a_broker_is_refused(env):
    env.broker.add_middleware(UniqueJobs(backend=env.backend), before=TimeLimit)
    with pytest.raises(InvalidLockOptions, match="added to this broker 2 times"):

        @env.actor(lock="while_executing")
        def sync(account_id):
            pass


def test_a_second_unique_jobs_added_after_the_actors_is_refused(env):
    @env.actor(lock="while_executing")
    def sync(account_id):
        pass

    with pytest.raises(InvalidLockOptions, match="added to this broker 2 times"):
        env.broker.add_middleware(UniqueJobs(backend=env.backend), before=TimeLimit)


# A re-driven dead letter is a new send (L6) ------------------------------------------------


@ON_EVERY_BACKEND
def test_a_dead_lettered_message_enqueued_again_meets_the_lock_of_a_newer_copy(env):
    fail = {"evt_1"}
    runs = []

    @env.actor(lock="until_executed", max_retries=0)
    def settle(event_id):
        runs.append(event_id)
        if event_id in fail:
            raise RuntimeError("the provider is down")

    settle.send("evt_1")
    env.worker()
    env.join(settle)
    [dead] = env.dead_letters(settle)
    fail.clear()
    for worker in env.workers:
        worker.stop()
    env.workers.clear()

    newer = settle.send("evt_1")  # the lock was given up at the final failure
    assert enqueue_outcome(newer).enqueued
    redriven = env.broker.enqueue(dead)
    assert enqueue_outcome(redriven).status == "duplicate"
    assert enqueue_outcome(redriven).holder == newer.message_id
    env.worker()
    env.join(settle)
    assert runs == ["evt_1", "evt_1"]


# Groups and pipelines (issue 8, defect 12) -----------------------------------------------


@pytest.fixture
def callbacks_env(env):
    limiter = StubRateLimiterBackend() if env.kind == "stub" else RedisRateLimiterBackend(client=env.broker.client)
    env.broker.add_middleware(GroupCallbacks(limiter))
    return env


@pytest.mark.parametrize("strategy", ["log", "replace"])
def test_a_group_member_that_meets_a_lock_waits_for_it_so_the_group_completes(callbacks_env, strategy):
    env = callbacks_env
    gate = Gate()
    finished = []

    @env.actor(lock="until_executed", on_conflict={"client": strategy}, reschedule_delay=50)
    def resize(image_id):
        gate.enter(image_id)

    @env.actor
    def notify_done():
        finished.append(time.monotonic())

    resize.send(5)  # another request is resizing image 5 already
    env.worker()
    wait_for(lambda: gate.count(5) == 1)
    members = group([resize.message(1), resize.message(5), resize.message(7)])
    members.add_completion_callback(notify_done.message())
    members.run()
    gate.open()
    env.join(resize, notify_done)
    assert sorted(gate.runs) == [1, 5, 5, 7]  # the member ran after the holder, not beside it
    assert gate.max_running[5] == 1
    assert len(finished) == 1


@pytest.mark.parametrize("strategy", ["log", "raise"])
def test_a_pipeline_step_that_meets_a_lock_waits_for_it_so_the_pipeline_goes_on(env, strategy, caplog):
    # One publish at a time (a lock on no arguments). A pipeline's publish step that meets the
    # lock was dropped (log) or raised inside Dramatiq's Pipelines middleware (raise): either way
    # the pipeline stopped there and its notify step never ran.
    gate = Gate()
    notified = []

    @env.actor
    def render(doc_id):
        return f"{doc_id}.pdf"

    @env.actor(lock="until_executed", on_conflict=strategy, reschedule_delay=50, lock_args_method=lambda path: [])
    def publish(path):
        gate.enter(path)
        return path

    @env.actor
    def notify(path):
        notified.append(path)

    publish.send("other.pdf")  # a publish runs already: the lock is held
    env.worker()
    wait_for(lambda: gate.count("other.pdf") == 1)
    with caplog.at_level(logging.INFO):
        pipeline([render.message("d1"), publish.message(), notify.message()]).run()
        wait_for(lambda: any("is rescheduled" in r.getMessage() for r in caplog.records))
        gate.open()
        env.join(render, publish, notify)
    assert gate.runs == ["other.pdf", "d1.pdf"]
    assert notified == ["d1.pdf"]
    assert not any(r.levelno >= logging.CRITICAL for r in caplog.records)


# Redeliveries under lock_limit (L7, L8) ------------------------------------------------


@ON_EVERY_BACKEND
def test_a_redelivery_never_takes_a_second_place_beside_its_running_attempt(env):
    gate = Gate()

    @env.actor(lock="while_executing", lock_limit=2, reschedule_delay=50)
    def sync(account_id):
        gate.enter(account_id)

    message = sync.send("acct_1")
    env.worker(threads=4)
    wait_for(lambda: gate.count("acct_1") == 1)
    env.broker.enqueue(message)  # the broker hands the same message out again while it runs
    wait_for(lambda: len(env.seen.skipped) >= 1)
    assert gate.count("acct_1") == 1
    gate.open()
    wait_for(lambda: gate.count("acct_1") == 2)
    env.join(sync)
    assert gate.max_running["acct_1"] == 1


def test_a_group_member_is_never_replaced(callbacks_env):
    env = callbacks_env
    runs = []
    finished = []

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, reschedule_delay=50)
    def resize(image_id, size):
        runs.append((image_id, size))

    @env.actor
    def notify_done():
        finished.append(True)

    members = group([resize.message(1, "s")])
    members.add_completion_callback(notify_done.message())
    members.run()
    newer = resize.send(1, "s")
    assert enqueue_outcome(newer).status == "duplicate"
    env.worker()
    env.join(resize, notify_done)
    assert runs == [(1, "s")]
    assert finished == [True]


@pytest.mark.parametrize("lock", ["until_executing", "until_executed", "until_and_while_executing"])
def test_a_replaced_delayed_message_that_comes_due_leaves_no_place_behind(env, lock):
    # Revision 1 is sent with a delay, revision 2 replaces it and runs. When revision 1 comes
    # due, its move out of the delay queue re-enters the (now free) lock, and at start it is
    # skipped as replaced without giving that place back: the lock stays held by a message
    # that will never run, and an actor sharing the lock drops every send as its duplicate.
    runs = []

    @env.actor(
        lock=lock,
        on_conflict={"client": "replace"},
        unique_across_actors=True,
        lock_args_method=lambda doc_id, revision: [doc_id],
    )
    def render(doc_id, revision):
        runs.append(("render", revision))

    @env.actor(lock=lock, unique_across_actors=True, lock_args_method=lambda doc_id, revision: [doc_id])
    def audit(doc_id, revision):
        runs.append(("audit", revision))

    older = render.send_with_options(args=("d", 1), delay=300)
    newer = render.send("d", 2)
    assert enqueue_outcome(newer).replaced == older.message_id
    env.worker()
    wait_for(lambda: older.message_id in [m.message_id for m in env.seen.skipped])
    env.join(render)
    later = audit.send("d", 3)
    assert enqueue_outcome(later).enqueued, enqueue_outcome(later)
    env.join(audit)
    assert runs == [("render", 2), ("audit", 3)]


def test_an_on_success_callback_that_meets_its_lock_is_rescheduled_not_lost(env, caplog):
    # Dramatiq's Callbacks middleware sends the on_success message from the worker: nobody can
    # catch DuplicateMessage there. It escaped into Dramatiq (CRITICAL "Unexpected failure in
    # after_process_message of Callbacks", with a traceback) and the callback never ran.
    gate = Gate()

    @env.actor(lock="until_executed", on_conflict="raise", reschedule_delay=50, lock_args_method=lambda *args: [])
    def report(message_data, result):
        gate.enter("report")

    @env.actor(on_success="report")
    def work(x):
        pass

    report.send({}, None)  # a report runs already: the lock is held
    env.worker()
    wait_for(lambda: gate.count("report") == 1)
    with caplog.at_level(logging.INFO):
        work.send(1)
        # The callback met the held lock, was enqueued again later, met it again, and so on:
        # twice is enough to see it kept, while the gate still holds the first report.
        wait_for(lambda: len([delay for _, delay in env.seen.enqueues if delay]) >= 2)
        assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]
        gate.open()
        env.join(work, report)
    assert gate.count("report") == 2
