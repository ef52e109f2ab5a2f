"""Lock events and the activity counters (issue 10, O3): subscribers see each kind of event in
scripted scenarios on both backends with real Workers; a failing subscriber never breaks
locking; nothing is built without subscribers; the per-minute counts reach Redis only from the
heartbeat thread, in one round trip, and read back."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from dramatiq_unique import RedisBackend, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.activity import ActivityCounter, read_activity
from dramatiq_unique.events import EVENT_KINDS, Events, LockEvent
from dramatiq_unique.keys import activity_key
from dramatiq_unique.runtime import PERIODIC_THREAD, Runtime

from .support import Env, Gate, plant_dead_workers_run_lock, wait_for
from .test_outages import server  # noqa: F401 (fixture)

PREFIX = "dramatiq-unique"


def test_subscribers_receive_every_kind_of_lock_event(make_env):
    env = make_env()
    events: list[LockEvent] = []
    conflicts: list[LockEvent] = []
    env.middleware.subscribe(EVENT_KINDS, events.append)
    env.middleware.subscribe("conflict", conflicts.append)  # many subscribers per kind
    gate = Gate()

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    @env.actor(lock="until_executed", on_conflict="reject")
    def refund(event_id):
        pass

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, lock_args_method=lambda key, label: [key])
    def publish(key, label):
        pass

    @env.actor(lock="until_executed", lock_ttl=50)
    def expiring(key):
        pass

    @env.actor(lock="while_executing", on_conflict="reschedule", reschedule_delay=10)
    def sync(key):
        gate.enter(key)

    @env.actor(lock="until_executed", on_conflict="wait")
    def post(key):
        pass

    first = settle.send("e1")
    duplicate = settle.send("e1")
    refund.send("r1")
    refund.send("r1")
    old = publish.send("d", "old")
    publish.send("d", "new")
    expiring.send("x")
    post.send("a")
    waiting = post.send("a")
    time.sleep(0.1)  # its lock_ttl runs out before a worker starts it
    env.worker()
    running = sync.send("k")
    wait_for(lambda: gate.count("k") == 1)
    sync.send("k")
    wait_for(lambda: any(e.kind == "rescheduled" for e in events))
    gate.open()
    env.join(settle, refund, publish, expiring, sync, post)

    def seen(kind, actor, **fields) -> list[LockEvent]:
        return [
            e
            for e in events
            if e.kind == kind and e.actor_name == actor and all(getattr(e, k) == v for k, v in fields.items())
        ]

    digest = enqueue_outcome(first).digest
    (acquired,) = seen("acquired", "settle")
    assert (acquired.message_id, acquired.digest, acquired.lock, acquired.lock_kind) == (
        first.message_id,
        digest,
        "until_executed",
        "enqueue",
    )
    assert acquired.token is not None and acquired.queue_name == "default"
    (conflict,) = seen("conflict", "settle")
    assert (conflict.message_id, conflict.side, conflict.strategy, conflict.holders) == (
        duplicate.message_id,
        "client",
        "log",
        (first.message_id,),
    )
    assert seen("released", "settle", message_id=first.message_id, lock_kind="enqueue")
    assert seen("rejected", "refund", reason="lock held at enqueue")
    assert seen("replaced", "publish", replaced=old.message_id)
    assert seen("lapsed", "expiring", lock_kind="enqueue")
    assert seen("acquired", "sync", message_id=running.message_id, lock_kind="run")
    assert seen("conflict", "sync", side="server", strategy="reschedule")
    assert seen("rescheduled", "sync", delay=10)
    assert seen("released", "sync", lock_kind="run")
    assert seen("waiting", "post", message_id=waiting.message_id, side="client", lock_kind="enqueue")
    assert seen("handed_over", "post", message_id=waiting.message_id, lock_kind="enqueue")
    assert conflicts == [e for e in events if e.kind == "conflict"]
    # The other kinds are told by the heartbeat thread and the reaper: tested in test_data_loss.py and
    # below, and cancelled in test_cancel.py.
    assert {e.kind for e in events} == EVENT_KINDS - {"lease_lost", "reaped", "backend_error", "data_lost", "cancelled"}


@pytest.mark.parametrize(
    "lock, kinds",
    [
        # The lock is given up at start: the retry takes it again.
        ("until_executing", {"acquired enqueue": 2, "released enqueue": 2}),
        # The retry re-enters the place it kept: no new acquisition.
        ("until_executed", {"acquired enqueue": 1, "released enqueue": 1}),
        ("until_expired", {"acquired enqueue": 1}),
        ("while_executing", {"acquired run": 2, "released run": 2}),
        (
            "until_and_while_executing",
            {"acquired enqueue": 2, "acquired run": 2, "released enqueue": 2, "released run": 2},
        ),
    ],
)
def test_each_place_taken_is_one_acquisition_and_each_given_up_one_release(make_env, lock, kinds):
    env = make_env()
    events: list[LockEvent] = []
    env.middleware.subscribe(["acquired", "released"], events.append)
    attempts = []

    @env.actor(lock=lock, lock_ttl=60_000 if lock == "until_expired" else None, max_retries=1)
    def job(key):
        attempts.append(key)
        if len(attempts) == 1:
            raise RuntimeError("fails once")

    env.worker()
    job.send("k")
    env.join(job)
    assert len(attempts) == 2
    seen: dict[str, int] = {}
    for e in events:
        seen[f"{e.kind} {e.lock_kind}"] = seen.get(f"{e.kind} {e.lock_kind}", 0) + 1
    assert seen == kinds


def test_a_lost_lease_and_a_reaped_lock_are_events(make_env):
    env = make_env(lease_period=300, heartbeat_interval=100)
    events: list[LockEvent] = []
    env.middleware.subscribe(["lease_lost", "reaped"], events.append)
    gate = Gate()

    @env.actor(lock="while_executing")
    def sync(key):
        gate.enter(key)

    env.worker()
    message = sync.send("k")
    wait_for(lambda: gate.count("k") == 1)
    # The run lock lapses behind the worker's back (as after a long pause of its heartbeat thread).
    cursor, records = env.backend.scan(PREFIX, "0", 100)
    (record,) = [r for r in records if r.kind == "run"]
    assert env.backend.release_record(record.key, record.owner, record.record)
    wait_for(lambda: events)
    gate.open()
    env.join(sync)
    plant_dead_workers_run_lock(env.backend, "orphan")
    env.middleware.reaper.run(broker=env.broker)

    lost, reaped = events
    assert (lost.kind, lost.actor_name, lost.message_id, lost.lock_kind) == (
        "lease_lost",
        "sync",
        message.message_id,
        "run",
    )
    assert lost.digest == enqueue_outcome(message).digest
    assert (reaped.kind, reaped.actor_name, reaped.queue_name, reaped.digest, reaped.message_id) == (
        "reaped",
        "sync",
        "default",
        "orphan",
        "gone",
    )
    assert reaped.lock_kind == "run" and "stopped sending heartbeats" in reaped.reason


def test_backend_errors_are_events():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there
    broker = StubBroker()
    backend = RedisBackend(url=f"redis://127.0.0.1:{port}/0", socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    env = Env("stub", broker, backend, UniqueJobs(backend=backend, on_backend_error="allow"))
    runs = env.run()
    next(runs)
    try:
        errors: list[LockEvent] = []
        env.middleware.subscribe("backend_error", errors.append)

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        message = settle.send("e1")
        assert enqueue_outcome(message).status == "unlocked"
        (error,) = errors
        assert (error.actor_name, error.message_id, error.reason) == (
            "settle",
            message.message_id,
            "acquisition at enqueue",
        )
        assert "The Redis lock backend failed" in str(error.error)
        env.middleware.liveness.tick()  # a heartbeat outside any message
        assert errors[1].actor_name == "" and errors[1].reason == "heartbeat"
    finally:
        next(runs, None)


def test_a_failing_subscriber_is_logged_once_per_failure_and_locking_goes_on(make_env, caplog):
    env = make_env()
    runs = []

    def broken(event: LockEvent) -> None:
        raise RuntimeError("subscriber bug")

    env.middleware.subscribe(["acquired", "conflict"], broken)

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)

    sent = [settle.send("e1") for _ in range(3)]
    env.worker()
    env.join(settle)
    assert [enqueue_outcome(m).status for m in sent] == ["enqueued", "duplicate", "duplicate"]
    assert runs == ["e1"]
    assert env.is_free(enqueue_outcome(sent[0]).digest)
    failures = [r for r in caplog.records if r.name.startswith("dramatiq_unique") and "subscriber" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.ERROR] * 3
    assert "RuntimeError('subscriber bug')" in failures[0].getMessage()
    # The traceback once, not with every failure.
    assert [bool(r.exc_info) for r in failures] == [True, False, False]


def test_without_subscribers_no_event_is_built(make_env, monkeypatch):
    # The conflict trail subscribes to conflicts: off here.
    env = make_env(activity=False, history=False)
    built: list[str] = []
    original = LockEvent.__init__

    def counted(self, *args, **kwargs):
        built.append(kwargs["kind"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(LockEvent, "__init__", counted)
    gate = Gate()

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    @env.actor(lock="while_executing")
    def sync(key):
        gate.enter(key)

    settle.send("e1")
    settle.send("e1")
    env.worker()
    sync.send("k")
    wait_for(lambda: gate.count("k") == 1)
    sync.send("k")
    env.wait_for_skips(1)
    gate.open()
    env.join(settle, sync)
    assert built == []
    for worker in env.workers:  # or it may run the first e2, and free its lock, before the second is sent
        worker.stop()
    env.workers.clear()
    env.middleware.subscribe("conflict", lambda event: None)
    settle.send("e2")
    settle.send("e2")
    assert built == ["conflict"]


def test_unknown_event_kinds_are_refused(stub_env):
    with pytest.raises(ValueError, match=r"'conflicts'.*valid kinds are 'acquired', 'backend_error'"):
        stub_env.middleware.subscribe("conflicts", print)


# The activity counters ---------------------------------------------------------------------


class Monitor:
    """The commands the Redis server runs, from MONITOR, in order."""

    def __init__(self, client: redis.Redis):
        self.client = client
        self.commands: list[str] = []
        self._monitor = client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            command = self._monitor.next_command()["command"]
            self.commands.append(command)
            if command == "ECHO monitor:stop":
                return

    def mark(self, name: str) -> None:
        """Put a marker in the command stream and wait until it was read."""
        self.client.echo(f"monitor:{name}")
        wait_for(lambda: f"ECHO monitor:{name}" in self.commands)

    def stop(self) -> None:
        self.mark("stop")
        self._thread.join()
        self._monitor.__exit__(None, None, None)

    def between(self, start: str, end: str) -> list[str]:
        commands = self.commands
        return commands[commands.index(f"ECHO monitor:{start}") + 1 : commands.index(f"ECHO monitor:{end}")]


def test_activity_reaches_redis_in_one_round_trip_per_heartbeat_and_reads_back(redis_client):
    # No heartbeat tick during the scenario: the counts wait in memory until the test ticks.
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, heartbeat_interval=60_000, lease_period=180_000))
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        monitor = Monitor(redis.Redis(connection_pool=redis_client.connection_pool))
        monitor.mark("start")
        for event_id in ("e1", "e1", "e1", "e2"):
            settle.send(event_id)
        # The worker starts after the sends: one that settled the first e1 before the third send
        # would let that send in (a flake under load).
        worker = env.worker()
        env.join(settle)
        monitor.mark("tick")
        env.middleware.runtime.tick()
        monitor.mark("ticked")
        settle.send("e3")
        env.join(settle)
        worker.stop()  # its last counts are flushed as it stops
        env.workers.remove(worker)
        monitor.mark("stopped")
        monitor.stop()

        flush = f"FCALL {backend._scripts.scripts.function('add_counts')}"
        scenario = monitor.between("start", "tick")
        assert not [c for c in scenario if c.startswith(flush) or c.startswith("HINCRBY")]
        assert len([c for c in monitor.between("tick", "ticked") if c.startswith(flush)]) == 1
        assert len([c for c in monitor.between("ticked", "stopped") if c.startswith(flush)]) == 1

        report = read_activity(backend, prefix=PREFIX, minutes=5)
        assert report.totals()["settle"] == {"acquired": 3, "conflict": 2, "released": 3}
        assert {row.actor_name for row in report} == {"settle"}
        assert all(row.minute % 60_000 == 0 and report.now - row.minute < 5 * 60_000 for row in report)
        assert report.as_dict()["totals"] == {"settle": {"acquired": 3, "conflict": 2, "released": 3}}
        ttl = redis_client.pttl(activity_key(PREFIX, report.rows[0].minute // 60_000))
        assert 5 * 3600_000 < ttl <= 6 * 3600_000
    finally:
        next(runs, None)


@pytest.fixture(params=["stub", "redis", "cluster"])
def backend(request):
    if request.param == "stub":
        return StubBackend()
    if request.param == "cluster":
        return RedisBackend(client=request.getfixturevalue("cluster_client"))
    return RedisBackend(client=request.getfixturevalue("redis_client"))


def test_one_flush_writes_the_counts_of_several_minutes(backend):
    # On Redis Cluster the minute keys share one hash tag, so one call writes them all.
    now = [backend.time() - 60_000]
    counter = ActivityCounter(
        backend,
        prefix=PREFIX,
        clock=lambda: now[0],
        logger=logging.getLogger("test"),
    )
    counter("settle", "acquired")
    counter("settle", "conflict")
    counter("sync", "conflict")
    now[0] += 60_000
    counter("settle", "conflict")
    counter.flush()
    counter.flush()  # nothing left: no call
    minute = now[0] // 60_000
    assert key_slot(activity_key(PREFIX, minute).encode()) == key_slot(activity_key(PREFIX, minute - 1).encode())
    assert backend.read_counts([activity_key(PREFIX, minute - 1), activity_key(PREFIX, minute)]) == [
        {"settle|acquired": 1, "settle|conflict": 1, "sync|conflict": 1},
        {"settle|conflict": 1},
    ]
    rows = [(row.minute // 60_000, row.actor_name, dict(row.counts)) for row in read_activity(backend, minutes=2)]
    assert rows == [
        (minute - 1, "settle", {"acquired": 1, "conflict": 1}),
        (minute - 1, "sync", {"conflict": 1}),
        (minute, "settle", {"conflict": 1}),
    ]


def test_a_process_without_a_worker_flushes_from_a_thread_of_its_own():
    backend = StubBackend()
    broker = StubBroker()
    env = Env("stub", broker, backend, UniqueJobs(backend=backend, heartbeat_interval=50, lease_period=150))
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        settle.send("e1")
        settle.send("e1")
        wait_for(lambda: read_activity(backend, minutes=2).totals() == {"settle": {"acquired": 1, "conflict": 1}})
        # With nothing left to flush, the thread ends. (Its own thread: counters of other tests whose
        # Redis is gone keep theirs while they hold counts.)
        wait_for(lambda: env.middleware.runtime._periodic is None)
    finally:
        next(runs, None)


@pytest.mark.parametrize("minutes", [0, 361, 1.5, True])
def test_read_activity_refuses_a_number_of_minutes_it_does_not_keep(minutes):
    with pytest.raises(ValueError, match=rf"minutes={minutes!r}: it must be an integer from 1 to 360"):
        read_activity(StubBackend(), minutes=minutes)


SENDER = """
import sys
import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

