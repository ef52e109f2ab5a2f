"""The Redis lock backend."""

from __future__ import annotations

from importlib import resources
from typing import Any

import redis

from ..errors import LockBackendError
from .base import Acquisition, Holder, LockBackend, LockRecord

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
        self._renew = self.client.register_script(_script_source("renew"))
        self._heartbeat = self.client.register_script(_script_source("heartbeat"))
        self._heartbeats = self.client.register_script(_script_source("heartbeats"))
        self._release_record = self.client.register_script(_script_source("release_record"))

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

    def renew(self, key: str, owner: str, *, ttl: int, deadline: int | None = None) -> int | None:
        reply = int(self._call(self._renew, [key], [owner, ttl, deadline or 0]))
        return None if reply < 0 else reply

    def heartbeat(self, key: str, worker_id: str) -> int:
        return int(self._call(self._heartbeat, [key], [worker_id]))

    def heartbeats(self, key: str) -> tuple[int, dict[str, int]]:
        reply = self._call(self._heartbeats, [key], [])
        entries = reply[1:]
        return int(reply[0]), {_text(entries[i]): int(float(entries[i + 1])) for i in range(0, len(entries), 2)}

    def forget_workers(self, key: str, *, worker_id: str | None = None, before: int | None = None) -> int:
        try:
            if worker_id is not None:
                return int(self.client.zrem(key, worker_id))
            return int(self.client.zremrangebyscore(key, "-inf", f"({before}"))
        except redis.RedisError as e:
            raise _backend_error(e) from e

    def scan(self, prefix: str, cursor: str, count: int) -> tuple[str, list[LockRecord]]:
        # Lock keys are "<prefix>:{<digest>}" and "<prefix>:{<digest>}:run"; a glob
        # character in the prefix is escaped. SCAN costs O(count) per step (SPEC R4).
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + ":{*"
        try:
            if _is_cluster(self.client):
                next_cursor, keys = self._scan_cluster(cursor, pattern, count)
            else:
                position, keys = self.client.scan(int(cursor), match=pattern, count=count)
                next_cursor = str(position)
            pipe = self.client.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            contents = pipe.execute()
        except redis.RedisError as e:
            raise _backend_error(e) from e
        records = []
        for key, fields in zip(keys, contents, strict=True):
            key = _text(key)
            for owner, record in fields.items():
                owner = _text(owner)
                if owner != "fence":
                    records.append(LockRecord.parse(key, owner, _text(record)))
        return next_cursor, records

    def _scan_cluster(self, cursor: str, pattern: str, count: int) -> tuple[str, list[Any]]:
        # Node by node, primaries in a stable order: the cursor is "<node index>:<node cursor>".
        nodes = sorted(self.client.get_primaries(), key=lambda node: node.name)
        index, _, position = cursor.partition(":") if cursor != "0" else ("0", "", "0")
        index, position = int(index), int(position or 0)
        if index >= len(nodes):
            return "0", []
        reply = self.client.scan(position, match=pattern, count=count, target_nodes=nodes[index])
        position, keys = reply if isinstance(reply, tuple) else next(iter(reply.values()))
        if int(position) == 0:
            index, position = index + 1, 0
        return ("0" if index >= len(nodes) else f"{index}:{position}"), keys

    def release_record(self, key: str, owner: str, record: str) -> bool:
        return bool(self._call(self._release_record, [key], [owner, record]))

    def get_value(self, key: str) -> str | None:
        try:
            value = self.client.get(key)
        except redis.RedisError as e:
            raise _backend_error(e) from e
        return None if value is None else _text(value)

    def set_value(self, key: str, value: str, *, ttl: int) -> None:
        try:
            self.client.set(key, value, px=ttl)
        except redis.RedisError as e:
            raise _backend_error(e) from e

    @staticmethod
    def _call(script, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(keys=keys, args=args)
        except redis.RedisError as e:
            raise _backend_error(e) from e


def _backend_error(e: redis.RedisError) -> LockBackendError:
    # The error names host and port at most, never credentials (SPEC S7).
    return LockBackendError(f"The Redis lock backend failed: {type(e).__name__}: {e}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


def _acquisition(reply: list[Any]) -> Acquisition:
    if reply[0] == 1:
        return Acquisition(acquired=True, token=int(reply[1]), expires_at=int(reply[2]) or None)
    holders = tuple(h.decode() if isinstance(h, bytes) else h for h in reply[1:])
    return Acquisition(acquired=False, holders=holders)
