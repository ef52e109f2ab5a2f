"""The conflict trail (issue 34, "why did my job not run?"): each message that met a held lock or
a failing store is recorded off the hot path, with its call, its holder and what became of it,
bounded, on Redis, StubBackend and Redis Cluster, and read back through Locks.history()."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading

import pytest

from dramatiq_unique import (
    InvalidLockOptions,
    LockBackendError,
    Locks,
    RedisBackend,
    StubBackend,
    UniqueJobs,
    enqueue_outcome,
)
from dramatiq_unique.calls import CALL_SHOWN, message_call
from dramatiq_unique.events import CONFLICT, RESCHEDULED, WAITING, LockEvent
from dramatiq_unique.history import ConflictRecorder
from dramatiq_unique.keys import history_key
from dramatiq_unique.liveness import worker_id

from . import test_cli
from .cluster import cluster_env
from .support import pop_script_calls, wait_for
from .test_cli import assert_error, cli, ok

#: The command's tests' fixture: tests/cli_app.py on the test server, with locks in every state.
app = test_cli.app

PREFIX = "dramatiq-unique"
#: A terminal of 100 columns, the command's widest (the test runner may set a narrower one).
WIDE = {"COLUMNS": "100"}
HOUR = 3_600_000


def trail(env, **filters):
    """Write what the process recorded, as its periodic thread does once per heartbeat, and read it back."""
    env.middleware.activity.flush()
    return Locks.from_middleware(env.middleware).history(**filters)


def test_dropped_rescheduled_replaced_and_waiting_sends_are_in_the_trail(make_env):
    env = make_env()

    @env.actor(lock="until_executed")
    def reindex(tenant, batch):
        pass

    @env.actor(lock="until_executed", on_conflict="reschedule", reschedule_delay=60_000)
    def sync(account):
        pass

    @env.actor(lock="until_executed", on_conflict={"client": "replace", "server": "log"})
    def refresh(page):
        pass

    @env.actor(lock="until_executed", on_conflict="keep_latest")
    def publish(site):
        pass

    held = reindex.send("acme", 200)
    dropped = reindex.send("acme", 200)
    sync_holder, sync_again = sync.send(7), sync.send(7)
    replaced, newer = refresh.send("home"), refresh.send("home")
    publish_holder, waiter, latest = publish.send("blog"), publish.send("blog"), publish.send("blog")

    entries = trail(env)
    by_message = {entry.message_id: entry for entry in entries}
    assert len(entries) == 6  # one entry per message: a reschedule follows its conflict, not beside it
    assert [entry.at for entry in entries] == sorted((entry.at for entry in entries), reverse=True)

    entry = by_message[dropped.message_id]
    assert (entry.actor, entry.queue, entry.call, entry.outcome) == (
        "reindex",
        "default",
        "reindex('acme', 200)",
        "dropped",
    )
    assert (entry.holders, entry.lock, entry.lock_kind, entry.side, entry.strategy) == (
        (held.message_id,),
        "until_executed",
        "enqueue",
        "client",
        "log",
    )
    assert entry.worker == worker_id() and entry.prefix == PREFIX and len(entry.digest) == 22
    # The holder as its lock says when the entry is written: queued, in no worker yet.
    assert (entry.holder_state, entry.holder_worker) == ("queued", None)

    entry = by_message[sync_again.message_id]
    assert (entry.outcome, entry.strategy, entry.delay, entry.holders) == (
        "rescheduled",
        "reschedule",
        60_000,
        (sync_holder.message_id,),
    )

    # The loser of replace is the queued message whose place the newer one took.
    entry = by_message[replaced.message_id]
    assert (entry.outcome, entry.holders, entry.holder_state, entry.call) == (
        "replaced",
        (newer.message_id,),
        "queued",
        None,
    )

    # keep_latest: the first waiter waited, then the latest took its place in the line.
    waits = [e for e in entries if e.message_id == waiter.message_id]
    assert sorted(e.outcome for e in waits) == ["displaced", "waiting"]
    assert {e.holders for e in waits} == {(publish_holder.message_id,), (latest.message_id,)}
    assert by_message[latest.message_id].outcome == "waiting"
    assert by_message[latest.message_id].call == "publish('blog')"

    as_json = by_message[dropped.message_id].as_dict()
    assert as_json["holders"] == [held.message_id] and as_json["call"] == "reindex('acme', 200)"


def test_a_duplicate_dropped_in_the_worker_names_its_running_holder(make_env):
    env = make_env()
    started, gate = threading.Event(), threading.Event()

    @env.actor(lock="while_executing")
    def export(report):
        started.set()
        gate.wait(30)

    first = export.send("q3")
    env.worker(threads=2)
    assert started.wait(10)
    second = export.send("q3")
    wait_for(lambda: env.seen.skipped)
    (entry,) = trail(env, actor="export")  # written while the holder runs: its worker is named
    gate.set()
    env.join(export)

    assert (entry.message_id, entry.call, entry.outcome, entry.side, entry.lock_kind) == (
        second.message_id,
        "export('q3')",
        "dropped",
        "server",
        "run",
    )
    assert (entry.holders, entry.holder_state, entry.holder_worker) == ((first.message_id,), "running", worker_id())


def test_history_filters_by_actor_arguments_digest_and_time(make_env):
    env = make_env()

    @env.actor(lock="until_executed")
    def reindex(tenant, batch):
        pass

    @env.actor(lock="until_executed", lock_args_method=lambda tenant, batch: [tenant])
    def purge(tenant, batch):
        pass

    for args in (("acme", 1), ("acme", 1), ("globex", 2), ("globex", 2), ("globex", 2)):
        reindex.send(*args)
    purge.send("acme", 1)
    purge.send("acme", 2)  # the same lock: its lock arguments are the tenant alone

    locks = Locks.from_middleware(env.middleware)
    entries = trail(env)
    assert len(entries) == 4
    assert {e.call for e in locks.history("reindex", args=["globex", 2])} == {"reindex('globex', 2)"}
    assert len(locks.history(reindex, args=["globex", 2])) == 2
    # An actor with a lock_args_method: only the actor itself knows how its arguments make a digest.
    assert [e.call for e in locks.history(purge, args=["acme", 99])] == ["purge('acme', 2)"]
    globex = locks.history(reindex, args=["globex", 2])[0].digest
    assert len(locks.history(digest=globex)) == 2
    assert len(locks.history(limit=3)) == 3
    assert locks.history(within_ms=HOUR) == entries
    assert locks.history(since_ms=entries[0].at + 1) == ()
    with pytest.raises(ValueError, match="limit=0"):
        locks.history(limit=0)
    with pytest.raises(ValueError, match="without an actor"):
        locks.history(args=[1])
    with pytest.raises(ValueError, match="22 characters"):
        locks.history(digest="abc")


def test_a_send_that_meets_no_lock_writes_nothing(redis_client):
    # Activity counts off, so that no other write happens: the sends of free locks cost the same
    # round trips with the trail as without, and the trail's key is never written.
    calls = {}
    for history in (True, False):
        redis_client.flushall()
        unique = UniqueJobs(backend=RedisBackend(client=redis_client), activity=False, history=history)
        env = _env(redis_client, unique)
        with env.running():

            @env.actor(lock="until_executed", actor_name=f"free_{history}")
            def free(n):
                pass

            free.send(0)  # the first send checks the store's eviction policy
            redis_client.config_resetstat()
            for n in range(1, 21):
                free.send(n)
            env.middleware.activity is None or env.middleware.activity.flush()
            stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in redis_client.info("commandstats").items()}
            calls[history] = (pop_script_calls(stats), stats.get("xadd", 0))
            assert not redis_client.exists(history_key(PREFIX))
            assert env.middleware.history is None or not env.middleware.history.pending
    # (RedisBroker's enqueue is a script call too: two a send.)
    assert calls[True] == calls[False] == (40, 0)


def test_the_trail_keeps_its_bound_and_vanishes_when_idle(make_env):
    env = make_env(history_limit=3, history_retention=HOUR)

    @env.actor(lock="until_executed")
    def reindex(n):
        pass

    reindex.send(0)
    duplicates = [reindex.send(0) for _ in range(5)]
    entries = trail(env)
    # The newest three.
    assert [e.message_id for e in entries] == [m.message_id for m in reversed(duplicates[2:])]
    if env.kind == "redis":
        client = env.backend.client
        assert client.xlen(history_key(PREFIX)) == 3
        assert HOUR - 10_000 < client.pttl(history_key(PREFIX)) <= HOUR


def test_old_entries_go_after_the_retention(redis_client):
    backend = RedisBackend(client=redis_client)
    key = history_key(PREFIX)
    # Entries are dated by the server when added: one added "two hours ago".
    redis_client.xadd(key, {"at": "1", "actor": "old"}, id=f"{backend.time() - 2 * HOUR}-0")
    backend.add_history(key, [{"at": "2", "actor": "a"}], max_entries=10, retention=HOUR)
    assert redis_client.xlen(key) == 1
    backend.add_history(key, [{"at": "3", "actor": "b"}], max_entries=10, retention=HOUR)
    assert [fields["actor"] for _, fields in backend.read_history(key, limit=10)[1]] == ["b", "a"]


def test_off_means_no_key_and_no_subscriber(make_env):
    env = make_env(history=False)

    @env.actor(lock="until_executed")
    def reindex(n):
        pass

    reindex.send(1)
    reindex.send(1)
    assert env.middleware.history is None and env.middleware.runtime.history is None
    assert not env.middleware.events.wants(CONFLICT)
    assert trail(env) == ()
    if env.kind == "redis":
        assert not env.backend.client.exists(history_key(PREFIX))


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"history": "no"}, "history='no': it must be True or False"),
        ({"history_limit": 0}, "history_limit=0: it must be an integer from 1 to 1_000_000"),
        ({"history_limit": 2.5}, "history_limit=2.5"),
        ({"history_retention": True}, "history_retention=True: it must be an integer from 1 to"),
        ({"history_retention": 10**12}, "history_retention=1000000000000"),
    ],
)
def test_bad_options_are_refused_by_name(options, problem):
    with pytest.raises(InvalidLockOptions, match=problem.replace("(", r"\(")):
        UniqueJobs(backend=StubBackend(), **options)


def test_a_process_that_only_sends_writes_its_entries_at_exit(redis_url, redis_client):
    script = textwrap.dedent(
        f"""
        import dramatiq
        from dramatiq.brokers.stub import StubBroker
        from dramatiq.middleware import TimeLimit
        from dramatiq_unique import RedisBackend, UniqueJobs

        broker = StubBroker()
        # A heartbeat interval longer than the process: only the write at exit saves the entry.
        broker.add_middleware(
            UniqueJobs(backend=RedisBackend(url={redis_url!r}), heartbeat_interval=60_000, lease_period=180_000),
            before=TimeLimit,
        )

        @dramatiq.actor(broker=broker, lock="until_executed")
        def reindex(tenant, batch):
            pass

        reindex.send("acme", 200)
        print(reindex.send("acme", 200).message_id)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (entry,) = Locks(RedisBackend(client=redis_client)).history()
    assert (entry.message_id, entry.call, entry.outcome) == (result.stdout.strip(), "reindex('acme', 200)", "dropped")


