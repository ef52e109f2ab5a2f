"""Serialize per resource: never two balance syncs of one account at once; accounts in parallel.

    python examples/serialize_per_resource.py   # set REDIS_URL to use your own server

It touches only keys under ``example-serialize:`` and deletes them at the end.
"""

import threading

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, current_lock

PREFIX = "example-serialize"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

# The example holds each sync until the story has moved on, so that it prints the same lines on
# every run; a real sync just calls the bank.
may_finish = {42: threading.Event(), 43: threading.Event()}
started = threading.Semaphore(0)
syncs = []  # (account_id, name of the message) of every sync that ran
names = {}  # message_id -> a short name for the story: A, B, C
naming = threading.Lock()  # a worker may start a message before send() has returned


@dramatiq.actor(lock="while_executing", on_conflict="reschedule", reschedule_delay=300)
def sync_account_balance(account_id):
    with naming:
        name = names[current_lock().message_id]
    print(f"{name}: the sync of account {account_id} starts", flush=True)
    syncs.append((account_id, name))
    started.release()
    may_finish[account_id].wait(10)  # stands for the call to the bank's API


def rescheduled(event):
    print(f"{names[event.message_id]}: met the run lock of {names[event.holders[0]]}", end="")
    print(f", rescheduled to try again in {event.delay} ms", flush=True)
    started.release()


unique.subscribe("rescheduled", rescheduled)


def send(name, account_id):
    with naming:
        message = sync_account_balance.send(account_id)
        names[message.message_id] = name
    print(f"send sync_account_balance({account_id}) -> message {name}", flush=True)


def main():
    worker = Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        send("A", 42)
        started.acquire(timeout=10)  # A runs
        send("C", 43)
        started.acquire(timeout=10)  # C runs beside A: another account, another lock
        send("B", 42)
        started.acquire(timeout=10)  # B met A's lock
        print("A and C finish.", flush=True)
        may_finish[42].set()
        may_finish[43].set()
        broker.join(sync_account_balance.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    runs_42 = [name for account, name in syncs if account == 42]
    print(f"Account 42 synced {len(runs_42)} times ({', then '.join(runs_42)}), never two at once.")
    runs_43 = [name for account, name in syncs if account == 43]
    print(f"Account 43 synced {len(runs_43)} time ({runs_43[0]}), beside account 42.")


if __name__ == "__main__":
    main()
