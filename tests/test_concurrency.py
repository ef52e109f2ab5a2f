"""Locks under contention: many sender threads, sender processes, worker threads and
worker processes racing for one digest (SPEC L2, L4, L5, L8, L10, C1, C6).

Every count is taken twice where it can be: from what ``send()`` reported and from
what the broker really holds or the workers really ran, so a lock that says
"duplicate" but lets the message through is caught as well as one that never locks,
one that locks forever, or one that lets fewer than ``lock_limit`` holders in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from dramatiq import Message

from dramatiq_unique import current_lock, enqueue_outcome

from .support import Gate, wait_for

SENDER_THREADS = 32
SENDER_PROCESSES = 4
KEYS = range(3)

#: Sends the same job from its own broker, backend and middleware once the test says go,
#: and prints what send() reported for each copy.
SEND_SCRIPT = """
import json, os, sys
import dramatiq, redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

url, lock, limit, sends = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
broker = RedisBroker(url=url)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=url)), before=TimeLimit)

@dramatiq.actor(broker=broker, lock=lock, lock_limit=limit)
def settle(event_id):
    pass

client = redis.Redis.from_url(url)
settle.send(f"warm-up {os.getpid()}")  # scripts loaded and connections open before the race
client.rpush("test:ready", 1)
assert client.blpop(["test:go"], timeout=30), "no go signal"
outcomes = []
for _ in range(sends):
    message = settle.send("evt_1")
    outcome = enqueue_outcome(message)
    outcomes.append({"enqueued": outcome.enqueued, "id": message.message_id, "token": outcome.token})
print(json.dumps(outcomes))
"""

#: A worker process: a Worker of 8 threads with worker_timeout=100, as the Env fixtures use (the
#: dramatiq CLI's 1 s idle poll would let one process take every message). Each run records its
#: interval, process and fencing token in Redis; every message processed or skipped bumps a counter.
WORKER_SCRIPT = """
import json, os, time
import dramatiq, redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware, TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs, current_lock

URL = os.environ["UNIQUE_TEST_REDIS_URL"]
client = redis.Redis.from_url(URL)


class Record(Middleware):
    def after_worker_boot(self, broker, worker):
        client.rpush("test:ready", os.getpid())

    def after_process_message(self, broker, message, *, result=None, exception=None):
        client.incr("test:done")

    def after_skip_message(self, broker, message):
        client.incr("test:done")


broker = RedisBroker(url=URL)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=URL)), before=TimeLimit)
broker.add_middleware(Record())


LIMIT = int(os.environ["UNIQUE_TEST_LOCK_LIMIT"])


@dramatiq.actor(broker=broker, lock="while_executing", lock_limit=LIMIT, max_retries=0)
def sync(key):
    start = time.time()
    token = current_lock().token
    time.sleep(0.03)
    run = {"key": key, "start": start, "end": time.time(), "pid": os.getpid(), "token": token}
    client.rpush("test:runs", json.dumps(run))


broker.emit_after("process_boot")
worker = Worker(broker, worker_threads=8, worker_timeout=100)
worker.start()
time.sleep(60)  # the test kills it long before; this only bounds an orphan's life
worker.stop()
"""


@pytest.fixture
def processes(tmp_path, redis_url):
    """Starts OS processes in their own session; all of them are killed at teardown,
    before Redis is flushed (this fixture depends on it)."""
    started: list[tuple[subprocess.Popen, object]] = []

    def start(args: list[str], **env: str) -> subprocess.Popen:
        log = open(tmp_path / f"process-{len(started)}.log", "w+b")  # closed at teardown
        proc = subprocess.Popen(
            [sys.executable, *args],
            cwd=tmp_path,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc.log = log
        started.append((proc, log))
        return proc

    yield start
    for proc, log in started:
        try:  # the whole session: anything a process started goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        log.close()


def wait_until_ready(client, procs: list[subprocess.Popen]) -> None:
    """Wait until every process has pushed to ``test:ready``; fail at once if one has died."""

    def ready() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                proc.log.seek(0)
                raise AssertionError(f"process exited with {proc.returncode}: {proc.log.read().decode()}")
        return client.llen("test:ready") == len(procs)

    wait_for(ready, timeout=30)


def output(proc: subprocess.Popen, timeout: float = 30) -> str:
    proc.wait(timeout=timeout)
    proc.log.seek(0)
    text = proc.log.read().decode()
    assert proc.returncode == 0, text
    return text


def queued_message_ids(env, queue_name: str) -> list[str]:
    """The message_ids the broker really holds in a queue, read from its storage."""
    if env.kind == "stub":
        payloads = list(env.broker.queues[queue_name].queue)
    else:
        payloads = env.broker.client.hvals(f"{env.broker.namespace}:{queue_name}.msgs")
    return sorted(Message.decode(p).message_id for p in payloads)


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """How many of these [start, end] intervals were open at the same instant, at most."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in events:  # at a tie an end (-1) sorts first: touching intervals do not overlap
        running += step
        peak = max(peak, running)
    return peak