broker = StubBroker()
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=sys.argv[1])), before=TimeLimit)

@dramatiq.actor(broker=broker, lock="until_executed")
def settle(event_id):
    pass

settle.send("e1")
settle.send("e1")
"""


def test_a_process_that_only_sends_and_exits_keeps_its_counts(redis_url, redis_client):
    # review3: the thread of its own is a daemon, and nothing flushed at exit, so a short-lived
    # sender (a script, a cron job) lost every count it made within its last heartbeat interval.
    subprocess.run([sys.executable, "-c", SENDER, redis_url], check=True, timeout=60)
    backend = RedisBackend(client=redis_client)
    assert read_activity(backend, minutes=2).totals() == {"settle": {"acquired": 1, "conflict": 1}}


#: A process that only sends, to a lock store without a socket_timeout (None given: recent redis-py
#: versions have a default one): a round trip to a server that stopped waits for ever. Its first
#: flush would come a heartbeat interval after its sends.
SENDER_TO_A_FROZEN_STORE = """
import sys
import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from dramatiq_unique import RedisBackend, UniqueJobs

broker = StubBroker()
backend = RedisBackend(url=sys.argv[1], socket_timeout=None)
unique = UniqueJobs(backend=backend, lease_period=12_000, heartbeat_interval=4_000)
broker.add_middleware(unique, before=TimeLimit)

