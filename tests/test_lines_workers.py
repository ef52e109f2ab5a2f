"""Lines where they meet Dramatiq's retries and AgeLimit, with a real `dramatiq` worker process
(issue 31). What a user notices is recorded by the worker in Redis, apart from the locks: each
run's start and end, each attempt, each message skipped."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

import dramatiq_unique
from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.keys import enqueue_key

from .support import wait_for
from .test_concurrency import processes, wait_until_ready  # noqa: F401 (fixture)
from .test_lines_crash import WORKER_PREAMBLE, start_worker

WORKER_SCRIPT = (
    WORKER_PREAMBLE
    + """

class Skipped(Middleware):
    def after_skip_message(self, broker, message):
        client.rpush("test:skipped", repr(message.args))


broker = RedisBroker(url=URL)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=URL)), before=TimeLimit)
broker.add_middleware(Ready())
broker.add_middleware(Skipped())


@dramatiq.actor(
    broker=broker, queue_name="documents", lock="until_executing", on_conflict="wait", reschedule_delay=60_000,
    lock_args_method=lambda seq: [], max_retries=3, min_backoff=100, max_backoff=200,
)
def save(seq):
    client.rpush("test:runs", f"start {seq}")
    if client.incr(f"test:attempts:{seq}") == 1 and seq == 1:
        raise RuntimeError("the first attempt fails")
    client.rpush("test:runs", f"end {seq}")


@dramatiq.actor(
    broker=broker, queue_name="accounts", lock="while_executing", on_conflict={"server": "wait"},
    reschedule_delay=60_000, lock_args_method=lambda account, seq: [account],
)
def sync(account, seq):
    client.rpush("test:runs", f"start {seq}")
    while seq == 0 and not client.exists("test:go"):
        time.sleep(0.01)
    client.rpush("test:runs", f"end {seq}")
