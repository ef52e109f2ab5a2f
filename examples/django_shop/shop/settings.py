"""The example shop's settings, on a RedisBroker: its locks live on the broker's
Redis."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "only-for-the-example"
INSTALLED_APPS = ["django_dramatiq", "orders"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3"}
}
USE_TZ = True

DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.redis.RedisBroker",
    "OPTIONS": {"url": os.environ.get("REDIS_URL", "redis://localhost:6379/0")},
    # django_dramatiq's default list without Prometheus and AdminMiddleware, which
    # the shop's tests do without. Keep your list, and add the UniqueJobs line.
    "MIDDLEWARE": [
        "dramatiq.middleware.AgeLimit",
        # Ahead of TimeLimit and Retries: it sees Retries' verdict, and no time limit
        # cuts its calls short.
        "dramatiq_unique.UniqueJobs",
        "dramatiq.middleware.TimeLimit",
        "dramatiq.middleware.Callbacks",
        "dramatiq.middleware.Retries",
        "django_dramatiq.middleware.DbConnectionsMiddleware",
    ],
}

# Where orders.tasks writes the receipts it "sends".
RECEIPTS_LOG = BASE_DIR / "receipts.log"
