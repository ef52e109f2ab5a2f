"""A lock store SIGKILLed and restarted empty under load, with real `dramatiq` worker processes
(issue 20): the run that tests/test_data_loss_processes.py and benchmarks/data_loss.py make.

Two worker processes of four threads (``dramatiq tests.data_loss_workers:broker``) run payments
(``until_executed``, 200 ms each) and syncs (``while_executing`` per account, 300 ms each), with
UniqueJobs on a redis-server of their own (no persistence): the lock store, the only server
faulted. A sender thread here sends steadily: every 100 ms a new payment event, due 3 s later (it waits in
the delay queue), sent again 1 s and 2 s later (both copies should be duplicates, and the 2nd
of an event sent just before the kill comes after the restart), and a sync for one of three
accounts. Mid-run
the lock store is SIGKILLed and started again empty 1.5 s later.

Every figure comes from the record the workers keep in the broker's Redis (each run's interval,
each skipped message) and from what each send returned, never from the library's own counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import redis

from dramatiq_unique import LockBackendError, LockStoreHealing, RedisBackend, enqueue_outcome
from dramatiq_unique.keys import lock_kind

from . import data_loss_workers
from .test_outages import RedisProcess

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "dramatiq-unique"
TICK = 0.05
ACCOUNTS = 3
#: A payment is due this long after its event (ms): it waits in the delay queue meanwhile.
PAYMENT_DELAY = 3000
#: The 2nd and 3rd sends of an event come this many events (of 100 ms) after the 1st: 1 s and 2 s later,
#: while the 1st waits, so both should be duplicates; 2 s is longer than the store stays down.
COPIES = (10, 20)
#: How long the lock store stays down.
DOWN = 1.5

ERROR = "The lock store lost its data:"
RESUMED = "The lock store takes new locks again"
REBUILT = "After the lock store lost its data, this worker took again"
NOT_REBUILT = "The enqueue locks of the messages queued before the lock store lost its data are not taken again"
RETAKEN = "this worker took them again"
RUN_LOCK_TAKEN = "another copy took them since"


@dataclass
class Send:
    kind: str
    key: object
    at: float  # when send() returned (time.time())
    status: str  # enqueued, duplicate, ..., healing (LockStoreHealing) or refused (another LockBackendError)
    message_id: str


@dataclass
class Run:
    kind: str
    key: object
    start: float
    end: float
    pid: int
    message_id: str


@dataclass
class Figures:
    broker: str
    fault: bool
    seconds: float
    sends: list[Send]
    runs: list[Run]
    skipped: set[str]
    failed: set[str]
    #: The library's WARNING and ERROR lines: (time, pid, level, message).
    log: list[tuple[float, int, str, str]]
    #: The text the worker processes wrote (the dramatiq CLI's output).
    output: str
    worker_pids: list[int]
    keys_before: Counter = field(default_factory=Counter)
    keys_after: Counter = field(default_factory=Counter)
    killed_at: float | None = None
    restarted_at: float | None = None

    # What the workers said ----------------------------------------------------------

    def lines(self, start: str) -> list[tuple[float, int, str, str]]:
        return [line for line in self.log if line[3].startswith(start) or start in line[3]]

    @property
    def errors_per_worker(self) -> dict[int, int]:
        counted = Counter(pid for _, pid, level, _ in self.lines(ERROR) if level == "ERROR")
        return {pid: counted[pid] for pid in self.worker_pids}

    @property
    def detected_at(self) -> float | None:
        """When the last worker found the loss."""
        times = [at for at, *_ in self.lines(ERROR)]
        return max(times) if len(times) >= len(self.worker_pids) else None

    @property
    def healed_at(self) -> float | None:
        """When new locks were taken again (the WARNING of the healing worker)."""
        resumed = self.lines(RESUMED)
        return resumed[0][0] if resumed else None

    def after_restart(self, at: float | None) -> int | None:
        return None if at is None or self.restarted_at is None else int((at - self.restarted_at) * 1000)

    # What happened to the messages --------------------------------------------------

    @property
    def enqueued(self) -> list[Send]:
        return [send for send in self.sends if send.status == "enqueued"]

    @property
    def lost(self) -> list[Send]:
        """Sends enqueued whose message never ran and was not skipped."""
        done = {run.message_id for run in self.runs} | self.skipped
        return [send for send in self.enqueued if send.message_id not in done]

    def refused(self, status: str = "refused") -> list[Send]:
        return [send for send in self.sends if send.status == status]

    def duplicates(self) -> list[Send]:
        """Payment sends enqueued while an earlier enqueued send of the same event had not settled."""
        settled: dict[str, float] = {}
        for run in self.runs:
            settled[run.message_id] = min(run.end, settled.get(run.message_id, run.end))
        earlier: dict[object, list[str]] = defaultdict(list)
        found = []
        for send in self.sends:
            if send.kind != "payment" or send.status != "enqueued":
                continue
            if any(settled.get(message_id, float("inf")) > send.at for message_id in earlier[send.key]):
                found.append(send)
            earlier[send.key].append(send.message_id)
        return found

    def refused_after_healing(self) -> tuple[int, int]:
        """Payment sends after healing while an earlier enqueued send of the event had not settled:
        how many, and how many of them were refused as duplicates."""
        healed = self.healed_at
        settled: dict[str, float] = {}
        for run in self.runs:
            settled[run.message_id] = min(run.end, settled.get(run.message_id, run.end))
        earlier: dict[object, list[str]] = defaultdict(list)
        copies = refused = 0
        for send in self.sends:
            if send.kind != "payment":
                continue
            pending = any(settled.get(message_id, float("inf")) > send.at for message_id in earlier[send.key])
            if healed is not None and send.at > healed and pending and send.status not in ("refused", "healing"):
                copies += 1
                refused += send.status == "duplicate"
            if send.status == "enqueued":
                earlier[send.key].append(send.message_id)
        return copies, refused

    def settled_twice(self) -> tuple[int, int]:
        """Events settled by a duplicate as well as by their earlier message, and of those, how many
        ran twice at the same time. (An event whose 1st send was refused while the store was down
        is settled by its 2nd, and its 3rd, a second later, rightly runs again: not counted.)"""
        duplicates = {send.message_id for send in self.duplicates()}
        by_event: dict[object, list[Run]] = defaultdict(list)
        for run in self.runs:
            if run.kind == "payment":
                by_event[run.key].append(run)
        twice = [runs for runs in by_event.values() if len(runs) > 1 and any(r.message_id in duplicates for r in runs)]
        return len(twice), sum(bool(_overlaps(runs)) for runs in twice)

    def ran_twice(self) -> int:
        """Messages that ran more than once."""
        return sum(count > 1 for count in Counter(run.message_id for run in self.runs).values())

    def sync_overlaps(self, sent_after: float | None = None) -> list[tuple[Run, Run]]:
        """Pairs of syncs of one account that ran at the same time; with ``sent_after``, only the
        pairs one of which was sent after that time."""
        sent = {send.message_id: send.at for send in self.sends}
        by_account: dict[object, list[Run]] = defaultdict(list)
        for run in self.runs:
            if run.kind == "sync":
                by_account[run.key].append(run)
        pairs = [pair for runs in by_account.values() for pair in _overlaps(runs)]
        if sent_after is None:
            return pairs
        return [pair for pair in pairs if max(sent.get(run.message_id, 0) for run in pair) > sent_after]

    def in_window(self, sends: list[Send]) -> int:
        """Of these sends, those between the kill and the healing."""
        if self.killed_at is None:
            return 0
        healed = self.healed_at or float("inf")
        return sum(self.killed_at <= send.at <= healed for send in sends)


def _overlaps(runs: list[Run]) -> list[tuple[Run, Run]]:
    runs = sorted(runs, key=lambda run: run.start)
    return [(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :] if b.start < a.end]


def lock_keys(client: redis.Redis) -> Counter:
    """The locks held in the store, by kind (enqueue, run), and its lock keys ("keys"): a released
    lock's key stays a while, keeping its fencing token."""
    keys = [key.decode() for key in client.scan_iter(f"{PREFIX}:{{*", count=1000) if lock_kind(key.decode())]
    backend = RedisBackend(client=client)
    counted: Counter = Counter(keys=len(keys))
    for i in range(0, len(keys), 500):
        _, records = backend.read(keys[i : i + 500])
        for key in {record.key for record in records}:
            counted[lock_kind(key)] += 1
    return counted


