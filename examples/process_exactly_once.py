"""Process exactly once: a payment event is settled once, however often the provider
delivers it.

    python examples/process_exactly_once.py   # set REDIS_URL to use your own server

It touches only keys under ``example-once:`` and deletes them at the end.
"""

import threading

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, current_lock, enqueue_outcome

PREFIX = "example-once"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

settled = {}  # event_id -> payload: stands for your payments table


@dramatiq.actor(
    queue_name="payments",
    lock="until_executed",
    # Only the event id decides uniqueness: the payload may differ between deliveries.
    lock_args_method=lambda event_id, payload: [event_id],
)
def settle_payment(event_id, payload):
    if event_id in settled:  # idempotent: a later delivery changes nothing
        delivery = payload["delivery"]
        say(f"  {event_id} (delivery {delivery}) is settled already: nothing to do")
        return
    call_the_payment_provider(event_id, payload)
    settled[event_id] = payload


# What follows only tells the story, the same way on every run.
tokens = {}  # message_id -> the fencing token its send() got
names = {}  # message_id -> "delivery 1", ...
# One line at a time, each send's line before its message's lines.
story = threading.RLock()
running = threading.Event()
# Holds the first settlement until the provider has delivered again.
may_finish = threading.Event()


def say(line):
    with story:
        print(line, flush=True)


def call_the_payment_provider(event_id, payload):
    lock = current_lock()
    with story:  # the send may not have noted its token yet
        same = "the same" if lock.token == tokens[lock.message_id] else "ANOTHER"
        delivery = payload["delivery"]
        say(f"  settling {event_id} (delivery {delivery}), holding {same} lock token")
    running.set()
    may_finish.wait(10)  # stands for the call to the payment provider


def deliver(event_id, delivery):
    with story:
        # [docs: send] (the lines its page shows)
        payload = {"amount": "120.00", "delivery": delivery}
        message = settle_payment.send(event_id, payload)
        outcome = enqueue_outcome(message)  # send() returns normally, enqueued or not
        # [docs: end]
        names[message.message_id] = f"delivery {delivery}"
        if outcome.enqueued:
            tokens[message.message_id] = outcome.token
            said = f"enqueued, lock token {outcome.token}"
        else:  # not enqueued; send() returned normally
            said = f"{outcome.status}, the lock is held by {names[outcome.holder]}"
        say(f"webhook {event_id}, delivery {delivery}: {said}")
    return message


def wait_until_done():
    broker.join(settle_payment.queue_name, timeout=10_000)
    worker.join()


worker = Worker(broker, worker_threads=2, worker_timeout=100)


def main():
    worker.start()
    try:
        deliver("evt_123", 1)
        running.wait(10)
        deliver("evt_123", 2)  # the provider did not see our 200 in time
        deliver("evt_456", 1)  # another event: another lock
        may_finish.set()
        wait_until_done()
        print("Both events are settled; the lock of evt_123 is free again.")
        deliver("evt_123", 3)  # much later, the provider delivers once more
        wait_until_done()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    deliveries = (
        f"{event} (delivery {p['delivery']})" for event, p in sorted(settled.items())
    )
    print("Settled:", ", ".join(deliveries))


if __name__ == "__main__":
    main()