# 1. Sender threads --------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3])
@pytest.mark.parametrize("lock", ["until_executed", "until_and_while_executing"])
def test_threads_sending_at_once_enqueue_exactly_lock_limit_copies(env, lock, limit):
    # L8 + L2/L5 + C6: 32 threads released together send each key; the check and the take are one step.
    ran = []

    @env.actor(lock=lock, lock_limit=limit)
    def settle(event_id):
        ran.append((event_id, current_lock().message_id))

    barrier = threading.Barrier(SENDER_THREADS)

    def send_all():
        barrier.wait(timeout=10)
        return [(key, settle.send(key)) for key in KEYS]

    with ThreadPoolExecutor(SENDER_THREADS) as pool:
        futures = [pool.submit(send_all) for _ in range(SENDER_THREADS)]
        sent = [pair for future in futures for pair in future.result()]

    enqueued = defaultdict(list)
    for key, message in sent:
        outcome = enqueue_outcome(message)
        if outcome.enqueued:
            enqueued[key].append((message.message_id, outcome.token))
    for key in KEYS:
        assert len(enqueued[key]) == limit, key
        assert len({token for _, token in enqueued[key]}) == limit  # L10: every acquisition its own token
        holders = {message_id for message_id, _ in enqueued[key]}
        assert {enqueue_outcome(m).holder for k, m in sent if k == key} == holders
    enqueued_ids = sorted(message_id for pairs in enqueued.values() for message_id, _ in pairs)

    # What the broker holds, not what send() said: a "duplicate" that slipped through shows here.
    assert queued_message_ids(env, settle.queue_name) == enqueued_ids
    env.worker(threads=8)
    env.join(settle)
    assert sorted(message_id for _, message_id in ran) == enqueued_ids
    assert sorted(key for key, _ in ran) == sorted(list(KEYS) * limit)


# 2. Sender processes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("lock", "limit"), [("until_executed", 1), ("until_executed", 3), ("until_and_while_executing", 2)]
)
def test_processes_sending_at_once_enqueue_exactly_lock_limit_copies(
    redis_client, redis_url, processes, tmp_path, lock, limit
):
    # L8 across processes: each has its own broker, backend and middleware on one redis-server.
    sends = 10
    (tmp_path / "send.py").write_text(SEND_SCRIPT)
    senders = [processes(["send.py", redis_url, lock, str(limit), str(sends)]) for _ in range(SENDER_PROCESSES)]
    wait_until_ready(redis_client, senders)
    redis_client.rpush("test:go", *["go"] * SENDER_PROCESSES)  # all are connected and waiting: release them
    outcomes = [o for proc in senders for o in json.loads(output(proc).strip().splitlines()[-1])]

    assert len(outcomes) == SENDER_PROCESSES * sends
    enqueued = [o for o in outcomes if o["enqueued"]]
    assert len(enqueued) == limit
    assert len({o["token"] for o in enqueued}) == limit  # L10: distinct fencing tokens across processes
    queued = [Message.decode(p) for p in redis_client.hvals("dramatiq:default.msgs")]
    assert sorted(m.message_id for m in queued if m.args == ("evt_1",)) == sorted(o["id"] for o in enqueued)


