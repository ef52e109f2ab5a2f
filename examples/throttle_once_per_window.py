"""Throttle to once per window: at most one digest email per user per window, however
often it is triggered. The window is one day in real life, one second here.

    python examples/throttle_once_per_window.py   # set REDIS_URL to use your own server

It touches only keys under ``example-throttle:`` and deletes them at the end.
"""

import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-throttle"
WINDOW = 1000  # ms; 24 * 60 * 60 * 1000 for once a day

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


@dramatiq.actor(lock="until_expired", lock_ttl=WINDOW)
def send_daily_digest(user_id):
    email_the_digest(user_id)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time, each send's line before its message's
names = {}  # message_id -> A, B, C...: short names for the story


def email_the_digest(user_id):
    with story:
        print(f"  emailing user {user_id} their digest", flush=True)


def trigger(name, user_id):
    with story:
        message = send_daily_digest.send(user_id)
        names[message.message_id] = name
        outcome = enqueue_outcome(message)
        said = outcome.status
        if not outcome.enqueued:
            said += f", the lock is held by {names[outcome.holder]}"
        print(f"send_daily_digest.send({user_id}) -> {name}: {said}", flush=True)


def wait_until_sent(worker):
    broker.join(send_daily_digest.queue_name, timeout=10_000)
    worker.join()


def main():
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        window_starts = time.monotonic()
        trigger("A", 1)
        wait_until_sent(worker)
        trigger("B", 1)  # A has run, but the window has not passed
        trigger("C", 2)  # another user, another lock
        wait_until_sent(worker)
        time.sleep(max(0.0, window_starts + (WINDOW + 200) / 1000 - time.monotonic()))
        print(f"{WINDOW} ms after A was sent, its lock has run out:")
        trigger("D", 1)
        wait_until_sent(worker)
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
