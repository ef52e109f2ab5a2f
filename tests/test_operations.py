"""The operations API (SPEC O1; issue 10): list, get, explain and unlock held locks, on the Stub,
on Redis and on a Redis Cluster, with locks in every state: queued, running, lapsed, several
holders of one digest, locks under an actor's own prefix."""

from __future__ import annotations

import time

import pytest

from dramatiq_unique import InvalidLockOptions, LockArgumentsError, Locks, enqueue_outcome
from dramatiq_unique.backends import Holder
from dramatiq_unique.web import make_wsgi_app

from .support import Gate, declare_small_app, run_sync_worker, wait_for

pytestmark = pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)


@pytest.fixture
def app(env):
    """Locks in every state: queued, running, lapsed, two holders of one digest, another prefix."""
    gate = Gate()
    actors = declare_small_app(env, gate)
    sent = {
        "settle": actors["settle"].send("evt_1", {"amount": 100}),
        "report_a": actors["report"].send("2024-01-01"),
        "report_b": actors["report"].send("2024-01-01"),
        "invoice": actors["invoice"].send(7),
        "remind": actors["remind"].send(1),
        "sync": actors["sync"].send(42),
    }
    run_sync_worker(env)
    wait_for(lambda: gate.running.get(42) == 1)
    time.sleep(0.06)  # remind's lock lapses
    yield env, actors, sent, gate
    gate.open()


def digest_of(message):
    return enqueue_outcome(message).digest


def test_list_shows_every_held_lock_with_its_holders(app):
    env, actors, sent, _ = app
    locks = Locks.from_middleware(env.middleware, batch=2)  # several scan steps
    listed = list(locks.list())
    by_actor = {(lock.actor, lock.kind): lock for lock in listed}
    assert set(by_actor) == {("settle", "enqueue"), ("report", "enqueue"), ("invoice", "enqueue"), ("sync", "run")}

    settle = by_actor["settle", "enqueue"]
    assert settle.digest == digest_of(sent["settle"])
    assert (settle.queue, settle.lock, settle.prefix) == ("payments", "until_executed", "dramatiq-unique")
    (holder,) = settle.holders
    assert (holder.message_id, holder.state, holder.worker_id, holder.expires_at) == (
        sent["settle"].message_id,
        "queued",
        None,
        None,
    )
    assert holder.token == enqueue_outcome(sent["settle"]).token
    assert holder.acquired_at <= settle.read_at

    report = by_actor["report", "enqueue"]
    assert [h.message_id for h in report.holders] == [sent["report_a"].message_id, sent["report_b"].message_id]

    run = by_actor["sync", "run"]
    (running,) = run.holders
    assert running.message_id == sent["sync"].message_id and running.state == "running"
    assert running.worker_id and running.expires_at is not None  # a lease

    assert by_actor["invoice", "enqueue"].prefix == "billing"
    assert settle.as_dict() == {
        "digest": settle.digest,
        "kind": "enqueue",
        "actor": "settle",
        "queue": "payments",
        "lock": "until_executed",
        "holders": [
            {
                "message_id": sent["settle"].message_id,
                "state": "queued",
                "worker_id": None,
                "acquired_at": holder.acquired_at,
                "expires_at": None,
                "token": holder.token,
                "call": None,
                "stop_requested_by": None,
            }
        ],
        "waiting": [],
    }


def test_list_filters_by_actor_and_state_and_stops_at_the_limit(app):
    env, _, sent, _ = app
    locks = Locks.from_middleware(env.middleware)
    assert [(lock.actor, lock.kind) for lock in locks.list(state="running")] == [("sync", "run")]
    assert {lock.actor for lock in locks.list(state="queued")} == {"settle", "report", "invoice"}
    (report,) = locks.list(actor="report")
    assert len(report.holders) == 2
    assert list(locks.list(actor="report", state="running")) == []
    assert len(list(locks.list(limit=2))) == 2
    # Without the actor's own prefix, its locks are not seen.
    assert "invoice" not in {lock.actor for lock in Locks(env.backend).list()}
    with pytest.raises(ValueError, match="'queued', 'running'"):
        list(locks.list(state="waiting"))


def test_get_reads_both_locks_of_a_digest(app):
    env, _, sent, _ = app
    locks = Locks.from_middleware(env.middleware)
    (settle,) = locks.get(digest_of(sent["settle"]))
    assert settle.holders[0].message_id == sent["settle"].message_id
    (run,) = locks.get(next(lock.digest for lock in locks.list(actor="sync")))
    assert run.kind == "run"
    assert locks.get("0" * 64) == ()
    (invoice,) = locks.get(digest_of(sent["invoice"]))
    assert invoice.prefix == "billing"
    with pytest.raises(ValueError, match="is not a digest"):
        locks.get("dramatiq-unique:{abc}")


