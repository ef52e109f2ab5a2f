"""Bounded concurrency: at most three calls to one partner's API at a time.

    python examples/bounded_concurrency.py   # set REDIS_URL to use your own server

It touches only keys under ``example-bounded:`` and deletes them at the end.
"""

import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-bounded"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# The partner allows three concurrent requests per client. The partner is the lock
# argument: the request id only names the request.
@dramatiq.actor(
    lock="while_executing",
    lock_limit=3,
    lock_args_method=lambda partner, request_id: [partner],
    on_conflict="reschedule",
    reschedule_delay=300,  # ms; 5000 by default
)
def call_partner_api(partner, request_id):
    send_the_request(partner, request_id)


# What follows only tells the story, the same way on every run.
mutex = threading.Lock()
running = {"acme": 0, "globex": 0}  # calls running now, per partner
most_at_once = {"acme": 0, "globex": 0}
calls = {"acme": 0, "globex": 0}
rescheduled_copies = set()
may_finish = threading.Event()  # holds the first calls until the story has moved on


def send_the_request(partner, request_id):
    with mutex:
        calls[partner] += 1
        running[partner] += 1
        most_at_once[partner] = max(most_at_once[partner], running[partner])
    may_finish.wait(10)  # stands for the HTTP request
    with mutex:
        running[partner] -= 1


def rescheduled(event):
    with mutex:
        rescheduled_copies.add(event.message_id)


unique.subscribe("rescheduled", rescheduled)


def wait_for(condition):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with mutex:
            if condition():
                return
        time.sleep(0.01)
    raise TimeoutError("the story did not go as expected")


def main():
    worker = Worker(broker, worker_threads=8, worker_timeout=100)
    worker.start()
    try:
        sent = [call_partner_api.send("acme", request) for request in range(5)]
        sent.append(call_partner_api.send("globex", 0))
        queued = sum(enqueue_outcome(message).enqueued for message in sent)
        nothing = "while_executing takes nothing at send()"
        print(f"send 5 calls for acme, 1 for globex: {queued} queued ({nothing})")
        wait_for(
            lambda: running == {"acme": 3, "globex": 1} and len(rescheduled_copies) == 2
        )
        acme, globex = running["acme"], running["globex"]
        print(f"{acme} calls for acme run at once, and {globex} for globex beside them")
        met = f"{len(rescheduled_copies)} calls for acme met the full lock"
        print(f"{met}: rescheduled to try again in 300 ms")
        may_finish.set()
        broker.join(call_partner_api.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    for partner in ("acme", "globex"):
        ran = f"{calls[partner]} call{'s' if calls[partner] > 1 else ''} ran"
        print(f"{partner}: {ran}, at most {most_at_once[partner]} at a time")


if __name__ == "__main__":
    main()