def test_the_trail_on_redis_cluster(redis_client, cluster_client):
    env = cluster_env(redis_client, cluster_client)
    with env.running():

        @env.actor(lock="until_executed", on_conflict="reschedule")
        def reindex(tenant):
            pass

        @env.actor(lock="until_executed", lock_prefix="billing")
        def invoice(number):
            pass

        holder, again = reindex.send("acme"), reindex.send("acme")
        invoice.send(1)
        dropped = invoice.send(1)
        entries = trail(env)
        assert {(e.prefix, e.message_id, e.outcome) for e in entries} == {
            (PREFIX, again.message_id, "rescheduled"),
            ("billing", dropped.message_id, "dropped"),
        }
        by_message = {e.message_id: e for e in entries}
        assert by_message[again.message_id].holders == (holder.message_id,)
        # The holders of locks in two slots, named as their locks say.
        assert {e.holder_state for e in entries} == {"queued"}


def test_a_backend_outage_is_recorded_with_what_failed(redis_client, caplog):
    backend = RedisBackend(client=redis_client)
    recorder = ConflictRecorder(backend, clock=lambda: None, worker=worker_id, logger=logging.getLogger("test"))
    event = LockEvent(
        kind="backend_error",
        actor_name="reindex",
        queue_name="default",
        digest="d" * 22,
        message_id="m1",
        lock="until_executed",
        reason="acquisition at enqueue",
        error=ConnectionError("Connection refused"),
        call="reindex(1)",
        lock_prefix=PREFIX,
    )
    recorder(event)
    # Dramatiq's own enqueue that could not take its lock tries again later: one entry.
    recorder(
        LockEvent(
            kind=RESCHEDULED,
            actor_name="reindex",
            queue_name="default",
            message_id="m1",
            delay=5000,
            lock_prefix=PREFIX,
            reason="the lock backend failed",
        )
    )
    recorder(LockEvent(kind=WAITING, actor_name="x", queue_name="default", message_id=None))  # no message: ignored
    recorder.flush()
    (entry,) = Locks(backend).history()
    assert (entry.outcome, entry.delay, entry.lock_kind) == ("rescheduled", 5000, None)
    assert entry.reason == "the lock backend failed"


