"""Debounce: a burst of profile edits is pushed to the CRM once, with the
newest version, after the edits have stopped for a moment.

    python examples/debounce.py   # set REDIS_URL to use your own server

It touches only keys under ``example-debounce:`` and deletes them at the end.
"""

import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import current_millis
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-debounce"
QUIET_PERIOD = 500  # ms without a new edit before the push runs

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# Locked on the profile alone: a newer edit takes the place of the waiting, older one,
# and waits a quiet period of its own.
@dramatiq.actor(
    lock="until_executed",
    on_conflict={"client": "replace"},
    lock_args_method=lambda profile_id, version: [profile_id],
    debounce=QUIET_PERIOD,
)
def push_profile(profile_id, version):
    push_to_the_crm(profile_id, version)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time
names = {}  # message_id -> "edit 1", ...
pushes = []  # (profile_id, version, when) of every push that ran


def push_to_the_crm(profile_id, version):
    with story:
        print(
            f"  pushing version {version} of profile {profile_id} to the CRM",
            flush=True,
        )
        pushes.append((profile_id, version, current_millis()))


def edit(profile_id, version):
    with story:
        sent_at = current_millis()  # in whole ms, as the eta Dramatiq gives the message
        message = push_profile.send(profile_id, version)
        names[message.message_id] = f"edit {version}"
        outcome = enqueue_outcome(message)
        replaced = ""
        if outcome.replaced:
            replaced = f", took the place of {names[outcome.replaced]}"
        waits = f"waits {QUIET_PERIOD} ms"
        print(
            f"edit {version} of profile 7: {outcome.status}, {waits}{replaced}",
            flush=True,
        )
    return sent_at


def main():
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        for version in range(1, 6):  # five edits, 50 ms apart
            last_edit = edit(7, version)
            time.sleep(0.05)
        broker.join(push_profile.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    versions = [version for _, version, _ in pushes]
    waited = all(when - last_edit >= QUIET_PERIOD for _, _, when in pushes)
    print(
        f"5 edits, {len(pushes)} push (version {', '.join(map(str, versions))}),",
        end=" ",
    )
    print(f"{QUIET_PERIOD} ms or more after the last edit" if waited else "TOO EARLY")


if __name__ == "__main__":
    main()