@dramatiq.actor(broker=broker, lock="until_executed")
def settle(event_id):
    pass

settle.send("e1")
settle.send("e1")
print("sent", flush=True)
sys.stdin.readline()  # the test stops the lock store, then lets this process exit
"""


@pytest.mark.slow
def test_a_process_that_only_sends_exits_within_a_bound_when_the_lock_store_is_frozen(server):  # noqa: F811
    # Issue 32 (8): at exit, the last flush of the activity counts waited for the lock store
    # without a bound: with its server stopped (SIGSTOP: it accepts and never answers) and no
    # socket_timeout, a script that had sent two jobs never exited.
    url = f"redis://127.0.0.1:{server.port}"
    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER_TO_A_FROZEN_STORE, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sender.stdout.readline() == "sent\n"
        server.proc.send_signal(signal.SIGSTOP)
        try:
            _, errors = sender.communicate("\n", timeout=60)
        finally:
            server.proc.send_signal(signal.SIGCONT)
    finally:
        if sender.poll() is None:
            sender.kill()
            sender.wait()
    assert sender.returncode == 0, errors
    assert (
        "The last lock activity counts of this process were not written (lock events of actors 'settle': 2): "
        "the lock backend did not answer within 12000 ms. They are missing from the lock activity; no lock is "
        "affected."
    ) in errors, errors


def test_the_last_counts_that_a_lock_store_refuses_are_reported_once_at_warning(server, caplog):  # noqa: F811
    # Issue 32 (8): the last flush of a process that only sends, refused by a lock store that is
    # down, logged at INFO that its counts were "tried again later": there is no later.
    broker = StubBroker()
    backend = RedisBackend(client=server.client())
    unique = UniqueJobs(backend=backend, lease_period=12_000, heartbeat_interval=4_000)
    with Env("stub", broker, backend, unique).running() as env:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        settle.send("e1")
        settle.send("e1")
        server.stop()
        with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
            unique.activity.close()
    lines = [r.getMessage() for r in caplog.records if "activity counts" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "The last lock activity counts of this process were not written (lock events of actors 'settle': 2): "
        "the lock backend failed: "
    ), lines[0]
    assert [r.levelname for r in caplog.records if "activity counts" in r.getMessage()] == ["WARNING"]


class _WindowAfterRelease:
    """A lock that runs ``on_release`` once, in the thread that released it, when ``when()`` says so."""

    def __init__(self, when, on_release):
        self._lock = threading.Lock()
        self.when, self.on_release, self.done = when, on_release, False

    def __enter__(self):
        self._lock.acquire()

    def __exit__(self, *exc):
        fire = not self.done and self.when()
        self._lock.release()
        if fire:
            self.done = True
            self.on_release()


def test_an_event_while_the_senders_thread_ends_is_flushed_all_the_same():
    # review3: the thread decided to end and cleared its slot in two critical sections; an event
    # in between saw a thread still there, started none, and its count waited for the next event.
    backend = StubBackend()
    logger = logging.getLogger("test")
    runtime = Runtime(
        backend,
        prefix=PREFIX,
        lease_period=30,
        heartbeat_interval=10,
        logger=logger,
        events=Events(logger=logger),
        background_releases=False,
        activity=True,
    )
    counter = runtime.activity
    assert counter is not None

    def late_event():
        late = threading.Thread(target=counter, args=("settle", "conflict"))
        late.start()
        late.join()

    # In a process that only sends, the periodic thread takes the runtime's mutex once per round,
    # to decide whether to go on. An event arrives the moment it lets go of it, having decided to end.
    def ending() -> bool:
        return threading.current_thread().name == PERIODIC_THREAD  # only its decision takes this mutex

    runtime._mutex = _WindowAfterRelease(ending, late_event)  # type: ignore[assignment]
    counter("settle", "acquired")
    wait_for(lambda: read_activity(backend, minutes=2).totals() == {"settle": {"acquired": 1, "conflict": 1}})
    counter.close()
