"""Test helpers shared by the suites: an environment of broker, backend and workers."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq
import redis
from dramatiq import Message, Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import LockBackend, RedisBackend, UniqueJobs
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key, registry_key, run_key
from dramatiq_unique.runtime import PERIODIC_THREAD, RELEASE_THREAD

#: Retries that keep failing tests short.
FAST_RETRIES = {"min_backoff": 10, "max_backoff": 40}

#: The commands that call a lock script: FCALL where the server has Redis Functions, else EVALSHA.
SCRIPT_CALLS = ("fcall", "evalsha")


def pop_script_calls(calls: dict[str, int]) -> int:
    """Remove the script calls from ``calls`` (command -> calls, from ``INFO commandstats``) and
    return how many there were: the round trips of the lock transitions."""
    return sum(calls.pop(command, 0) for command in SCRIPT_CALLS)


class Seen(dramatiq.Middleware):
    """What the broker and workers did: skipped messages (dropped duplicates), enqueues, and a
    count of every event, which tells ``Env.join`` when nothing moves any more."""

    def __init__(self):
        self.skipped: list[Message] = []
        self.enqueues: list[tuple[str, int | None]] = []
        self.events = 0

    def after_skip_message(self, broker, message):
        self.skipped.append(message)
        self.events += 1

    def after_enqueue(self, broker, message, delay):
        self.enqueues.append((message.message_id, delay))
        self.events += 1

    def after_process_message(self, broker, message, *, result=None, exception=None):
        self.events += 1

    def after_nack(self, broker, message):
        self.events += 1


class Env:
    """A broker with UniqueJobs on it, the backend, and the workers a test starts."""

    def __init__(self, kind: str, broker, backend: LockBackend, middleware: UniqueJobs, queue_suffix: str = ""):
        self.kind = kind
        self.broker = broker
        self.backend = backend
        self.middleware = middleware
        self.queue_suffix = queue_suffix
        self.workers: list[Worker] = []
        self.seen = Seen()
        broker.add_middleware(middleware, before=TimeLimit)
        broker.add_middleware(self.seen)
        dramatiq.set_broker(broker)

    def run(self):
        try:
            yield self
        finally:
            for worker in self.workers:
                worker.stop()
            if self.middleware.activity is not None:
                # No count of this test is flushed from a thread into a later test's Redis.
                self.middleware.activity.close()
            queues = list(self.broker.get_declared_queues())
            self.broker.flush_all()
            if self.kind == "rabbitmq":
                for queue in queues:
                    for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
                        self.broker.channel.queue_delete(name)
            self.broker.close()

    #: ``with env.running():`` for a test that builds its Env itself, as a fixture runs ``run()``.
    running = contextlib.contextmanager(run)

    def actor(self, fn: Callable | None = None, **options: Any):
        """Declare an actor on this broker, with fast retries unless told otherwise."""
        options = {**FAST_RETRIES, **options}
        if self.queue_suffix:
            options["queue_name"] = f"{options.get('queue_name', 'default')}_{self.queue_suffix}"
        if fn is None:
            return lambda fn: dramatiq.actor(fn, broker=self.broker, **options)
        return dramatiq.actor(fn, broker=self.broker, **options)

    def worker(self, threads: int = 4) -> Worker:
        worker = Worker(self.broker, worker_timeout=100, worker_threads=threads)
        worker.start()
        self.workers.append(worker)
        return worker

    def join(self, *actors) -> None:
        """Wait until every message of these actors' queues, delayed ones and retries included, was processed."""
        while True:
            before = self.seen.events
            for actor in actors:
                if self.kind == "stub":
                    self.broker.join(actor.queue_name, fail_fast=False, timeout=30_000)
                elif self.kind == "redis":
                    self.broker.join(actor.queue_name, timeout=30_000)
                else:
                    self.broker.join(actor.queue_name, min_successes=5, idle_time=50, timeout=30_000)
            for worker in self.workers:
                worker.join()
            # A retry or a due delayed message may be on its way back through the broker.
            time.sleep(0.05)
            if self.seen.events == before:
                return

    def wait_for_retry(self, message) -> None:
        """Wait until Retries has enqueued ``message`` again, with its backoff."""
        wait_for(lambda: any(mid == message.message_id and delay for mid, delay in self.seen.enqueues))

    def wait_for_skips(self, count: int) -> None:
        """Wait until workers have skipped ``count`` messages (dropped or rescheduled duplicates)."""
        wait_for(lambda: len(self.seen.skipped) >= count)

    def waiting(self, actor) -> int:
        """How many messages wait in the actor's queue, not yet fetched by a worker."""
        if self.kind == "stub":
            return self.broker.queues[actor.queue_name].qsize()
        if self.kind == "redis":
            return self.broker.client.llen(f"{self.broker.namespace}:{actor.queue_name}")
        return self.broker.get_queue_message_counts(actor.queue_name)[0]

    def dead_letters(self, actor) -> list[Message]:
        """The messages of this actor's queue that ended in its dead-letter queue."""
        queue = actor.queue_name
        if self.kind == "stub":
            return [m._message for m in self.broker.dead_letters_by_queue[queue]]
        if self.kind == "redis":
            payloads = self.broker.client.hvals(f"{self.broker.namespace}:{queue}.XQ.msgs")
            return [Message.decode(p) for p in payloads]
        # RabbitMQ: the consumer nacks after the worker is done, so wait for the count to settle;
        # then read the dead letters and put them back.
        counts = None
        while counts != (counts := self.broker.get_queue_message_counts(queue)[2]):
            time.sleep(0.2)
        messages, last_tag = [], None
        for _ in range(counts):
            method, _, body = self.broker.channel.basic_get(f"{queue}.XQ", auto_ack=False)
            if method is None:
                break
            last_tag = method.delivery_tag
            messages.append(Message.decode(body))
        if last_tag is not None:
            self.broker.channel.basic_nack(delivery_tag=last_tag, multiple=True, requeue=True)
        return messages

    def is_free(self, digest: str, *, run: bool = False, prefix: str = "dramatiq-unique") -> bool:
        """Whether nobody holds the lock: probe it with a place of our own, then give it back."""
        key = run_key(prefix, digest) if run else enqueue_key(prefix, digest)
        probe = Holder(message_id="probe", actor="probe", queue="probe", lock="probe", state="queued")
        acquisition = self.backend.acquire(key, "probe", limit=1, ttl=60_000, holder=probe)
        if acquisition.acquired:
            self.backend.release(key, "probe")
        return acquisition.acquired