def test_explain_says_what_a_new_send_would_meet(app):
    env, actors, sent, _ = app
    locks = Locks.from_middleware(env.middleware)

    explained = locks.explain(actors["settle"], "evt_1", {"amount": 999})
    assert explained.digest == digest_of(sent["settle"])
    assert explained.lock_args == ["evt_1"]
    assert explained.on_send.startswith(
        f"A new send would be dropped as a duplicate of message {sent['settle'].message_id!r} (queued, held for "
    )
    assert explained.on_send.endswith("never expires) (strategy 'log').")
    assert explained.on_start is None
    # What it said is what a send does.
    again = actors["settle"].send("evt_1", {"amount": 999})
    assert enqueue_outcome(again).status == "duplicate"
    assert enqueue_outcome(again).holder == sent["settle"].message_id

    assert locks.explain(actors["settle"], "evt_2").on_send == "A new send would take the enqueue lock: it is free."
    # A lapsed lock is free.
    assert locks.explain(actors["remind"], 1).on_send == "A new send would take the enqueue lock: it is free."

    sync = locks.explain(actors["sync"], 42)
    assert sync.on_send == "A new send would be enqueued: while_executing takes no lock at enqueue."
    assert sync.on_start.startswith(
        "A message with these arguments, started now, would be rescheduled to try again in 1m 00s: "
        f"the run lock is held by message {sent['sync'].message_id!r} (running on worker "
    )
    assert [lock.kind for lock in sync.locks] == ["run"]

    report = locks.explain(actors["report"], "2024-01-01")
    assert "as a duplicate of messages" in report.on_send and len(report.locks[0].holders) == 2
    free = "A new send would take the enqueue lock: it is free."
    assert locks.explain(actors["report"], "2024-01-02").on_send == free
    actors["report"].send("2024-01-02")
    assert (
        locks.explain(actors["report"], "2024-01-02").on_send
        == "A new send would take a free slot of the enqueue lock (1 of 2 taken)."
    )

    assert locks.explain(actors["invoice"], 7).prefix == "billing"
    assert "dropped as a duplicate" in locks.explain(actors["invoice"], 7).on_send

    plain = locks.explain(actors["plain"], 1)
    assert plain.digest is None and plain.on_send.startswith("No lock: actor 'plain' has no lock option")


def test_explain_names_the_queued_message_a_new_send_would_replace(app):
    env, actors, _, _ = app
    locks = Locks.from_middleware(env.middleware)
    first = actors["refresh"].send("k")
    explained = locks.explain(actors["refresh"], "k")
    assert explained.on_send.startswith(f"A new send would replace queued message {first.message_id!r} (queued, ")
    second = actors["refresh"].send("k")
    assert enqueue_outcome(second).replaced == first.message_id


def test_explain_reports_bad_lock_arguments(env):
    @env.actor(lock="until_executed", lock_args_method=lambda x: x["id"])
    def fussy(x):
        pass

    with pytest.raises(LockArgumentsError, match="lock_args_method of actor 'fussy' raised TypeError"):
        Locks.from_middleware(env.middleware).explain(fussy, 1)


def test_unlock_frees_a_digest_or_one_holder_and_returns_what_it_freed(app):
    env, actors, sent, _ = app
    locks = Locks.from_middleware(env.middleware)
    report_digest = digest_of(sent["report_a"])
    (freed,) = locks.unlock(report_digest, message_id=sent["report_a"].message_id)
    assert [h.message_id for h in freed.holders] == [sent["report_a"].message_id]
    (left,) = locks.get(report_digest)
    assert [h.message_id for h in left.holders] == [sent["report_b"].message_id]
    assert locks.unlock(report_digest, message_id="not-a-holder") == ()

    (freed,) = locks.unlock(digest_of(sent["settle"]))
    assert freed.holders[0].message_id == sent["settle"].message_id
    assert locks.get(digest_of(sent["settle"])) == ()
    # What a user notices: the next send is enqueued.
    assert enqueue_outcome(actors["settle"].send("evt_1")).status == "enqueued"
    assert locks.unlock("0" * 64) == ()

    # Under an actor's own prefix too.
    (freed,) = locks.unlock(digest_of(sent["invoice"]))
    assert freed.prefix == "billing"


