"""Schedule the orphan reaper with APScheduler: the scheduler sends the reaper actor, a
worker runs it.

    python examples/reaper_apscheduler.py   # set REDIS_URL to use your own server

Every 10 minutes in real life, every second here. It touches only keys under
``example-apscheduler:`` and deletes them at the end.
"""

import threading

import dramatiq
from apscheduler.schedulers.background import BackgroundScheduler
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend as ResultsBackend
from redis_for_examples import delete_keys, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-apscheduler"
INTERVAL = 1  # seconds; 600 for every 10 minutes

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
# reaper_interval=None: the workers do not send the reaper themselves; the scheduler
# does.
unique = UniqueJobs(
    backend=RedisBackend(url=redis_url()),
    lock_prefix=f"{PREFIX}:lock",
    reaper=True,
    reaper_interval=None,
)
broker.add_middleware(unique, before=TimeLimit)
# Only so that this example can print the reaper's reports: it returns them where
# results are kept.
broker.add_middleware(
    Results(backend=ResultsBackend(url=redis_url(), namespace=f"{PREFIX}:results"))
)
dramatiq.set_broker(broker)
# The scheduler's process runs no worker, so it declares the reaper actor itself.
reaper = unique.declare_reaper(broker)


@dramatiq.actor(queue_name="payments", lock="until_executed")
def settle_payment(event_id):
    pass


sent = []  # the reaper messages the scheduler sent
two_sent = threading.Event()


def send_reaper():
    sent.append(reaper.send_with_options(store_results=True))
    if len(sent) == 2:
        two_sent.set()


def main():
    queued = settle_payment.send(
        "evt_123"
    )  # stays queued: this worker only runs the reaper's queue
    worker = Worker(
        broker, worker_threads=1, worker_timeout=100, queues={reaper.queue_name}
    )
    worker.start()
    scheduler = BackgroundScheduler()
    scheduler.add_job(send_reaper, "interval", seconds=INTERVAL, max_instances=1)
    scheduler.start()
    try:
        print(f"APScheduler sends {reaper.actor_name} every {INTERVAL} s")
        two_sent.wait(10 * INTERVAL)
        scheduler.shutdown()
        for number, message in enumerate(sent[:2], start=1):
            report = message.get_result(block=True, timeout=10_000)
            inspected, released = report["inspected"], report["released"]
            print(
                f"run {number}: inspected {inspected} holder, released {released}, "
                f"full cycle: {report['complete']}"
            )
        again = enqueue_outcome(settle_payment.send("evt_123"))
        held = again.holder == queued.message_id
        said = f"{again.status}, held by the queued message: {held}"
        print(f"settle_payment.send('evt_123') again: {said}")
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
