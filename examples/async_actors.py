"""Async actors: an ``async def`` actor under Dramatiq's AsyncIO middleware holds its
run lock, reads it with require_current_lock() in its coroutine and in the tasks it
starts, and hands the fencing token to the resource it writes.

    python examples/async_actors.py   # set REDIS_URL to use your own server

It touches only keys under ``example-async:`` and deletes them at the end.
"""

import asyncio
import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.asyncio import get_event_loop_thread
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.middleware.asyncio import AsyncIO
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, current_lock, require_current_lock

PREFIX = "example-async"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
# AsyncIO runs every async def actor on one event loop thread per worker process.
broker.add_middleware(AsyncIO())
dramatiq.set_broker(broker)


class StaleLock(Exception):
    """A newer holder of the lock has written since this one took it."""


class Ledger:
    """Stands for your database: it keeps the highest token it accepted per account."""

    def __init__(self):
        self.balances, self.fences = {}, {}

    async def save(self, account_id, balance, token):
        if token < self.fences.get(account_id, 0):
            raise StaleLock(
                f"token {token} is older than the last write to {account_id}"
            )
        self.balances[account_id], self.fences[account_id] = balance, token


ledger = Ledger()
names = {}  # message_id -> A, B, ...
tokens = {}  # name -> the token its run lock got
story = threading.Lock()  # each send's line before its message's lines
running, bank_may_answer, done = threading.Event(), threading.Event(), threading.Event()


async def fetch_balance(account_id):
    # Stands for an HTTP call with an async client: A's hangs until the story lets it
    # answer. Meanwhile the event loop runs the other messages' coroutines.
    while account_id == 42 and not bank_may_answer.is_set():
        await asyncio.sleep(0.01)
    return {42: "100.00", 43: "7.50"}[account_id]


async def audit(account_id):
    return current_lock().token  # a task started by the actor sees the actor's lock


@dramatiq.actor(queue_name="balances", lock="while_executing", max_retries=0)
async def sync_balance(account_id):
    lock = require_current_lock()  # raises NoLockHeld rather than write unfenced
    on_loop = threading.current_thread() is get_event_loop_thread()
    # A moment's wait for send() to return: no await inside, so the loop is held only
    # that long.
    with story:
        name = names[lock.message_id]
        tokens[name] = lock.token
        holds = f"holds the run lock of account {account_id}"
        print(f"  {name} {holds}, on the event loop thread: {on_loop}", flush=True)
    if name == "A":
        running.set()
    balance = await fetch_balance(account_id)
    seen_by_task = await asyncio.create_task(audit(account_id))
    await ledger.save(account_id, balance, lock.token)
    same = seen_by_task == lock.token
    saw = f"a task it started saw the same: {same}"
    print(f"  {name} saves {balance} with its token; {saw}")
    done.set()


def send(name, account_id):
    with story:
        message = sync_balance.send(account_id)
        names[message.message_id] = name
        print(f"send sync_balance({account_id}) -> {name}", flush=True)


def main():
    conflicts = []
    unique.subscribe("conflict", conflicts.append)
    worker = Worker(broker, worker_threads=3, worker_timeout=100)
    worker.start()
    try:
        send("A", 42)
        running.wait(10)
        send("B", 42)  # while A awaits the bank
        while not conflicts:
            time.sleep(0.01)
        event = conflicts[0]
        holder = names[event.holders[0]]
        strategy = event.strategy
        print(f"  B met the run lock held by {holder}: dropped (strategy {strategy!r})")
        done.clear()
        send("C", 43)  # another account, another lock: it runs while A still waits
        done.wait(10)
        bank_may_answer.set()
        broker.join(sync_balance.queue_name, timeout=10_000)
        worker.join()
        send("D", 42)  # later: a new run, a new token
        broker.join(sync_balance.queue_name, timeout=10_000)
        worker.join()
        lower = "lower" if tokens["A"] < tokens["D"] else "NOT lower"
        print(f"Tokens of account 42: A's is {lower} than D's.")
        try:  # A's write, arriving late
            asyncio.run(ledger.save(42, "100.00", tokens["A"]))
        except StaleLock:
            print("A late write with A's token is refused: StaleLock.")
        print(f"Outside an actor, current_lock() is {current_lock()}.")
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    balances = sorted(ledger.balances.items())
    print(
        "Balances:",
        ", ".join(f"{account} = {balance}" for account, balance in balances),
    )


if __name__ == "__main__":
    main()