def test_unlock_all_frees_every_lock_of_one_actor_only(app):
    env, actors, sent, gate = app
    locks = Locks.from_middleware(env.middleware)
    actors["settle"].send("evt_2")
    freed = locks.unlock_all(actor="settle")
    assert sorted(len(lock.holders) for lock in freed) == [1, 1]
    assert list(locks.list(actor="settle")) == []
    assert {lock.actor for lock in locks.list()} == {"report", "invoice", "sync"}
    # A running message's run lock: it is freed, and a copy may now start beside it.
    (freed,) = locks.unlock_all(actor="sync")
    assert freed.kind == "run" and freed.holders[0].message_id == sent["sync"].message_id
    assert "would take the run lock: it is free" in locks.explain(actors["sync"], 42).on_start


def test_an_unlock_never_frees_a_holder_that_came_after_it_read(app):
    # O1 + S2: owner-checked against the record read, never a blind delete.
    env, actors, sent, _ = app
    locks = Locks.from_middleware(env.middleware)
    stale = locks.get(digest_of(sent["settle"]))
    assert locks.unlock(digest_of(sent["settle"]))
    newer = actors["settle"].send("evt_1")
    assert locks.release(stale) == ()
    (held,) = locks.get(digest_of(sent["settle"]))
    assert held.holders[0].message_id == newer.message_id


def test_explain_matches_what_send_does_for_each_client_strategy(env):
    from dramatiq_unique import DuplicateMessage

    @env.actor(queue_name="strict", lock="until_executed", on_conflict="raise")
    def strict(x):
        pass

    @env.actor(queue_name="strict", lock="until_executed", on_conflict="reject")
    def picky(x):
        pass

    @env.actor(queue_name="strict", lock="until_executed", on_conflict="reschedule", max_reschedules=0)
    def patient(x):
        pass

    locks = Locks.from_middleware(env.middleware)
    held = {actor: actor.send(1) for actor in (strict, picky, patient)}

    explained = locks.explain(strict, 1).on_send
    assert explained.startswith(
        f"A new send would make send() raise DuplicateMessage as a duplicate of message {held[strict].message_id!r}"
    )
    with pytest.raises(DuplicateMessage):
        strict.send(1)

    assert locks.explain(picky, 1).on_send.startswith("A new send would go to the dead-letter queue without running")
    assert enqueue_outcome(picky.send(1)).status == "rejected"

    # max_reschedules=0: the first reschedule is one too many.
    assert locks.explain(patient, 1).on_send.startswith("A new send would go to the dead-letter queue without running")
    assert enqueue_outcome(patient.send(1)).status == "rejected"


def test_page_walks_every_lock_once_with_its_cursor_and_filters(app):
    env, _, sent, _ = app
    locks = Locks.from_middleware(env.middleware, batch=2)  # several scan steps, pages end inside a step
    every = sorted(lock.key for lock in locks.list())
    walked, cursor, pages = [], None, 0
    while True:
        found, cursor = locks.page(cursor=cursor, limit=1)
        walked += [lock.key for lock in found]
        pages += 1
        assert len(found) <= 1 and pages < 50
        if cursor is None:
            break
    assert sorted(walked) == every and len(walked) == len(set(walked))
    found, cursor = locks.page(state="running", limit=10, max_steps=1000)
    assert [(lock.actor, lock.kind) for lock in found] == [("sync", "run")] and cursor is None
    settle = digest_of(sent["settle"])
    (only,) = locks.page(digest_prefix=settle[:8], limit=10, max_steps=1000)[0]
    assert only.digest == settle
    with pytest.raises(ValueError, match="is not a cursor of Locks.page"):
        locks.page(cursor="9.0")
    with pytest.raises(ValueError, match="'queued', 'running'"):
        locks.page(state="waiting")


def test_workers_are_read_with_their_prefixes_and_whether_they_are_alive(app):
    # Issue 18: the web page reads the worker registry through Locks.
    env, _, _, _ = app
    locks = Locks.from_middleware(env.middleware)
    read_at, workers = locks.workers()
    (worker,) = [w for w in workers if w.worker_id == env.middleware.liveness.worker_id]
    assert worker.prefixes == ("dramatiq-unique", "billing") and worker.alive
    assert worker.read_at == read_at and worker.alive_until > read_at
    env.backend.heartbeat("dramatiq-unique:workers", "dead-host:1:0", ttl=1)
    time.sleep(0.01)
    _, workers = locks.workers()
    dead = {w.worker_id: w for w in workers}["dead-host:1:0"]
    assert not dead.alive and dead.prefixes == ("dramatiq-unique",)
    assert workers[-1] is dead  # the one alive the longest first


