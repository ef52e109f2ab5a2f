"""Releases off the worker's critical path (issue 11): a finished message's enqueue lock is
given up by the process's release thread, many in one round trip; a send() in the process waits
for such a release of its lock; a warm shutdown sends them all; a failed one is tried again."""

from __future__ import annotations

import logging
import threading
import time

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique import (
    InvalidLockOptions,
    LockBackendError,
    RedisBackend,
    StubBackend,
    UniqueJobs,
    enqueue_outcome,
)
from dramatiq_unique import releases as releases_module
from dramatiq_unique.events import RELEASED, Events, EventSubject

from .support import Env, pop_script_calls, unique_warnings, wait_for


class Finished(dramatiq.Middleware):
    """Counts the messages whose after_process_message hooks all ran: added before UniqueJobs,
    its hook runs after that of UniqueJobs, which hands the release over."""

    def __init__(self):
        self.count = 0

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self.count += 1


class HeldReleases:
    """Holds the release thread inside its first RELEASED event until ``open()``: every
    release handed over meanwhile waits, unsent."""

    def __init__(self, env):
        self.env = env
        self.entered = threading.Event()
        self._open = threading.Event()
        self.threads: list[str] = []
        self.released: list[str] = []
        self.finished = Finished()
        env.middleware.subscribe(RELEASED, self)
        env.broker.add_middleware(self.finished, before=UniqueJobs)

    def hold(self, actor, threads: int = 4):
        """Send ``actor``'s message "first" (kept as ``self.first``) and start a worker, whose
        release thread then waits in that message's event; returns the worker."""
        self.first = actor.send("first")
        worker = self.env.worker(threads=threads)
        assert self.entered.wait(10)
        wait_for(lambda: self.finished.count == 1)
        return worker

    def finish(self, actor, *args):
        """Send a message and wait until the worker is done with it: its release waits, unsent."""
        done = self.finished.count
        message = actor.send(*args)
        wait_for(lambda: self.finished.count > done)
        return message

    def __call__(self, event) -> None:
        self.threads.append(threading.current_thread().name)
        self.released.append(event.message_id)
        if not self.entered.is_set():
            self.entered.set()
            assert self._open.wait(10)

    def open(self) -> None:
        self._open.set()


def test_a_finished_messages_lock_is_released_by_the_release_thread(env):
    releases = HeldReleases(env)
    releases.open()

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    message = settle.send("e1")
    env.worker()
    env.join(settle)
    wait_for(lambda: releases.released == [message.message_id])
    assert releases.threads == ["dramatiq-unique-releases"]
    assert env.is_free(enqueue_outcome(message).digest)


