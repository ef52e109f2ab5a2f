"""Waiting in line (on_conflict="wait") and keeping the latest (on_conflict="keep_latest") with
real Workers on StubBroker, RedisBroker and RabbitmqBroker (issue 21).

What a user notices is recorded independently of the library: each run's key, payload and its
start and end on one clock, under a mutex; what send() returned; what is in the dead-letter queue.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import Locks, RedisBackend, UniqueJobs, enqueue_outcome, reap_orphans
from dramatiq_unique.keys import enqueue_key, line_key, run_key, waiters_key
from dramatiq_unique.presentation import describe_lock, lock_table

from .support import Env, Gate, unique_warnings, wait_for

#: StubBackend, a Redis server, and a Redis Cluster (locks on the cluster, messages on a Redis).
ON_EVERY_BACKEND = pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)

#: Long enough that a waiter that polled (``reschedule``) would show: every handoff is far shorter.
POLLING_DELAY = 60_000


class Runs:
    """Each run of an actor: key, payload, and when it started and ended (monotonic s)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self.starts: list[tuple[Any, Any, float]] = []
        self.ends: list[tuple[Any, Any, float]] = []

    def run(self, key: Any, payload: Any, seconds: float = 0.002) -> None:
        with self._mutex:
            self.starts.append((key, payload, time.monotonic()))
        time.sleep(seconds)
        with self._mutex:
            self.ends.append((key, payload, time.monotonic()))

    def of(self, key: Any) -> list[tuple[Any, float, float]]:
        """The runs of ``key`` in the order they started: payload, start, end."""
        ends = {(k, p): t for k, p, t in self.ends}
        started = sorted(self.starts, key=lambda run: run[2])
        return [(p, t, ends.get((k, p), float("inf"))) for k, p, t in started if k == key]


def assert_one_at_a_time(runs: list[tuple[Any, float, float]]) -> list[float]:
    """Each run of a key started after the one before it ended; returns the handoff gaps (s)."""
    gaps = [start - previous_end for (_, _, previous_end), (_, start, _) in zip(runs, runs[1:], strict=False)]
    assert all(gap >= 0 for gap in gaps), gaps
    return gaps


def send_in_line(env, keys: int, per_key: int, **options: Any):
    runs = Runs()

    @env.actor(
        lock="until_executed",
        on_conflict="wait",
        reschedule_delay=POLLING_DELAY,
        lock_args_method=lambda key, seq: [key],
        **options,
    )
    def update(key, seq):
        runs.run(key, seq)

    outcomes = {(key, seq): enqueue_outcome(update.send(key, seq)) for seq in range(per_key) for key in range(keys)}
    return update, runs, outcomes


def check_line(env, update, runs: Runs, outcomes, keys: int, per_key: int) -> None:
    for key in range(keys):
        assert outcomes[(key, 0)].status == "enqueued"
        assert [outcomes[(key, seq)].status for seq in range(1, per_key)] == ["waiting"] * (per_key - 1)
        assert [outcomes[(key, seq)].position for seq in range(1, per_key)] == list(range(1, per_key))
    env.worker(threads=4)
    wait_for(lambda: len(runs.ends) == keys * per_key, timeout=60)
    env.join(update)
    gaps = []
    for key in range(keys):
        of_key = runs.of(key)
        assert [payload for payload, _, _ in of_key] == list(range(per_key))  # once each, in send order
        gaps += assert_one_at_a_time(of_key)
    # A waiter is enqueued by the step that frees the place, never after reschedule_delay.
    assert max(gaps) < POLLING_DELAY / 1000 / 6, max(gaps)
    print(f"handoff: median {statistics.median(gaps) * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms")


@ON_EVERY_BACKEND
def test_200_messages_on_5_keys_wait_in_line_and_run_once_each_in_send_order(env):
    update, runs, outcomes = send_in_line(env, keys=5, per_key=40)
    check_line(env, update, runs, outcomes, keys=5, per_key=40)


def test_200_messages_on_5_keys_wait_in_line_on_rabbitmq(rabbitmq_env):
    update, runs, outcomes = send_in_line(rabbitmq_env, keys=5, per_key=40)
    check_line(rabbitmq_env, update, runs, outcomes, keys=5, per_key=40)


# until_and_while_executing waits in both lines: for the enqueue lock at send, for the run lock at start.
@ON_EVERY_BACKEND
@pytest.mark.parametrize(
    ("lock", "on_conflict"), [("while_executing", {"server": "wait"}), ("until_and_while_executing", "wait")]
)
def test_messages_that_meet_a_running_one_wait_in_line_in_the_worker(env, lock, on_conflict):
    runs, gate = Runs(), Gate()

    @env.actor(
        lock=lock,
        on_conflict=on_conflict,
        reschedule_delay=POLLING_DELAY,
        lock_args_method=lambda key, seq: [key],
    )
    def sync(key, seq):
        if seq == 0:
            gate.enter(key)
        runs.run(key, seq)

    for seq in range(8):
        for key in range(3):
            sync.send(key, seq)
    env.worker(threads=4)
    wait_for(lambda: len(gate.runs) == 3)
    gate.open()
    wait_for(lambda: len(runs.ends) == 24, timeout=30)
    env.join(sync)
    for key in range(3):
        of_key = runs.of(key)
        assert sorted(payload for payload, _, _ in of_key) == list(range(8))
        assert max(assert_one_at_a_time(of_key)) < POLLING_DELAY / 1000 / 6
    assert not env.dead_letters(sync)


