"""The two stories of the docs, run for real: a RedisBroker, a Worker and
dramatiq-unique's locks.

    make demo                                        # starts a throwaway Valkey server
    REDIS_URL=redis://127.0.0.1:6379/0 make demo     # or uses yours

On your own server the demo touches only keys under ``dramatiq-unique-demo:``
(its broker namespace and its lock prefix) and deletes them when it is done.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import Counter

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import (
    delete_keys,
    redis_url,
    started_a_server,
    stop_server,
    where,
)

from dramatiq_unique import RedisBackend, UniqueJobs, current_lock, enqueue_outcome

PREFIX = "dramatiq-unique-demo"
WORKER_THREADS = 4
SYNC_SECONDS = 0.4  # how long a balance sync takes
SETTLE_SECONDS = 0.3  # how long the payment provider takes to settle

_print_mutex = threading.Lock()
_t0 = time.monotonic()


def say(text: str = "") -> None:
    """Print a line; worker threads print too, so one line at a time."""
    with _print_mutex:
        print(text, flush=True)


def event(text: str) -> None:
    """Print a line of a story's timeline, with the seconds since the story began."""
    say(f"  {time.monotonic() - _t0:6.3f}s  {text}")


def short(message_id: str) -> str:
    return f"[{message_id[:8]}]"


def times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


class WatchConflicts(dramatiq.Middleware):
    """Reports the copies that met a held run lock: rescheduled, or dropped.

    With on_conflict="reschedule", UniqueJobs enqueues a copy of the message (same
    message_id) with a delay, which ``after_enqueue`` sees, then skips the original;
    Dramatiq calls ``after_skip_message`` on every middleware for it, this one included.
    """

    def __init__(self, conflicts):
        self.conflicts = conflicts

    def after_enqueue(self, broker, message, delay):
        reschedules = enqueue_outcome(message).reschedules
        if delay and reschedules:
            self.conflicts.rescheduled(message, delay, reschedules)

    def after_skip_message(self, broker, message):
        self.conflicts.skipped(message)


def main() -> int:
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    # Dramatiq logs a WARNING for every message a middleware skips; the demo reports
    # those itself.
    logging.getLogger("dramatiq.worker.WorkerThread").setLevel(logging.ERROR)
    url = redis_url()
    embedded = started_a_server()
    on = where() + ("" if embedded else f" (keys under {PREFIX}:)")
    say(
        f"dramatiq-unique demo: a RedisBroker and a Worker ({WORKER_THREADS} threads) "
        f"on {on}."
    )
    broker = RedisBroker(url=url, namespace=f"{PREFIX}:broker")
    backend = RedisBackend(url=url)
    # Ahead of TimeLimit, as the middleware asks, and before any actor is declared.
    broker.add_middleware(
        UniqueJobs(backend=backend, lock_prefix=f"{PREFIX}:lock"), before=TimeLimit
    )
    conflicts = Conflicts()
    broker.add_middleware(WatchConflicts(conflicts))
    dramatiq.set_broker(broker)
    delete_keys(PREFIX)  # left over from an interrupted run, if any

    sync_account_balance, syncs = declare_story_1(conflicts)
    settle_payment, ledger = declare_story_2()

    broker.emit_after("process_boot")
    worker = Worker(broker, worker_threads=WORKER_THREADS, worker_timeout=100)
    worker.start()
    try:
        problems = story_1(broker, worker, sync_account_balance, syncs, conflicts)
        problems += story_2(broker, worker, settle_payment, ledger)
    finally:
        worker.stop()
        delete_keys(PREFIX)
        broker.close()
        broker.client.close()
        backend.client.close()

    stop_server()
    say()
    if problems:
        for problem in problems:
            say(f"UNEXPECTED: {problem}")
        return 1
    say(
        "Done: worker stopped, demo keys deleted"
        + (", Valkey server stopped." if embedded else ".")
    )
    return 0


def wait_until_done(broker, worker, queue_name: str) -> None:
    broker.join(queue_name, timeout=10_000)
    worker.join()


# Story 1 ---------------------------------------------------------------------


RESCHEDULE_DELAY = (
    200  # ms before a copy that met the lock tries again; 5000 by default
)


