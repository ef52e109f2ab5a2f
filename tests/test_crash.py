"""Crashes: worker processes killed with SIGKILL while they run a message (SPEC R1, R6).

The workers are real OS processes with their own broker and middleware, as in
production; the test kills them and then watches what a user would: whether the
next job for the same key runs, and when; whether a message runs exactly once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker

import dramatiq_unique
from dramatiq_unique import InvalidLockOptions, RedisBackend, StubBackend, UniqueJobs, current_lock, enqueue_outcome

from .support import Env, Gate, wait_for
from .test_concurrency import processes, wait_until_ready  # noqa: F401 (fixture)

#: One lock per account, whichever actor and queue: the worker process holds it with an actor
#: of its own queue, so that it never prefetches the test's messages.
ACCOUNT_LOCK = dict(
    lock="while_executing",
    lock_args_method=lambda key, attempt: key,
    unique_across_actors=True,
    unique_across_queues=True,
)

#: Tests use a lease of one second (the default is 30 s).
LEASE = 1000
HEARTBEAT = 200

#: The module a `dramatiq` worker process runs: its actors mark in Redis that they started, then
#: sleep (the test kills the process meanwhile).
WORKER_SCRIPT = """
import os, time
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
client = redis.Redis.from_url(URL)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        client.rpush("test:ready", os.getpid())


#: One lock per account, whichever actor and queue (the test's own actor shares it).
ACCOUNT_LOCK = dict(
    lock="while_executing",
    lock_args_method=lambda key, attempt: key,
    unique_across_actors=True,
    unique_across_queues=True,
)
broker = RedisBroker(url=URL)
unique = UniqueJobs(backend=RedisBackend(url=URL), lease_period=1000, heartbeat_interval=200)
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, queue_name="crash", max_retries=0, **ACCOUNT_LOCK)
def hold(key, attempt):
    client.rpush("test:started", key)
    time.sleep(60)


@dramatiq.actor(broker=broker, queue_name="payments", lock="until_executed", time_limit=120_000)
def settle(event_id):
    client.rpush("test:started", event_id)
    time.sleep(60)
    client.rpush("test:done", event_id)


@dramatiq.actor(
    broker=broker, queue_name="payments", lock="until_executed", on_conflict={"client": "replace"}, time_limit=120_000
)
def publish(doc_id):
    client.rpush("test:started", doc_id)
    time.sleep(60)

"""


@pytest.fixture
def lease_env(redis_client):
    """RedisBroker with UniqueJobs on 1 s leases. (RedisBroker.join would wait for the
    killed worker's message, so tests wait for what they expect instead.)"""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=LEASE, heartbeat_interval=HEARTBEAT))
    yield from env.run()


@pytest.fixture
def crash_env(redis_client):
    """RedisBroker that notices a dead worker after 1 s and redelivers its messages at
    once (maintenance on every 2nd fetch), with UniqueJobs on 1 s leases."""
    broker = RedisBroker(client=redis_client, heartbeat_timeout=1000, maintenance_chance=500_000)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=LEASE, heartbeat_interval=HEARTBEAT))
    yield from env.run()


def start_worker(processes, tmp_path, redis_url, client):  # noqa: F811
    """Start `dramatiq crashing:broker` (one worker process of one thread)."""
    (tmp_path / "crashing.py").write_text(WORKER_SCRIPT)
    # The package under test, wherever it is imported from here.
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        ["-m", "dramatiq", "crashing:broker", "--processes", "1", "--threads", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
    )
    wait_until_ready(client, [cli])
    cli.worker_pid = int(client.lindex("test:ready", 0))
    return cli


def kill(cli) -> float:
    """SIGKILL the worker process (not the CLI's main process)."""
    pid = cli.worker_pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        cli.log.seek(0)
        raise AssertionError(f"the worker process was gone before the kill: {cli.log.read().decode()}") from None

    def dead() -> bool:
        try:
            return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        except (FileNotFoundError, ProcessLookupError):
            return True  # the dramatiq CLI's main process reaped it (maybe as its stat was read)

    wait_for(dead)
    return time.monotonic()


