"""A web page of the held locks: a plain WSGI application to mount in any web app.

It needs Jinja2, which the package's ``web`` extra brings (see :doc:`Getting started </getting-started>`).
"""

from .app import BrokerLocksWebApp, LocksWebApp, from_broker, from_middleware, make_wsgi_app

__all__ = ["BrokerLocksWebApp", "LocksWebApp", "from_broker", "from_middleware", "make_wsgi_app"]