def test_a_call_is_cut_to_its_bound_whatever_the_arguments_size():
    written = []

    class Item:
        def __repr__(self):
            written.append(self)
            return "i"

    class Message:
        actor_name = "load"
        args = ([Item()] * 100_000, "x" * 10_000_000, *(["y" * 1000] * 5))
        kwargs = {"mode": "full"}

    call = message_call(Message())
    assert len(call) == CALL_SHOWN and call.startswith("load([i, i, i") and call.endswith("…")
    assert len(written) <= CALL_SHOWN  # each argument shortened as it is written, not written whole
    Message.args = ("acme", 200)
    assert message_call(Message()) == "load('acme', 200, mode='full')"

    # An int beyond Python's limit of digits has no repr (ValueError).
    Message.args = (10**5000,)
    assert message_call(Message()) == "load(…)"  # an event of the trail is built in Dramatiq's hooks: never raises


def _env(redis_client, unique):
    from dramatiq.brokers.redis import RedisBroker

    from .support import Env

    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    return Env("redis", broker, unique.backend, unique)


def test_stub_and_redis_keep_and_read_a_trail_alike(redis_client, cluster_client):
    # The backend model's rule: StubBackend answers as RedisBackend does (and on Redis Cluster).
    answers = []
    for backend in (StubBackend(), RedisBackend(client=redis_client), RedisBackend(client=cluster_client)):
        key, now = history_key(PREFIX), backend.time()
        entries = [
            {"at": str(now - 3 * HOUR + n), "actor": "a" if n % 2 else "b", "digest": f"d{n % 3}", "n": str(n)}
            for n in range(12)
        ]
        backend.add_history(key, entries[:5], max_entries=8, retention=HOUR)
        backend.add_history(key, entries[5:], max_entries=8, retention=HOUR)
        reads = [
            backend.read_history(key, limit=100),
            backend.read_history(key, actor="a", limit=2),
            backend.read_history(key, digest="d1", limit=100),
            backend.read_history(key, since=now - 3 * HOUR + 9, limit=100),
            backend.read_history(key, within=HOUR, limit=100),
            backend.read_history(history_key("other"), limit=100),
        ]
        answers.append([[fields["n"] for _, fields in read] for _, read in reads])
    assert answers[0] == answers[1] == answers[2]
    assert answers[0] == [
        ["11", "10", "9", "8", "7", "6", "5", "4"],
        ["11", "9"],
        ["10", "7", "4"],
        ["11", "10", "9"],
        [],
        [],
    ]