@pytest.mark.slow
def test_a_killed_workers_run_lock_is_free_within_one_lease_period(
    lease_env,
    redis_url,
    processes,  # noqa: F811
    tmp_path,
):
    # R1: while the worker lives, it renews its lease well past the lease period; once it is
    # SIGKILLed, the next job for the same key runs within one lease period.
    env, client = lease_env, lease_env.broker.client
    worker = start_worker(processes, tmp_path, redis_url, client)
    gate = Gate()

    @env.actor(actor_name="hold", queue_name="crash", max_retries=0, **ACCOUNT_LOCK)
    def hold(key, attempt):
        raise AssertionError("runs in the worker process only")

    @env.actor(actor_name="sync", max_retries=0, **ACCOUNT_LOCK)
    def sync(key, attempt):
        gate.enter((key, attempt))

    digest = enqueue_outcome(hold.send("acct_1", 0)).digest
    wait_for(lambda: client.llen("test:started") == 1)
    env.worker(threads=1)
    time.sleep(2.5 * LEASE / 1000)  # two and a half lease periods: only renewals keep the lock
    sync.send("acct_1", 1)
    wait_for(lambda: len(env.seen.skipped) == 1)
    assert gate.runs == []  # the duplicate met the lock and was dropped
    assert not env.is_free(digest, run=True)

    killed_at = kill(worker)
    attempt = 2
    while not gate.runs:
        sync.send("acct_1", attempt)
        attempt += 1
        time.sleep(0.02)
    recovered = time.monotonic() - killed_at
    gate.open()
    print(f"\nR1: a new while_executing job ran {recovered:.2f} s after the worker was killed (lease {LEASE} ms)")
    assert recovered < LEASE / 1000 + 0.5  # the lease, plus a worker's fetch and our polling
    assert len(gate.runs) == 1


@pytest.mark.slow
def test_a_killed_workers_until_executed_message_is_redelivered_and_runs_once(
    crash_env,
    redis_url,
    processes,  # noqa: F811
    tmp_path,
):
    # R1/R3 for until_executed: the enqueue lock outlives the killed worker (no TTL), so a
    # duplicate sent meanwhile is refused; RedisBroker redelivers the message, which passes
    # its own lock, completes once and frees the lock.
    env, client = crash_env, crash_env.broker.client
    worker = start_worker(processes, tmp_path, redis_url, client)
    ran = []

    @env.actor(actor_name="settle", queue_name="payments", lock="until_executed", time_limit=120_000)
    def settle(event_id):
        ran.append(current_lock().message_id)

    message = settle.send("evt_1")
    digest = enqueue_outcome(message).digest
    wait_for(lambda: client.llen("test:started") == 1)
    killed_at = kill(worker)
    duplicate = settle.send("evt_1")
    assert not enqueue_outcome(duplicate).enqueued
    assert enqueue_outcome(duplicate).holder == message.message_id

    env.worker(threads=1)
    wait_for(lambda: ran, timeout=20)
    redelivered = time.monotonic() - killed_at
    env.join(settle)
    print(f"\nR1: the killed worker's until_executed message ran {redelivered:.2f} s after the kill")
    assert ran == [message.message_id]
    assert client.llen("test:done") == 0  # the killed attempt never completed
    assert env.is_free(digest)
    assert enqueue_outcome(settle.send("evt_1")).enqueued


def kill_while_publishing(env, worker, client):
    """Send ``publish`` (until_executed, replace), SIGKILL the worker process once the message
    runs there, and return the actor, the message and the list of its runs in this process."""
    ran = []

    @env.actor(
        actor_name="publish",
        queue_name="payments",
        lock="until_executed",
        on_conflict={"client": "replace"},
        time_limit=120_000,
    )
    def publish(doc_id):
        ran.append(current_lock().message_id)

    message = publish.send("doc_1")
    wait_for(lambda: client.llen("test:started") == 1)
    kill(worker)
    return publish, message, ran