"""
)


@pytest.fixture
def worker(processes, tmp_path, redis_url, redis_client):  # noqa: F811
    """Starts a `dramatiq` process running the script above, once the test sent what it sends first."""
    return lambda: start_worker(processes, tmp_path, redis_url, redis_client, script=WORKER_SCRIPT, module="documents")


@pytest.fixture
def sender(redis_client):
    """The test's own broker, declaring the worker's actors with the same lock options."""
    broker = RedisBroker(client=redis_client)
    broker.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    save = dramatiq.actor(
        lambda seq: None,
        actor_name="save",
        broker=broker,
        queue_name="documents",
        lock="until_executing",
        on_conflict="wait",
        reschedule_delay=60_000,
        lock_args_method=lambda seq: [],
    )
    sync = dramatiq.actor(
        lambda account, seq: None,
        actor_name="sync",
        broker=broker,
        queue_name="accounts",
        lock="while_executing",
        on_conflict={"server": "wait"},
        reschedule_delay=60_000,
        lock_args_method=lambda account, seq: [account],
    )
    return save, sync


def runs(client) -> list[str]:
    return [run.decode() for run in client.lrange("test:runs", 0, -1)]


@pytest.mark.slow
def test_the_retry_of_a_message_a_line_handed_a_place_runs_in_a_worker_process(worker, sender, redis_client):
    # Issue 31 (1): the handed message failed once; its retry was skipped as "a copy of it started
    # already" and never ran, and its new enqueue place, never given up, held the job for ever.
    save, _ = sender
    key = enqueue_key("dramatiq-unique", enqueue_outcome(save.send(0)).digest)
    assert enqueue_outcome(save.send(1)).status == "waiting"
    worker()
    wait_for(lambda: "end 1" in runs(redis_client), timeout=30)
    # The retry gives its place up as it starts, from the release thread: maybe after its end.
    wait_for(lambda: RedisBackend(client=redis_client).read([key])[1] == [])
    # until_executing: 1 is handed the place as 0 starts, and may start while 0 runs.
    assert sorted(runs(redis_client)) == ["end 0", "end 1", "start 0", "start 1", "start 1"]
    assert runs(redis_client).index("start 0") < runs(redis_client).index("start 1")
    assert redis_client.lrange("test:skipped", 0, -1) == []
    assert enqueue_outcome(save.send(2)).status == "enqueued"


@pytest.mark.slow
def test_a_handed_message_that_age_limit_skips_lets_the_line_go_on_in_a_worker_process(worker, sender, redis_client):
    # Issue 31 (3): a message that waited in the run lock's line longer than its max_age was handed
    # the place, skipped by AgeLimit, and kept it: no later message of the account ran.
    _, sync = sender
    worker()
    sync.send("a1", 0)
    wait_for(lambda: "start 0" in runs(redis_client))
    sync.send_with_options(args=("a1", 1), max_age=500)
    wait_for(lambda: redis_client.llen("test:skipped") == 1)  # it waits in the run lock's line
    time.sleep(0.6)  # older than its max_age by the time it is handed the place
    sync.send_with_options(args=("a1", 2), max_age=600_000)
    wait_for(lambda: redis_client.llen("test:skipped") == 2)
    redis_client.set("test:go", 1)
    wait_for(lambda: "end 2" in runs(redis_client), timeout=30)
    assert runs(redis_client) == ["start 0", "end 0", "start 2", "end 2"]
    assert redis_client.llen("test:skipped") == 3  # 1 and 2 waited; AgeLimit skipped 1


def worker_log(cli) -> list[str]:
    """The lines the worker process printed so far (Dramatiq logs to stderr)."""
    cli.log.seek(0)
    return cli.log.read().decode().splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("command", ["dramatiq", "dramatiq-gevent"])
def test_a_message_that_waits_in_line_says_so_once_and_is_not_skipped(
    command,
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    sender,
):
    # Issue 34 (5): a message that waits in the run lock's line was logged by Dramatiq as
    # "[WARNING] Message sync('a1', 1) was skipped.", though it runs later. It says that it waits
    # in one INFO line; a real skip (AgeLimit) still has Dramatiq's WARNING.
    if command == "dramatiq-gevent":
        pytest.importorskip("gevent")
        args = [str(Path(sys.executable).parent / "dramatiq-gevent")]
    else:
        args = ["-m", "dramatiq"]
    (tmp_path / "documents.py").write_text(WORKER_SCRIPT)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        [*args, "documents:broker", "--processes", "1", "--threads", "2"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
    )
    wait_until_ready(redis_client, [cli])
    _, sync = sender
    sync.send("a1", 0)
    wait_for(lambda: "start 0" in runs(redis_client))
    waiting = [sync.send_with_options(args=("a1", 1), max_age=500)]
    wait_for(lambda: redis_client.llen("test:skipped") == 1)
    time.sleep(0.6)  # 1 is older than its max_age by the time it is handed the run lock
    waiting.append(sync.send("a1", 2))
    wait_for(lambda: redis_client.llen("test:skipped") == 2)
    redis_client.set("test:go", 1)
    wait_for(lambda: "end 2" in runs(redis_client), timeout=30)
    assert runs(redis_client) == ["start 0", "end 0", "start 2", "end 2"]
    wait_for(lambda: redis_client.llen("test:skipped") == 3)  # AgeLimit skipped 1 when it was handed the lock

    log = worker_log(cli)
    digest = enqueue_outcome(waiting[0]).digest
    for position, message in enumerate(waiting, start=1):
        said = [line for line in log if f"Message {message} waits in line" in line]
        assert len(said) == 1, log
        assert "[INFO]" in said[0]
        assert f"for the run lock {digest} at position {position} (1 is next)" in said[0]
        assert f"message id {message.message_id!r}" in said[0]
    # Dramatiq's WARNING for the one real skip, none for the waits.
    skipped = [line for line in log if "was skipped" in line]
    assert len(skipped) == 1, log
    assert "[WARNING] Message sync('a1', 1) was skipped." in skipped[0]
