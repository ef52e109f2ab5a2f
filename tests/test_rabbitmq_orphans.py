"""The enqueue lock of a message RabbitMQ lost is freed by the orphan reaper, and the lock of a
message that is queued, delayed, waiting in a worker's memory or running never is (issue 19,
point 3), on a real RabbitMQ with real Workers and real `dramatiq` processes.

RabbitMQ cannot be asked for a message by its id: the reaper counts the messages waiting in the
queue and its delay queue, and each worker publishes with its heartbeat the messages in its hands.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

import dramatiq_unique
from dramatiq_unique import Locks, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.keys import registry_key

from .support import Env, Gate, wait_for
from .test_concurrency import processes, wait_until_ready  # noqa: F401 (fixture)
from .test_crash import kill

HEARTBEAT = 200


def rabbit_env(redis_client, url: str, **options) -> Env:
    broker = RabbitmqBroker(url=url)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    suffix = uuid.uuid4().hex[:8]
    # The reaper's queue is the test's own too: the teardown deletes every queue of the broker.
    middleware = UniqueJobs(
        backend=backend,
        lease_period=1000,
        heartbeat_interval=HEARTBEAT,
        reaper_queue=f"reaper_{suffix}",
        **options,
    )
    return Env("rabbitmq", broker, backend, middleware, queue_suffix=suffix)


@pytest.fixture
def env(redis_client, rabbitmq_url):
    """RabbitmqBroker, UniqueJobs on 1 s leases and 200 ms heartbeats, no periodic reaper:
    the tests run it."""
    yield from rabbit_env(redis_client, rabbitmq_url, reaper_interval=None).run()


def reap(env: Env):
    env.middleware.reaper.min_age = 0
    return env.middleware.reaper.run(broker=env.broker)


def purge(env: Env, actor) -> None:
    env.broker.channel.queue_purge(actor.queue_name)


def send_lost(env: Env, actor, *args):
    """Send a message of ``actor`` and purge it from RabbitMQ once it waits there: a lost message, its lock held."""
    message = actor.send(*args)
    wait_for(lambda: env.waiting(actor) == 1)
    purge(env, actor)
    return message


def test_only_the_lost_message_loses_its_lock_not_those_queued_delayed_waiting_or_running(env, caplog):
    # The message lost to a purge is freed; one waiting in the queue, one delayed in a worker's
    # memory, one prefetched into a worker's work queue and one running keep their locks.
    gate, runs = Gate(), []

    @env.actor(queue_name="reports", lock="until_executed", lock_args_method=lambda day: [day])
    def report(day):
        runs.append(day)
        gate.enter(day)

    lost = send_lost(env, report, "lost")
    queued = report.send("queued")
    wait_for(lambda: env.waiting(report) == 1)
    assert reap(env).released == 0  # a message waits in the queue: nothing can be told yet
    assert not env.is_free(enqueue_outcome(lost).digest)

    env.worker(threads=1)  # one thread, and two messages at most in its hands besides the delayed
    delayed = report.send_with_options(args=("delayed",), delay=60_000)
    wait_for(lambda: gate.count("queued") == 1)  # running
    waiting = report.send("waiting")  # prefetched into the work queue behind the running one
    wait_for(lambda: env.waiting(report) == 0 and env.broker.get_queue_message_counts(report.queue_name)[1] == 0)

    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        report_of_run = reap(env)
    assert report_of_run.released_missing_messages == 1, caplog.text
    assert env.is_free(enqueue_outcome(lost).digest)
    for kept in (queued, delayed, waiting):
        assert not env.is_free(enqueue_outcome(kept).digest), kept.args
    assert reap(env).released == 0

    gate.open()
    wait_for(lambda: sorted(runs) == ["queued", "waiting"])
    assert not env.is_free(enqueue_outcome(delayed).digest)
    assert enqueue_outcome(report.send("lost")).enqueued  # the job can be sent again
    wait_for(lambda: sorted(runs) == ["lost", "queued", "waiting"])


def test_a_worker_that_publishes_nothing_keeps_every_lock(env, caplog):
    # A worker of an earlier release heartbeats without publishing the messages in its hands:
    # the reaper cannot tell where they are, and frees nothing.
    @env.actor(queue_name="reports", lock="until_executed")
    def report(day):
        pass

    lost = send_lost(env, report, "lost")
    env.backend.heartbeat(registry_key("dramatiq-unique"), "older-release", ttl=60_000)
    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        assert reap(env).released == 0
    assert "'older-release' did not publish the messages in their hands in time" in caplog.text
    assert not env.is_free(enqueue_outcome(lost).digest)

    env.backend.forget_workers(registry_key("dramatiq-unique"), worker_id="older-release")
    assert reap(env).released_missing_messages == 1
    assert env.is_free(enqueue_outcome(lost).digest)


def test_a_retry_keeps_its_lock_while_it_waits_in_the_worker_that_failed_it(env):
    # The copy of a retry is published to the delay queue and may reach this worker's delay-queue
    # consumer, under the same message id, before the failed delivery is acknowledged: the ack of
    # that delivery must not take the copy out of the messages in the worker's hands.
    runs = []

    @env.actor(queue_name="jobs", lock="until_executed", max_retries=3, min_backoff=60_000, max_backoff=60_000)
    def job(x):
        runs.append(x)
        raise RuntimeError("fails, and is retried in a minute")

    class SlowErrorReporter(dramatiq.Middleware):
        # Like an error tracker's network call: its after-hook runs after Retries' one, before the ack.
        def after_process_message(self, broker, message, *, result=None, exception=None):
            if exception is not None:
                time.sleep(0.05)

    env.broker.middleware.insert(0, SlowErrorReporter())
    env.worker(threads=1)
    message = job.send("a")
    env.wait_for_retry(message)
    counts = env.broker.get_queue_message_counts
    wait_for(lambda: runs == ["a"] and counts(job.queue_name)[:2] == (0, 0))  # the copy is in the worker
    time.sleep(3 * HEARTBEAT / 1000)
    assert reap(env).released == 0
    assert not env.is_free(enqueue_outcome(message).digest)


@pytest.mark.slow
def test_a_purged_messages_lock_is_freed_by_the_periodic_reaper_within_the_bound(redis_client, rabbitmq_url, caplog):
    # Nobody acts: a worker runs, the reaper actor is sent every second, and the lock of the purged
    # message goes once it is ten seconds old (the reaper never takes a younger one) at the next
    # run. The documented bound: its age of ten seconds, plus one reaper interval, plus the few
    # heartbeat intervals one run waits for the workers' publications.
    interval = 1000
    env = rabbit_env(redis_client, rabbitmq_url, reaper=True, reaper_interval=interval)
    runs = env.run()
    next(runs)
    try:

        @env.actor(queue_name="reports", lock="until_executed")
        def report(day):
            pass

        sent_at = time.monotonic()
        lost = report.send("2026-12-01")
        wait_for(lambda: env.waiting(report) == 1)
        purge(env, report)
        env.worker(threads=2)
        duplicate = report.send("2026-12-01")
        assert not enqueue_outcome(duplicate).enqueued  # held until the reaper frees it
        bound = 10 + interval / 1000 + 6 * HEARTBEAT / 1000 + 2
        wait_for(lambda: env.is_free(enqueue_outcome(lost).digest), timeout=bound + 10)
        freed_after = time.monotonic() - sent_at
        print(f"\nThe purged message's enqueue lock was freed {freed_after:.1f} s after its send (bound {bound:.1f} s)")
        assert freed_after <= bound
        assert enqueue_outcome(report.send("2026-12-01")).enqueued
    finally:
        next(runs, None)


#: The module a `dramatiq` worker process runs on RabbitMQ: `settle` marks in Redis that it
#: started, then sleeps (the test kills the process meanwhile).
WORKER_SCRIPT = """
import os, time
import dramatiq, redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
client = redis.Redis.from_url(URL)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        client.rpush("test:ready", os.getpid())


