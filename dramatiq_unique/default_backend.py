"""The lock backend of a UniqueJobs given none, chosen once its broker is known.

Frameworks such as django_dramatiq build middleware from a dotted path with
no arguments, so ``UniqueJobs()`` must find its lock store by itself. It looks,
in this order, at:

1. the ``DRAMATIQ_UNIQUE_URL`` environment variable: a Redis URL (the
   ``dramatiq-unique`` command reads the same variable first, so workers and
   the command agree on where the locks are);
2. in a Django project, the ``DRAMATIQ_UNIQUE`` setting: ``{"BACKEND": ...,
   "BACKEND_OPTIONS": {...}}``, shaped like django_dramatiq's
   ``DRAMATIQ_RESULT_BACKEND``;
3. the broker's own Redis, when the broker is a ``RedisBroker``.

Nothing found is an :class:`~dramatiq_unique.errors.InvalidBackendOptions`
that says what to set.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from dramatiq import Broker
from dramatiq.brokers.redis import RedisBroker

from .backends import LockBackend, RedisBackend
from .errors import InvalidBackendOptions

#: The environment variable that holds the Redis URL of the locks.
URL_VARIABLE = "DRAMATIQ_UNIQUE_URL"

#: The Django setting that names the lock backend.
DJANGO_SETTING = "DRAMATIQ_UNIQUE"

#: The keys of the Django setting, and the backend class used when ``BACKEND`` is left out.
BACKEND_KEY = "BACKEND"
OPTIONS_KEY = "BACKEND_OPTIONS"
DEFAULT_BACKEND_CLASS = "dramatiq_unique.RedisBackend"

WHAT_TO_SET = (
    f"set the {URL_VARIABLE} environment variable to a Redis URL; or, in a Django project, set "
    f'{DJANGO_SETTING} = {{"{OPTIONS_KEY}": {{"url": "redis://..."}}}} in its settings; or pass '
    "UniqueJobs(backend=RedisBackend(url=...))."
)


def default_backend(broker: Broker) -> LockBackend:
    """The lock backend of a UniqueJobs that was given none, on ``broker``.

    Raises:
      InvalidBackendOptions: If nothing names a lock backend and the broker is no
        ``RedisBroker``, or if the Django setting cannot be used. Its message
        never quotes a URL.
    """
    url = os.environ.get(URL_VARIABLE)
    if url:
        return RedisBackend(url=url)
    setting = _django_setting()
    if setting is not None:
        return _from_setting(setting)
    client = _redis_broker_client(broker)
    if client is not None:
        return RedisBackend(client=client)
    raise InvalidBackendOptions(
        f"UniqueJobs was given no lock backend, and its broker, a {type(broker).__name__}, is no RedisBroker "
        f"whose Redis could hold the locks. To name the Redis of the locks, {WHAT_TO_SET}"
    )


def _django_setting() -> Any:
    """The Django setting, ``None`` outside a configured Django project or where it is not set."""
    # A process that has not imported Django is no Django project: Django is not imported for it.
    conf = sys.modules.get("django.conf")
    settings = getattr(conf, "settings", None)
    if settings is None or not settings.configured:
        return None
    return getattr(settings, DJANGO_SETTING, None)


def _from_setting(setting: Any) -> LockBackend:
    if not isinstance(setting, Mapping) or not set(setting) <= {BACKEND_KEY, OPTIONS_KEY}:
        raise InvalidBackendOptions(
            f'The Django setting {DJANGO_SETTING} must be a dict with the keys "{BACKEND_KEY}" (a dotted path to '
            f'a lock backend class, {DEFAULT_BACKEND_CLASS!r} when left out) and "{OPTIONS_KEY}" (its keyword '
            f'arguments), e.g. {{"{OPTIONS_KEY}": {{"url": "redis://..."}}}}.'
        )
    path = setting.get(BACKEND_KEY, DEFAULT_BACKEND_CLASS)
    options = setting.get(OPTIONS_KEY, {})
    backend_class = _import_class(path)
    if not (isinstance(backend_class, type) and issubclass(backend_class, LockBackend)):
        raise InvalidBackendOptions(
            f"{DJANGO_SETTING}[{BACKEND_KEY!r}] is {path!r}, which is no LockBackend class, "
            f"e.g. {DEFAULT_BACKEND_CLASS!r} or 'dramatiq_unique.StubBackend'."
        )
    if not isinstance(options, Mapping):
        raise InvalidBackendOptions(f"{DJANGO_SETTING}[{OPTIONS_KEY!r}] must be a dict of keyword arguments.")
    try:
        return backend_class(**options)
    except TypeError as e:
        # Only the names of the arguments are quoted: the values may hold a password.
        raise InvalidBackendOptions(
            f"{DJANGO_SETTING}[{OPTIONS_KEY!r}] has arguments that {backend_class.__name__} does not take "
            f"({', '.join(sorted(options))}): {e}"
        ) from None


def _import_class(path: Any) -> Any:
    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        raise InvalidBackendOptions(
            f"{DJANGO_SETTING}[{BACKEND_KEY!r}] is {path!r}, which cannot be imported: it must be the dotted path "
            f"of a lock backend class, e.g. {DEFAULT_BACKEND_CLASS!r}."
        ) from None


def _redis_broker_client(broker: Broker) -> Any:
    """The Redis client of a RedisBroker, ``None`` for any other broker."""
    return broker.client if isinstance(broker, RedisBroker) else None
