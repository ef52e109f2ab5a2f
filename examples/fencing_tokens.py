"""Fencing tokens protecting a write: a sync whose lock lapsed while it waited for the
bank cannot overwrite the balance that a newer sync saved meanwhile.

    python examples/fencing_tokens.py   # set REDIS_URL to use your own server

It touches only keys under ``example-fencing:`` and deletes them at the end.
"""

import contextlib
import sqlite3
import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import Locks, RedisBackend, UniqueJobs, current_lock

PREFIX = "example-fencing"
LOCK_TTL = 300  # ms; ten minutes, say, in real life

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

# The resource the lock protects keeps the highest token it accepted next to the data.
db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
db.execute(
    "CREATE TABLE accounts"
    " (id INTEGER PRIMARY KEY, balance TEXT, fence INTEGER NOT NULL DEFAULT 0)"
)
db.execute("INSERT INTO accounts (id, balance) VALUES (42, '0.00')")
db_mutex = threading.Lock()


class StaleLock(Exception):
    """A newer holder of the lock has written since this one took it."""


def save_balance(account_id, balance, token):
    with db_mutex:  # one UPDATE compares and writes: atomic
        cursor = db.execute(
            "UPDATE accounts SET balance = ?, fence = ? WHERE id = ? AND fence <= ?",
            (balance, token, account_id, token),
        )
    if cursor.rowcount == 0:
        raise StaleLock(f"token {token} is older than the last write to {account_id}")


# throws=(StaleLock,): a refused write is not retried; a newer holder did the work.
@dramatiq.actor(lock="while_executing", lock_ttl=LOCK_TTL, throws=(StaleLock,))
def sync_account_balance(account_id):
    token = current_lock().token
    balance = fetch_balance_from_bank(account_id)
    with telling_the_story(balance):
        save_balance(account_id, balance, token)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time, each send's line before its message's
names = {}  # message_id -> A, B
tokens = {}  # name -> the token its run lock got
started = {"A": threading.Event(), "B": threading.Event()}
done = {"A": threading.Event(), "B": threading.Event()}
# A's bank call hangs until the story lets it answer.
bank_answers = {"A": threading.Event()}


def fetch_balance_from_bank(account_id):
    lock = current_lock()
    with story:
        name = names[lock.message_id]
        tokens[name] = lock.token
        calls = f"takes the run lock of account {account_id} and calls the bank"
        print(f"  {name} {calls}", flush=True)
    started[name].set()
    if name in bank_answers:
        bank_answers[name].wait(10)
        return "100.00"  # read before B's sync: stale by the time it arrives
    return "80.00"


@contextlib.contextmanager
def telling_the_story(balance):
    name = names[current_lock().message_id]
    try:
        yield
        with story:
            print(f"  {name} saves balance {balance}", flush=True)
    except StaleLock:
        with story:
            refused = "is refused: StaleLock, a newer holder wrote since"
            print(f"  {name}'s write of {balance} {refused}", flush=True)
        raise
    finally:
        done[name].set()


def send(name):
    with story:
        message = sync_account_balance.send(42)
        names[message.message_id] = name
        print(f"send sync_account_balance(42) -> {name}", flush=True)


def main():
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        send("A")
        started["A"].wait(10)
        locks = Locks.from_middleware(unique)
        while any(locks.list(actor="sync_account_balance")):  # until A's lock lapsed
            time.sleep(0.02)
        lapses = f"lock_ttl ({LOCK_TTL} ms) ran out while A waits for the bank"
        print(f"  A's run lock lapses: {lapses}")
        send("B")
        done["B"].wait(10)
        bank_answers["A"].set()  # A's answer arrives at last
        broker.join(sync_account_balance.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    query = "SELECT balance, fence FROM accounts WHERE id = 42"
    balance, fence = db.execute(query).fetchone()
    writer = next(name for name, token in tokens.items() if token == fence)
    lower = "lower" if tokens["A"] < tokens["B"] else "NOT lower"
    print(f"Tokens: A's is {lower} than B's.", end=" ")
    print(f"Account 42 keeps balance {balance}, written by {writer}.")


if __name__ == "__main__":
    main()