@pytest.mark.parametrize(
    ("lock", "on_conflict", "ran"),
    [
        ("until_executed", "wait", [0, 1, 2]),
        ("until_executed", "keep_latest", [0, 2]),
        ("while_executing", {"server": "wait"}, [0, 1, 2]),
    ],
)
def test_a_line_keeps_the_messages_of_an_encoder_that_writes_bytes(env, lock, on_conflict, ran):
    # Issue 31 (7): with PickleEncoder, each send of a wait or keep_latest actor raised
    # UnicodeDecodeError inside before_enqueue; Dramatiq logged it and enqueued the message
    # without its lock, and every copy ran, at once.
    previous = dramatiq.get_encoder()
    dramatiq.set_encoder(dramatiq.PickleEncoder())
    try:
        runs, gate = Runs(), Gate()

        @env.actor(lock=lock, on_conflict=on_conflict, reschedule_delay=POLLING_DELAY, lock_args_method=lambda seq: [])
        def sync(seq):
            if seq == 0:
                gate.enter(seq)
            runs.run("account", seq)

        sync.send(0)
        env.worker(threads=3)
        wait_for(lambda: len(gate.runs) == 1)
        sync.send(1)
        sync.send(2)
        if lock == "while_executing":
            wait_for(lambda: len(env.seen.skipped) == 2)  # both wait in the run lock's line
        gate.open()
        wait_for(lambda: len(runs.ends) == len(ran), timeout=30)
        env.join(sync)
    finally:
        dramatiq.set_encoder(previous)
    of_account = runs.of("account")
    payloads = [payload for payload, _, _ in of_account]
    # In the worker, 1 and 2 join the run lock's line in the order their threads get there.
    assert (sorted(payloads) if lock == "while_executing" else payloads) == ran
    assert_one_at_a_time(of_account)


def test_lock_limit_runs_that_many_at_once_and_the_rest_wait_in_order(env):
    runs, running, most = Runs(), [0], [0]
    mutex = threading.Lock()

    @env.actor(lock="until_executed", on_conflict="wait", lock_limit=2, lock_args_method=lambda seq: [])
    def render(seq):
        with mutex:
            running[0] += 1
            most[0] = max(most[0], running[0])
        runs.run("all", seq, seconds=0.02)
        with mutex:
            running[0] -= 1

    statuses = [enqueue_outcome(render.send(seq)).status for seq in range(12)]
    assert statuses == ["enqueued"] * 2 + ["waiting"] * 10
    env.worker(threads=6)
    wait_for(lambda: len(runs.ends) == 12, timeout=30)
    env.join(render)
    assert most[0] == 2
    started = [payload for payload, _, _ in runs.of("all")]
    assert sorted(started) == list(range(12))
    # Handed over two at a time, in line order: each waiter starts before those two places behind it.
    assert all(started.index(seq) < started.index(seq + 2) for seq in range(2, 10))


def test_a_full_line_sends_the_newcomer_to_the_dead_letter_queue(env):
    gate = Gate()

    @env.actor(lock="until_executed", on_conflict="wait", line_limit=2, lock_args_method=lambda seq: [])
    def export(seq):
        gate.enter(seq)

    statuses = [enqueue_outcome(export.send(seq)).status for seq in range(5)]
    assert statuses == ["enqueued", "waiting", "waiting", "rejected", "rejected"]
    env.worker(threads=2)
    wait_for(lambda: len(gate.runs) == 1)
    gate.open()
    wait_for(lambda: len(gate.runs) == 3)
    env.join(export)
    assert gate.runs == [0, 1, 2]
    assert sorted(m.args[0] for m in env.dead_letters(export)) == [3, 4]


def send_updates_while_one_runs(env, updates: int):
    gate, payloads = Gate(), []

    @env.actor(lock="until_executed", on_conflict="keep_latest", lock_args_method=lambda profile, version: [profile])
    def push_profile(profile, version):
        payloads.append(version)
        gate.enter(profile)

    assert enqueue_outcome(push_profile.send(7, 0)).status == "enqueued"
    env.worker(threads=2)
    wait_for(lambda: payloads == [0])  # the first push runs
    outcomes = [enqueue_outcome(push_profile.send(7, version)) for version in range(1, updates + 1)]
    return push_profile, gate, payloads, outcomes


