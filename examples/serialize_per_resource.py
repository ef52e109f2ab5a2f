"""Serialize per resource: never two balance syncs of one account at once; accounts in
parallel.

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


@dramatiq.actor(
    lock="while_executing",
    on_conflict="reschedule",
    reschedule_delay=300,  # ms; 5000 by default
)
def sync_account_balance(account_id):
    call_the_bank(account_id)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time, each send's line before its message's
names = {}  # message_id -> A, B, C: short names for the story
syncs = []  # (account_id, name) of every sync that ran
running = []  # the accounts syncing now
most_at_once = {42: 0, 43: 0}
beside_42 = []  # the syncs of account 43 that started while one of 42 ran
started = threading.Semaphore(0)
# Holds the syncs until the story has moved on.
may_finish = {42: threading.Event(), 43: threading.Event()}


def call_the_bank(account_id):
    with story:
        name = names[current_lock().message_id]
        print(f"  {name} starts syncing account {account_id}", flush=True)
        syncs.append((account_id, name))
        if account_id == 43 and 42 in running:
            beside_42.append(name)
        running.append(account_id)
        at_once = max(most_at_once[account_id], running.count(account_id))
        most_at_once[account_id] = at_once
    started.release()
    may_finish[account_id].wait(10)  # stands for the call to the bank's API
    with story:
        running.remove(account_id)


def rescheduled(event):
    with story:
        met = f"{names[event.message_id]} met the run lock of {names[event.holders[0]]}"
        print(f"  {met}: rescheduled to try again in {event.delay} ms", flush=True)
    started.release()


unique.subscribe("rescheduled", rescheduled)


def send(name, account_id):
    with story:
        message = sync_account_balance.send(account_id)
        names[message.message_id] = name
        print(f"send sync_account_balance({account_id}) -> {name}", flush=True)


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
        with story:
            print("  A and C finish", flush=True)
        may_finish[42].set()
        may_finish[43].set()
        broker.join(sync_account_balance.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    for account in (42, 43):
        ran = [name for synced, name in syncs if synced == account]
        syncs_ran = (
            f"{len(ran)} sync{'s' if len(ran) > 1 else ''} ({' then '.join(ran)})"
        )
        most = most_at_once[account]
        print(f"Account {account}: {syncs_ran}, at most {most} at a time.")
    beside = ", ".join(beside_42) or "none"
    print(f"Syncs of account 43 that ran beside one of 42: {beside}.")


if __name__ == "__main__":
    main()
