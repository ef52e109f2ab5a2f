import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import UniqueJobs

broker = RedisBroker(url=os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
broker.add_middleware(UniqueJobs(), before=TimeLimit)  # locks in the broker's Redis
dramatiq.set_broker(broker)


# Locked from send() until it has run: a second send meanwhile is dropped.
@dramatiq.actor(lock="until_executed")
def send_welcome_email(user_id):
    print(f"Sending the welcome email to user {user_id}")  # your mailer call here
