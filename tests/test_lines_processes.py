"""Lines where they meet a lock store restarted empty, lock_limit, an encoder of bytes and the
option checks, with real `dramatiq` worker processes and real redis-servers (issue 31, defects 4
to 9; defects 1 to 3 are in tests/test_lines_workers.py).

The worker processes keep their locks on a redis-server of their own (the lock store, which a
test may SIGKILL and start again empty) and their queues on the tests' Redis, where the actors
record each run apart from the locks: what a user notices.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

import dramatiq_unique
from dramatiq_unique import InvalidLockOptions, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.keys import enqueue_key
from dramatiq_unique.reaper import REAPER_ACTOR_NAME

from .support import wait_for
from .test_concurrency import output, processes, wait_until_ready  # noqa: F401 (fixture)
from .test_data_loss import store  # noqa: F401 (fixture)
from .test_lines_crash import WORKER_PREAMBLE
from .test_lines_workers import worker_log
from .test_outages import RedisProcess

#: What every app of these tests adds to WORKER_PREAMBLE: its lock store, a record of skipped
#: messages, and a bounded wait for the test's word.
APP_PREAMBLE = (
    WORKER_PREAMBLE
    + """
STORE_URL = os.environ["UNIQUE_TEST_STORE_URL"]


class Skipped(Middleware):
    def after_skip_message(self, broker, message):
        client.rpush("test:skipped", message.message_id)


def ran(*what):
    client.rpush("test:runs", " ".join(map(str, what)))


def wait_for_go(name):
    deadline = time.monotonic() + 20
    while not client.exists(name) and time.monotonic() < deadline:
        time.sleep(0.01)
"""
)

APP = (
    APP_PREAMBLE
    + """

broker = RedisBroker(url=URL)
# The reaper is declared, and sent by the test when it is to run.
unique = UniqueJobs(
    backend=RedisBackend(url=STORE_URL), heartbeat_interval=100, lease_period=600, reaper=True, reaper_interval=None
)
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(Ready())
broker.add_middleware(Skipped())


@dramatiq.actor(
    broker=broker, queue_name="posts", lock="until_executed", on_conflict="wait",
    lock_args_method=lambda key, seq: [key],
)
def post(key, seq):
    ran("post", seq)


@dramatiq.actor(broker=broker, queue_name="posts")
def blocker():
    ran("blocker")
    wait_for_go("test:go")


@dramatiq.actor(
    broker=broker, queue_name="profiles", lock="until_executed", on_conflict={"client": "replace"},
    lock_args_method=lambda user, version: [user],
)
def push_profile(user, version):
    ran("push_profile", user, version)


@dramatiq.actor(
    broker=broker, queue_name="profiles", lock="until_executed", on_conflict={"client": "replace"}, debounce=2000,
    lock_args_method=lambda user, version: [user],
)
def push_debounced(user, version):
    ran("push_debounced", user, version)


@dramatiq.actor(
    broker=broker, queue_name="exports", lock="while_executing", on_conflict={"server": "wait"}, lock_limit=2,
    lock_args_method=lambda seq: [],
)
def export(seq):
    ran("start", seq, os.getpid())
    wait_for_go(f"test:go:{seq}")
    ran("end", seq)


@dramatiq.actor(broker=broker, queue_name="plain")
def plain(seq):
    ran("plain", seq)
