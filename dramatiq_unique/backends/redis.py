"""The Redis lock backend."""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis

from ..errors import LockBackendError
from .base import Acquisition, Holder, LockBackend

#: The Lua functions every script starts with.
_LIBRARY = "holders"


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

    def __init__(self, *, client: redis.Redis | None = None, url: str | None = None, **parameters: Any):
        if client is None:
            client = redis.Redis.from_url(url, **parameters) if url else redis.Redis(**parameters)
        self.client = client
        self._acquire = self.client.register_script(_script_source("acquire"))
        self._release = self.client.register_script(_script_source("release"))
        self._swap = self.client.register_script(_script_source("swap"))

    def acquire(
        self, key: str, owner: str, *, limit: int, ttl: int | None, holder: Holder, extend: int = 0
    ) -> Acquisition:
        reply = self._call(self._acquire, [key], [owner, limit, ttl or 0, extend, holder.to_json()])
        return _acquisition(reply)

    def release(self, key: str, owner: str) -> bool:
        return bool(self._call(self._release, [key], [owner]))

    def swap(
        self,
        *,
        release_key: str,
        release_owner: str,
        acquire_key: str,
        owner: str,
        limit: int,
        ttl: int | None,
        holder: Holder,
    ) -> Acquisition:
        reply = self._call(
            self._swap, [release_key, acquire_key], [release_owner, owner, limit, ttl or 0, holder.to_json()]
        )
        return _acquisition(reply)

    @staticmethod
    def _call(script, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as e:
            # The error names host and port at most, never credentials (SPEC S7).
            raise LockBackendError(f"The Redis lock backend failed: {type(e).__name__}: {e}") from e


def _acquisition(reply: list[Any]) -> Acquisition:
    if reply[0] == 1:
        return Acquisition(acquired=True, token=int(reply[1]), expires_at=int(reply[2]) or None)
    holders = tuple(h.decode() if isinstance(h, bytes) else h for h in reply[1:])
    return Acquisition(acquired=False, holders=holders)