class Conflicts:
    """The copies that met a held run lock, and who was running when they did."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.running: dict[
            tuple, str
        ] = {}  # (actor, args) -> message_id of the copy that runs
        self.reschedules: dict[
            str, int
        ] = {}  # message_id -> how often it was rescheduled
        self.pending: set[str] = set()  # rescheduled, the original not skipped yet
        self.dropped: list[str] = []

    def holder(self, message) -> str:
        args = ", ".join(map(repr, message.args))
        with self.mutex:
            holder = self.running.get((message.actor_name, tuple(message.args)))
        return (
            f"sync {args} {short(holder)} is running"
            if holder
            else f"another sync {args} is running"
        )

    def rescheduled(self, message, delay: int, reschedules: int) -> None:
        with self.mutex:
            if reschedules <= self.reschedules.get(message.message_id, 0):
                # A delayed enqueue of a message rescheduled before (a retry, say), not
                # a new reschedule.
                return
            self.reschedules[message.message_id] = reschedules
            self.pending.add(message.message_id)
        args = ", ".join(map(repr, message.args))
        event(
            f"sync {args} {short(message.message_id)} rescheduled in {delay} ms"
            f" (reschedule {reschedules}): {self.holder(message)}"
        )

    def skipped(self, message) -> None:
        with self.mutex:
            if (
                message.message_id in self.pending
            ):  # the original of a copy rescheduled just now
                self.pending.discard(message.message_id)
                return
            self.dropped.append(message.message_id)
        args = ", ".join(map(repr, message.args))
        event(
            f"sync {args} {short(message.message_id)} dropped without running: "
            f"{self.holder(message)}"
        )


def declare_story_1(conflicts: Conflicts):
    runs: list[
        tuple[int, str, float, float]
    ] = []  # (account_id, message_id, start, end) of every sync that ran

    @dramatiq.actor(
        lock="while_executing",
        on_conflict="reschedule",
        reschedule_delay=RESCHEDULE_DELAY,
    )
    def sync_account_balance(account_id):
        message_id = current_lock().message_id
        with conflicts.mutex:
            conflicts.running[("sync_account_balance", (account_id,))] = message_id
        start = time.monotonic()
        event(f"sync {account_id} {short(message_id)} starts")
        time.sleep(SYNC_SECONDS)  # the call to the bank's API
        with conflicts.mutex:
            del conflicts.running[("sync_account_balance", (account_id,))]
            runs.append((account_id, message_id, start, time.monotonic()))
        event(f"sync {account_id} {short(message_id)} done")

    return sync_account_balance, runs


def story_1(broker, worker, sync_account_balance, runs, conflicts) -> list[str]:
    global _t0
    say()
    say("Story 1: serialize per account")
    say(
        '  sync_account_balance(account_id) has lock="while_executing": a lock on its '
        "arguments, held only"
    )
    say(
        '  while it runs, and on_conflict="reschedule": a copy that finds the lock '
        "held is enqueued again to"
    )
    say(
        f"  try later, after reschedule_delay ({RESCHEDULE_DELAY} ms here; the default "
        "is 5000 ms)."
    )
    say("  You send five syncs at once: accounts 42, 42, 43, 42, 43.")
    say()
    _t0 = time.monotonic()
    sent = [
        sync_account_balance.send(account_id) for account_id in (42, 42, 43, 42, 43)
    ]
    wait_until_done(broker, worker, sync_account_balance.queue_name)

    runs_42 = sorted((start, end) for account, _, start, end in runs if account == 42)
    runs_43 = [(start, end) for account, _, start, end in runs if account == 43]
    overlapping_42 = any(
        later[0] < earlier[1]
        for earlier, later in zip(runs_42, runs_42[1:], strict=False)
    )
    side_by_side = sum(
        max(0.0, min(a[1], b[1]) - max(a[0], b[0])) for a in runs_42 for b in runs_43
    )
    queued = sum(enqueue_outcome(m).enqueued for m in sent)
    ran = Counter(message_id for _, message_id, _, _ in runs)
    rescheduled_copies = len(conflicts.reschedules)
    reschedules = sum(conflicts.reschedules.values())

    say()
    say("  What happened:")
    say(
        f"  - All {queued} sends were queued: while_executing takes no lock at enqueue."
    )
    every_once = ran == Counter(m.message_id for m in sent)
    say(
        (
            "  - Every sync ran, exactly once. "
            if every_once
            else f"  - {len(runs)} runs for {len(sent)} syncs sent. "
        )
        + f"Account 42 synced {times(len(runs_42))}, "
        + (
            "TWO AT ONCE;"
            if overlapping_42
            else "one after another, never two at once;"
        )
    )
    say(
        f"    account 43 synced {times(len(runs_43))}, side by side with 42 for "
        f"{side_by_side:.2f}s."
    )
    say(
        f"  - {rescheduled_copies} copies reached a worker while a sync for the same "
        "account was running."
        " Each time, the worker"
    )
    delay = f"{RESCHEDULE_DELAY} ms"
    say(
        "    acked the copy without running it and enqueued it again (same "
        f"message_id) to try {delay} later:"
    )
    say(
        f"    {reschedules} reschedules in all, until its account was free. "
        'on_conflict="log", the default, would have'
    )
    say(
        "    dropped them"
        + (f"; {len(conflicts.dropped)} were dropped." if conflicts.dropped else ".")
    )

    problems = []
    if queued != len(sent):
        problems.append(f"only {queued} of {len(sent)} syncs were queued")
    if overlapping_42:
        problems.append("two syncs for account 42 ran at the same time")
    if side_by_side <= 0:
        problems.append("accounts 42 and 43 never synced at the same time")
    never_ran = [m for m in sent if not ran[m.message_id]]
    if never_ran:
        problems.append(f"{len(never_ran)} of {len(sent)} syncs never ran")
    if max(ran.values(), default=0) > 1:
        problems.append(
            "syncs ran more than once: "
            f"{sorted(short(m) for m, n in ran.items() if n > 1)}"
        )
    if conflicts.dropped:
        problems.append(
            f"{len(conflicts.dropped)} syncs were dropped instead of rescheduled"
        )
    if not rescheduled_copies:
        problems.append(
            "no copy met the lock of a running sync, so none was rescheduled"
        )
    return problems


# Story 2 ---------------------------------------------------------------------


def declare_story_2():
    ledger = {
        "settled": {},
        "started": {},
        "mutex": threading.Lock(),
    }  # stands in for your payments table

    # Only the event id decides uniqueness: the payload may differ between deliveries.
    @dramatiq.actor(
        queue_name="payments",
        lock="until_executed",
        lock_args_method=lambda event_id, payload=None: [event_id],
    )
    def settle_payment(event_id, payload=None):
        lock = current_lock()
        event(
            f"settle {event_id} {short(lock.message_id)} starts; current_lock().token "
            f"= {lock.token}"
        )
        ledger["started"].setdefault(event_id, threading.Event()).set()
        time.sleep(SETTLE_SECONDS)  # the call to the payment provider
        with ledger["mutex"]:
            # Idempotent: a later delivery of a settled event changes nothing.
            already = event_id in ledger["settled"]
            ledger["settled"].setdefault(event_id, lock.token)
        event(
            f"settle {event_id} {short(lock.message_id)} "
            + ("found it settled already" if already else "done")
        )

    return settle_payment, ledger


def story_2(broker, worker, settle_payment, ledger) -> list[str]:
    global _t0
    say()
    say("Story 2: process a payment event once")
    say(
        '  settle_payment(event_id, payload) runs on queue "payments" with '
        'lock="until_executed", locked on the'
    )
    say(
        "  event id alone: the lock is taken when you send and given up when the "
        "settlement has finished."
    )
    say()
    _t0 = time.monotonic()
    started_123 = ledger["started"].setdefault("evt_123", threading.Event())

    def deliver(event_id, payload, note=""):
        message = settle_payment.send(event_id, payload)
        outcome = enqueue_outcome(message)
        if outcome.enqueued:
            event(
                f"webhook {event_id}{note}: enqueued as {short(message.message_id)}, "
                f"lock token {outcome.token}"
            )
        else:
            event(
                f"webhook {event_id}{note}: NOT enqueued, a duplicate: the lock is "
                f"held by {short(outcome.holder)}"
            )
        return message, outcome

    first, _ = deliver("evt_123", {"amount": "120.00", "delivery": 1})
    deliver("evt_456", {"amount": "35.50", "delivery": 1})
    started_123.wait(10)
    # The provider did not see your 200 in time and sends the same event again, with
    # another payload.
    _, duplicate = deliver("evt_123", {"amount": "120.00", "delivery": 2}, " again")
    wait_until_done(broker, worker, settle_payment.queue_name)
    say("  Later, after settlement, the provider delivers evt_123 once more:")
    _, later_outcome = deliver(
        "evt_123", {"amount": "120.00", "delivery": 3}, " a third time"
    )
    wait_until_done(broker, worker, settle_payment.queue_name)

    say()
    say("  What happened:")
    say(
        "  - The second delivery of evt_123 was dropped at send time. send() returned "
        "normally, and"
    )
    say(
        f"    enqueue_outcome(message) said status={duplicate.status!r}, "
        f"holder={short(duplicate.holder)}: the first."
    )
    say("  - evt_456 has a lock of its own and settled alongside evt_123.")
    say(
        "  - Once evt_123 was settled its lock was free, so the third delivery was "
        "enqueued and ran. The actor"
    )
    say(
        "    found evt_123 settled already and changed nothing: keep your actors "
        "idempotent for this case."
    )
    say(
        "  - current_lock().token grows with every new holder: pass it along with your "
        "write, so the resource"
    )
    say("    you write to can refuse a stale holder.")

    problems = []
    if duplicate.enqueued or duplicate.holder != first.message_id:
        problems.append(
            "the duplicate delivery of evt_123 was not dropped in favour of the "
            f"first: {duplicate}"
        )
    if not later_outcome.enqueued:
        problems.append("the lock of evt_123 was still held after settlement")
    if sorted(ledger["settled"]) != ["evt_123", "evt_456"]:
        problems.append(f"settled events: {sorted(ledger['settled'])}")
    return problems


if __name__ == "__main__":
    sys.exit(main())