def check_latest(env, push_profile, gate, payloads, outcomes, updates: int) -> None:
    assert [o.status for o in outcomes] == ["waiting"] * updates
    assert all(o.position == 1 for o in outcomes)
    # Each update took the place of the one before it.
    ids = [o.holder for o in outcomes]
    assert ids[0] and outcomes[0].replaced is None and all(o.replaced for o in outcomes[1:])
    gate.open()
    wait_for(lambda: len(payloads) == 2)
    env.join(push_profile)
    time.sleep(0.2)
    assert payloads == [0, updates]  # exactly one more run, with the latest payload
    assert gate.max_running == {7: 1}


@ON_EVERY_BACKEND
def test_keep_latest_runs_once_more_with_the_last_of_50_updates(env):
    push_profile, gate, payloads, outcomes = send_updates_while_one_runs(env, 50)
    check_latest(env, push_profile, gate, payloads, outcomes, 50)


def test_keep_latest_on_rabbitmq(rabbitmq_env):
    push_profile, gate, payloads, outcomes = send_updates_while_one_runs(rabbitmq_env, 50)
    check_latest(rabbitmq_env, push_profile, gate, payloads, outcomes, 50)


def test_a_line_survives_a_failure_of_the_holder(env):
    # The holder fails for good (no retries): its place goes to the next in line all the same.
    runs = Runs()

    @env.actor(lock="until_executed", on_conflict="wait", max_retries=0, lock_args_method=lambda seq: [])
    def flaky(seq):
        runs.run("all", seq)
        if seq == 0:
            raise RuntimeError("boom")

    for seq in range(3):
        flaky.send(seq)
    env.worker(threads=2)
    wait_for(lambda: len(runs.ends) == 3)
    env.join(flaky)
    assert [payload for payload, _, _ in runs.of("all")] == [0, 1, 2]
    assert [m.args[0] for m in env.dead_letters(flaky)] == [0]


@ON_EVERY_BACKEND
@pytest.mark.parametrize(("lock", "on_conflict"), [("until_executed", "wait"), ("while_executing", "wait")])
def test_a_handoff_lost_with_its_process_is_enqueued_again_by_the_reaper_and_runs_once(env, lock, on_conflict):
    # The process that freed the place dies before it enqueues the waiter: here, nobody enqueues
    # what the line hands over. The reaper finds the place whose message never reached the
    # broker and enqueues it again; a second copy of it (the dying process did enqueue it after
    # all) is skipped.
    gate, payloads = Gate(), []

    @env.actor(lock=lock, on_conflict=on_conflict, reschedule_delay=POLLING_DELAY, lock_args_method=lambda seq: [])
    def export(seq):
        payloads.append(seq)
        gate.enter(seq)

    handoffs = env.backend.handoffs
    handed: list[bytes] = []
    env.backend.handoffs = handed.extend  # the process dies before it enqueues them
    digest = enqueue_outcome(export.send(0)).digest
    export.send(1)
    env.worker(threads=2)
    # One runs; the other waits in line (in the worker, either may come first).
    wait_for(lambda: len(payloads) == 1 and (lock != "while_executing" or len(env.seen.skipped) == 1))
    gate.open()
    wait_for(lambda: len(handed) == 1)
    env.join(export)
    assert len(payloads) == 1
    env.backend.handoffs = handoffs

    reaper = env.middleware.reaper
    reaper.min_age = 0
    report = reaper.run(broker=env.broker)
    assert report.enqueued_again == 1 and report.released == 0
    wait_for(lambda: sorted(payloads) == [0, 1])
    handoffs(handed)  # the copy the dying process enqueued after all
    env.join(export)
    time.sleep(0.2)
    assert sorted(payloads) == [0, 1]
    assert env.is_free(digest, run=lock == "while_executing")


@pytest.mark.parametrize(
    ("lock", "on_conflict"),
    [("until_executing", "wait"), ("until_and_while_executing", {"client": "replace", "server": "wait"})],
)
def test_a_retry_of_a_message_a_line_handed_a_place_runs(env, lock, on_conflict):
    # Issue 31 (1): the handed message failed once, and its retry was skipped as "a copy of it
    # started already": it took a new enqueue place, with a new token, which the start compared
    # with the token of the place the line had handed (in the second pattern, a run lock's).
    runs, gate, attempts = Runs(), Gate(), []

    @env.actor(
        lock=lock,
        on_conflict=on_conflict,
        reschedule_delay=POLLING_DELAY,
        lock_args_method=lambda seq: [],
        max_retries=3,
        min_backoff=50,
        max_backoff=100,
    )
    def save(seq):
        attempts.append(seq)
        if seq == 0:
            gate.enter(seq)
        if attempts.count(1) == 1 and seq == 1:
            raise RuntimeError("the first attempt fails")
        runs.run("document", seq)

    save.send(0)
    if lock == "until_executing":
        assert enqueue_outcome(save.send(1)).status == "waiting"  # in the enqueue lock's line
        env.worker(threads=2)
    else:
        env.worker(threads=2)
        wait_for(lambda: len(gate.runs) == 1)
        save.send(1)
        wait_for(lambda: len(env.seen.skipped) == 1)  # in the run lock's line
    gate.open()
    wait_for(lambda: len(runs.ends) == 2, timeout=30)
    env.join(save)
    assert attempts.count(1) == 2 and [payload for payload, _, _ in runs.of("document")] == [0, 1]
    # No place was left behind: a new send does not wait.
    assert enqueue_outcome(save.send(2)).status == "enqueued"