# The command (a subprocess of the real command, on tests/cli_app.py) ---------------------------


def test_history_command_filters_by_actor_arguments_and_since(app, redis_url):
    module, sent = app
    dropped = [module.settle_payment.send("evt_123", {"amount": n}) for n in range(2)]
    module.build_report.send("2024-06-30")  # its lock_limit of 2 is full
    # An entry of three hours ago, as a process whose clock says so would have written it.
    old = ConflictRecorder(
        module.unique.backend,
        clock=lambda: module.unique.backend.time() - 3 * HOUR,
        worker=worker_id,
        logger=logging.getLogger("test"),
    )
    old(
        _conflict(
            "settle_payment",
            "m-old",
            call="settle_payment('evt_123')",
            holders=("m-holder",),
            digest=enqueue_outcome(sent["settle"]).digest,
        )
    )
    old.flush()
    module.unique.activity.flush()  # a worker's heartbeat thread does this once per interval

    out = ok(cli("--url", redis_url, "history", "settle_payment", "--since", "2h", env=WIDE))
    lines = out.splitlines()
    server = redis_url.split("//")[1].rsplit("/", 1)[0]
    assert " ".join(lines[:2]).startswith(
        f"Conflicts of actor 'settle_payment' in the last 2h 00m on Redis {server}/0 under prefix 'dramatiq-unique'"
    )
    assert all(len(line) <= 100 for line in lines)
    assert "m-old" not in out and out.count("dropped at send (log)  settle_payment('evt_123', {'amount':") == 2
    for message in dropped:
        assert f"message {message.message_id[:8]} held by {sent['settle'].message_id[:8]} (queued)" in out
    assert lines[-1] == "2 conflicts shown; --json prints every field."

    # Without --since, the old entry too; --args with the actor's own lock_args_method (--app).
    listed = json.loads(
        ok(cli("--app", "tests.cli_app", "history", "settle_payment", "--args", '["evt_123"]', "--json"))
    )
    assert [entry["message_id"] for entry in listed] == [m.message_id for m in reversed(dropped)] + ["m-old"]
    assert set(listed[0]) >= {"at", "actor", "queue", "call", "digest", "outcome", "holders", "worker", "side"}
    assert listed[0]["holders"] == [sent["settle"].message_id]
    everything = json.loads(ok(cli("--url", redis_url, "history", "--json", "--limit", "10")))
    assert {entry["actor"] for entry in everything} == {"settle_payment", "build_report"}
    assert len(json.loads(ok(cli("--url", redis_url, "history", "--json", "--limit", "1")))) == 1
    assert ok(cli("--url", redis_url, "history", "ping")).startswith("No conflicts of actor 'ping' on Redis ")


