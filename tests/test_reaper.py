"""The orphan reaper (SPEC R2, R3, R4): it releases exactly the orphans, never the lock of a
message that is queued, delayed, retrying or running on a live worker, in bounded passes,
and only one reaper works at a time."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import StubBackend as StubResultBackend

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome, reap_orphans
from dramatiq_unique.backends import Holder
from dramatiq_unique.backends.base import format_record
from dramatiq_unique.keys import registry_key
from dramatiq_unique.liveness import worker_id
from dramatiq_unique.reaper import Reaper

from .support import Env, Gate, wait_for

PREFIX = "dramatiq-unique"
#: The lock_prefix of an actor that has its own.
BILLING = "billing"
LOGGER = logging.getLogger("test.reaper")


def scan_all(backend, prefix: str = PREFIX) -> set[tuple[str, str]]:
    """Every (key, owner) place held under the prefix."""
    cursor, places = "0", set()
    while True:
        cursor, records = backend.scan(prefix, cursor, 1000)
        places.update((r.key, r.owner) for r in records)
        if cursor == "0":
            return places


def place_line(owner: str, holder: Holder, *, acquired_at: int, expires_at: int | None) -> str:
    """The line of ``owner``'s place, taken at ``acquired_at`` (its token that millisecond's),
    in a lock's value as the scripts write it (issue 33): "<owner>|<record>"."""
    record = format_record(
        expires_at=expires_at, token=acquired_at * 1000, acquired_at=acquired_at, holder=holder.encode(owner)
    )
    return f"{owner}|{record}"


def plant_orphans(
    backend, client, count: int, *, dead_worker: str = "dead-host:1:0000", prefix: str = PREFIX
) -> set[tuple[str, str]]:
    """Half run locks of a worker whose time ran out ten minutes ago (with a long lease, as a
    killed worker leaves them), half enqueue locks whose RedisBroker message does not exist."""
    now = backend.heartbeats(registry_key(prefix))[0]
    client.zadd(registry_key(prefix), {dead_worker: now - 600_000})
    planted = set()
    for i in range(count):
        digest, owner = uuid.uuid4().hex, uuid.uuid4().hex
        if i % 2:
            key = f"{prefix}:{{{digest}}}:run"
            holder = Holder(f"gone-{i}", "sync", "default", "while_executing", "running", worker_id=dead_worker)
            ttl = 600_000
        else:
            key, owner = f"{prefix}:{{{digest}}}", f"gone-{i}"
            holder = Holder(owner, "settle", "default", "until_executed", "queued", redis_message_id=str(uuid.uuid4()))
            ttl = None
        assert backend.acquire(key, owner, limit=1, ttl=ttl, holder=holder).acquired
        planted.add((key, owner))
    return planted


def lose(env, message) -> None:
    """The broker loses ``message`` (a purge): its lock is left behind."""
    if env.kind == "stub":
        queue = env.broker.queues[message.queue_name]
        with queue.mutex:
            queue.queue.remove(next(p for p in queue.queue if message.message_id.encode() in p))
            queue.unfinished_tasks -= 1
    else:
        rid = message.options["redis_message_id"]
        env.broker.client.hdel(f"dramatiq:{message.queue_name}.msgs", rid)
        env.broker.client.lrem(f"dramatiq:{message.queue_name}", 0, rid)


@pytest.fixture
def reaper_env(redis_client):
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend))
    yield from env.run()