def test_a_handed_message_that_age_limit_skips_hands_its_place_on(env):
    # Issue 31 (3): a message that waited in the run lock's line longer than its max_age was handed
    # the place, skipped by AgeLimit (before UniqueJobs sees it), and kept the place for ever: no
    # later message of that lock ran.
    runs, gate = Runs(), Gate()

    @env.actor(
        lock="while_executing",
        on_conflict={"server": "wait"},
        reschedule_delay=POLLING_DELAY,
        lock_args_method=lambda account, seq: [account],
    )
    def sync(account, seq):
        if seq == 0:
            gate.enter(seq)
        runs.run(account, seq)

    sync.send("a1", 0)
    env.worker(threads=3)
    wait_for(lambda: len(gate.runs) == 1)
    sync.send_with_options(args=("a1", 1), max_age=500)
    wait_for(lambda: len(env.seen.skipped) == 1)  # waits in the run lock's line
    time.sleep(0.6)  # older than its max_age by the time it is handed the place
    sync.send_with_options(args=("a1", 2), max_age=600_000)
    wait_for(lambda: len(env.seen.skipped) == 2)
    gate.open()
    wait_for(lambda: len(runs.ends) == 2, timeout=30)
    env.join(sync)
    assert [payload for payload, _, _ in runs.of("a1")] == [0, 2]
    assert len(env.seen.skipped) == 3  # 1 and 2 waited in line; AgeLimit skipped 1


def test_explain_list_and_the_lock_events_show_the_line(env):
    gate, events = Gate(), []
    env.middleware.subscribe(["waiting", "handed_over"], events.append)

    @env.actor(lock="until_executed", on_conflict="wait", lock_args_method=lambda seq: [])
    def export(seq):
        gate.enter(seq)

    sent = [export.send(seq) for seq in range(4)]
    locks = Locks.from_middleware(env.middleware)
    assert "wait in line" in locks.explain(export, 9).on_send
    assert "3 messages wait in its line" in locks.explain(export, 9).on_send
    (lock,) = locks.list()
    assert lock.waiting == tuple(message.message_id for message in sent[1:])
    table = "\n".join(lock_table([lock]))
    assert f"{sent[1].message_id}  waiting 1" in table and f"{sent[3].message_id}  waiting 3" in table
    assert "  3 messages waiting in its line, the next first:" in describe_lock(lock)
    assert [(e.kind, e.side, e.message_id) for e in events] == [("waiting", "client", m.message_id) for m in sent[1:]]

    env.worker(threads=2)
    wait_for(lambda: len(gate.runs) == 1)
    gate.open()
    wait_for(lambda: len(gate.runs) == 4)
    env.join(export)
    assert [e.message_id for e in events if e.kind == "handed_over"] == [m.message_id for m in sent[1:]]
    assert list(locks.list()) == []


def test_a_retry_that_meets_the_lock_waits_in_line_again_and_runs(env):
    # The retry keeps the place's token it started with once; waiting again, it is handed a new
    # place, and runs with it.
    runs, failed = Runs(), []

    @env.actor(
        lock="while_executing", on_conflict="wait", reschedule_delay=POLLING_DELAY, lock_args_method=lambda seq: []
    )
    def post(seq):
        if seq == 1 and not failed:
            failed.append(seq)
            raise RuntimeError("fails once")
        runs.run("all", seq, seconds=0.05)

    for seq in range(4):
        post.send(seq)
    env.worker(threads=4)
    wait_for(lambda: len(runs.ends) == 4, timeout=30)
    env.join(post)
    assert sorted(payload for payload, _, _ in runs.of("all")) == [0, 1, 2, 3]
    assert_one_at_a_time(runs.of("all"))
    assert env.is_free(_digest_of(env, post), run=True)


def _digest_of(env, actor) -> str:
    locks = Locks.from_middleware(env.middleware)
    return locks.explain(actor, 0).digest


def place(env, key: str, message_id: str, *, ttl: int | None = None, starting: str | None = None):
    """An attempt of ``message_id`` at the run lock ``key``, waiting in line if it is taken."""
    from dramatiq_unique.backends import Holder, Waiter

    holder = Holder(message_id, "post", "default", "while_executing", "running", "worker-1")
    waiter = Waiter(message=f'{{"message_id": "{message_id}"}}'.encode(), line_limit=10)
    owner = f"attempt-{message_id}-{starting}"
    return owner, env.backend.acquire(
        key, owner, limit=1, ttl=ttl, holder=holder, waiter=waiter, starting=starting if starting is not None else ""
    )


