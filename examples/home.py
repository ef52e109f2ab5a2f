"""The home page's first example, whole: two actors with locks, and a payment
event delivered twice and settled once.

    python examples/home.py   # the Redis at REDIS_URL, else the one on localhost:6379
"""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import UniqueJobs, enqueue_outcome

# UniqueJobs() keeps its locks on the broker's Redis, or on the one that
# $DRAMATIQ_UNIQUE_URL names.
broker = RedisBroker(url=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
broker.add_middleware(UniqueJobs(), before=TimeLimit)
dramatiq.set_broker(broker)


# A payment event is handled once: locked from send() until the actor is done.
@dramatiq.actor(
    queue_name="payments",
    lock="until_executed",
    lock_args_method=lambda event_id, payload=None: [event_id],
)
def settle_payment(event_id, payload=None):
    print(f"settling {event_id} from delivery {payload['delivery']}")


# Never two syncs of one account at once; a copy that meets the lock runs later.
@dramatiq.actor(lock="while_executing", on_conflict="reschedule")
def sync_account_balance(account_id): ...


if __name__ == "__main__":
    # The provider delivers evt_123 twice: the second send is dropped.
    for delivery in (1, 2):
        message = settle_payment.send("evt_123", {"delivery": delivery})
        print(f"delivery {delivery}: {enqueue_outcome(message).status}")
    # A worker settles it once; its lock is then free for a later delivery.
    worker = dramatiq.Worker(broker, worker_timeout=100)
    worker.start()
    broker.join("payments")
    worker.join()
    worker.stop()