def test_whether_a_queued_holder_is_still_in_the_broker_is_asked_through_locks(app):
    # Issue 18: the web page asks through Locks, not the reaper's broker locators.
    env, _, sent, _ = app
    locks = Locks.from_middleware(env.middleware)
    found = locks.get(digest_of(sent["settle"]))
    (lock,) = found
    assert locks.in_broker(found, env.broker) == {(lock.key, sent["settle"].message_id): True}
    assert locks.in_broker(found, None) == {}
    running = [lock for lock in locks.list(state="running")]
    assert running and locks.in_broker(running, env.broker) == {}  # only queued holders of enqueue locks


def test_explain_describes_a_registered_strategy_without_an_explain_method_by_its_name(env):
    # Issue 18: each strategy describes its outcome; one of the user's own falls back on its name.
    from dramatiq.middleware import SkipMessage

    from dramatiq_unique import ConflictStrategy, EnqueueCancelled, register_strategy
    from dramatiq_unique.strategies import STRATEGIES

    class Park(ConflictStrategy):
        name = "park"

        def on_client_conflict(self, conflict):
            raise EnqueueCancelled("Parked.", conflict.message)

        def on_server_conflict(self, conflict):
            raise SkipMessage("Parked.")

    register_strategy(Park())
    try:

        @env.actor(queue_name="parked", lock="until_executed", on_conflict="park")
        def parked(x):
            pass

        first = parked.send(1)
        on_send = Locks.from_middleware(env.middleware).explain(parked, 1).on_send
        assert on_send.startswith(
            f"A new send would be left to strategy 'park' as a duplicate of message {first.message_id!r}"
        )
        assert on_send.endswith("(strategy 'park').")
    finally:
        del STRATEGIES["park"]


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("{billing}", "it must be a non-empty string without '{' or '}'."),
        (
            "billing:\udcff",
            "it holds a lone surrogate, which UTF-8 cannot encode, and the lock store's keys are UTF-8 text.",
        ),
    ],
)
def test_a_prefix_no_actor_may_declare_is_refused(env, prefix, problem):
    # Issue 32: braces, which the actor's lock_prefix refuses, listed nothing and said so; a lone
    # surrogate raised the codec's error at the first read.
    for build in (
        lambda: Locks(env.backend, actor_prefixes=[prefix]),
        lambda: make_wsgi_app(env.backend, lock_prefix=prefix),
    ):
        with pytest.raises(InvalidLockOptions) as raised:
            build()
        assert str(raised.value) == f"Locks has an invalid lock prefix {prefix!r}: {problem}"


def test_resolve_finds_the_digests_that_start_with_a_prefix_and_reads_no_other_lock(app):
    # Issue 34, point 2: a digest is taken by a unique prefix of it, as git takes one of a commit id.
    env, _, sent, _ = app
    locks = Locks.from_middleware(env.middleware, batch=2)
    settle, invoice = digest_of(sent["settle"]), digest_of(sent["invoice"])
    assert locks.resolve(settle[:6]) == (settle,)
    assert locks.resolve(invoice[:5]) == (invoice,)  # under the actor's own prefix
    assert locks.resolve(settle) == (settle,)  # a whole digest is its own prefix
    # Two held digests that start alike: both are answered, sorted.
    holder = Holder("m-x", "settle", "payments", "until_executed", "queued")
    twins = ["Ab-_" + "x" * 18, "Ab-_" + "y" * 18]
    for n, twin in enumerate(twins):
        assert env.backend.acquire(f"dramatiq-unique:{{{twin}}}", f"o{n}", limit=1, ttl=None, holder=holder).acquired
    assert locks.resolve("Ab-_") == tuple(twins)
    assert locks.resolve("Ab-_x") == (twins[0],)
    assert locks.resolve("Zz9-") == ()
    # The backend is asked for the keys of those digests only, in every scan step.
    cursor, seen = "0", set()
    while True:
        cursor, records = env.backend.scan("dramatiq-unique", cursor, 2, digest_start="Ab-_")
        seen |= {record.key for record in records}
        if cursor == "0":
            break
    assert seen == {f"dramatiq-unique:{{{twin}}}" for twin in twins}
    with pytest.raises(ValueError, match="'Ab-' is too short a digest prefix: give at least 4 characters"):
        locks.resolve("Ab-")
    with pytest.raises(ValueError, match="is not a digest"):
        locks.resolve("Ab-_}")
