"""The example shop on RabbitMQ, django_dramatiq's default broker: the locks need a
Redis of their own."""

import os

from .settings import *  # noqa: F403
from .settings import DRAMATIQ_BROKER

DRAMATIQ_BROKER = {
    **DRAMATIQ_BROKER,
    "BROKER": "dramatiq.brokers.rabbitmq.RabbitmqBroker",
    "OPTIONS": {
        "url": os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost:5672/%2F")
    },
}

DRAMATIQ_UNIQUE = {
    "BACKEND_OPTIONS": {
        "url": os.environ.get("LOCKS_REDIS_URL", "redis://localhost:6379/1")
    },
}
