"""RabbitMQ carries the messages, a Redis of its own keeps the locks; the orphan reaper
frees the enqueue lock of a message lost from its queue.

    python examples/rabbitmq_broker.py

RABBITMQ_URL names your RabbitMQ (default: the guest account on 127.0.0.1:5672); set
REDIS_URL to use your own Redis. It uses the queues ``example-rabbitmq.reports`` (with
``.DQ`` and ``.XQ``) and the Redis keys under ``example-rabbitmq:``, and deletes both at
the end.
"""

import os
import time

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name
from dramatiq.middleware import TimeLimit
from redis_for_examples import (
    delete_keys,
    dramatiq_unique_command,
    fit_the_page,
    redis_url,
)

from dramatiq_unique import Locks, RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-rabbitmq"
QUEUE = f"{PREFIX}.reports"
#: The reaper leaves an enqueue lock younger than 10 s alone (its message may be on its
#: way to the broker): it is asked about an older one here, as it would be in
#: production.
REAPER_MIN_AGE = 10.5

broker = RabbitmqBroker(
    url=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
)
# RabbitMQ has no Redis to lend: the locks go to a Redis named here (or by
# DRAMATIQ_UNIQUE_URL).
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

built = []


@dramatiq.actor(queue_name=QUEUE, lock="until_executed", max_retries=0)
def build_report(day):
    built.append(day)


def dramatiq_unique(*arguments, tail=None):
    """The ``dramatiq-unique`` command, with this module as the application."""
    shown = " ".join(
        f"'{argument}'" if argument.startswith("[") else argument
        for argument in arguments
    )
    print(
        f"$ dramatiq-unique --app rabbitmq_broker {shown}"
        + (f" | tail -n {tail}" if tail else "")
    )
    lines = dramatiq_unique_command("rabbitmq_broker", *arguments)
    for line in lines[-tail if tail else 0 :]:
        print(fit_the_page(line))


def main():
    try:
        sent_at = time.monotonic()
        lost = build_report.send("2024-01-01")
        print(f"build_report.send('2024-01-01'): {enqueue_outcome(lost).status}")
        broker.flush(QUEUE)  # the message is lost: a purged queue, a deleted queue...
        again = enqueue_outcome(build_report.send("2024-01-01"))
        held = again.holder == lost.message_id
        print(
            f"sent again after its queue was purged: {again.status}, held by it: {held}"
        )
        time.sleep(max(0.0, sent_at + REAPER_MIN_AGE - time.monotonic()))
        # In production the workers send the reaper actor every reaper_interval; here it
        # runs once, by hand. The queue and its delay queue have no message waiting, and
        # no worker holds the message: it is gone.
        dramatiq_unique("reap")
        after = enqueue_outcome(build_report.send("2024-01-01"))
        print(f"after the reaper, sent again: {after.status}")
        worker = Worker(broker, worker_threads=1, worker_timeout=100)
        worker.start()
        try:
            broker.join(QUEUE, timeout=10_000)
            worker.join()
        finally:
            worker.stop()
        left = len(list(Locks.from_middleware(unique).list()))
        print(f"built: {', '.join(built)}; locks left: {left}")
    finally:
        for name in (QUEUE, dq_name(QUEUE), xq_name(QUEUE)):
            broker.channel.queue_delete(name)
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