class Workers:
    """``dramatiq tests.data_loss_workers:broker --processes 2 --threads 4`` in a session of its own."""

    def __init__(self, config: dict, directory: Path, record: redis.Redis, run: str):
        self.log_path = directory / f"workers-{run}.log"
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
        self.log = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dramatiq", "tests.data_loss_workers:broker", "--processes", "2", "--threads", "4"],
            cwd=directory,
            env={**os.environ, "PYTHONPATH": path, "DATA_LOSS_RUN": json.dumps(config)},
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while record.llen(f"{run}:ready") < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the workers did not start: {self.output()}")
            time.sleep(0.05)
        self.pids = [int(pid) for pid in record.lrange(f"{run}:ready", 0, -1)]

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL of the whole session after 15 s."""
        if self.log.closed:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.log.close()


def run_load(
    *,
    broker_kind: str,
    broker_url: str,
    record_url: str,
    directory: Path,
    fault: bool = True,
    before: float = 3.0,
    after: float = 6.0,
    drain: float = 30.0,
) -> Figures:
    """Send for ``before`` seconds, kill the lock store and start it again empty ``DOWN`` seconds
    later (unless not ``fault``), send for ``after`` more seconds, then wait up to ``drain`` seconds
    for every enqueued message to have run or been skipped."""
    run = f"dataloss-{uuid.uuid4().hex[:8]}"
    record = redis.Redis.from_url(record_url)
    store = RedisProcess(directory)
    store.start()
    store_url = f"redis://127.0.0.1:{store.port}/0"
    config = dict(broker_kind=broker_kind, broker_url=broker_url, store_url=store_url, record_url=record_url, run=run)
    workers = sender_broker = None
    try:
        workers = Workers(config, directory, record, run)
        sender_broker, settle, sync = data_loss_workers.build(**config, sender=True, store_client=store.client())
        sends: list[Send] = []
        stop = threading.Event()

        def send(kind: str, actor, key, *args, delay: int | None = None) -> None:
            try:
                message = actor.send_with_options(args=(key, *args), delay=delay)
            except LockStoreHealing:
                sends.append(Send(kind, key, time.time(), "healing", ""))
                return
            except LockBackendError:
                sends.append(Send(kind, key, time.time(), "refused", ""))
                return
            sends.append(Send(kind, key, time.time(), enqueue_outcome(message).status, message.message_id))

        def sender() -> None:
            tick = 0
            next_at = time.monotonic()
            while not stop.is_set():
                event = tick // 2
                if tick % 2 == 0:
                    send("payment", settle, f"evt-{event}", delay=PAYMENT_DELAY)
                    for later in COPIES:
                        if event >= later:
                            send("payment", settle, f"evt-{event - later}")
                else:
                    send("sync", sync, event % ACCOUNTS, event)
                tick += 1
                next_at += TICK
                time.sleep(max(0.0, next_at - time.monotonic()))

        thread = threading.Thread(target=sender, name="sender")
        started = time.time()
        thread.start()
        time.sleep(before)
        figures_keys_before = lock_keys(store.client())
        killed_at = restarted_at = None
        figures_keys_after: Counter = Counter()
        if fault:
            killed_at = time.time()
            store.kill()
            time.sleep(DOWN)
            store.start()
            restarted_at = time.time()
            # Until the rebuild's WARNING (RedisBroker) or the one saying there is none (RabbitMQ).
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                lines = [json.loads(line)[3] for line in record.lrange(f"{run}:log", 0, -1)]
                if any(line.startswith((REBUILT, NOT_REBUILT)) for line in lines):
                    break
                time.sleep(0.02)
            figures_keys_after = lock_keys(store.client())
            time.sleep(max(0.0, after - (time.time() - restarted_at)))
        else:
            time.sleep(DOWN + 1.0)
            figures_keys_after = lock_keys(store.client())
            time.sleep(max(0.0, after - 1.0))
        stop.set()
        thread.join()
        seconds = time.time() - started

        def accounted() -> bool:
            done = {json.loads(line)[5] for line in record.lrange(f"{run}:runs", 0, -1)}
            done |= {m.decode() for m in record.lrange(f"{run}:skipped", 0, -1)}
            return all(send.message_id in done for send in sends if send.status == "enqueued")

        deadline = time.monotonic() + drain
        while not accounted() and time.monotonic() < deadline:
            time.sleep(0.1)
        workers.stop()
        return Figures(
            broker=broker_kind,
            fault=fault,
            seconds=seconds,
            sends=sends,
            runs=[Run(*json.loads(line)) for line in record.lrange(f"{run}:runs", 0, -1)],
            skipped={m.decode() for m in record.lrange(f"{run}:skipped", 0, -1)},
            failed={m.decode() for m in record.lrange(f"{run}:failed", 0, -1)},
            log=[tuple(json.loads(line)) for line in record.lrange(f"{run}:log", 0, -1)],
            output=workers.output(),
            worker_pids=workers.pids,
            keys_before=figures_keys_before,
            keys_after=figures_keys_after,
            killed_at=killed_at,
            restarted_at=restarted_at,
        )
    finally:
        if workers is not None:
            workers.stop()
        if sender_broker is not None:
            _clean_broker(sender_broker, broker_kind, run)
            sender_broker.close()
        store.kill()
        for key in record.scan_iter(f"{run}:*"):
            record.delete(key)


def _clean_broker(broker, broker_kind: str, run: str) -> None:
    """The run's queues go: they were its own."""
    queues = [f"{kind}-{run}" for kind in ("payments", "syncs")]
    names = [name for queue in queues for name in (queue, f"{queue}.DQ", f"{queue}.XQ")]
    try:
        if broker_kind == "rabbitmq":
            for name in names:
                broker.channel.queue_delete(name)
        else:
            for name in names:
                for key in broker.client.scan_iter(f"{broker.namespace}:{name}*"):
                    broker.client.delete(key)
    except Exception:  # noqa: BLE001 (cleaning up is best effort)
        pass


