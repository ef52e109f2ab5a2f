"""A web page of the held locks: a plain WSGI application to mount in any web app.

It needs Jinja2: ``pip install 'dramatiq-unique[web]'``.
"""

from .app import BrokerLocksWebApp, LocksWebApp, from_broker, from_middleware, make_wsgi_app

__all__ = ["BrokerLocksWebApp", "LocksWebApp", "from_broker", "from_middleware", "make_wsgi_app"]
