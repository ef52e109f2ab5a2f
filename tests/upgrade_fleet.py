"""The application of the rolling-upgrade tests (tests/test_rolling_upgrade.py), run by a process of
each version (``python upgrade_fleet.py``, a copy in a directory of its own, with the version's
package first on PYTHONPATH).

The process sends messages, starts a worker and runs the orphan reaper as the test tells it, one JSON request a
line on stdin, one JSON answer a line on stdout. Its actors record each run in the broker's Redis,
apart from the locks: the version that ran it, the message id, and its start and end
(``time.time()``, one clock for every process of the machine); each message a worker skipped too.
``dramatiq-unique --app upgrade_fleet`` imports it as well, to read its locks.

The store is named by the environment: ``UPGRADE_BROKER_URL`` (the RedisBroker's Redis, where the
records go too), ``UPGRADE_LOCKS_URL`` (the locks) and ``UPGRADE_LOCKS_CLUSTER`` (set when that URL
names a node of a Redis Cluster). ``UPGRADE_VERSION`` and ``UPGRADE_PACKAGE_DIR`` say which version
of the package the process must have imported, and from where: any other fails the import.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import dramatiq
import redis
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, Middleware, TimeLimit
from redis.cluster import RedisCluster

import dramatiq_unique
from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

#: The lists of the records in the broker's Redis.
RUNS = "upgrade:runs"
SKIPS = "upgrade:skips"

#: A copy of a running message tries again this soon: the copy runs soon after the first ends.
RESCHEDULE_DELAY = 100
#: Long enough that a waiter that polled instead of being handed the place would show.
POLLING_DELAY = 60_000
#: Two messages of different actors and queues, with the same lock arguments, share a lock: each
#: version's worker runs one of the queues, so a test chooses which version runs which message.
SHARED = dict(unique_across_actors=True, unique_across_queues=True)


def check_version() -> None:
    # A process that imported the package from elsewhere (an editable install, the checkout)
    # would test one version against itself.
    imported = Path(dramatiq_unique.__file__).resolve()
    expected, directory = os.environ["UPGRADE_VERSION"], Path(os.environ["UPGRADE_PACKAGE_DIR"]).resolve()
    if dramatiq_unique.__version__ != expected or not imported.is_relative_to(directory):
        raise ImportError(
            f"dramatiq_unique {dramatiq_unique.__version__} was imported from {imported}, "
            f"not {expected} from {directory}"
        )


class Record(Middleware):
    def __init__(self, records: redis.Redis):
        self.records = records

    def after_skip_message(self, broker, message):
        entry = {"actor": message.actor_name, "message_id": message.message_id, "version": dramatiq_unique.__version__}
        self.records.rpush(SKIPS, json.dumps(entry))


def declare_actors(broker: RedisBroker, records: redis.Redis) -> None:
    def ran(event: str, key: Any) -> None:
        message = CurrentMessage.get_current_message()
        entry = {
            "event": event,
            "actor": message.actor_name,
            "key": key,
            "message_id": message.message_id,
            "version": dramatiq_unique.__version__,
            "at": time.time(),
        }
        records.rpush(RUNS, json.dumps(entry))

    def run(key: Any, seconds: float = 0.0) -> None:
        ran("start", key)
        time.sleep(seconds)
        ran("end", key)

    @dramatiq.actor(broker=broker, queue_name="payments", lock="until_executed", max_retries=0)
    def settle(event_id):
        run(event_id)

    # sync_first and sync_copy: never two runs of one account at once.
    for name in ("sync_first", "sync_copy"):
        dramatiq.actor(
            lambda account, seconds: run(account, seconds),
            actor_name=name,
            broker=broker,
            queue_name=name,
            lock="while_executing",
            on_conflict="reschedule",
            reschedule_delay=RESCHEDULE_DELAY,
            lock_args_method=lambda account, seconds: [account],
            max_retries=0,
            **SHARED,
        )

    # post_first and post_copy: the posts of one account, one at a time, in line.
    for name in ("post_first", "post_copy"):
        dramatiq.actor(
            lambda account, seq: run(account),
            actor_name=name,
            broker=broker,
            queue_name=name,
            lock="until_executed",
            on_conflict="wait",
            reschedule_delay=POLLING_DELAY,
            lock_args_method=lambda account, seq: [account],
            max_retries=0,
            **SHARED,
        )


def build() -> tuple[RedisBroker, UniqueJobs]:
    check_version()
    locks_url = os.environ["UPGRADE_LOCKS_URL"]
    if os.environ.get("UPGRADE_LOCKS_CLUSTER"):
        backend = RedisBackend(client=RedisCluster.from_url(locks_url))
    else:
        backend = RedisBackend(url=locks_url)
    broker = RedisBroker(url=os.environ["UPGRADE_BROKER_URL"])
    unique = UniqueJobs(backend=backend)
    broker.add_middleware(unique, before=TimeLimit)
    broker.add_middleware(CurrentMessage())
    records = redis.Redis.from_url(os.environ["UPGRADE_BROKER_URL"])
    broker.add_middleware(Record(records))
    dramatiq.set_broker(broker)
    declare_actors(broker, records)
    return broker, unique


# Built where a process of the fleet runs it, or the command imports it (the tests import only
# its names).
if "UPGRADE_BROKER_URL" in os.environ:
    broker, unique = build()


def send(actor: str, args: list[Any]) -> dict[str, Any]:
    message = broker.get_actor(actor).send(*args)
    outcome = enqueue_outcome(message)
    return {
        "message_id": message.message_id,
        "status": outcome.status,
        "holder": outcome.holder,
        "position": outcome.position,
        "digest": outcome.digest,
    }


def reap() -> dict[str, Any]:
    # The test's lock is seconds old, younger than the reaper leaves alone by default.
    unique.reaper.min_age = 0
    return unique.reaper.run(broker=broker).as_dict()


def serve() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    broker.emit_after("process_boot")
    print(json.dumps({"version": dramatiq_unique.__version__, "file": dramatiq_unique.__file__}), flush=True)
    worker = None
    for line in sys.stdin:
        request = json.loads(line)
        answer: dict[str, Any] = {}
        try:
            if request["op"] == "send":
                answer = send(request["actor"], request["args"])
            elif request["op"] == "work":
                # worker_timeout=100, as the tests' in-process workers: a message is fetched at once.
                worker = Worker(broker, queues=set(request["queues"]), worker_threads=2, worker_timeout=100)
                worker.start()
            elif request["op"] == "reap":
                answer = reap()
            elif request["op"] == "purge":
                broker.flush(request["queue"])
            else:
                answer = {"error": f"unknown request {request!r}"}
        except Exception:
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)
    # stdin closed: the test is done. The worker stops before the test flushes the store, so it
    # leaves the worker registry and heartbeats into no later test.
    if worker is not None:
        worker.stop()
    broker.close()


if __name__ == "__main__":
    serve()