@pytest.mark.slow
def test_one_cycle_releases_exactly_the_orphans_among_thousands_of_live_locks(reaper_env):
    # R3 + R4: 5,000 live locks in every state a message can be in, and 20 planted orphans.
    env, client, backend = reaper_env, reaper_env.broker.client, reaper_env.backend
    # The running messages hold their threads until the test is done, however long 5,000 sends take.
    gate, failed = Gate(timeout=300), []

    @env.actor(lock="until_executed", queue_name="retrying", min_backoff=60_000, max_backoff=60_000)
    def flaky(n):
        if n not in failed:
            failed.append(n)
            raise RuntimeError("provider timeout")

    @env.actor(lock="while_executing", queue_name="running")
    def sync(n):
        gate.enter(("sync", n))

    @env.actor(lock="until_executed", queue_name="running")
    def hold(n):
        gate.enter(("hold", n))

    @env.actor(lock="until_and_while_executing", queue_name="running")
    def swap(n):
        gate.enter(("swap", n))

    @env.actor(lock="until_executed")
    def settle(n):
        pass

    @env.actor(lock="until_executing")
    def notify(n):
        pass

    @env.actor(lock="until_expired", lock_ttl=600_000)
    def report(n):
        pass

    @env.actor(lock="until_and_while_executing")
    def sync_queued(n):
        pass

    # Retrying: failed once, waiting out a one-minute backoff in the delay queue.
    env.worker(threads=8)
    for n in range(20):
        flaky.send(n)
    wait_for(lambda: len(failed) == 20 and env.broker.client.hlen("dramatiq:retrying.DQ.msgs") == 20)
    # Running on a live worker: 8 messages hold the worker's 8 threads (run locks, enqueue locks,
    # and a queued copy next to a running until_and_while_executing message).
    for n in range(3):
        sync.send(n), hold.send(n)
    swap.send(0), swap.send(1)
    wait_for(lambda: len(gate.runs) == 8)
    swap.send(0)
    # Queued and delayed (nothing consumes "default" while all threads are busy; prefetched
    # messages stay in the broker until acked).
    for n in range(1830):
        settle.send(n)
    for n in range(1000):
        settle.send_with_options(args=(f"delayed-{n}",), delay=600_000)
    for n in range(1000):
        notify.send(n)
    for n in range(700):
        sync_queued.send(n)
    for n in range(450):
        report.send(n)
    live = scan_all(backend)
    assert len(live) >= 5000
    orphans = plant_orphans(backend, client, 20)

    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=500, min_age=0)
    started = time.monotonic()
    report_ = reaper.run(broker=env.broker)
    elapsed = time.monotonic() - started
    print(
        f"\nR3: one reaper cycle over {report_.inspected} places in {report_.passes} passes took {elapsed:.2f} s "
        f"and released {report_.released} ({report_.released_dead_workers} of a dead worker, "
        f"{report_.released_missing_messages} of missing messages)"
    )
    assert report_.complete and not report_.skipped
    assert report_.passes > 1  # bounded batches, not one sweep
    assert (report_.released_dead_workers, report_.released_missing_messages) == (10, 10)
    assert scan_all(backend) == live  # every live lock is still held, every orphan gone
    assert not orphans & scan_all(backend)

    # And the live ones still work: the running messages finish and free their locks.
    env.broker.flush(settle.queue_name)  # (the thousands of queued no-ops need not run)
    gate.open()
    wait_for(lambda: client.hlen("dramatiq:running.msgs") == 0, timeout=20)


def test_two_reapers_started_at_once_only_one_works(redis_client, caplog):
    # R2: one reaper at a time across the deployment.
    backend = RedisBackend(client=redis_client)
    orphans = plant_orphans(backend, redis_client, 200)
    broker = RedisBroker(client=redis_client)
    start = threading.Barrier(2)
    reports = []

    def run():
        reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=40, min_age=0)
        start.wait()
        reports.append(reaper.run(broker=broker))

    threads = [threading.Thread(target=run) for _ in range(2)]
    with caplog.at_level(logging.INFO):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    worked = [r for r in reports if not r.skipped]
    assert len(worked) == 1 and len(reports) == 2
    assert worked[0].released == 200
    assert not orphans & scan_all(backend)
    assert sum("released lock" in r.getMessage() for r in caplog.records) == 200  # a line per lock
    assert "already running" in caplog.text


def test_a_stopped_reaper_resumes_where_it_stopped(redis_client):
    # R4: max_passes bounds a run; the cursor is saved and the next run goes on from it.
    backend = RedisBackend(client=redis_client)
    plant_orphans(backend, redis_client, 100)
    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=20, min_age=0)
    first = reaper.run(max_passes=1)
    assert first.passes == 1 and not first.complete
    rest = reaper.run()
    assert rest.complete
    assert first.released + rest.released == 50  # no broker given: only the dead worker's run locks
    assert first.inspected + rest.inspected >= 100


def test_enqueue_locks_on_a_stub_broker(env):
    # R2 on both brokers the reaper can ask: the lock of a message that was lost is released;
    # a queued message's lock is not. (StubBroker: not while a message is in a worker's hands.)
    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    kept = settle.send("evt_1")
    lost = settle.send("evt_2")
    lose(env, lost)
    reaper = Reaper(env.backend, prefix=PREFIX, logger=LOGGER, min_age=0)
    report = reaper.run(broker=env.broker)
    assert (report.released_missing_messages, report.inspected) == (1, 2)
    assert env.is_free(enqueue_outcome(lost).digest)
    assert not env.is_free(enqueue_outcome(kept).digest)


@pytest.fixture
def triggering_env(redis_client):
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    middleware = UniqueJobs(backend=backend, reaper=True, reaper_interval=400, lease_period=600, heartbeat_interval=100)
    env = Env("redis", broker, backend, middleware)
    yield from env.run()


