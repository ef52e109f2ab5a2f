"""The Redis lock backend."""

from __future__ import annotations

import time
from importlib import resources
from typing import Any

import redis

from ..errors import LockBackendError
from .base import HELD, LAPSED, SUPERSEDED, Acquisition, Holder, LockBackend

#: The Lua functions every script starts with.
_LIBRARY = "holders"

#: How long a replaced message is remembered, in milliseconds: it is skipped
#: if it reaches a worker within that time (7 days, Dramatiq's longest delay).
REPLACED_TTL = 7 * 24 * 60 * 60 * 1000


def _script_source(name: str) -> str:
    lua = resources.files(__package__).joinpath("lua")
    return lua.joinpath(f"{_LIBRARY}.lua").read_text() + "\n" + lua.joinpath(f"{name}.lua").read_text()


class RedisBackend(LockBackend):
    """A lock backend for Redis_ and Redis Cluster.

    Each transition is one Lua script called by SHA (one round trip); the
    client reloads a script by itself when the server answers ``NOSCRIPT``
    after a restart or failover. Times come from the Redis server's clock.

    Parameters:
      client(Redis): An optional client, e.g. a ``RedisCluster``. If this is
        passed, then all other parameters are ignored.
      url(str): An optional connection URL, e.g. ``rediss://user:password@host:6379/1``.
      **parameters: Connection parameters passed to :class:`redis.Redis`, or
        added to those of the URL (e.g. ``socket_timeout``).

    .. _Redis: https://redis.io
    """

    #: How long, in seconds, a call is tried again while Redis Cluster cannot run it yet
    #: (``TRYAGAIN`` for longer than redis-py retries it, e.g. the swap of a digest whose slot
    #: is moving between masters, or ``CLUSTERDOWN``). Such a call never ran, so trying it
    #: again is safe. See docs/redis-cluster.md.
    cluster_retry_seconds = 5.0

    def __init__(self, *, client: redis.Redis | None = None, url: str | None = None, **parameters: Any):
        if client is None:
            client = redis.Redis.from_url(url, **parameters) if url else redis.Redis(**parameters)
        self.client = client
        self._acquire = self.client.register_script(_script_source("acquire"))
        self._release = self.client.register_script(_script_source("release"))
        self._swap = self.client.register_script(_script_source("swap"))
        self._replace = self.client.register_script(_script_source("replace"))
        self._claim = self.client.register_script(_script_source("claim"))

    def acquire(
        self, key: str, owner: str, *, limit: int, ttl: int | None, holder: Holder, extend: int = 0
    ) -> Acquisition:
        reply = self._call(self._acquire, [key], [owner, limit, ttl or 0, extend, holder.to_json()])
        return _acquisition(reply)

    def release(self, key: str, owner: str) -> bool:
        return bool(self._call(self._release, [key], [owner]))

    def replace(
        self, key: str, owner: str, *, replaced_key: str, limit: int, ttl: int | None, holder: Holder, extend: int = 0
    ) -> Acquisition:
        reply = self._call(
            self._replace,
            [key, replaced_key],
            [owner, limit, ttl or 0, extend, holder.to_json(), REPLACED_TTL],
        )
        return _acquisition(reply)

    def claim(self, key: str, owner: str, *, replaced_key: str, release: bool, holder: Holder) -> str:
        reply = self._call(self._claim, [key, replaced_key], [owner, "release" if release else "run", holder.to_json()])
        return {1: HELD, 0: LAPSED, -1: SUPERSEDED}[reply]

    def swap(
        self,
        *,
        release_key: str,
        release_owner: str,
        replaced_key: str,
        acquire_key: str,
        owner: str,
        limit: int,
        ttl: int | None,
        holder: Holder,
    ) -> Acquisition:
        reply = self._call(
            self._swap,
            [release_key, acquire_key, replaced_key],
            [release_owner, owner, limit, ttl or 0, holder.to_json()],
        )
        return _acquisition(reply)

    def _call(self, script, keys: list[str], args: list[Any]) -> Any:
        deadline = None
        while True:
            try:
                return script(keys=keys, args=args)
            except redis.exceptions.ClusterError as e:
                # redis-py gave up on redirects and TRYAGAIN answers, or the cluster is down.
                deadline = deadline or time.monotonic() + self.cluster_retry_seconds
                if time.monotonic() >= deadline:
                    raise _backend_error(e) from e
                time.sleep(0.05)
            except redis.RedisError as e:
                raise _backend_error(e) from e


def _backend_error(e: redis.RedisError) -> LockBackendError:
    # The error names host and port at most, never credentials (SPEC S7).
    return LockBackendError(f"The Redis lock backend failed: {type(e).__name__}: {e}")


def _acquisition(reply: list[Any]) -> Acquisition:
    if reply[0] == -1:
        return Acquisition(acquired=False, superseded=True)
    strings = tuple(s.decode() if isinstance(s, bytes) else s for s in reply[1:])
    if reply[0] == 1:
        replaced = strings[2] if len(strings) > 2 else None
        return Acquisition(acquired=True, token=int(reply[1]), expires_at=int(reply[2]) or None, replaced=replaced)
    return Acquisition(acquired=False, holders=strings)
