"""The shop's WSGI application: Django, and the locks page under /ops/locks."""

import os

from django.core.wsgi import get_wsgi_application
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from dramatiq_unique.web import from_broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django_app = get_wsgi_application()

# The broker django_dramatiq builds, its UniqueJobs and their lock store, found at the
# page's first request. Read-only; Django's login does not run for /ops/locks.
locks_page = from_broker()
application = DispatcherMiddleware(django_app, {"/ops/locks": locks_page})
