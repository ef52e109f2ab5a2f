"""A worker cut off from the lock store while it keeps its broker (issue 32, point 7).

The lock store is reached through a TCP proxy the test cuts; the broker is reached directly. What a
user notices is recorded by the actors in Redis, apart from the locks: each run, and what went to
the dead-letter queue.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

from .proxy import TcpProxy
from .support import Env, wait_for
from .test_concurrency import processes  # noqa: F401 (fixture)
from .test_lines_crash import WORKER_PREAMBLE, start_worker

#: The worker's lease period and heartbeat interval (ms): it is cut off a second after the cut.
LEASE, HEARTBEAT = 1000, 200

CUT_OFF = "has not reached the lock store for"
BACK = "reaches the lock store again"
#: The lock options of ``job``, in every worker.
JOB_OPTIONS = {"lock": "until_executed", "max_retries": 0, "reschedule_delay": 300}
GIVEN_BACK = "is enqueued again to start in 300 ms: this worker cannot reach the lock store"

WORKER_SCRIPT = (
    WORKER_PREAMBLE
    + f"""
broker = RedisBroker(url=URL)
unique = UniqueJobs(
    backend=RedisBackend(url=os.environ["STORE_URL"], socket_timeout=1), lease_period={LEASE},
    heartbeat_interval={HEARTBEAT},
)
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, queue_name="jobs", **{JOB_OPTIONS!r})
def job(n):
    client.rpush("test:runs", f"job {{n}}")


@dramatiq.actor(broker=broker, queue_name="jobs")
def plain(n):
    client.rpush("test:runs", f"plain {{n}}")
"""
)


@pytest.fixture
def proxy(redis_server):
    proxy = TcpProxy((redis_server.host, redis_server.port))
    yield proxy
    proxy.close()


def runs(client) -> list[str]:
    return [run.decode() for run in client.lrange("test:runs", 0, -1)]


def declare(broker, queue_name: str = "jobs") -> tuple[dramatiq.Actor, dramatiq.Actor]:
    """The worker's two actors, declared on a sender's ``broker`` with the same options."""
    job = dramatiq.actor(lambda n: None, actor_name="job", broker=broker, queue_name=queue_name, **JOB_OPTIONS)
    plain = dramatiq.actor(lambda n: None, actor_name="plain", broker=broker, queue_name=queue_name)
    return job, plain


@pytest.mark.slow
def test_a_worker_process_cut_off_from_the_lock_store_runs_no_job_with_a_lock_until_it_answers(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    proxy,
):
    # Issue 32 (7): a worker that could not reach the lock store kept taking work: each message
    # with a lock failed to take it, used up its retries and went to the dead-letter queue.
    worker = start_worker(
        processes, tmp_path, redis_url, redis_client, script=WORKER_SCRIPT, module="jobs", STORE_URL=proxy.url
    )
    log = Path(worker.log.name)
    job, plain = declare(_sender(redis_client))
    job.send(1)
    wait_for(lambda: runs(redis_client) == ["job 1"])

    proxy.cut()
    wait_for(lambda: CUT_OFF in log.read_text(), timeout=15)
    second = job.send(2)
    plain.send(1)
    wait_for(lambda: "plain 1" in runs(redis_client))  # a job without a lock runs
    wait_for(lambda: GIVEN_BACK in log.read_text())
    time.sleep(3 * LEASE / 1000)
    assert runs(redis_client) == ["job 1", "plain 1"]
    assert redis_client.llen("dramatiq:jobs.XQ") == 0 and redis_client.zcard("dramatiq:jobs.XQ") == 0
    # The copy sent again is a duplicate: the second message still holds its lock.
    assert enqueue_outcome(job.send(2)).status == "duplicate"

    proxy.restore()
    wait_for(lambda: runs(redis_client) == ["job 1", "plain 1", "job 2"], timeout=20)
    text = log.read_text()
    assert text.count(CUT_OFF) == 1 and "[ERROR]" in text.split(CUT_OFF)[0].splitlines()[-1]
    assert BACK in text
    assert enqueue_outcome(second).status == "enqueued"
    time.sleep(1)
    assert runs(redis_client) == ["job 1", "plain 1", "job 2"]


@pytest.fixture
def rabbitmq_env_through(redis_client, rabbitmq_url, proxy):
    """RabbitmqBroker with a RedisBackend reached through the proxy. Redis is flushed after its
    worker stopped: a flush under a running worker is a loss of the store's data, which it heals."""
    broker = RabbitmqBroker(url=rabbitmq_url)
    broker.emit_after("process_boot")
    backend = RedisBackend(url=proxy.url, socket_timeout=1)
    unique = UniqueJobs(backend=backend, lease_period=LEASE, heartbeat_interval=HEARTBEAT)
    yield from Env("rabbitmq", broker, backend, unique, queue_suffix=uuid.uuid4().hex[:8]).run()