broker = RabbitmqBroker(url=os.environ["UNIQUE_TEST_RABBITMQ_URL"])
unique = UniqueJobs(backend=RedisBackend(url=URL), lease_period=1000, heartbeat_interval=200, reaper_interval=None)
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, queue_name=os.environ["UNIQUE_TEST_QUEUE"], lock="until_executed", time_limit=120_000)
def settle(event_id):
    client.rpush("test:started", event_id)
    time.sleep(60)
"""


@pytest.mark.slow
def test_a_killed_workers_messages_keep_their_locks_while_rabbitmq_redelivers_them(
    env,
    redis_client,
    redis_url,
    rabbitmq_url,
    processes,  # noqa: F811
    tmp_path,
):
    # A `dramatiq` process holds a running message, one prefetched and one delayed; it is
    # SIGKILLed and RabbitMQ gives the three back. The reaper, run again and again meanwhile and
    # once a new worker holds them, frees none of their locks; duplicates sent meanwhile are
    # refused, and each message runs once.
    queue = f"payments_{env.queue_suffix}"
    gate, ran = Gate(), []

    @env.actor(actor_name="settle", queue_name="payments", lock="until_executed", time_limit=120_000)
    def settle(event_id):
        ran.append(event_id)
        gate.enter(event_id)

    (tmp_path / "settling.py").write_text(WORKER_SCRIPT)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        ["-m", "dramatiq", "settling:broker", "--processes", "1", "--threads", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        UNIQUE_TEST_RABBITMQ_URL=rabbitmq_url,
        UNIQUE_TEST_QUEUE=queue,
        PYTHONPATH=path,
    )
    wait_until_ready(redis_client, [cli])
    cli.worker_pid = int(redis_client.lindex("test:ready", 0))

    messages = [settle.send("evt_running")]
    wait_for(lambda: redis_client.llen("test:started") == 1)
    messages += [settle.send("evt_waiting"), settle.send_with_options(args=("evt_delayed",), delay=3_000)]
    counts = env.broker.get_queue_message_counts
    wait_for(lambda: counts(queue)[:2] == (0, 0))  # all three in the worker process's hands
    assert reap(env).released == 0
    kill(cli)

    # RabbitMQ gives them back at once; the killed worker counts as alive for one more lease
    # period, then as dead, which keeps the reaper from deciding until it is forgotten.
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert reap(env).released == 0
        for message in messages:
            assert not enqueue_outcome(settle.send(*message.args)).enqueued
    assert sum(counts(queue)[:2]) == 3
    registry = registry_key("dramatiq-unique")
    assert env.backend.forget_workers(registry, before=env.backend.time()) == 1  # as the reaper does 5 min on
    assert reap(env).released == 0  # they wait in their queues

    env.worker(threads=2)
    wait_for(lambda: gate.count("evt_running") + gate.count("evt_waiting") == 2)
    wait_for(lambda: counts(queue)[:2] == (0, 0))
    assert reap(env).released == 0  # now in the new worker's hands
    for message in messages:
        assert not env.is_free(enqueue_outcome(message).digest)
    gate.open()
    env.join(settle)
    assert sorted(ran) == ["evt_delayed", "evt_running", "evt_waiting"]
    assert redis_client.llen("test:started") == 1  # the killed process ran only the first, unfinished
    for message in messages:
        assert env.is_free(enqueue_outcome(message).digest)


def test_the_operations_api_tells_a_lost_message_on_rabbitmq(env):
    # Locks.in_broker, which explain and the web page read: a purged message is no longer in the
    # broker; while its queue has a message waiting, nothing can be told and both count as there.
    @env.actor(queue_name="reports", lock="until_executed")
    def report(day):
        pass

    lost = send_lost(env, report, "lost")
    locks = Locks.from_middleware(env.middleware)
    assert {message_id: there for (_, message_id), there in locks.in_broker(locks.list(), env.broker).items()} == {
        lost.message_id: False
    }
    queued = report.send("queued")
    wait_for(lambda: env.waiting(report) == 1)
    answers = {message_id: there for (_, message_id), there in locks.in_broker(locks.list(), env.broker).items()}
    assert answers == {lost.message_id: True, queued.message_id: True}