def test_only_the_copy_a_line_handed_a_place_takes_it(env):
    key, handed = "dramatiq-unique:{" + "ab" * 32 + "}:run", []
    env.backend.handoffs = handed.extend
    owner_a, a = place(env, key, "A")
    assert a.acquired
    _, b = place(env, key, "B")
    assert b.waiting == 1
    env.backend.release(key, owner_a)
    (message,) = handed
    token = message.partition(b"\n")[0].decode()
    # B as it was before it joined the line, redelivered: never takes the place handed to its copy.
    assert place(env, key, "B", starting="")[1].started_before
    # Nor does a copy handed an earlier place, the reaper having handed it again.
    assert place(env, key, "B", starting=str(int(token) - 1))[1].started_before
    owner_b, b = place(env, key, "B", starting=token)
    assert b.acquired
    # Once it started, no other copy runs, but the copy that started does (a redelivery).
    assert place(env, key, "B", starting="")[1].started_before
    env.backend.release(key, owner_b)
    assert place(env, key, "B", starting=token)[1].acquired


def test_the_reaper_hands_a_lapsed_place_to_the_line_and_says_so(env, caplog):
    caplog.set_level(logging.INFO)
    # A's worker died: its lease ran out, and nothing else touches the lock.
    key, handed = "dramatiq-unique:{" + "cd" * 32 + "}:run", []
    env.backend.handoffs = handed.extend
    _, a = place(env, key, "A", ttl=50)
    assert a.acquired
    assert place(env, key, "B")[1].waiting == 1
    time.sleep(0.1)
    report = env.middleware.reaper.run()
    assert [m.partition(b"\n")[2] for m in handed] == [b'{"message_id": "B"}']
    assert Locks(env.backend).get("cd" * 32)[0].holders[0].message_id == "B"
    # The run says what it freed: it released 0 before, with the lapsed place handed on unsaid.
    assert (report.released_lapsed, report.released) == (1, 1)
    assert f"released lock {key!r} of message 'A'" in caplog.text and "its lease ran out" in caplog.text
    assert "released 1: 0 of dead workers, 0 of messages that no longer exist, 1 that lapsed." in caplog.text


def test_a_lapsed_place_that_a_renewal_meets_stays_for_the_line(env):
    # Issue 31 (6): lock_limit=2 and wait. A's worker was killed; B's lease renewal dropped A's
    # lapsed place without handing it to the line, and the reaper then found nothing lapsed: C
    # waited for as long as B ran. Neither a renewal nor a handoff's record drops it now.
    from dramatiq_unique.backends import Holder, Lease, Waiter

    key, handed = "dramatiq-unique:{" + "fa" * 32 + "}:run", []
    env.backend.handoffs = handed.extend

    def attempt(message_id: str, ttl: int):
        holder = Holder(message_id, "post", "default", "while_executing", "running", "worker-1")
        waiter = Waiter(message=f'{{"message_id": "{message_id}"}}'.encode(), line_limit=10)
        return env.backend.acquire(key, f"attempt-{message_id}", limit=2, ttl=ttl, holder=holder, waiter=waiter)

    assert attempt("A", 50).acquired and attempt("B", 60_000).acquired
    assert attempt("C", 60_000).waiting == 1
    time.sleep(0.1)  # A's lease lapses
    assert env.backend.renew(key, "attempt-B", ttl=60_000)
    assert env.backend.renew_many([Lease(key, "attempt-B", 60_000, None)])[0]
    assert handed == []
    env.middleware.reaper.run()
    assert [m.partition(b"\n")[2] for m in handed] == [b'{"message_id": "C"}']


def test_a_reaper_without_a_broker_leaves_a_lapsed_place_with_a_line_to_one_with_it(redis_env, caplog):
    # Issue 31 (2): the reaper run with --url handed the lapsed place to the line, and could not
    # enqueue the message handed it, which then held the place for ever.
    env, key = redis_env, "dramatiq-unique:{" + "ce" * 32 + "}:run"
    _, a = place(env, key, "A", ttl=50)
    assert a.acquired and place(env, key, "B")[1].waiting == 1
    time.sleep(0.1)
    report = reap_orphans(RedisBackend(client=env.broker.client))
    assert (report.released, report.left_for_broker) == (0, 1)
    assert "could not free a place" in caplog.text and "waiting in its line" in caplog.text
    assert env.backend.lines([key]) == {key: ("B",)}
    handed: list[bytes] = []
    env.backend.handoffs = handed.extend
    env.middleware.reaper.run()
    assert [m.partition(b"\n")[2] for m in handed] == [b'{"message_id": "B"}']


