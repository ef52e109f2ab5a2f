"""Process exactly once: a payment event is settled once, however often the provider delivers it.

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
broker.add_middleware(
    UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock"),
    before=TimeLimit,
)
dramatiq.set_broker(broker)

settled = {}  # event_id -> payload: stands for your payments table
tokens = {}  # message_id -> the fencing token its send() got
names = {}  # message_id -> "delivery 1", ...
story = (
    threading.Lock()
)  # one line at a time, each send's line before its message's lines
running = threading.Event()
may_finish = (
    threading.Event()
)  # holds the first settlement until the provider has delivered again


# Only the event id decides uniqueness: the payload may differ between deliveries.
@dramatiq.actor(
    queue_name="payments",
    lock="until_executed",
    lock_args_method=lambda event_id, payload: [event_id],
)
def settle_payment(event_id, payload):
    lock = current_lock()
    with story:
        if (
            event_id in settled
        ):  # idempotent: a later delivery of a settled event changes nothing
            print(
                f"  {event_id} (delivery {payload['delivery']}) is settled already: nothing to do",
                flush=True,
            )
            return
        same = "the same" if lock.token == tokens[lock.message_id] else "ANOTHER"
        print(
            f"  settling {event_id} (delivery {payload['delivery']}), holding {same} lock token",
            flush=True,
        )
    running.set()
    may_finish.wait(10)  # stands for the call to the payment provider
    settled[event_id] = payload


def deliver(event_id, delivery):
    with story:
        message = settle_payment.send(
            event_id, {"amount": "120.00", "delivery": delivery}
        )
        outcome = enqueue_outcome(message)
        names[message.message_id] = f"delivery {delivery}"
        if outcome.enqueued:
            tokens[message.message_id] = outcome.token
            print(
                f"webhook {event_id}, delivery {delivery}: enqueued, lock token {outcome.token}",
                flush=True,
            )
        else:  # not enqueued; send() returned normally
            print(
                f"webhook {event_id}, delivery {delivery}: {outcome.status},", end=" "
            )
            print(f"the lock is held by {names[outcome.holder]}", flush=True)
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
    print(
        "Settled:",
        ", ".join(
            f"{event_id} (delivery {p['delivery']})"
            for event_id, p in sorted(settled.items())
        ),
    )


if __name__ == "__main__":
    main()
