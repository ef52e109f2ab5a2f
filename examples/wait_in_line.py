"""Wait in line: the postings to one account's ledger run one at a time, in the order
they were sent, and none is dropped; one more than the line holds goes to the
dead-letter queue.

    python examples/wait_in_line.py   # set REDIS_URL to use your own server

It touches only keys under ``example-line:`` and deletes them at the end.
"""

import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-line"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# Locked on the account alone: a posting that finds one queued or running for its
# account waits in the lock's line, four at most.
@dramatiq.actor(
    lock="until_executed",
    on_conflict="wait",
    line_limit=4,
    lock_args_method=lambda account_id, posting, amount: [account_id],
)
def post_to_ledger(account_id, posting, amount):
    write_to_the_ledger(account_id, posting, amount)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time
runs = []  # (posting, start, end) of every posting that ran, in monotonic seconds
running = []  # the postings running now
most_at_once = [0]
all_posted = threading.Semaphore(0)


def write_to_the_ledger(account_id, posting, amount):
    with story:
        started = time.monotonic()
        print(f"  {posting} posts {amount:+} to account {account_id}", flush=True)
        running.append(posting)
        most_at_once[0] = max(most_at_once[0], len(running))
    time.sleep(0.05)  # stands for the write to the ledger
    with story:
        running.remove(posting)
        runs.append((posting, started, time.monotonic()))
    all_posted.release()


def main():
    postings = [("A", 100), ("B", -30), ("C", 250), ("D", -80), ("E", 15), ("F", -5)]
    for posting, amount in postings:  # sent before any worker runs
        outcome = enqueue_outcome(post_to_ledger.send(42, posting, amount))
        place = f", position {outcome.position}" if outcome.status == "waiting" else ""
        print(f"send {posting} to account 42: {outcome.status}{place}", flush=True)
    worker = Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        for _ in range(5):
            all_posted.acquire(timeout=10)
        broker.join(post_to_ledger.queue_name, timeout=10_000)
        worker.join()
        dead_letter_queue = f"{broker.namespace}:{post_to_ledger.queue_name}.XQ.msgs"
        dead = broker.client.hvals(dead_letter_queue)
        dead_letters = [dramatiq.Message.decode(payload).args[1] for payload in dead]
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    order = " ".join(posting for posting, _, _ in runs)
    gaps = [
        later[1] - earlier[2] for earlier, later in zip(runs, runs[1:], strict=False)
    ]
    most = most_at_once[0]
    print(f"Account 42: {len(runs)} postings ({order}), at most {most} at a time.")
    print(f"In the dead-letter queue: {', '.join(dead_letters) or 'nothing'}.")
    gap = f"{max(gaps) * 1000:.0f} ms"
    print(f"From the end of one posting to the start of the next: {gap} at most.")


if __name__ == "__main__":
    main()