class Gate:
    """Blocks actors until the test opens it, or ``timeout`` seconds passed; counts concurrent runs per key."""

    def __init__(self, timeout: float = 10):
        self._timeout = timeout
        self._open = threading.Event()
        self._mutex = threading.Lock()
        self.runs: list[Any] = []
        self.running: dict[Any, int] = {}
        self.max_running: dict[Any, int] = {}

    def open(self) -> None:
        self._open.set()

    def enter(self, key: Any, hold: float = 0.0) -> None:
        """Record a run of ``key``, wait for the gate (and ``hold`` seconds), then leave."""
        with self._mutex:
            self.runs.append(key)
            self.running[key] = self.running.get(key, 0) + 1
            self.max_running[key] = max(self.max_running.get(key, 0), self.running[key])
        try:
            self._open.wait(self._timeout)
            if hold:
                time.sleep(hold)
        finally:
            with self._mutex:
                self.running[key] -= 1

    def count(self, key: Any) -> int:
        with self._mutex:
            return self.runs.count(key)


def plant_dead_workers_run_lock(backend, digest: str, *, actor: str = "sync") -> None:
    """A run lock of a worker whose published time has run out."""
    backend.heartbeat(registry_key("dramatiq-unique"), "dead-host:1:0", ttl=1)
    time.sleep(0.01)
    holder = Holder("gone", actor, "default", "while_executing", "running", worker_id="dead-host:1:0")
    assert backend.acquire(f"dramatiq-unique:{{{digest}}}:run", "owner", limit=1, ttl=60_000, holder=holder).acquired