def describe(figures: Figures) -> list[str]:
    """The figures of one run, one per line."""
    payments = [send for send in figures.sends if send.kind == "payment"]
    syncs = [send for send in figures.sends if send.kind == "sync"]
    statuses = Counter(send.status for send in payments)
    duplicates = figures.duplicates()
    twice, twice_overlapping = figures.settled_twice()
    overlaps = figures.sync_overlaps()
    lines = [
        f"{figures.broker}, {'store killed and restarted empty' if figures.fault else 'no fault (control)'}, "
        f"{figures.seconds:.0f} s of load: {len(payments)} payment sends ({dict(statuses)}), "
        f"{len(syncs)} sync sends ({dict(Counter(send.status for send in syncs))})",
        f"  locks held (and lock keys) before the kill: {dict(figures.keys_before)}; after the restart and healing: "
        f"{dict(figures.keys_after)}",
        f"  duplicate payments enqueued: {len(duplicates)} ({figures.in_window(duplicates)} between the kill "
        f"and the healing); events settled twice: {twice} ({twice_overlapping} with overlapping runs)",
        f"  syncs of one account that overlapped: {len(overlaps)} pairs "
        f"({len(figures.sync_overlaps(sent_after=figures.detected_at)) if figures.fault else 0} with one sent after "
        f"the last worker found the loss)",
        f"  messages lost: {len(figures.lost)} of {len(figures.enqueued)} enqueued "
        f"({len(figures.failed)} dead-lettered); messages that ran twice: {figures.ran_twice()}",
    ]
    if figures.fault:
        refused, healing = figures.refused(), figures.refused("healing")
        copies, refused_copies = figures.refused_after_healing()
        errors = figures.errors_per_worker
        rebuilt = figures.lines(REBUILT) + figures.lines(NOT_REBUILT)
        lines += [
            f"  sends refused (LockBackendError) while the store was down: {len(refused)}"
            + (f", over {refused[-1].at - refused[0].at:.1f} s" if refused else ""),
            f"  sends refused while the store healed (LockStoreHealing): {len(healing)}"
            + (
                f", from {figures.after_restart(healing[0].at)} to {figures.after_restart(healing[-1].at)} ms after "
                "the restart"
                if healing
                else ""
            ),
            f"  new locks taken again: {[figures.after_restart(at) for at, *_ in figures.lines(RESUMED)]} ms after "
            "the restart: " + " / ".join(line[3] for line in figures.lines(RESUMED)),
            f"  loss ERROR per worker: {list(errors.values())}, "
            f"{[figures.after_restart(at) for at, *_ in figures.lines(ERROR)]} ms after the restart",
            f"  rebuild WARNING: {len(rebuilt)}, "
            f"{[figures.after_restart(at) for at, *_ in rebuilt]} ms after the restart: "
            + " / ".join(dict.fromkeys(line[3] for line in rebuilt)),
            f"  run locks taken again: {len(figures.lines(RETAKEN))} WARNING(s); "
            f"taken by another copy first: {len(figures.lines(RUN_LOCK_TAKEN))}",
            f"  payment copies sent after the healing while their original was pending: {copies}, "
            f"refused as duplicates: {refused_copies}",
        ]
    return lines