def test_workers_trigger_the_reaper_actor_once_per_interval(triggering_env):
    # R2: UniqueJobs(reaper=True): the workers send the reaper actor every reaper_interval,
    # one run per interval; it frees an enqueue lock whose message is gone.
    env, client = triggering_env, triggering_env.broker.client
    now = env.backend.heartbeats(registry_key(PREFIX))[0]
    # An enqueue lock, a minute old (past the reaper's grace), whose message is gone.
    holder = Holder("lost", "settle", "default", "until_executed", "queued", redis_message_id="nowhere")
    client.set(f"{PREFIX}:{{lost}}", place_line("lost", holder, acquired_at=now - 60_000, expires_at=None))
    runs = []
    env.middleware.declare_reaper(env.broker)
    reaper = env.middleware.reaper
    original = reaper.run

    def counted(**kwargs):
        runs.append(original(**kwargs))
        return runs[-1]

    reaper.run = counted
    started = time.monotonic()
    env.worker(threads=2)
    env.worker(threads=2)  # two Workers in one process share one heartbeat thread
    wait_for(lambda: not client.exists(f"{PREFIX}:{{lost}}"), timeout=5)
    time.sleep(1.0)
    elapsed = time.monotonic() - started
    assert 1 <= len(runs) <= elapsed / 0.4 + 1
    assert sum(run.released_missing_messages for run in runs) == 1


@pytest.mark.parametrize("results", [False, True])
def test_the_reaper_actor_logs_its_report_and_returns_it_only_where_results_are_kept(stub_env, caplog, results):
    # O4: Dramatiq warns of every value an actor returns without the Results middleware: the
    # reaper's report is in its own log line then; with Results, get_result() has it too.
    env = stub_env
    if results:
        env.broker.add_middleware(Results(backend=StubResultBackend()))
    reaper = env.middleware.declare_reaper(env.broker)
    caplog.set_level(logging.INFO)
    env.worker(threads=1)
    message = reaper.send_with_options(args=(2,), store_results=results)
    env.join(reaper)
    assert not [r for r in caplog.records if "returned a value" in r.getMessage()]
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("The orphan reaper inspected")]
    assert reports == [
        "The orphan reaper inspected 0 holders of locks in 1 pass and released 0: 0 of dead workers, "
        "0 of messages that no longer exist."
    ]
    if results:
        assert message.get_result(backend=env.broker.get_results_backend())["passes"] == 1


def test_run_locks_of_an_unregistered_worker_are_left_to_their_lease(redis_client):
    # R3: a worker missing from the registry (forgotten after it died, or not registered under
    # this prefix yet) may still be running: only its lease ends its run lock, however old.
    backend = RedisBackend(client=redis_client)
    now = backend.heartbeats(registry_key(PREFIX))[0]
    for name, acquired_at in (("young", now - 1_000), ("old", now - 600_000)):
        holder = Holder(name, "sync", "default", "while_executing", "running", worker_id="old-host:7")
        line = place_line("t", holder, acquired_at=acquired_at, expires_at=now + 600_000)
        redis_client.set(f"{PREFIX}:{{{name}}}:run", line, px=600_000)
    report = Reaper(backend, prefix=PREFIX, logger=LOGGER).run()
    assert report.released == 0
    assert scan_all(backend) == {(f"{PREFIX}:{{young}}:run", "t"), (f"{PREFIX}:{{old}}:run", "t")}


@pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)
def test_the_reaper_works_after_a_message_was_replaced(env):
    # Issue 8, defect 1 (R2, R4): a replaced message leaves a set of replaced messages beside its
    # digest's locks; the reaper's scan passes it by, still releases the orphans, and the
    # replaced message is still skipped when it reaches a worker.
    gate = Gate()

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, lock_args_method=lambda key, label: [key])
    def publish(key, label):
        gate.enter(label)

    older = publish.send("doc_1", "rev_1")
    newer = publish.send("doc_1", "rev_2")
    assert enqueue_outcome(newer).replaced == older.message_id
    lost = publish.send("doc_2", "rev_1")
    lose(env, lost)

    report = Reaper(env.backend, prefix=PREFIX, logger=LOGGER, min_age=0).run(broker=env.broker)

    assert report.complete and report.released_missing_messages == 1
    assert env.is_free(enqueue_outcome(lost).digest)
    assert not env.is_free(enqueue_outcome(newer).digest)
    gate.open()
    env.worker()
    env.join(publish)
    assert gate.runs == ["rev_2"]


