"""Enqueue once, run serialized: at most one report rebuild queued per customer, never
two running.

    python examples/enqueue_once_run_serialized.py   # REDIS_URL: your own server

It touches only keys under ``example-enqueue-once:`` and deletes them at the end.
"""

import threading

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, current_lock, enqueue_outcome

PREFIX = "example-enqueue-once"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# Drop a duplicate at send(): one queued copy is enough. Reschedule one that reaches a
# worker while another copy runs: it was sent after that copy started, so it has work
# to do.
@dramatiq.actor(
    lock="until_and_while_executing",
    on_conflict={"client": "log", "server": "reschedule"},
    reschedule_delay=300,  # ms; 5000 by default
)
def rebuild_report(customer_id):
    build_the_report(customer_id)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time, each send's line before its message's
names = {}  # message_id -> A, B, C...: short names for the story
rebuilds = []
running = []  # the rebuilds running now
most_at_once = 0
started = threading.Semaphore(0)
may_finish = threading.Event()  # holds rebuild A until the story has moved on


def build_the_report(customer_id):
    global most_at_once
    with story:
        name = names[current_lock().message_id]
        print(
            f"  {name} starts rebuilding the report of customer {customer_id}",
            flush=True,
        )
        rebuilds.append(name)
        running.append(name)
        most_at_once = max(most_at_once, len(running))
    started.release()
    if name == "A":
        may_finish.wait(10)  # stands for a long rebuild
    with story:
        running.remove(name)


def rescheduled(event):
    with story:
        met = f"{names[event.message_id]} met the run lock of {names[event.holders[0]]}"
        print(f"  {met}: rescheduled in {event.delay} ms, keeping its enqueue lock")
    started.release()


unique.subscribe("rescheduled", rescheduled)


def send(name):
    with story:
        message = rebuild_report.send(7)
        names[message.message_id] = name
        outcome = enqueue_outcome(message)
        held_by = ""
        if not outcome.enqueued:
            held_by = f", the enqueue lock is held by {names[outcome.holder]}"
        print(
            f"send rebuild_report(7) -> {name}: {outcome.status}{held_by}", flush=True
        )


def main():
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    try:
        send("A")
        send("B")  # A waits in the queue: one copy is enough
        worker.start()
        started.acquire(timeout=10)  # A runs: its enqueue lock became the run lock
        send("C")
        send("D")  # C waits in the queue: one copy is enough
        started.acquire(timeout=10)  # C reached a worker while A runs: rescheduled
        send("E")  # C was rescheduled with its enqueue lock: still the one queued copy
        with story:
            print("  A finishes", flush=True)
        may_finish.set()
        broker.join(rebuild_report.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    order = " then ".join(rebuilds)
    print(
        f"5 sends, {len(rebuilds)} rebuilds ({order}), at most {most_at_once} at once."
    )


if __name__ == "__main__":
    main()