@pytest.fixture
def redis_quiet_env(redis_client):
    """RedisBackend alone on its Redis (the broker is a StubBroker), with no heartbeat within a test."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("stub", broker, backend, UniqueJobs(backend=backend, heartbeat_interval=60_000, lease_period=180_000))
    yield from env.run()


def test_releases_that_wait_go_out_together_in_one_round_trip(redis_quiet_env):
    env = redis_quiet_env
    releases = HeldReleases(env)

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    releases.hold(settle, threads=8)
    # The release thread waits in the first message's event; fifty more finish meanwhile.
    for i in range(50):
        settle.send(f"e{i}")
    wait_for(lambda: releases.finished.count == 51)
    client = env.backend.client
    client.config_resetstat()
    releases.open()
    wait_for(lambda: len(releases.released) == 51)
    stats = client.info("commandstats")
    calls = pop_script_calls({name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()})
    assert calls == 1, f"{calls} round trips for 50 releases"
    assert all(env.is_free(enqueue_outcome(settle.message(f"e{i}")).digest or "") for i in range(50))


def test_a_send_gives_up_a_waiting_release_of_its_lock_itself(make_env):
    env = make_env()
    releases = HeldReleases(env)
    runs = []

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)

    releases.hold(settle)
    # "e1" ran and is done; its release waits behind the first one's, which the thread is busy with.
    done = releases.finish(settle, "e1")
    outcomes = []
    sender = threading.Thread(target=lambda: outcomes.append(enqueue_outcome(settle.send("e1"))), name="sender")
    sender.start()
    sender.join(10)
    try:
        assert outcomes[0].status == "enqueued"
        # The sender sent the release it found waiting, and no thread sends it again.
        assert releases.threads[1:] == ["sender"] and releases.released[1:] == [done.message_id]
    finally:
        releases.open()
    env.join(settle)
    assert runs == ["first", "e1", "e1"]
    assert releases.released.count(done.message_id) == 1


def test_a_warm_shutdown_sends_every_release_before_the_worker_is_gone(make_env):
    env = make_env()
    releases = HeldReleases(env)
    runs = []

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)

    worker = releases.hold(settle)
    messages = [releases.finish(settle, f"e{i}") for i in range(5)]
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    time.sleep(0.1)
    assert stopper.is_alive()  # the worker stops only once its releases are sent
    releases.open()
    stopper.join(10)
    assert not stopper.is_alive()
    finished = [releases.first, *messages]
    for message in finished:
        assert env.is_free(enqueue_outcome(message).digest)
    assert sorted(releases.released) == sorted(m.message_id for m in finished)


class FailingReleases(StubBackend):
    """A StubBackend whose first batched release raises ``error`` (the backend is down, or a bug)."""

    def __init__(self, error: Exception):
        super().__init__()
        self.error: Exception | None = error

    def release_many(self, places):
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return super().release_many(places)


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (LockBackendError("The lock backend is down."), "could not be released"),
        (RuntimeError("a bug"), "failed; they are tried again"),
    ],
)
def test_a_release_that_fails_is_tried_again_by_the_heartbeat_thread(error, logged, caplog):
    backend = FailingReleases(error)
    broker = StubBroker()
    broker.emit_after("process_boot")
    env = Env("stub", broker, backend, UniqueJobs(backend=backend, heartbeat_interval=100, lease_period=1000))
    runs = env.run()
    next(runs)
    try:

        @env.actor(lock="until_executed")
        def settle(event_id):
            pass

        caplog.set_level(logging.INFO, logger="dramatiq_unique")
        message = settle.send("e1")
        env.worker()
        env.join(settle)
        wait_for(lambda: env.is_free(enqueue_outcome(message).digest))
        warnings = unique_warnings(caplog)
        assert len(warnings) == 1 and logged in warnings[0]
        assert any("released on a later attempt" in r.getMessage() for r in caplog.records)
    finally:
        next(runs, None)


def test_without_background_releases_the_worker_thread_releases(make_env):
    env = make_env(background_releases=False)
    threads = []
    env.middleware.subscribe(RELEASED, lambda event: threads.append(threading.current_thread().name))

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    message = settle.send("e1")
    env.worker()
    env.join(settle)
    assert env.is_free(enqueue_outcome(message).digest)
    assert len(threads) == 1 and threads[0] != "dramatiq-unique-releases"


def test_background_releases_must_be_a_boolean():
    with pytest.raises(InvalidLockOptions, match=r"background_releases='yes': it must be True or False"):
        UniqueJobs(backend=StubBackend(), background_releases="yes")


def test_a_subscriber_of_released_sends_the_same_job_without_waiting(make_env):
    # A RELEASED subscriber runs in the release thread: a send() there of the job whose
    # release it is told of must not wait for that very thread (it waited SETTLE_TIMEOUT).
    env = make_env()
    runs, sends = [], []

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)

    def send_again(event):
        if len(sends) == 0:
            started = time.monotonic()
            message = settle.send("e1")
            sends.append((time.monotonic() - started, enqueue_outcome(message).status))

    env.middleware.subscribe(RELEASED, send_again)
    settle.send("e1")
    env.worker()
    wait_for(lambda: sends)
    env.join(settle)
    elapsed, status = sends[0]
    assert status == "enqueued"
    assert elapsed < 1, f"the send waited {elapsed:.1f} s for the release thread it ran in"
    assert runs == ["e1", "e1"]


def test_a_send_is_not_dropped_for_a_release_that_waits_behind_a_slow_subscriber(make_env, monkeypatch):
    # The release thread is busy in a subscriber for longer than a send waits for it: the
    # send must not meet the lock of a message that finished long ago.
    monkeypatch.setattr(releases_module, "SETTLE_TIMEOUT", 0.2)
    env = make_env()
    releases = HeldReleases(env)
    runs = []

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)

    releases.hold(settle)
    releases.finish(settle, "e1")
    try:
        outcome = enqueue_outcome(settle.send("e1"))
    finally:
        releases.open()
    assert outcome.status == "enqueued", f"dropped as a duplicate of finished message {outcome.holder}"
    env.join(settle)
    assert runs == ["first", "e1", "e1"]


def test_a_message_enqueued_again_keeps_its_lock_when_its_last_release_was_late(make_env, monkeypatch):
    # The same message enqueued again (same message_id) while the release of its finished run
    # waits behind a slow subscriber: that late release must not free the place it takes again.
    monkeypatch.setattr(releases_module, "SETTLE_TIMEOUT", 0.2)
    env = make_env()
    releases = HeldReleases(env)
    runs, gate = [], threading.Event()

    @env.actor(lock="until_executed")
    def settle(event_id):
        runs.append(event_id)
        if runs.count("e1") == 2:
            assert gate.wait(10)

    releases.hold(settle)
    message = releases.finish(settle, "e1")
    try:
        env.broker.enqueue(message)
    finally:
        releases.open()
    wait_for(lambda: runs == ["first", "e1", "e1"])
    wait_for(lambda: len(releases.released) >= 2)
    time.sleep(0.05)
    try:
        duplicate = enqueue_outcome(settle.send("e1"))
    finally:
        gate.set()
    env.join(settle)
    assert duplicate.status == "duplicate", "the running copy's lock was freed by its previous run's release"


def test_a_worker_started_while_the_last_one_stops_has_a_release_thread(make_env):
    # A Worker started in the process while the last one stops (its release thread still
    # sending) found that thread still there, started none, and was left without one.
    env = make_env()
    releases = HeldReleases(env)

    @env.actor(lock="until_executed")
    def settle(event_id):
        pass

    first = releases.hold(settle)
    stopper = threading.Thread(target=first.stop)
    stopper.start()
    # The stopping worker is in after_worker_shutdown, waiting for the release thread.
    wait_for(lambda: not env.middleware.releases.running)
    assert stopper.is_alive()
    env.workers.remove(first)
    env.worker()
    releases.open()
    stopper.join(10)
    assert not stopper.is_alive()
    message = settle.send("e1")
    env.join(settle)
    wait_for(lambda: message.message_id in releases.released)
    assert releases.threads[-1] == "dramatiq-unique-releases"
    assert env.middleware.releases.running


class GatedReleases(StubBackend):
    """A StubBackend whose batched releases are recorded, and whose first one waits for ``gate``."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.batches: list[list[str]] = []

    def release_many(self, places):
        self.batches.append([owner for _, owner in places])
        self.entered.set()
        assert self.gate.wait(10)
        return [False] * len(places)