def test_a_rabbitmq_worker_cut_off_from_the_lock_store_gives_its_messages_with_locks_back(
    rabbitmq_env_through, rabbitmq_url, redis_client, proxy, caplog
):
    # Issue 32 (7), on RabbitMQ: each message with a lock it receives goes back to the broker, the others run.
    caplog.set_level(logging.INFO, logger="dramatiq_unique")
    env = rabbitmq_env_through
    ran: list[str] = []
    job = env.actor(lambda n: ran.append(f"job {n}"), actor_name="job", queue_name="jobs", **JOB_OPTIONS)
    env.actor(lambda n: ran.append(f"plain {n}"), actor_name="plain", queue_name="jobs")
    worker = Worker(env.broker, worker_timeout=100, worker_threads=2)
    worker.start()
    env.workers.append(worker)
    proxy.cut()
    wait_for(lambda: CUT_OFF in caplog.text, timeout=15)
    # Sent through a broker of its own, whose lock store answers.
    sender = RabbitmqBroker(url=rabbitmq_url)
    sender.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    try:
        sent_job, sent_plain = declare(sender, job.queue_name)
        sent_job.send(1)
        sent_plain.send(1)
        wait_for(lambda: ran == ["plain 1"])
        wait_for(lambda: GIVEN_BACK in caplog.text)
        time.sleep(3 * LEASE / 1000)
        assert ran == ["plain 1"]
        proxy.restore()
        wait_for(lambda: sorted(ran) == ["job 1", "plain 1"], timeout=20)
        assert BACK in caplog.text
        assert env.broker.get_queue_message_counts(job.queue_name)[2] == 0  # nothing dead-lettered
    finally:
        sender.close()


def test_a_worker_that_boots_without_its_lock_store_runs_no_job_with_a_lock_until_it_answers(
    redis_client, proxy, caplog
):
    # Issue 32 (7): a worker that booted while its lock store was away counted as cut off only a
    # lease period later; meanwhile each message with a lock used up its retries.
    caplog.set_level(logging.INFO, logger="dramatiq_unique")
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(url=proxy.url, socket_timeout=1)
    unique = UniqueJobs(backend=backend, lease_period=60_000, heartbeat_interval=HEARTBEAT)
    with Env("redis", broker, backend, unique).running() as env:
        ran: list[int] = []
        env.actor(lambda n: ran.append(n), actor_name="job", queue_name="jobs", **JOB_OPTIONS)
        proxy.cut()
        worker = Worker(env.broker, worker_timeout=100, worker_threads=2)
        worker.start()
        env.workers.append(worker)
        assert "cannot reach the lock store as it boots" in caplog.text
        sent_job, _ = declare(_sender(redis_client), "jobs")
        sent_job.send(1)
        wait_for(lambda: GIVEN_BACK in caplog.text)
        assert ran == [] and redis_client.zcard("dramatiq:jobs.XQ") == 0
        proxy.restore()
        wait_for(lambda: ran == [1], timeout=20)
        assert "reaches the lock store: it runs messages with locks again." in caplog.text


def _sender(redis_client) -> RedisBroker:
    """A broker of its own, whose lock store answers."""
    sender = RedisBroker(client=redis_client)
    sender.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    return sender
