"""A line of waiting messages while worker processes are SIGKILLed, handoffs among them (issue 21).

Real `dramatiq` worker processes run messages that wait in line (``until_executed`` +
``on_conflict="wait"``); the test kills one every second or so and starts another. What a user
notices is recorded by the actor in Redis, apart from the locks: each run's start and end. Every
message ends exactly once, per key in send order, and never two runs of a key overlap, but for
Dramatiq's at-least-once delivery: a process killed after a run ended and before the broker's
acknowledgement has that message delivered again, and it runs again.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

import dramatiq_unique
from dramatiq_unique import RedisBackend, UniqueJobs

from .support import wait_for
from .test_concurrency import processes, wait_until_ready  # noqa: F401 (fixture)

#: What a worker script of these tests starts with: its Redis, and a middleware that says when
#: its Worker booted (start_worker waits for it).
WORKER_PREAMBLE = """
import os, random, time
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
client = redis.Redis.from_url(URL)


class Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        client.rpush("test:ready", os.getpid())
"""

WORKER_SCRIPT = (
    WORKER_PREAMBLE
    + """

broker = RedisBroker(url=URL, heartbeat_timeout=1000, maintenance_chance=500_000)
unique = UniqueJobs(
    backend=RedisBackend(url=URL), lease_period=1500, heartbeat_interval=300, reaper=True, reaper_interval=1000
)
# A handoff lost with a killed process is enqueued again by the reaper once it is a second old.
unique.reaper.min_age = 1000
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(
    broker=broker, queue_name="ledger", lock="until_executed", on_conflict="wait", reschedule_delay=60_000,
    lock_args_method=lambda account, seq: [account],
)
def post(account, seq):
    pid = os.getpid()
    client.rpush("test:runs", f"start {account} {seq} {pid} {time.time()}")
    time.sleep(random.uniform(0.05, 0.15))
    client.rpush("test:runs", f"end {account} {seq} {pid} {time.time()}")
"""
)

ACCOUNTS, PER_ACCOUNT = 3, 30


def start_worker(processes, tmp_path, redis_url, client, *, script=WORKER_SCRIPT, module="ledger", **env):  # noqa: F811
    """A `dramatiq` process of two threads running ``script`` as ``module``, once its Worker
    booted; ``env`` adds to its environment."""
    (tmp_path / f"{module}.py").write_text(script)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    client.delete("test:ready")
    cli = processes(
        ["-m", "dramatiq", f"{module}:broker", "--processes", "1", "--threads", "2"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        PYTHONPATH=path,
        **env,
    )
    wait_until_ready(client, [cli])
    cli.worker_pid = int(client.lindex("test:ready", 0))
    return cli


@pytest.mark.slow
def test_a_line_loses_nothing_and_runs_nothing_twice_while_workers_are_killed(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
):
    workers = [start_worker(processes, tmp_path, redis_url, redis_client) for _ in range(2)]
    # The test sends through a broker of its own, with the workers' lock options.
    broker = RedisBroker(client=redis_client)
    broker.add_middleware(UniqueJobs(backend=RedisBackend(client=redis_client)), before=TimeLimit)
    post = dramatiq.actor(
        lambda account, seq: None,
        actor_name="post",
        broker=broker,
        queue_name="ledger",
        lock="until_executed",
        on_conflict="wait",
        reschedule_delay=60_000,
        lock_args_method=lambda account, seq: [account],
    )
    for seq in range(PER_ACCOUNT):
        for account in range(ACCOUNTS):
            post.send(account, seq)

    def ended() -> set[tuple[int, int]]:
        runs = [run.split() for run in map(bytes.decode, redis_client.lrange("test:runs", 0, -1))]
        return {(int(account), int(seq)) for kind, account, seq, _, _ in runs if kind == "end"}

    killed: dict[str, float] = {}  # pid: when it was killed
    deadline = time.monotonic() + 120
    while len(ended()) < ACCOUNTS * PER_ACCOUNT and time.monotonic() < deadline:
        time.sleep(0.5)
        if len(killed) < 6:
            victim = workers.pop(0)
            os.kill(victim.worker_pid, signal.SIGKILL)
            killed[str(victim.worker_pid)] = time.time()
            workers.append(start_worker(processes, tmp_path, redis_url, redis_client))
    wait_for(lambda: len(ended()) == ACCOUNTS * PER_ACCOUNT, timeout=5)
    time.sleep(3)  # a second copy, if one were enqueued, would have run by now

    runs = [r.split() for r in map(bytes.decode, redis_client.lrange("test:runs", 0, -1))]
    first_ends: dict[tuple[int, int], list[str]] = {}
    again_after_end = []
    in_order = []
    for run in runs:
        kind, message = run[0], (int(run[1]), int(run[2]))
        if message in first_ends:
            again_after_end.append(run)
        else:
            in_order.append(run)
            if kind == "end":
                first_ends[message] = run
    cut = len([run for run in in_order if run[0] == "start"]) - len(first_ends)
    print(f"{len(killed)} workers killed, {cut} runs cut short by a kill and run again")
    print(f"{len(again_after_end) // 2} runs delivered again after they ended: {again_after_end}")
    # A message runs again after it ended only when the process that ran it was killed after that
    # end, before the broker had its acknowledgement: never because a lock let a duplicate through.
    for run in again_after_end:
        message = (int(run[1]), int(run[2]))
        _, _, _, pid, ended_at = first_ends[message]
        assert float(ended_at) < killed.get(pid, 0.0), ("a message ran to its end twice", message, pid)
    for account in range(ACCOUNTS):
        # Once each, in send order.
        assert [seq for a, seq in first_ends if a == account] == list(range(PER_ACCOUNT))
        # Never two at once: each start comes after the end of the run before it, or after the
        # kill of a run that never ended (its message runs again, on another worker).
        spans: dict[int, list[float]] = {}
        for _, a, s, _, at in in_order:
            if int(a) == account:
                spans.setdefault(int(s), []).append(float(at))
        previous_end = 0.0
        for seq in range(PER_ACCOUNT):
            times = spans[seq]
            assert times[0] >= previous_end, (account, seq)
            previous_end = times[-1]
