"""cancel_in_progress with real `dramatiq` worker processes and a real redis-server (issue 35).

What a user notices is recorded by the actor itself in a Redis list, apart from the locks: each
run's start, its normal end ("done") and its `finally` ("end"), with the time of each."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.results import ResultFailure, Results
from dramatiq.results.backends import RedisBackend as RedisResults

import dramatiq_unique
from dramatiq_unique import ConflictInfo, Locks, RedisBackend, UniqueJobs
from dramatiq_unique.presentation import holder_phrase

from .support import wait_for
from .test_concurrency import processes  # noqa: F401 (fixture)
from .test_lines_crash import WORKER_PREAMBLE, start_worker

#: The worker's heartbeat interval (ms): a cancel_in_progress holder's lease is renewed at each
#: heartbeat, so a request to stop reaches it within about one interval.
HEARTBEAT = 500

WORKER_SCRIPT = (
    WORKER_PREAMBLE
    + f"""
import asyncio
from dramatiq.middleware.asyncio import AsyncIO
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend as RedisResults

broker = RedisBroker(url=URL)
unique = UniqueJobs(
    backend=RedisBackend(url=URL), lease_period=3000, heartbeat_interval={HEARTBEAT}, reaper=True,
    reaper_interval=1000,
)
unique.reaper.min_age = 1000
# The cancelled events, as a subscriber sees them.
unique.subscribe("cancelled", lambda e: client.rpush("test:cancelled", f"{{e.message_id}} {{e.cancelled_by}}"))
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Results(backend=RedisResults(client=client)))
broker.add_middleware(Ready())
broker.add_middleware(AsyncIO())


@dramatiq.actor(
    broker=broker, queue_name="deploys", lock="until_and_while_executing", on_conflict="cancel_in_progress",
    lock_args_method=lambda app, seq: [app], max_retries=3, min_backoff=100, max_backoff=200, store_results=True,
)
def deploy(app, seq):
    client.rpush("test:runs", f"start {{seq}} {{time.time()}}")
    try:
        until = time.time() + (60 if seq == 0 else 0.3)
        while time.time() < until:
            time.sleep(0.01)
        client.rpush("test:runs", f"done {{seq}} {{time.time()}}")
        return seq
    finally:
        client.rpush("test:runs", f"end {{seq}} {{time.time()}}")


@dramatiq.actor(broker=broker, queue_name="deploys", lock="while_executing", lock_args_method=lambda app, seq: [app])
def reindex(app, seq):
    deploy.fn(app, seq)


@dramatiq.actor(
    broker=broker, queue_name="deploys", lock="while_executing", on_conflict="cancel_in_progress",
    lock_args_method=lambda app, seq: [app],
)
async def deploy_async(app, seq):
    client.rpush("test:runs", f"start {{seq}} {{time.time()}}")
    try:
        await asyncio.sleep(60 if seq == 0 else 0.3)
        client.rpush("test:runs", f"done {{seq}} {{time.time()}}")
    except asyncio.CancelledError:
        client.rpush("test:runs", f"cancelled {{seq}} {{time.time()}}")
        raise
    finally:
        client.rpush("test:runs", f"end {{seq}} {{time.time()}}")
"""
)


@pytest.fixture
def worker(processes, tmp_path, redis_url, redis_client):  # noqa: F811
    return lambda: start_worker(processes, tmp_path, redis_url, redis_client, script=WORKER_SCRIPT, module="deploys")


@pytest.fixture
def deploy(redis_client):
    """The test's own broker, declaring the worker's actor with the same lock options."""
    broker = RedisBroker(client=redis_client)
    broker.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    broker.add_middleware(Results(backend=RedisResults(client=redis_client)))
    return dramatiq.actor(
        lambda app, seq: None,
        actor_name="deploy",
        broker=broker,
        queue_name="deploys",
        lock="until_and_while_executing",
        on_conflict="cancel_in_progress",
        lock_args_method=lambda app, seq: [app],
        store_results=True,
    )


def runs(client) -> list[tuple[str, int, float]]:
    entries = [run.decode().split() for run in client.lrange("test:runs", 0, -1)]
    return [(what, int(seq), float(at)) for what, seq, at in entries]


def events(client) -> list[str]:
    return [f"{what} {seq}" for what, seq, _ in runs(client)]


def cancelled_events(client) -> list[str]:
    """The cancelled events the worker's subscriber saw: the message and who asked it to stop."""
    return [event.decode() for event in client.lrange("test:cancelled", 0, -1)]