"""
)


def start(processes, tmp_path, redis_url, client, *, store_url, threads=2, script=APP, module="lines_app", **env):  # noqa: F811
    """A `dramatiq` process of ``threads`` threads running ``script`` as ``module``, with its locks
    at ``store_url``, once its Worker booted; ``env`` adds to its environment."""
    (tmp_path / f"{module}.py").write_text(script)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    client.delete("test:ready")
    cli = processes(
        ["-m", "dramatiq", f"{module}:broker", "--processes", "1", "--threads", str(threads)],
        UNIQUE_TEST_REDIS_URL=redis_url,
        UNIQUE_TEST_STORE_URL=store_url,
        PYTHONPATH=path,
        **env,
    )
    wait_until_ready(client, [cli])
    cli.worker_pid = int(client.lindex("test:ready", 0))
    # What the worker logged at boot has come through Dramatiq's logging pipe.
    wait_for(lambda: said(cli, "Worker process is ready for action."))
    return cli


def runs(client) -> list[str]:
    return [run.decode() for run in client.lrange("test:runs", 0, -1)]


def skipped(client) -> list[str]:
    return [message_id.decode() for message_id in client.lrange("test:skipped", 0, -1)]


def said(cli, text: str) -> list[str]:
    return [line for line in worker_log(cli) if text in line]


class Sender:
    """The test's own broker and lock store client, declaring the app's actors with its lock options."""

    def __init__(self, redis_client, store_url: str):
        self.store = redis.Redis.from_url(store_url)
        self.broker = RedisBroker(client=redis_client)
        self.middleware = UniqueJobs(backend=RedisBackend(client=self.store))
        self.broker.add_middleware(self.middleware, before=TimeLimit)

        def declare(name: str, queue_name: str, **options):
            return dramatiq.actor(
                lambda *args: None, actor_name=name, broker=self.broker, queue_name=queue_name, **options
            )

        profile = {"lock": "until_executed", "on_conflict": {"client": "replace"}}
        self.post = declare(
            "post", "posts", lock="until_executed", on_conflict="wait", lock_args_method=lambda key, seq: [key]
        )
        self.blocker = declare("blocker", "posts")
        self.push_profile = declare("push_profile", "profiles", **profile, lock_args_method=lambda user, v: [user])
        self.push_debounced = declare(
            "push_debounced", "profiles", **profile, debounce=2000, lock_args_method=lambda user, v: [user]
        )
        self.export = declare(
            "export",
            "exports",
            lock="while_executing",
            on_conflict={"server": "wait"},
            lock_limit=2,
            lock_args_method=lambda seq: [],
        )
        self.plain = declare("plain", "plain")

    def places(self, digest: str) -> list[str]:
        """The messages holding a place in the enqueue lock of ``digest``."""
        return [
            place.owner for place in RedisBackend(client=self.store).read([enqueue_key("dramatiq-unique", digest)])[1]
        ]

    def run_reaper(self) -> None:
        self.broker.enqueue(
            dramatiq.Message(queue_name="default", actor_name=REAPER_ACTOR_NAME, args=(), kwargs={}, options={})
        )

    def close(self) -> None:
        if self.middleware.activity is not None:
            # No count of this test is flushed from a thread into a later test's Redis.
            self.middleware.activity.close()
        self.broker.close()
        self.store.close()


@pytest.fixture
def sender(redis_client, store):  # noqa: F811
    built = Sender(redis_client, f"redis://127.0.0.1:{store.port}/0")
    yield built
    built.close()


def restart_empty(store, cli) -> None:  # noqa: F811
    """SIGKILL the lock store and start it again empty; wait until the worker healed it."""
    store.kill()
    store.start()
    wait_for(lambda: said(cli, "took again the enqueue locks of"), timeout=10)
    wait_for(lambda: said(cli, "The lock store takes new locks again"), timeout=10)


@pytest.mark.slow
def test_a_handed_message_runs_after_the_lock_store_restarted_empty_in_a_worker_process(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
    sender,
):
    """Issue 31, defect 4: after the lock store restarted empty, the healing took the handed
    message's place again with a new token; at its start the message was skipped as "a copy of it
    started already", its place never lapsed, and every later send waited behind it."""
    digest = enqueue_outcome(sender.post.send("k", 0)).digest
    handed = sender.post.send("k", 1)
    assert enqueue_outcome(handed).status == "waiting"
    sender.blocker.send()
    # The one thread runs post 0, which hands its place to post 1, enqueued behind the blocker;
    # the store restarts empty while post 1 waits in the queue.
    # It fetches one message at a time: Dramatiq 2.0 runs the messages it prefetched in any order.
    cli = start(
        processes, tmp_path, redis_url, redis_client,
        store_url=f"redis://127.0.0.1:{store.port}/0", threads=1, dramatiq_queue_prefetch="1",
    )  # fmt: skip
    wait_for(lambda: runs(redis_client) == ["post 0", "blocker"])
    wait_for(lambda: sender.places(digest) == [handed.message_id])
    time.sleep(0.3)  # the worker's heartbeats have read the store's mark
    restart_empty(store, cli)
    redis_client.set("test:go", 1)
    wait_for(lambda: "post 1" in runs(redis_client))
    wait_for(lambda: sender.places(digest) == [])  # post 1 gives its place up after its run
    assert enqueue_outcome(sender.post.send("k", 2)).status == "enqueued"
    wait_for(lambda: "post 2" in runs(redis_client))
    assert runs(redis_client) == ["post 0", "blocker", "post 1", "post 2"]
    assert skipped(redis_client) == []
    assert said(cli, "a copy of it started already") == []