@pytest.mark.slow
def test_the_reaper_keeps_the_lock_of_a_killed_workers_message_that_is_redelivered(
    crash_env,
    redis_url,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 8, defect 2 (R2, R3): with replace, an until_executed message records its enqueue lock
    # as running when it starts. Once its worker is SIGKILLed, the reaper asks the broker, which
    # still has the message (it is redelivered), so the lock stays: a duplicate sent meanwhile is
    # refused, and the redelivered original runs once.
    env, client = crash_env, crash_env.broker.client
    worker = start_worker(processes, tmp_path, redis_url, client)
    publish, message, ran = kill_while_publishing(env, worker, client)
    digest = enqueue_outcome(message).digest
    time.sleep(2 * LEASE / 1000)  # the killed worker is dead by its lease

    env.middleware.reaper.min_age = 0
    report = env.middleware.reaper.run(broker=env.broker)
    assert report.complete and report.released == 0
    assert not env.is_free(digest)
    duplicate = publish.send("doc_1")
    assert not enqueue_outcome(duplicate).enqueued
    assert enqueue_outcome(duplicate).holder == message.message_id

    env.worker(threads=1)
    wait_for(lambda: ran, timeout=20)
    env.join(publish)
    assert ran == [message.message_id]
    assert env.is_free(digest)


@pytest.mark.slow
def test_the_reaper_frees_the_lock_of_a_killed_workers_message_that_was_purged(
    crash_env,
    redis_url,
    processes,  # noqa: F811
    tmp_path,
):
    # Issue 8, defect 2 (R2): recorded as running, the enqueue lock still names the message's
    # RedisBroker id, so once the broker has lost the message (a purge after the crash), the
    # reaper frees the lock and the job can be sent again.
    env, client = crash_env, crash_env.broker.client
    worker = start_worker(processes, tmp_path, redis_url, client)
    publish, message, ran = kill_while_publishing(env, worker, client)
    env.broker.flush("payments")

    env.middleware.reaper.min_age = 0
    report = env.middleware.reaper.run(broker=env.broker)
    assert report.released_missing_messages == 1
    assert env.is_free(enqueue_outcome(message).digest)
    again = publish.send("doc_1")
    assert enqueue_outcome(again).enqueued

    env.worker(threads=1)
    env.join(publish)
    assert ran == [again.message_id]


# Leases in one process, on both backends --------------------------------------------


@pytest.fixture(params=["stub", "redis"])
def short_lease_env(request):
    """Both backends, with 300 ms leases renewed every 100 ms heartbeat."""
    if request.param == "stub":
        broker, backend = StubBroker(), StubBackend()
    else:
        client = request.getfixturevalue("redis_client")
        broker, backend = RedisBroker(client=client), RedisBackend(client=client)
    broker.emit_after("process_boot")
    env = Env(request.param, broker, backend, UniqueJobs(backend=backend, lease_period=300, heartbeat_interval=100))
    yield from env.run()


@pytest.mark.parametrize("lock_ttl", [None, 250])
def test_a_running_message_keeps_its_run_lock_past_the_lease_but_not_past_lock_ttl(short_lease_env, lock_ttl):
    # R1: the heartbeat thread renews the lease while the actor runs (three lease periods
    # here); lock_ttl still ends the run lock, renewals never go past it.
    env = short_lease_env
    gate = Gate()

    @env.actor(lock="while_executing", lock_ttl=lock_ttl, lock_args_method=lambda key, n: key)
    def sync(key, n):
        gate.enter(n, hold=0.9 if n == 0 else 0)

    gate.open()
    sync.send("acct_1", 0)
    env.worker(threads=2)
    wait_for(lambda: gate.runs == [0])
    time.sleep(0.5)  # past the lease and past lock_ttl, while run 0 still runs
    sync.send("acct_1", 1)
    env.join(sync)
    assert gate.runs == ([0] if lock_ttl is None else [0, 1])


def test_crash_options_are_validated():
    with pytest.raises(InvalidLockOptions, match="lease_period"):
        UniqueJobs(backend=StubBackend(), lease_period=0)
    with pytest.raises(InvalidLockOptions, match="at most a third of the lease period"):
        UniqueJobs(backend=StubBackend(), lease_period=1000, heartbeat_interval=500)
    with pytest.raises(InvalidLockOptions, match="on_backend_error"):
        UniqueJobs(backend=StubBackend(), on_backend_error="ignore")
    with pytest.raises(InvalidLockOptions, match="reaper_interval"):
        UniqueJobs(backend=StubBackend(), reaper=True, reaper_interval=0)