def scan_all(backend: LockBackend) -> list[Any]:
    """Every record, through as many scan steps as it takes (a cluster is scanned node by node)."""
    records, cursor = [], "0"
    while True:
        cursor, step = backend.scan("dramatiq-unique", cursor, 10)
        records.extend(step)
        if cursor == "0":
            return records


def stub_env_on(port: int, **options: Any) -> Env:
    """A StubBroker whose UniqueJobs keeps its locks on the redis-server at ``port`` (one a
    test may stop with SIGSTOP), with the middleware's ``options``."""
    broker = StubBroker()
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis.Redis(port=port))
    return Env("stub", broker, backend, UniqueJobs(backend=backend, **options))


def assert_stop_is_bounded(stopper: threading.Thread, caplog: Any) -> None:
    """Start ``stopper``, a thread calling a Worker's ``stop()`` while its lock backend does not
    answer, and check that it returns within 10 s with one ERROR about what it left waiting."""
    caplog.set_level(logging.ERROR, logger="dramatiq_unique")
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive(), "the worker's stop() waits for the lock backend"
    # (A WARNING that the worker could not leave the registry may come too, when the bounded wait ends first.)
    errors = [
        r.getMessage() for r in caplog.records if r.name.startswith("dramatiq_unique") and r.levelno >= logging.ERROR
    ]
    assert len(errors) == 1 and "still waiting for the lock backend" in errors[0], errors


def resume_after_bounded_stop(server: Any, stopper: threading.Thread, runs: Any) -> None:
    """Let a server stopped with SIGSTOP answer again, end the test's Env, and wait for the
    threads that waited for the server to finish their last round: before the server stops for
    good, or they would meet a server that refuses them, and retry."""
    server.proc.send_signal(signal.SIGCONT)
    stopper.join(10)
    next(runs, None)
    deadline = time.monotonic() + 10
    for thread in threading.enumerate():
        if thread.name in (PERIODIC_THREAD, RELEASE_THREAD):
            thread.join(max(0.0, deadline - time.monotonic()))
            assert not thread.is_alive(), f"{thread.name} did not end once the server answered"


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout:.1f}s")
        time.sleep(interval)


def unique_warnings(caplog) -> list[str]:
    """The WARNING and ERROR lines dramatiq_unique logged."""
    return [
        r.getMessage() for r in caplog.records if r.name.startswith("dramatiq_unique") and r.levelno >= logging.WARNING
    ]


def declare_small_app(env: Env, gate: Gate) -> dict[str, Any]:
    """The actors of a small application with locks of every kind (the operations and web tests);
    the sync actor waits at ``gate``."""
    actors = {}

    @env.actor(queue_name="payments", lock="until_executed", lock_args_method=lambda event_id, payload=None: [event_id])
    def settle(event_id, payload=None):
        pass

    @env.actor(queue_name="sync", lock="while_executing", on_conflict="reschedule", reschedule_delay=60_000)
    def sync(account_id):
        gate.enter(account_id)

    @env.actor(queue_name="reports", lock="until_executed", lock_limit=2)
    def report(day):
        pass

    @env.actor(queue_name="payments", lock="until_executed", lock_prefix="billing")
    def invoice(number):
        pass

    @env.actor(queue_name="payments", lock="until_executed", lock_ttl=50)
    def remind(number):
        pass

    @env.actor(queue_name="payments", lock="until_executing", on_conflict={"client": "replace"})
    def refresh(key):
        pass

    @env.actor(queue_name="payments")
    def plain(x):
        pass

    for actor in (settle, sync, report, invoice, remind, refresh, plain):
        actors[actor.actor_name] = actor
    return actors


def run_sync_worker(env: Env) -> Worker:
    """A worker that runs only the sync queue, so the other locks stay queued."""
    worker = Worker(env.broker, worker_timeout=100, worker_threads=2, queues={"sync"})
    worker.start()
    env.workers.append(worker)
    return worker