@pytest.mark.slow
@pytest.mark.parametrize("actor", ["push_profile", "push_debounced"], ids=["replace", "debounce"])
def test_the_newest_copy_runs_after_the_lock_store_restarted_empty_in_a_worker_process(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
    sender,
    actor,
):
    """Issue 31, defect 5: after the lock store restarted empty, the healing took the places of
    the replace and debounce copies again in the order the broker's hash gave them: in 6-10 of 16
    jobs the older payload ran, the newest was dropped, and the log called the older one "newer"."""
    users = 12
    cli = start(processes, tmp_path, redis_url, redis_client, store_url=f"redis://127.0.0.1:{store.port}/0")
    push = getattr(sender, actor)
    newer = {}  # each user's first message: the one that replaced it
    for user in range(users):
        first, second = (push.send_with_options(args=(user, version), delay=2_500) for version in (1, 2))
        newer[first.message_id] = second.message_id
    time.sleep(0.3)  # the worker's heartbeats have read the store's mark
    restart_empty(store, cli)
    not_again = "is not enqueued again: newer message"
    wait_for(lambda: len(runs(redis_client)) >= users and len(said(cli, not_again)) >= users, timeout=15)
    time.sleep(0.3)  # a copy more, if one ran, would show by now
    assert sorted(runs(redis_client)) == sorted(f"{actor} {user} 2" for user in range(users))
    # As each older copy falls due, the worker says that the newer one took its place.
    told = [re.search(r"Message '(.+?)' .* newer message '(.+?)'", line).groups() for line in said(cli, not_again)]
    assert dict(told) == newer


@pytest.mark.slow
def test_a_lapsed_place_of_a_killed_holder_goes_to_the_line_while_the_other_holder_runs(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
    sender,
):
    """Issue 31, defect 6: lock_limit=2 and wait. One holder's worker process was SIGKILLed; the
    other holder's lease renewal dropped its lapsed place without handing it to the line, the
    reaper then found nothing lapsed, and the waiting message waited as long as the other ran."""
    store_url = f"redis://127.0.0.1:{store.port}/0"
    # A process of one thread that fetches no message while it runs one: export 0 only.
    first = start(
        processes, tmp_path, redis_url, redis_client, store_url=store_url, threads=1, dramatiq_queue_prefetch="1"
    )
    sender.export.send(0)
    wait_for(lambda: f"start 0 {first.worker_pid}" in runs(redis_client))
    second = start(processes, tmp_path, redis_url, redis_client, store_url=store_url)
    sender.export.send(1)
    wait_for(lambda: f"start 1 {second.worker_pid}" in runs(redis_client))
    waiting = sender.export.send(2)
    wait_for(lambda: skipped(redis_client) == [waiting.message_id])  # it waits in the run lock's line
    os.kill(first.worker_pid, signal.SIGKILL)
    # Export 0's lease (600 ms) lapses, and export 1's renewals (every 400-500 ms) meet it.
    time.sleep(1.5)
    sender.run_reaper()
    wait_for(lambda: f"start 2 {second.worker_pid}" in runs(redis_client), timeout=10)
    assert "end 1" not in runs(redis_client)  # it went to the line while export 1 runs
    redis_client.set("test:go:1", 1)
    redis_client.set("test:go:2", 1)
    redis_client.set("test:go:3", 1)
    sender.export.send(3)
    wait_for(lambda: "end 3" in runs(redis_client))
    starts = [run.split()[1] for run in runs(redis_client) if run.startswith("start")]
    assert starts == ["0", "1", "2", "3"]


#: An app whose messages Dramatiq encodes with pickle: its actors wait in lines on either side.
PICKLED_APP = (
    APP_PREAMBLE
    + """
dramatiq.set_encoder(dramatiq.PickleEncoder())

broker = RedisBroker(url=URL)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=STORE_URL)), before=TimeLimit)
broker.add_middleware(Ready())
broker.add_middleware(Skipped())


def actor(name, **options):
    def run(seq):
        ran("start", name, seq)
        if seq == 0:
            wait_for_go("test:go")
        time.sleep(0.05)
        ran("end", name, seq)

    return dramatiq.actor(run, actor_name=name, broker=broker, lock_args_method=lambda seq: [], **options)


note = actor("note", lock="until_executed", on_conflict="wait")
latest = actor("latest", lock="until_executed", on_conflict="keep_latest")
sync = actor("sync", lock="while_executing", on_conflict={"server": "wait"})
"""
)