def test_a_send_given_up_after_a_lost_answer_leaves_the_line(env):
    # The backend failed to answer a send that joined the line: the send gives its place up, and
    # with it its place in the line, so it is neither enqueued nor handed a place later.
    from dramatiq_unique.backends import Holder, Waiter

    key, handed = "dramatiq-unique:{" + "ef" * 32 + "}", []
    env.backend.handoffs = handed.extend

    def send(message_id: str):
        holder = Holder(message_id, "post", "default", "until_executed", "queued")
        waiter = Waiter(message=message_id.encode(), line_limit=10)
        return env.backend.acquire(key, message_id, limit=1, ttl=None, holder=holder, waiter=waiter)

    assert send("A").acquired and send("B").waiting == 1 and send("C").waiting == 2
    assert not env.backend.release(key, "B")  # it held no place, but waited
    assert env.backend.lines([key]) == {key: ("C",)}
    env.backend.release(key, "A")
    assert [m.partition(b"\n")[2] for m in handed] == [b"C"]
    assert env.backend.waiting_message(key, "B") is None


#: Waiter entries this version cannot read: no fields at all, and a holder that is none.
JUNK_ENTRIES = [b"junk", b"1\nnot a holder\n{}"]


@pytest.mark.parametrize(
    ("lock", "on_conflict"),
    [
        ("until_executed", "wait"),
        ("while_executing", {"server": "wait"}),
        ("until_and_while_executing", "wait"),
    ],
)
def test_a_waiter_whose_entry_cannot_be_read_is_dropped_and_the_holder_runs(redis_env, caplog, lock, on_conflict):
    # Issue 32 (2): a junk entry at the head of the line that a start reads (claim, line, swap)
    # failed that start on every retry ("attempt to perform arithmetic on local 'first'"), and
    # the lock stayed held. The waiter is dropped with a WARNING; the holder runs, then the next.
    env, runs = redis_env, Runs()

    @env.actor(lock=lock, on_conflict=on_conflict, reschedule_delay=POLLING_DELAY, lock_args_method=lambda seq: [])
    def post(seq):
        runs.run("all", seq)

    first = post.send(0)
    second = post.send(1)
    digest = enqueue_outcome(first).digest
    key = enqueue_key("dramatiq-unique", digest) if lock == "until_executed" else run_key("dramatiq-unique", digest)
    if lock == "until_executed":
        assert env.backend.lines([key]) == {key: (second.message_id,)}
    env.broker.client.lpush(line_key(key), "ghost", b"\xff")
    env.broker.client.hset(waiters_key(key), mapping={"ghost": b"junk", b"\xff": b"junk"})
    env.worker(threads=1)
    wait_for(lambda: len(runs.ends) == 2, timeout=30)
    env.join(post)
    payloads = [payload for payload, _, _ in runs.of("all")]
    # A while_executing message waits in no line when it is sent: the broker's order of the two
    # decides which starts first (Dramatiq 2.0 does not keep equal priorities in send order).
    assert (sorted(payloads) if lock == "while_executing" else payloads) == [0, 1]
    assert unique_warnings(caplog) == [
        f"The entry of message {message_id!r} among the waiters of lock {key!r} (digest {digest}) cannot be read "
        "(written by another version, or by hand): it was dropped from the line, which goes on with the next."
        for message_id in ("\ufffd", "ghost")  # the one that is no UTF-8 is told too
    ]
    assert env.is_free(digest, run=lock != "until_executed")
    assert env.broker.client.hkeys(waiters_key(key)) == []


@pytest.mark.parametrize("junk", JUNK_ENTRIES)
def test_a_release_drops_a_waiter_it_cannot_read_and_hands_the_place_to_the_next(redis_env, caplog, junk):
    # Issue 32 (2): the release of the holder hands its place over: past a junk entry, to the next waiter.
    key, handed = "dramatiq-unique:{" + "a1" * 11 + "}", []
    redis_env.backend.handoffs = handed.extend
    send = sender(redis_env, key)
    assert send("A").acquired and send("B").waiting == 1 and send("C").waiting == 2
    redis_env.broker.client.hset(waiters_key(key), "B", junk)
    assert redis_env.backend.release(key, "A")
    assert [m.partition(b"\n")[2] for m in handed] == [b"C"]
    assert redis_env.backend.lines([key]) == {}
    (warning,) = unique_warnings(caplog)
    assert warning.startswith(f"The entry of message 'B' among the waiters of lock {key!r} (digest {'a1' * 11})")


@pytest.mark.parametrize("junk", JUNK_ENTRIES)
def test_the_reapers_steps_take_a_waiter_entry_they_cannot_read_for_none(redis_env, caplog, junk):
    # Issue 32 (2): the orphan reaper enqueues again, from its waiter entry, a message handed a place
    # that never reached the broker (waiting_message, hand_again). A junk entry raised IndexError,
    # or was enqueued as a message. It is taken for none, and hand_again drops it.
    key, handed = "dramatiq-unique:{" + "a2" * 11 + "}", []
    redis_env.backend.handoffs = handed.extend
    send = sender(redis_env, key)
    assert send("A").acquired and send("B").waiting == 1
    redis_env.backend.release(key, "A")
    assert [m.partition(b"\n")[2] for m in handed] == [b"B"]
    client = redis_env.broker.client
    client.hset(waiters_key(key), "B", junk)
    if junk == b"junk":
        assert redis_env.backend.waiting_message(key, "B") is None
    assert redis_env.backend.hand_again(key, "B", record_of(client, key, "B")) is None
    assert client.hexists(waiters_key(key), "B") == 0
    assert unique_warnings(caplog)[-1].startswith(
        f"The entry of message 'B' among the waiters of lock {key!r} (digest {'a2' * 11}) cannot be read"
    )