# 3. Worker threads --------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2])
@pytest.mark.parametrize("lock", ["while_executing", "until_and_while_executing"])
def test_worker_threads_never_run_more_than_lock_limit_copies(env, lock, limit):
    # L4/L5 + L8: 16 worker threads, copies of 3 keys queued up front and then kept coming.
    gate = Gate()
    gate.open()

    @env.actor(lock=lock, lock_limit=limit, max_retries=0)
    def sync(account_id):
        gate.enter(account_id, hold=0.03)

    for _ in range(20):  # a burst: for while_executing all 60 wait in the queue
        for key in KEYS:
            sync.send(key)
    env.worker(threads=16)
    for _ in range(40):  # then a stream, so later copies meet runs that are under way or over
        for key in KEYS:
            sync.send(key)
        time.sleep(0.01)
    env.join(sync)

    # Not more than the limit (a lock that never locks), and not fewer (one that serialises too much).
    assert gate.max_running == {key: limit for key in KEYS}
    # A lock that is never given back lets each key run only `limit` times.
    assert all(gate.count(key) >= limit + 2 for key in KEYS), gate.runs
    assert env.dead_letters(sync) == []  # the dropped copies were acked, not failed (C1)


# 4. Fencing tokens --------------------------------------------------------------


def test_fencing_tokens_increase_with_each_run(env):
    # L10: each run of one digest holds a higher token than the run before it.
    tokens = []

    @env.actor(lock="while_executing")
    def sync(account_id):
        tokens.append(current_lock().token)

    for _ in range(10):
        sync.send(42)
    env.worker(threads=1)  # one thread: the copies run one after another, none is dropped
    env.join(sync)
    assert len(tokens) == 10
    assert all(earlier < later for earlier, later in zip(tokens, tokens[1:], strict=False)), tokens


# 3 + 4. Worker processes --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 2])
def test_worker_processes_share_the_run_lock(redis_env, redis_url, processes, tmp_path, limit):
    # L4 + L8 + L10 across worker processes: runs of one key never overlap beyond
    # the limit, and (limit 1) each run's token beats the previous run's, whichever process ran it.
    (tmp_path / "work.py").write_text(WORKER_SCRIPT)
    workers = [
        processes(["work.py"], UNIQUE_TEST_REDIS_URL=redis_url, UNIQUE_TEST_LOCK_LIMIT=str(limit)) for _ in range(3)
    ]
    client = redis_env.broker.client
    wait_until_ready(client, workers)

    @redis_env.actor(actor_name="sync", lock="while_executing", lock_limit=limit)
    def sync(key):
        raise AssertionError("runs in the worker processes only")

    sent = 0
    for _ in range(50):
        for key in KEYS:
            sync.send(key)
            sent += 1
        time.sleep(0.01)
    wait_for(lambda: int(client.get("test:done") or 0) == sent, timeout=20)
    assert all(w.poll() is None for w in workers)

    runs = defaultdict(list)
    for raw in client.lrange("test:runs", 0, -1):
        run = json.loads(raw)
        runs[run["key"]].append(run)
    assert set(runs) == set(KEYS)
    assert len({run["pid"] for key_runs in runs.values() for run in key_runs}) >= 2
    for key_runs in runs.values():
        key_runs.sort(key=lambda run: run["start"])
        assert len(key_runs) >= limit + 2, key_runs  # a lock never given back lets `limit` runs in
        assert max_overlap([(run["start"], run["end"]) for run in key_runs]) == limit, key_runs
        assert len({run["token"] for run in key_runs}) == len(key_runs)
    if limit == 1:
        handovers = 0
        for key_runs in runs.values():
            for earlier, later in zip(key_runs, key_runs[1:], strict=False):
                assert earlier["token"] < later["token"], (earlier, later)
                handovers += earlier["pid"] != later["pid"]
        assert handovers >= 1  # the increasing tokens were compared across processes too
