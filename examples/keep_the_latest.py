"""Keep the latest: while a push of a profile runs, 50 more edits end in exactly one
more push, with the last version.

    python examples/keep_the_latest.py   # set REDIS_URL to use your own server

It touches only keys under ``example-latest:`` and deletes them at the end.
"""

import threading

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-latest"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# Locked on the profile alone: while one push holds the lock, the newest edit waits as
# its one successor.
@dramatiq.actor(
    lock="until_executed",
    on_conflict="keep_latest",
    lock_args_method=lambda profile_id, version: [profile_id],
)
def push_profile(profile_id, version):
    push_to_the_crm(profile_id, version)


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time
pushes = []  # the versions pushed, in the order the pushes started
running = []  # the pushes running now
most_at_once = [0]
first_push_runs = threading.Event()
crm_answers = threading.Event()  # holds the first push until the edits are sent
last_push_done = threading.Event()
LAST = 51


def push_to_the_crm(profile_id, version):
    with story:
        print(
            f"  pushing version {version} of profile {profile_id} to the CRM",
            flush=True,
        )
        pushes.append(version)
        running.append(version)
        most_at_once[0] = max(most_at_once[0], len(running))
    if version == 1:
        first_push_runs.set()
        crm_answers.wait(10)  # stands for a slow call to the CRM
    with story:
        running.remove(version)
    if version == LAST:
        last_push_done.set()


def main():
    worker = Worker(broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        outcome = enqueue_outcome(push_profile.send(7, 1))
        print(f"edit 1 of profile 7: {outcome.status}", flush=True)
        first_push_runs.wait(10)
        names = {}  # message_id -> "edit 2", ...
        for version in range(2, LAST + 1):  # 50 edits while the first push runs
            message = push_profile.send(7, version)
            names[message.message_id] = f"edit {version}"
            outcome = enqueue_outcome(message)
            if version in (2, 3, LAST):
                said = f"{outcome.status}, position {outcome.position}"
                if outcome.replaced:
                    said += f", took the place of {names[outcome.replaced]}"
                print(f"edit {version} of profile 7: {said}")
            elif version == 4:
                print("  ...")
        with story:
            print("  the CRM answers the first push", flush=True)
        crm_answers.set()
        last_push_done.wait(10)
        broker.join(push_profile.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    versions = ", ".join(map(str, pushes))
    most = most_at_once[0]
    pushed = f"{len(pushes)} pushes (versions {versions})"
    print(f"{LAST} edits, {pushed}, at most {most} at a time.")


if __name__ == "__main__":
    main()