def record_of(client, key: str, owner: str) -> str:
    """The record of ``owner``'s place in the lock at ``key``: its line of the lock's value after
    the owner and the first "|" (issue 33), as LockRecord.record holds it."""
    for line in client.get(key).decode().split("\n"):
        found, _, record = line.partition("|")
        if found == owner:
            return record
    raise AssertionError(f"{owner!r} holds no place in {key!r}")


def sender(env, key: str):
    """Sends of ``message_id`` to the lock ``key``, waiting in its line when it is taken."""
    from dramatiq_unique.backends import Holder, Waiter

    def send(message_id: str):
        holder = Holder(message_id, "post", "default", "until_executed", "queued")
        waiter = Waiter(message=message_id.encode(), line_limit=10)
        return env.backend.acquire(key, message_id, limit=1, ttl=None, holder=holder, waiter=waiter)

    return send


def test_a_send_of_another_strategy_leaves_a_lapsed_place_to_the_line_issue_31_gap_a(env):
    # Issue 31, after defect 6: a message of a wait actor sent with on_conflict="reject" took the
    # place whose lock_ttl ran out while message 1 waited for it: it jumped the line, and 1 waited
    # for it to be done. The lapsed place goes to 1 now, and the newcomer meets a full lock.
    runs = Runs()

    @env.actor(
        lock="until_executing",
        on_conflict="wait",
        lock_ttl=300,
        reschedule_delay=POLLING_DELAY,
        lock_args_method=lambda seq: [],
    )
    def post(seq):
        runs.run("all", seq)

    assert enqueue_outcome(post.send(0)).status == "enqueued"
    assert enqueue_outcome(post.send(1)).status == "waiting"
    time.sleep(0.4)  # 0's place lapsed, and 1 still waits for it
    assert enqueue_outcome(post.send_with_options(args=(2,), on_conflict="reject")).status == "rejected"
    env.worker(threads=1)
    wait_for(lambda: len(runs.ends) == 2, timeout=30)
    env.join(post)
    # 0, whose place lapsed, and 1 each run once, in either order (Dramatiq 2.0 runs the messages
    # a worker prefetched in any order); 2 never does.
    assert sorted(payload for payload, _, _ in runs.of("all")) == [0, 1]


@pytest.mark.parametrize("step", ["acquire", "replace", "swap", "claim"])
def test_a_step_that_meets_a_lapsed_place_hands_it_to_the_line_first_issue_31_gap_a(env, step):
    # Issue 31, after defect 6: a send without a line (another strategy, a retry, an actor that
    # shares the lock), a replacing send, a swap without a waiter, and the start of a stale copy
    # of a handed message dropped a place that lapsed while messages waited, without handing it
    # on: a newcomer took it ahead of them, or they waited for as long as the others held theirs.
    from dramatiq_unique.backends import Holder, Waiter
    from dramatiq_unique.keys import replaced_key

    digest, handed = "e1" * 32, []
    env.backend.handoffs = handed.extend
    key = (run_key if step == "swap" else enqueue_key)("dramatiq-unique", digest)

    def send(message_id: str, ttl: int | None = None):
        holder = Holder(message_id, "post", "default", "until_executed", "queued")
        waiter = Waiter(message=message_id.encode(), line_limit=10)
        return env.backend.acquire(key, message_id, limit=2, ttl=ttl, holder=holder, waiter=waiter)

    assert send("A", ttl=100).acquired and send("B").acquired
    assert send("C").waiting == 1
    if step == "claim":
        assert send("D").waiting == 2
        env.backend.release(key, "B")
        (message,) = handed
        token, handed[:] = int(message.partition(b"\n")[0]), []
    time.sleep(0.2)  # A's place lapses (its lock_ttl, or its worker's lease), and C or D waits for it
    newcomer = Holder("N", "post", "default", "until_executed", "queued", replaceable=step == "replace")
    if step == "acquire":
        assert not env.backend.acquire(key, "N", limit=2, ttl=None, holder=newcomer).acquired
    elif step == "replace":
        replaced = replaced_key("dramatiq-unique", digest)
        assert not env.backend.replace(key, "N", replaced_key=replaced, limit=2, ttl=None, holder=newcomer).acquired
    elif step == "swap":
        running = Holder("N", "post", "default", "until_and_while_executing", "running", "worker-1")
        assert not env.backend.swap(
            release_key=enqueue_key("dramatiq-unique", digest), release_owner="N",
            replaced_key=replaced_key("dramatiq-unique", digest), acquire_key=key, owner="attempt-N", limit=2,
            ttl=60_000, holder=running,
        ).acquired  # fmt: skip
    else:
        running = Holder("C", "post", "default", "until_executed", "running", "worker-1")
        stale = str(token - 1)  # a copy the reaper replaced by enqueueing C again
        assert env.backend.claim(key, "C", replaced_key=None, release=False, holder=running, starting=stale) == (
            "started_before"
        )
    assert [m.partition(b"\n")[2] for m in handed] == [b"D" if step == "claim" else b"C"]