#: The sender process: it sends each actor's 0, waits for their starts, then 1 and 2 (sync's 2
#: once its 1 waits in line), and prints what each send returned.
PICKLED_SENDER = """
import time
from pickled import client, note, latest, sync
from dramatiq_unique import enqueue_outcome

def until(condition):
    deadline = time.monotonic() + 5
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)

def send(seq):
    for actor in (note, latest, sync):
        print(actor.actor_name, seq, enqueue_outcome(actor.send(seq)).status)

send(0)
until(lambda: client.llen("test:runs") == 3)
send(1)
until(lambda: client.llen("test:skipped") == 1)
send(2)
"""


@pytest.mark.slow
def test_lines_keep_the_messages_of_pickle_encoder_in_worker_and_sender_processes(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
):
    """Issue 31, defect 7: with dramatiq.set_encoder(PickleEncoder()), each send of a wait or
    keep_latest actor raised UnicodeDecodeError inside before_enqueue (and each start of a
    server-side waiter, inside before_process_message); Dramatiq logged it and went on without
    the lock, and every copy ran at once."""
    store_url = f"redis://127.0.0.1:{store.port}/0"
    cli = start(
        processes,
        tmp_path,
        redis_url,
        redis_client,
        store_url=store_url,
        threads=4,
        script=PICKLED_APP,
        module="pickled",
    )
    (tmp_path / "send.py").write_text(PICKLED_SENDER)
    path = os.pathsep.join(
        [str(tmp_path), str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    sent = processes(["send.py"], UNIQUE_TEST_REDIS_URL=redis_url, UNIQUE_TEST_STORE_URL=store_url, PYTHONPATH=path)
    printed = output(sent)
    # The until_executed ones wait in their enqueue lock's line; sync's are enqueued, and wait in its run lock's.
    assert printed.splitlines() == [
        "note 0 enqueued",
        "latest 0 enqueued",
        "sync 0 enqueued",
        "note 1 waiting",
        "latest 1 waiting",
        "sync 1 enqueued",
        "note 2 waiting",
        "latest 2 waiting",
        "sync 2 enqueued",
    ], printed
    wait_for(lambda: redis_client.llen("test:skipped") == 2)  # sync 1 and 2 wait in line
    redis_client.set("test:go", 1)
    wait_for(lambda: len(runs(redis_client)) == 16)  # each start and end of 0, 1, 2; latest's 1 displaced
    time.sleep(0.2)  # a copy more, if one ran, would show by now
    for name, ran in (("note", [0, 1, 2]), ("latest", [0, 2]), ("sync", [0, 1, 2])):
        # Each ran once, in order, one at a time.
        expected = [f"{kind} {name} {seq}" for seq in ran for kind in ("start", "end")]
        assert [run for run in runs(redis_client) if run.split()[1] == name] == expected
    assert "Unexpected failure" not in "\n".join(worker_log(cli))


#: An app that declares a debounced actor without a lock.
DEBOUNCE_WITHOUT_LOCK_APP = (
    APP_PREAMBLE
    + """
broker = RedisBroker(url=URL)
broker.add_middleware(UniqueJobs(backend=RedisBackend(url=STORE_URL)), before=TimeLimit)
broker.add_middleware(Ready())


@dramatiq.actor(broker=broker, debounce=500)
def push_profile(user_id):
    ran("push_profile", user_id)
"""
)


@pytest.mark.slow
def test_a_worker_process_that_declares_a_debounce_without_a_lock_stops_at_import(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
):
    """Issue 31, defect 8: an actor declared with debounce and no lock was accepted, and every
    message ran at once, undelayed; the worker process now stops at import, saying why."""
    (tmp_path / "profiles.py").write_text(DEBOUNCE_WITHOUT_LOCK_APP)
    path = os.pathsep.join([str(Path(dramatiq_unique.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    cli = processes(
        ["-m", "dramatiq", "profiles:broker", "--processes", "1", "--threads", "1"],
        UNIQUE_TEST_REDIS_URL=redis_url,
        UNIQUE_TEST_STORE_URL=redis_url,
        PYTHONPATH=path,
    )
    wait_for(lambda: cli.poll() is not None or redis_client.llen("test:ready") > 0, timeout=20)
    assert redis_client.llen("test:ready") == 0, "the worker booted"
    cli.wait(timeout=10)
    assert cli.returncode != 0
    log = "\n".join(worker_log(cli))
    assert "InvalidLockOptions: Actor 'push_profile' uses debounce=500 with lock=None" in log, log


@pytest.mark.slow
def test_a_send_with_debounce_to_an_actor_without_a_lock_fails_and_runs_nothing_in_a_worker_process(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
    sender,
):
    """Issue 31, defect 8: send_with_options(debounce=...) of an actor without a lock was
    accepted, and the message ran at once, undelayed."""
    start(processes, tmp_path, redis_url, redis_client, store_url=f"redis://127.0.0.1:{store.port}/0")
    with pytest.raises(InvalidLockOptions, match="'plain' .*uses debounce=500 with lock=None"):
        sender.plain.send_with_options(args=(1,), debounce=500)
    sender.plain.send(2)
    wait_for(lambda: "plain 2" in runs(redis_client))
    time.sleep(0.2)  # the first, had it been enqueued, ran before the second
    assert runs(redis_client) == ["plain 2"]


@pytest.mark.slow
@pytest.mark.parametrize("appendonly", ["no", "yes"])
def test_a_worker_process_with_lines_warns_once_at_boot_of_a_store_that_keeps_nothing_on_disk(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    appendonly,
):
    """Issue 31, defect 9: a message waiting in line lives only in the lock store, which a restart
    without persistence empties, and nothing said so. A worker process whose actors wait in lines
    says it once at boot; with persistence on it says nothing. The store restarted empty loses
    the waiting message, as the lock store's page says, and the job goes on."""
    lock_store = RedisProcess(tmp_path, options=("--appendonly", appendonly))
    lock_store.start()
    store_url = f"redis://127.0.0.1:{lock_store.port}/0"
    sender = Sender(redis_client, store_url)
    try:
        cli = start(processes, tmp_path, redis_url, redis_client, store_url=store_url)
        warnings = said(cli, "keeps nothing on disk")
        if appendonly == "yes":
            assert warnings == []
            return
        (warning,) = warnings
        assert "[WARNING]" in warning
        assert (
            f"Actors 'export', 'post' wait in lines, and the lock store's Redis (127.0.0.1:{lock_store.port})"
            in warning
        )
        # post 0 is due in a second; post 1 waits in line, in the lock store only.
        digest = enqueue_outcome(sender.post.send_with_options(args=("k", 0), delay=1_000)).digest
        assert enqueue_outcome(sender.post.send("k", 1)).status == "waiting"
        time.sleep(0.3)  # the worker's heartbeats have read the store's mark
        restart_empty(lock_store, cli)
        wait_for(lambda: "post 0" in runs(redis_client), timeout=10)
        wait_for(lambda: sender.places(digest) == [])  # post 0 gives its place up after its run
        assert enqueue_outcome(sender.post.send("k", 2)).status == "enqueued"
        wait_for(lambda: "post 2" in runs(redis_client))
        assert runs(redis_client) == ["post 0", "post 2"]
        assert len(said(cli, "The lock store lost its data")) == 1
        assert len(said(cli, "keeps nothing on disk")) == 1
    finally:
        sender.close()
        lock_store.kill()


@pytest.mark.slow
def test_a_worker_process_counts_the_messages_it_parked_that_the_lock_store_lost(
    processes,  # noqa: F811
    tmp_path,
    redis_url,
    redis_client,
    store,  # noqa: F811
    sender,
):
    """Issue 31, defect 9: messages a worker parked in a run lock's line, acked by the broker,
    went with a lock store restarted empty, and nothing said how many. The worker that parked
    them counts them, with one ERROR line naming each, and none of them runs."""
    cli = start(processes, tmp_path, redis_url, redis_client, store_url=f"redis://127.0.0.1:{store.port}/0", threads=3)
    sent = {seq: sender.export.send(seq).message_id for seq in range(5)}
    # Two hold the lock's two places and wait for the test's word; the third thread parks the others.
    wait_for(lambda: len(skipped(redis_client)) == 3)
    started = [int(run.split()[1]) for run in runs(redis_client) if run.startswith("start ")]
    assert len(started) == 2
    parked = [sent[seq] for seq in sent if seq not in started]
    time.sleep(0.5)  # heartbeats since they were parked
    restart_empty(store, cli)
    (counted,) = said(cli, "loss of its data took")
    assert "took 3 message(s)" in counted and "actors 'export'" in counted
    assert all(repr(message_id) in counted for message_id in parked)
    for seq in sent:
        redis_client.set(f"test:go:{seq}", 1)
    wait_for(lambda: len([run for run in runs(redis_client) if run.startswith("end ")]) == 2)
    time.sleep(0.5)
    assert sorted(int(run.split()[1]) for run in runs(redis_client) if run.startswith("start ")) == sorted(started)
