"""Schedule the orphan reaper with periodiq: the reaper actor, declared with periodiq's
``periodic`` option, is sent by the ``periodiq`` command at every tenth minute and run
by a worker.

    python examples/reaper_periodiq.py   # set REDIS_URL to use your own server

In production this module is what both commands import: ``dramatiq reaper_periodiq``
and ``periodiq reaper_periodiq``. So that the example does not wait for a tenth minute,
``main()`` does what the periodiq command does at one: it takes the periodic actors and
sends them. It touches only keys under ``example-periodiq:`` and deletes them at the
end.
"""

import logging
import sys

import dramatiq
import pendulum
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from periodiq import PeriodiqMiddleware, Scheduler, cron
from redis_for_examples import delete_keys, fit_the_page, redis_url

from dramatiq_unique import RedisBackend, UniqueJobs

PREFIX = "example-periodiq"

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
broker.add_middleware(PeriodiqMiddleware(skip_delay=30))
dramatiq.set_broker(broker)
# Declared where both the worker and the periodiq command import it, after
# PeriodiqMiddleware.
reaper = unique.declare_reaper(broker, periodic=cron("*/10 * * * *"))


class PageWidth(logging.Formatter):
    """The reaper's report is one long line: printed in two here, to fit the page."""

    def format(self, record):
        return fit_the_page(super().format(record), indent="         ")


def main():
    # The worker's log lines that matter here: periodiq's and the reaper's report.
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(PageWidth("  log: %(message)s"))
    logging.basicConfig(handlers=[handler])
    logging.getLogger("periodiq").setLevel(logging.INFO)
    logging.getLogger("dramatiq_unique").setLevel(logging.INFO)
    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        actors = broker.actors.values()
        periodic = [actor for actor in actors if "periodic" in actor.options]
        for actor in periodic:
            when = actor.options["periodic"]
            print(f"periodiq schedules {actor.actor_name} at {when}")
        after = pendulum.datetime(2026, 1, 1, 12, 3)
        times = [reaper.options["periodic"].next_valid_date(after)]
        times.append(reaper.options["periodic"].next_valid_date(times[-1]))
        at = f"{times[0]:%H:%M} and {times[1]:%H:%M}"
        print(f"after 12:03 it sends it at {at}; here it sends it now:")
        Scheduler(actors=periodic).send_actors(periodic, now=pendulum.now())
        broker.join(reaper.queue_name, timeout=10_000)
        worker.join()
    finally:
        worker.stop()
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