@pytest.mark.parametrize(("lock", "on_conflict"), [("until_executed", "wait"), ("while_executing", {"server": "wait"})])
def test_a_handed_message_whose_actor_the_worker_does_not_declare_hands_its_place_on_issue_31_gap_b(
    redis_client, caplog, lock, on_conflict
):
    # Issue 31, defect 3's other half: a deploy renamed the actor while messages waited in its
    # line. The old worker's last run handed its place to the next message, which a new worker,
    # without that actor, dead-lettered before any hook of ours ran: the place a line hands never
    # lapses, so that message held it for ever and every later message of the lock waited.
    def deploy() -> Env:
        backend = RedisBackend(client=redis_client)
        return Env("redis", RedisBroker(client=redis_client), backend, UniqueJobs(backend=backend))

    old, new, gate = deploy(), deploy(), Gate()
    run = lock == "while_executing"
    with new.running(), old.running():

        @old.actor(lock=lock, on_conflict=on_conflict, reschedule_delay=POLLING_DELAY, lock_args_method=lambda seq: [])
        def export(seq):
            if seq == 0:
                gate.enter(seq)

        @new.actor
        def ping():
            pass

        sent = [export.send(0)]
        deployed = old.worker(threads=3)
        wait_for(lambda: gate.runs == [0])
        sent += [export.send(seq) for seq in (1, 2)]
        if run:
            old.wait_for_skips(2)  # 1 and 2 wait in the run lock's line
        else:
            assert [enqueue_outcome(m).status for m in sent] == ["enqueued", "waiting", "waiting"]
        new.worker(threads=1)
        # The old worker stops: its last run ends, and hands its place to message 1.
        stopping = threading.Thread(target=deployed.stop)
        stopping.start()
        time.sleep(0.2)
        gate.open()
        stopping.join()
        old.workers.remove(deployed)
        digest = enqueue_outcome(sent[0]).digest
        # Messages 1 and 2 go to the dead-letter queue, each giving its place to the next in line.
        wait_for(lambda: len(new.dead_letters(export)) == 2, timeout=10)
        wait_for(lambda: new.is_free(digest, run=run), timeout=10)
        assert sorted(m.message_id for m in new.dead_letters(export)) == sorted(m.message_id for m in sent[1:])
        assert gate.runs == [0]
        if not run:
            # A message sent now (by a process that still declares the actor) gives its own place up too.
            sent.append(export.send(3))
            assert enqueue_outcome(sent[3]).status == "enqueued"
            wait_for(lambda: len(new.dead_letters(export)) == 3, timeout=10)
            wait_for(lambda: new.is_free(digest), timeout=10)
        warnings = unique_warnings(caplog)
        for message in sent[1:]:
            assert any(message.message_id in w and "'export'" in w and digest in w for w in warnings), warnings


def test_a_message_whose_actor_the_worker_does_not_declare_keeps_an_until_expired_place(redis_client):
    # Review of issue 31's gap B: the step that gives up the place of a message dead-lettered for
    # want of its actor gave up an until_expired place too, which a dead-lettered message of a
    # declared actor keeps until its lock_ttl: a duplicate could be sent at once.
    def deploy() -> Env:
        backend = RedisBackend(client=redis_client)
        return Env("redis", RedisBroker(client=redis_client), backend, UniqueJobs(backend=backend))

    old, new = deploy(), deploy()
    with new.running(), old.running():

        @old.actor(lock="until_expired", lock_ttl=60_000, lock_args_method=lambda seq: [])
        def stamp(seq):
            pass

        @new.actor
        def ping():
            pass

        first = stamp.send(0)
        new.worker(threads=1)
        wait_for(lambda: len(new.dead_letters(stamp)) == 1, timeout=10)
        time.sleep(0.2)  # after_nack has run
        assert not new.is_free(enqueue_outcome(first).digest)
        assert enqueue_outcome(stamp.send(1)).status != "enqueued"


def test_a_lone_place_that_lapsed_is_not_freed_again_by_the_reaper(env):
    # Review: StubBackend answered that release_record freed a lock's only place after it lapsed,
    # where Redis has expired the key with it, and answers that it freed nothing.
    key = "dramatiq-unique:{" + "ee" * 32 + "}:run"
    owner, a = place(env, key, "A", ttl=50)
    assert a.acquired
    (record,) = env.backend.read([key])[1]
    time.sleep(0.1)
    assert env.backend.release_record(key, owner, record.record) is False