def test_the_reaper_takes_each_workers_liveness_from_what_it_published(env):
    # Issue 8, defect 5 (R1, R3): after each heartbeat a worker counts as alive for its own lease
    # period, whatever lease the process running the reaper has: a worker on the default 30 s
    # lease, last heard from half a second ago, keeps its run lock against the reaper of a
    # process on a 300 ms lease.
    gate = Gate()

    @env.actor(lock="while_executing", lock_args_method=lambda key, n: [key])
    def sync(key, n):
        gate.enter(n)

    sync.send("acct_1", 0)
    env.worker()
    wait_for(lambda: gate.runs == [0])
    time.sleep(0.5)  # past the other process's lease; its next heartbeat is 5 s after the first
    other = UniqueJobs(backend=env.backend, lease_period=300, heartbeat_interval=100)
    report = other.reaper.run(broker=env.broker)

    assert report.complete and report.released == 0
    sync.send("acct_1", 1)
    env.wait_for_skips(1)  # the duplicate met the running message's lock
    gate.open()
    env.join(sync)
    assert gate.runs == [0]


def test_workers_are_known_alive_under_every_lock_prefix_in_use(env):
    # Issue 8, defect 4 (R1, R3): a worker heartbeats into the registry of each lock prefix its
    # actors use, so a reaper of an actor's own prefix sees it alive, even one in a process on a
    # 300 ms lease: the run lock it holds there stays, and a duplicate is still dropped.
    gate = Gate()

    @env.actor(lock="while_executing", lock_prefix=BILLING, lock_args_method=lambda key, n: [key])
    def invoice(key, n):
        gate.enter(n)

    invoice.send("acct_1", 0)
    env.worker()
    wait_for(lambda: gate.runs == [0])
    time.sleep(0.5)  # past the other process's lease; this worker's next heartbeat is 5 s after its first
    other = UniqueJobs(backend=env.backend, lock_prefix=BILLING, lease_period=300, heartbeat_interval=100)
    report = other.reaper.run(broker=env.broker)
    assert report.complete and report.released == 0
    assert reap_orphans(env.backend, broker=env.broker, prefix=BILLING).released == 0

    invoice.send("acct_1", 1)
    env.wait_for_skips(1)  # the duplicate met the running message's lock
    gate.open()
    env.join(invoice)
    assert gate.runs == [0]
    assert set(env.backend.heartbeats(registry_key(BILLING))[1]) == {worker_id()}


def test_one_reaper_run_covers_the_locks_of_actors_with_their_own_prefix(env):
    # Issue 8, defect 4 (R2): the middleware's reaper covers its own lock prefix and those of its
    # actors: the lock of a lost message is released under each, the others stay.
    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    @env.actor(lock="until_executed", lock_prefix=BILLING)
    def invoice(event_id):
        pass

    kept, kept_billing = settle.send("evt_1"), invoice.send("evt_1")
    lost, lost_billing = settle.send("evt_2"), invoice.send("evt_2")
    lose(env, lost)
    lose(env, lost_billing)
    env.middleware.reaper.min_age = 0
    report = env.middleware.reaper.run(broker=env.broker)

    assert report.complete and report.released_missing_messages == 2
    assert env.is_free(enqueue_outcome(lost).digest)
    assert env.is_free(enqueue_outcome(lost_billing).digest, prefix=BILLING)
    assert not env.is_free(enqueue_outcome(kept).digest)
    assert not env.is_free(enqueue_outcome(kept_billing).digest, prefix=BILLING)


def test_a_stopped_reaper_resumes_where_it_stopped_across_prefixes(redis_client):
    # R4 + issue 8, defect 4: a run goes through the prefixes one after the other, each with its
    # own cursor; a run stopped by max_passes is resumed by the next, until a full cycle.
    backend = RedisBackend(client=redis_client)
    planted = plant_orphans(backend, redis_client, 40) | plant_orphans(backend, redis_client, 40, prefix=BILLING)
    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0)
    reaper.add_prefix(BILLING)
    runs = [reaper.run(max_passes=2)]
    while not runs[-1].complete:
        runs.append(reaper.run(max_passes=2))

    assert len(runs) > 2 and all(run.passes <= 2 for run in runs)
    assert sum(run.released_dead_workers for run in runs) == 40  # no broker given: only run locks
    assert sum(run.inspected for run in runs) >= 80
    live = {place for place in planted if not place[0].endswith(":run")}
    assert scan_all(backend) | scan_all(backend, BILLING) == live
    assert reaper.run().inspected >= 40  # the next run starts a new cycle
