"""Run the orphan reaper from cron: ``dramatiq-unique --app MODULE reap`` runs one
reaper cycle with the application's broker and lock prefixes, and exits. A crontab
line, every 10 minutes:

  */10 * * * * cd /srv/app && .venv/bin/dramatiq-unique --app tasks reap >>reap.log 2>&1

    python examples/reaper_cron.py   # set REDIS_URL to use your own server

This module is the application: a message is lost (its queue purged), its lock is left
behind, and one run of the command, as cron would start it, frees the lock. It touches
only keys under ``example-cron:`` and deletes them at the end.
"""

import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from redis_for_examples import (
    delete_keys,
    dramatiq_unique_command,
    fit_the_page,
    redis_url,
)

from dramatiq_unique import RedisBackend, UniqueJobs, enqueue_outcome

PREFIX = "example-cron"
#: The reaper leaves an enqueue lock younger than 10 s alone: its message may be on its
#: way to the broker.
REAPER_MIN_AGE = 10.5

broker = RedisBroker(url=redis_url(), namespace=f"{PREFIX}:broker")
unique = UniqueJobs(backend=RedisBackend(url=redis_url()), lock_prefix=f"{PREFIX}:lock")
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="reports", lock="until_executed")
def build_report(day):
    pass


def main():
    try:
        lost = build_report.send("2024-01-01")
        print(f"build_report.send('2024-01-01'): {enqueue_outcome(lost).status}")
        broker.flush("reports")  # the message is lost: a purged queue, a deleted key...
        again = enqueue_outcome(build_report.send("2024-01-01"))
        held = again.holder == lost.message_id
        print(
            f"sent again after its message was lost: {again.status}, held by it: {held}"
        )
        time.sleep(REAPER_MIN_AGE)
        print("$ dramatiq-unique --app reaper_cron reap")
        # What cron runs.
        for line in dramatiq_unique_command("reaper_cron", "reap"):
            print(fit_the_page(line))
        after = enqueue_outcome(build_report.send("2024-01-01"))
        print(f"sent again after the reaper ran: {after.status}")
    finally:
        # This process's lock activity counts, written now rather than at exit.
        unique.activity.close()
        broker.close()
        delete_keys(PREFIX)


if __name__ == "__main__":
    main()