def test_history_command_refuses_bad_input(redis_url):
    from dramatiq_unique.cli import RET_USAGE

    result = cli("--url", redis_url, "history", "--since", "2 hours")
    assert result.returncode == RET_USAGE and "'2 hours' is not a duration such as 30s, 15m, 2h or 1d" in result.stderr
    line = assert_error(cli("--url", redis_url, "history", "--args", "[1]"), RET_USAGE)
    assert "--args and --kwargs need an ACTOR" in line
    assert "--args must be a JSON array" in assert_error(cli("--url", redis_url, "history", "x", "--args", "{}"), 2)


def test_explain_ends_with_the_last_conflicts_of_the_job(app, redis_url):
    module, sent = app
    for _ in range(3):
        module.settle_payment.send("evt_123")
    module.settle_payment.send("evt_999")  # another job: not in this one's tail
    module.unique.activity.flush()
    out = ok(cli("explain", "tests.cli_app:settle_payment", '["evt_123"]', env=WIDE))
    tail = " ".join(out.split("\n\n")[-1].split())
    assert tail.startswith(
        f"3 sends in the last hour were dropped: held by message '{sent['settle'].message_id}' (queued), the latest at "
    )
    explained = json.loads(ok(cli("explain", "tests.cli_app:settle_payment", '["evt_123"]', "--json")))
    assert [entry["outcome"] for entry in explained["conflicts"]] == ["dropped"] * 3
    quiet = ok(cli("explain", "tests.cli_app:settle_payment", '["evt_000"]'))
    assert quiet.rstrip().endswith("The conflict trail has no message of this job in the last hour.")


def _conflict(actor, message_id, *, call, holders, digest="d" * 22):
    return LockEvent(
        kind=CONFLICT,
        actor_name=actor,
        queue_name="payments",
        digest=digest,
        message_id=message_id,
        lock="until_executed",
        side="client",
        strategy="log",
        holders=holders,
        call=call,
        lock_prefix=PREFIX,
    )


def test_sends_and_starts_refused_while_the_store_heals_are_in_the_trail(make_env):
    env = make_env()

    @env.actor(lock="until_executed")
    def reindex(n):
        pass

    @env.actor(lock="while_executing")
    def export(report):
        pass

    # As a worker that found the store's data lost refuses new places while it heals.
    env.backend.refuse_new_places(PREFIX, ttl=30_000)
    with pytest.raises(LockBackendError):
        reindex.send(1)
    started = export.send("q3")
    env.worker()
    env.wait_for_skips(1)  # enqueued again, to start once the store healed
    by_actor = {entry.actor: entry for entry in trail(env)}
    assert set(by_actor) == {"reindex", "export"}
    refused = by_actor["reindex"]
    assert (refused.outcome, refused.call, refused.side, refused.holders) == ("healing", "reindex(1)", None, ())
    assert refused.reason.startswith("acquisition at enqueue: ")
    entry = by_actor["export"]
    assert (entry.outcome, entry.message_id, entry.call) == ("healing", started.message_id, "export('q3')")
    assert entry.reason.startswith("start: ")
    env.backend.accept_new_places(PREFIX)
