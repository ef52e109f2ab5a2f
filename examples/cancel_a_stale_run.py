"""Cancel a stale run: a newer deploy of a site stops the one under way, which cleans up
in its ``finally``, and then runs; the two never run at once.

    python examples/cancel_a_stale_run.py   # set REDIS_URL to use your own server

It touches only keys under ``example-cancel:`` and deletes them at the end.
"""

import threading
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-cancel"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
# A heartbeat every 200 ms: a request to stop reaches the running deploy within 0.2 s.
unique = UniqueJobs(
    backend=RedisBackend(url=redis_url()),
    lock_prefix=f"{PREFIX}:lock",
    heartbeat_interval=200,
    lease_period=2000,
)
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


# Locked on the site alone: a newer revision stops the deploy under way, then runs.
@dramatiq.actor(
    lock="until_and_while_executing",
    on_conflict="cancel_in_progress",
    lock_args_method=lambda site, revision: [site],
)
def deploy(site, revision):
    began(revision)
    try:
        for step in ("build", "upload", "switch"):
            run_step(site, revision, step)
    finally:
        ended(site, revision)  # runs when the deploy is cancelled, too


# What follows only tells the story, the same way on every run.
story = threading.Lock()  # one line at a time
started, finished = [], []  # the revisions whose deploy started, and ran to its end
running = []  # the deploys running now
most_at_once = [0]
first_builds = threading.Event()
last_done = threading.Event()


def began(revision):
    with story:
        started.append(revision)
        running.append(revision)
        most_at_once[0] = max(most_at_once[0], len(running))


def run_step(site, revision, step):
    with story:
        print(f"  deploying revision {revision} of {site}: {step}", flush=True)
    if revision == 1:
        first_builds.set()
        until = time.monotonic() + 30  # a slow build, in Python: it can be interrupted
        while time.monotonic() < until:
            time.sleep(0.01)
    if step == "switch":
        finished.append(revision)


def ended(site, revision):
    with story:
        running.remove(revision)
        if revision not in finished:
            print(f"  revision {revision} of {site} stops and cleans up", flush=True)
    if revision == 2:
        last_done.set()


def main():
    worker = Worker(broker, worker_threads=2, worker_timeout=100)
    worker.start()
    try:
        first = enqueue_outcome(deploy.send("shop", 1))
        print(f"revision 1 of shop: {first.status}", flush=True)
        first_builds.wait(10)
        with story:
            second = enqueue_outcome(deploy.send("shop", 2))
            print(f"revision 2 of shop: {second.status}", flush=True)
        last_done.wait(10)
        broker.join(deploy.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)
    revisions = ", ".join(map(str, started))
    print(
        f"{len(started)} deploys started (revisions {revisions}), "
        f"{len(finished)} finished, at most {most_at_once[0]} at a time."
    )


if __name__ == "__main__":
    main()