class Finishing:
    """What a release handed over is about, as a message's lock tells it."""

    def __init__(self, message_id: str):
        self.actor_name = "settle"
        self.message_id = message_id

    @property
    def subject(self):
        return EventSubject("settle", "default", "digest", self.message_id, "until_executed")


def _serving(releases: releases_module.BackgroundReleases, target=None):
    """A release thread opened and started, as the runtime does; returns it and its stop event."""
    stopping = threading.Event()
    thread = threading.Thread(target=target or releases.serve, args=(stopping,), name="releases", daemon=True)
    releases.open(thread, stopping)
    thread.start()
    return thread, stopping


def _background_releases(backend) -> releases_module.BackgroundReleases:
    logger = logging.getLogger("dramatiq_unique")
    return releases_module.BackgroundReleases(backend, logger=logger, events=Events(logger=logger), retry=None)


def test_releases_handed_over_while_the_thread_sends_wake_it_no_more_and_go_out_together():
    backend = GatedReleases()
    releases = _background_releases(backend)
    thread, stopping = _serving(releases)
    wakes = []
    notify = releases._handed.notify
    releases._handed.notify = lambda n=1: (wakes.append(n), notify(n))
    wait_for(lambda: releases._asleep)
    assert releases.hand_over("k0", "m0", Finishing("m0"))
    assert backend.entered.wait(10)
    for i in range(1, 51):
        assert releases.hand_over(f"k{i}", f"m{i}", Finishing(f"m{i}"))
    assert wakes == [1], "a thread at work was woken for releases it finds when its round trip ends"
    backend.gate.set()
    wait_for(lambda: releases.idle)
    assert backend.batches == [["m0"], [f"m{i}" for i in range(1, 51)]]
    # Asleep again, it is woken by the next release.
    wait_for(lambda: releases._asleep)
    assert releases.hand_over("k51", "m51", Finishing("m51"))
    wait_for(lambda: releases.idle)
    assert wakes == [1, 1] and backend.batches[-1] == ["m51"]
    releases.close(stopping)
    thread.join(10)
    assert not thread.is_alive() and not releases.running
    assert not releases.hand_over("k52", "m52", Finishing("m52"))


def test_a_release_thread_that_ended_another_way_takes_no_more_releases():
    class Ended(BaseException):
        pass

    class Failing(StubBackend):
        def release_many(self, places):
            raise Ended()

    releases = _background_releases(Failing())

    def serve_until_it_fails(stopping):
        with pytest.raises(Ended):
            releases.serve(stopping)

    thread, _ = _serving(releases, serve_until_it_fails)
    assert releases.running
    assert releases.hand_over("k0", "m0", Finishing("m0"))
    thread.join(10)
    assert not thread.is_alive()
    assert not releases.running, "a thread that is gone was still taking releases"
    assert not releases.hand_over("k1", "m1", Finishing("m1"))


def test_a_forked_child_takes_no_release_of_its_parents_thread():
    releases = _background_releases(GatedReleases())
    thread, stopping = _serving(releases)
    wait_for(lambda: releases._asleep)
    parents = releases._handed
    releases.reset_after_fork()
    assert not releases.running and releases.idle and not releases._asleep
    assert not releases.hand_over("k0", "m0", Finishing("m0"))
    # The parent's thread, still here in this process unlike in a child: it ends.
    with parents:
        stopping.set()
        parents.notify_all()
    thread.join(10)
    assert not thread.is_alive()