def log_of(process) -> str:
    """What a process wrote so far (stdout and stderr)."""
    return Path(process.log.name).read_text()


def trail(client, actor: str) -> list[ConflictInfo]:
    """The conflict trail of ``actor`` once the worker's periodic thread wrote its cancelled entry."""

    def cancelled() -> list[ConflictInfo]:
        return [e for e in Locks(RedisBackend(client=client)).history(actor) if e.outcome == "cancelled"]

    wait_for(lambda: cancelled() != [], timeout=10)
    return cancelled()


def assert_never_overlapping(client) -> None:
    """Each run ends (its `finally`) before the next one starts."""
    kinds = [what for what, _, _ in runs(client) if what not in ("done", "cancelled")]
    assert kinds == ["start", "end"] * (len(kinds) // 2), events(client)


@pytest.mark.slow
def test_a_newer_send_interrupts_the_running_holder_and_runs_once_after_it(worker, deploy, redis_client):
    worker()
    first = deploy.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    sent_at = time.time()
    second = deploy.send("shop", 1)
    wait_for(lambda: "end 0" in events(redis_client), timeout=10)
    ended_at = next(at for what, seq, at in runs(redis_client) if (what, seq) == ("end", 0))
    # Within the documented bound: one heartbeat interval, and the time for the newer message
    # to reach the worker and for the next heartbeat's renewal; never the 60 s of the job.
    print(f"interrupted {ended_at - sent_at:.3f} s after the newer send")
    assert ended_at - sent_at < 2 * HEARTBEAT / 1000 + 1
    wait_for(lambda: "end 1" in events(redis_client), timeout=10)
    time.sleep(1)  # a retry of the cancelled message would run by now (backoff 100-200 ms)
    assert events(redis_client) == ["start 0", "end 0", "start 1", "done 1", "end 1"]
    assert_never_overlapping(redis_client)
    # The caller of the first waits for its result: a clear error, not a timeout.
    with pytest.raises(ResultFailure, match="Cancelled"):
        first.get_result(backend=RedisResults(client=redis_client), block=True, timeout=5000)
    # The newer one was handed the place by the line: its result is its copy's; the run says it ran.
    assert second.message_id


@pytest.mark.slow
def test_the_worker_log_the_event_and_the_trail_name_the_newer_message_that_cancelled_the_run(
    worker, deploy, redis_client
):
    """Issue 35, point 3: the cancelled message's outcome says by which message."""
    process = worker()
    first = deploy.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    second = deploy.send("shop", 1)
    wait_for(lambda: "end 1" in events(redis_client), timeout=10)
    by = f"message {second.message_id}"
    # The worker process's lines reach the log through dramatiq's main process: soon after.
    wait_for(lambda: "is neither retried nor dead-lettered" in log_of(process), timeout=10)
    log = log_of(process)
    assert f"Message {first.message_id!r} of actor 'deploy' was asked to stop by {by} while it ran" in log
    assert f"{first.message_id!r} of actor 'deploy' was cancelled while it ran: it was asked to stop by {by}" in log
    assert cancelled_events(redis_client) == [f"{first.message_id} {by}"]
    (entry,) = trail(redis_client, "deploy")
    assert (entry.message_id, entry.cancelled_by) == (first.message_id, by)
    assert holder_phrase(entry, full=True) == f"asked to stop by {by}"
    # The middleware's lines tell it: neither Dramatiq's ERROR with a traceback nor Retries' line
    # of a retry that is dropped.
    assert f"Message {first.message_id!r} of actor 'deploy' is not retried: it was cancelled." in log
    assert "Failed to process message" not in log and "Traceback" not in log, log
    assert f"Retrying message {first.message_id!r}" not in log, log


@pytest.mark.slow
def test_a_burst_of_newer_sends_during_a_run_makes_exactly_one_more_run_the_last(worker, deploy, redis_client):
    worker()
    deploy.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    for seq in range(1, 21):
        deploy.send("shop", seq)
    wait_for(lambda: "end 20" in events(redis_client), timeout=20)
    time.sleep(1.5)
    assert events(redis_client) == ["start 0", "end 0", "start 20", "done 20", "end 20"]
    assert_never_overlapping(redis_client)


@pytest.mark.slow
def test_a_sigkilled_holder_cannot_be_interrupted_its_lease_lapses_and_the_newer_runs(worker, deploy, redis_client):
    first = worker()
    deploy.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    os.kill(first.worker_pid, signal.SIGKILL)
    worker()
    deploy.send("shop", 1)
    wait_for(lambda: "end 1" in events(redis_client), timeout=30)
    assert events(redis_client) == ["start 0", "start 1", "done 1", "end 1"]


@pytest.mark.slow
def test_a_newer_send_cancels_the_task_of_a_running_async_actor(worker, deploy, redis_client):
    deploy_async = dramatiq.actor(
        lambda app, seq: None,
        actor_name="deploy_async",
        broker=deploy.broker,
        queue_name="deploys",
        lock="while_executing",
        on_conflict="cancel_in_progress",
        lock_args_method=lambda app, seq: [app],
    )
    worker()
    deploy_async.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    sent_at = time.time()
    deploy_async.send("shop", 1)
    wait_for(lambda: "end 1" in events(redis_client), timeout=10)
    ended_at = next(at for what, seq, at in runs(redis_client) if (what, seq) == ("end", 0))
    assert ended_at - sent_at < 2 * HEARTBEAT / 1000 + 1
    time.sleep(1)
    assert events(redis_client) == ["start 0", "cancelled 0", "end 0", "start 1", "done 1", "end 1"]
    assert_never_overlapping(redis_client)


GEVENT_SCRIPT = (
    WORKER_PREAMBLE
    + f"""


class AppConnection(redis.Connection):
    pass


broker = RedisBroker(url=URL)
unique = UniqueJobs(backend=BACKEND, lease_period=3000, heartbeat_interval={HEARTBEAT})
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(
    broker=broker, queue_name="deploys", lock="while_executing", on_conflict="cancel_in_progress",
    lock_args_method=lambda app, seq: [app],
)
def deploy(app, seq):
    client.rpush("test:runs", f"start {{seq}} {{time.time()}}")
    try:
        time.sleep(60 if seq == 0 else 0.3)  # waits on the gevent hub
        client.rpush("test:runs", f"done {{seq}} {{time.time()}}")
    finally:
        client.rpush("test:runs", f"end {{seq}} {{time.time()}}")
"""
)

#: The worker's lock backend: a plain URL, whose leases a native thread renews, and a client of a
#: connection class of the application's own, whose leases a greenlet renews.
GEVENT_BACKENDS = {
    "native": "RedisBackend(url=URL)",
    "greenlet": "RedisBackend(client=redis.Redis(connection_pool=redis.ConnectionPool.from_url(URL, "
    "connection_class=AppConnection)))",
}


@pytest.mark.slow
@pytest.mark.parametrize("renewals", ["native", "greenlet"])
def test_under_gevent_a_newer_send_kills_the_holders_greenlet_and_runs_once_after_it(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    deploy,
    renewals,
):
    """Issue 35, point 2: under dramatiq-gevent the holder's greenlet is killed with Cancelled
    within the documented bound, its `finally` runs, and the newer message runs once after it,
    never beside it; whether a native thread or a greenlet renews the leases."""
    pytest.importorskip("gevent")
    (tmp_path / "gdeploys.py").write_text(GEVENT_SCRIPT.replace("BACKEND", GEVENT_BACKENDS[renewals]))
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        [str(Path(sys.executable).parent / "dramatiq-gevent"), "gdeploys:broker", "--processes", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
    )
    wait_for(lambda: redis_client.llen("test:ready") == 1, timeout=30)
    deploy.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    sent_at = time.time()
    deploy.send("shop", 1)
    wait_for(lambda: "end 0" in events(redis_client), timeout=10)
    ended_at = next(at for what, seq, at in runs(redis_client) if (what, seq) == ("end", 0))
    print(f"interrupted {ended_at - sent_at:.3f} s after the newer send")
    assert ended_at - sent_at < 2 * HEARTBEAT / 1000 + 1
    wait_for(lambda: "end 1" in events(redis_client), timeout=10)
    time.sleep(1)  # a second run of either would have started by now
    assert events(redis_client) == ["start 0", "end 0", "start 1", "done 1", "end 1"]
    assert_never_overlapping(redis_client)
    cli.log.seek(0)
    log = cli.log.read().decode()
    assert "it is interrupted with Cancelled" in log and "was cancelled while it ran" in log, log
    assert "Failed to process message" not in log and "Retrying message" not in log, log
