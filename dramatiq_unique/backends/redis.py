"""The Redis lock backend."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis
import redis.sentinel
from redis.crc import key_slot

from ..errors import InvalidBackendOptions, LineNeedsBroker, LockBackendError, LockStoreHealing, NewerLockFormat
from ..keys import (
    debounce_key,
    digest_keys_start,
    digest_of,
    epoch_key,
    format_key,
    in_hand_key,
    line_key,
    lock_kind,
    prefix_of,
    refusal_key,
    served_key,
    waiters_key,
)
from ..version import RECORD_FORMAT, __version__
from .base import (
    HELD,
    HISTORY_MARGIN,
    LAPSED,
    LINE_RETENTION,
    SERVED_RETENTION,
    STARTED_BEFORE,
    SUPERSEDED,
    UNHEALED_REFUSAL,
    Acquisition,
    EvictionRisk,
    Holder,
    Lease,
    LockBackend,
    LockRecord,
    MessagesInHand,
    StopRequested,
    Waiter,
    parse_lock,
    read_place,
    unescape,
)
from .native_connection import native_client
from .scripts import LuaScripts, ScriptCaller

_logger = logging.getLogger(__name__)

#: What redis-py raises when Redis cannot be reached or fails. RedisClusterException is
#: no RedisError: a RedisCluster client raises it when no node of the cluster answers.
_REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)

#: How often a change sent with WAIT follows answers of a server without the scripts, MOVED and ASK before it gives up.
_REDIRECTS = 5
#: The hash slots of a Redis Cluster.
_SLOTS = 16384

#: How long a process that saw no mark of the store's data waits before it looks again, in seconds:
#: until a worker writes it, no script can tell that it went.
_MARK_LOOKS_EVERY = 60.0

#: How long, in seconds, the refusal key of a cluster slot found moving is looked at apart from
#: the scripts that take a place there: a script with keys on both sides of the move is refused.
_MOVING_SLOT_SECONDS = 5.0

#: How long a replaced message is remembered, in milliseconds: it is skipped
#: if it reaches a worker within that time (7 days, Dramatiq's longest delay).
REPLACED_TTL = 7 * 24 * 60 * 60 * 1000


#: How long a transition waits for its replicas (``min_replicas``) by default, in milliseconds.
DEFAULT_REPLICA_TIMEOUT = 1000

#: The ``maxmemory-policy`` values of Redis and Valkey that evict keys when memory is full:
#: ``allkeys-*`` any key, ``volatile-*`` the keys that expire.
EVICTION_POLICIES = (
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
)


class RedisBackend(LockBackend):
    """A lock backend for `Redis <https://redis.io>`_, Redis Sentinel and Redis Cluster.

    Each transition is one Lua script (one round trip): a function of a library
    loaded once per server where it has Redis Functions, else called by SHA; a
    server that lost the scripts (a restart, a failover) gets them again by
    itself. Times come from the Redis server's clock.

    Parameters:
      client(redis.Redis): An optional client, e.g. a :class:`~redis.cluster.RedisCluster`
        or a Sentinel ``master_for`` client. If this is passed, then ``url``,
        ``sentinels`` and the connection parameters are ignored.
      url(str): An optional connection URL, e.g. ``rediss://user:password@host:6379/1``.
        A password that holds ``/``, ``#``, ``?``, ``@`` or ``%`` must be
        percent-encoded, or left out of the URL and passed as ``password``.
      sentinels(list[tuple[str, int]]): The ``(host, port)`` of each Redis
        Sentinel to ask where the primary of ``service_name`` is: the backend
        then talks to that primary, and to its successor after a failover.
      service_name(str): The name the sentinels monitor the primary under
        (``sentinel monitor <name> ...``); only with ``sentinels``.
      sentinel_parameters(dict): Connection parameters for the sentinels
        themselves (e.g. their ``password``), passed to
        :class:`redis.sentinel.Sentinel` as ``sentinel_kwargs``; by default the
        ``socket_*`` ones of ``parameters``.
      min_replicas(int): How many replicas must have each change of a lock
        before it counts as made (``WAIT``, sent in the same round trip as
        the change). A change that fewer replicas acknowledged within
        ``replica_timeout`` raises :class:`LockBackendError`, so a lock is
        never reported held when a failover may lose it. 0, the default,
        waits for none. See :doc:`Failover </failover>`.
      replica_timeout(int): Milliseconds a change waits for its
        ``min_replicas`` replicas. The client's ``socket_timeout`` must be longer.
      accepted_eviction_policy(str): A ``maxmemory-policy`` that may evict locks (e.g.
        ``"volatile-lru"``) which you accept knowingly on this lock store: a worker's boot
        and the first send then log no WARNING about it. ``None``, the default, accepts none.
        See :doc:`Deploying the lock store </deploying-the-lock-store>`.
      **parameters: Connection parameters passed to :class:`redis.Redis`, or
        added to those of the URL (e.g. ``socket_timeout``), or passed to
        the Sentinel ``master_for`` client.

    Raises:
      InvalidBackendOptions: A ``ValueError``, if the URL or the Sentinel
        options cannot be used. Its message quotes no part of the URL and no
        connection parameter.
      ValueError: If ``min_replicas``, ``replica_timeout`` or
        ``accepted_eviction_policy`` is not valid.
    """

    #: How long, in seconds, a call is tried again while Redis Cluster cannot run it yet
    #: (``TRYAGAIN`` for longer than redis-py retries it, e.g. the swap of a digest whose slot
    #: is moving between masters, or ``CLUSTERDOWN``). Such a call never ran, so trying it
    #: again is safe. See :doc:`Running on Redis Cluster </redis-cluster>`.
    cluster_retry_seconds = 5.0

    def __init__(
        self,
        *,
        client: redis.Redis | redis.RedisCluster | None = None,
        url: str | None = None,
        sentinels: Sequence[tuple[str, int]] | None = None,
        service_name: str | None = None,
        sentinel_parameters: Mapping[str, Any] | None = None,
        min_replicas: int = 0,
        replica_timeout: int = DEFAULT_REPLICA_TIMEOUT,
        accepted_eviction_policy: str | None = None,
        **parameters: Any,
    ):
        if "fence_retention" in parameters:
            # An option of 0.1, which would otherwise reach redis-py as a connection parameter.
            raise TypeError(
                "RedisBackend takes no fence_retention any more: a lock keeps nothing after its last holder, and "
                "tokens keep increasing through the last token of its hash slot (see Upgrading in the docs)."
            )
        _check_integer("min_replicas", min_replicas, minimum=0, unit="replicas")
        # WAIT's timeout 0 would block forever.
        _check_integer("replica_timeout", replica_timeout, minimum=1, unit="milliseconds")
        if accepted_eviction_policy is not None and accepted_eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"RedisBackend has an invalid accepted_eviction_policy={accepted_eviction_policy!r}: it must be None "
                f"or the maxmemory-policy you accept, one of {', '.join(map(repr, EVICTION_POLICIES))}."
            )
        if client is None:
            if sentinels is not None or service_name is not None or sentinel_parameters is not None:
                client = _client_from_sentinels(url, sentinels, service_name, sentinel_parameters, parameters)
            else:
                client = _client_from_url(url, parameters) if url else redis.Redis(**parameters)
        if min_replicas:
            _check_socket_timeout(client, replica_timeout)
        self.client = client
        self.min_replicas = min_replicas
        self.replica_timeout = replica_timeout
        self.accepted_eviction_policy = accepted_eviction_policy
        #: Set after a cluster node failed to answer: the slot map is read again before the next change.
        self._stale_slots = False
        #: The lock prefixes whose mark of the store's data this process saw written, and when it
        #: last looked for the others' (monotonic, s): only a mark seen can be found gone. Forgotten
        #: when the last worker of the process stops, until a worker reads the marks again.
        self._marks_seen: set[str] = set()
        self._marks_looked_for: dict[str, float] = {}
        self._marks_forgotten = False
        #: The hash slots of a cluster found moving between masters, and until when (monotonic, s)
        #: their refusal key is looked at apart from the scripts.
        self._moving_slots: dict[int, float] = {}

        self._scripts = ScriptCaller(_LUA_SCRIPTS, client)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        min_replicas: int = 0,
        replica_timeout: int = DEFAULT_REPLICA_TIMEOUT,
        accepted_eviction_policy: str | None = None,
        **parameters: Any,
    ) -> RedisBackend:
        """A backend on the Redis at ``url``, or on its whole Redis Cluster when
        ``url`` names a node of one: listing the locks and reaping them then
        visit every master, which a client of one node would not.

        Parameters:
          url(str): As for :class:`RedisBackend`, e.g. ``redis://host:6379/1``.
          min_replicas(int): As for :class:`RedisBackend`.
          replica_timeout(int): As for :class:`RedisBackend`.
          accepted_eviction_policy(str): As for :class:`RedisBackend`.
          **parameters: Connection parameters, e.g. ``socket_timeout``, for the
            client of the server or of the cluster.

        Raises:
          InvalidBackendOptions: If the URL cannot be used; its message quotes no part of it.
          LockBackendError: If the server, or the cluster, cannot be reached to find out which it is.
        """
        backend = cls(
            url=url,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            accepted_eviction_policy=accepted_eviction_policy,
            **parameters,
        )
        try:
            # (redis-py before 8 types a reply as "Awaitable | Any": see [tool.mypy] in pyproject.toml.)
            cluster_enabled = backend.client.info("cluster").get("cluster_enabled")  # type: ignore[union-attr, unused-ignore]
        except redis.ResponseError:
            cluster_enabled = False  # e.g. an ACL user denied INFO: a single server, as far as we can tell
        except _REDIS_ERRORS as e:
            raise LockBackendError(f"Cannot reach the lock backend: {type(e).__name__}: {e}") from None
        if not cluster_enabled:
            return backend
        backend.client.close()  # type: ignore[no-untyped-call, unused-ignore]
        try:
            client = redis.RedisCluster.from_url(url, **parameters)
        except ValueError:
            raise InvalidBackendOptions(
                "The Redis URL cannot be used for a Redis Cluster (it is not quoted)."
            ) from None
        except _REDIS_ERRORS as e:
            raise LockBackendError(f"Cannot reach the Redis Cluster: {type(e).__name__}: {e}") from None
        return cls(
            client=client,
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
            accepted_eviction_policy=accepted_eviction_policy,
        )

    def for_native_thread(self) -> RedisBackend | None:
        """A backend of the same server, options and scripts, on a connection pool of its own
        whose sockets are not gevent's (:class:`~dramatiq_unique.backends.native_connection.NativeConnection`);
        ``None`` for a cluster, a Sentinel-managed master, TLS or a Unix socket."""
        client = native_client(self.client)
        if client is None:
            return None
        return RedisBackend(
            client=client,
            min_replicas=self.min_replicas,
            replica_timeout=self.replica_timeout,
            accepted_eviction_policy=self.accepted_eviction_policy,
        )

    def eviction_risks(self) -> tuple[EvictionRisk, ...]:
        """The servers whose ``maxmemory-policy`` may evict locks, as ``INFO memory`` reports it
        (managed services often disable ``CONFIG``): on Redis Cluster, every master. A server
        without ``maxmemory`` evicts nothing, and ``accepted_eviction_policy`` is no risk."""
        client: Any = self.client
        try:
            reports = {server: client.info("memory", **target) for server, target in self._masters()}
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        risks = []
        for server, report in sorted(reports.items()):
            policy, maxmemory = report.get("maxmemory_policy"), int(report.get("maxmemory", 0))
            if policy in (None, "noeviction", self.accepted_eviction_policy) or not maxmemory:
                continue
            risks.append(EvictionRisk(server=server, policy=str(policy), maxmemory=maxmemory))
        return tuple(risks)

    def unpersisted_servers(self) -> tuple[str, ...]:
        """The servers, every master of a Redis Cluster, with ``appendonly no`` and no ``save``
        schedule. A server that denies ``CONFIG GET`` (a managed service, an ACL) is not named."""
        client: Any = self.client
        unpersisted = []
        try:
            for server, target in self._masters():
                if int(client.info("persistence", **target).get("aof_enabled", 0)):
                    continue
                try:
                    save = client.config_get("save", **target)
                except redis.ResponseError:
                    continue
                if not str(save.get("save", "")).strip():
                    unpersisted.append(server)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        return tuple(unpersisted)

    def _masters(self) -> list[tuple[str, dict[str, Any]]]:
        """Each server that holds locks, in order: its name, and the keyword arguments that send
        a command of the client to it (none for one server)."""
        client: Any = self.client
        if not _is_cluster(client):
            return [(_server_name(client), {})]
        return sorted(((node.name, {"target_nodes": node}) for node in client.get_primaries()), key=lambda m: m[0])

    def acquire(
        self,
        key: str,
        owner: str,
        *,
        limit: int,
        ttl: int | None,
        holder: Holder,
        extend: int = 0,
        healing: bool = False,
        waiter: Waiter | None = None,
        starting: str | None = None,
    ) -> Acquisition:
        slot = self._place_keys(key, healing=healing)
        args = [owner, limit, ttl or 0, extend, holder.encode(owner)]
        if waiter is None:
            return self._acquisition_handing_over(self._call("acquire", [key], args, slot=slot))
        mode = "send" if starting is None else "start"
        args += [mode, starting or "", *_waiter_args(waiter, holder, limit)]
        reply, handed, dropped = self._call("line", [key, *_line_keys(key)], args, slot=slot)
        self._hand_over(handed, dropped)
        return _acquisition(reply)

    def record_handoff(self, key: str, owner: str, *, holder: Holder, handoff: int) -> Acquisition:
        return _acquisition(self._call("handed", [key], [owner, holder.encode(owner), handoff]))

    def hand_again(self, key: str, owner: str, record: str) -> bytes | None:
        handed, dropped = self._call("hand_again", self._lock_keys(key), [owner, record])
        _report_dropped(dropped)
        return None if handed is None else _bytes(handed)

    def release(self, key: str, owner: str) -> bool:
        reply = self._call("release", [key, *self._slot_keys(key)], [owner])
        if isinstance(reply, int):
            return bool(reply)
        released, handed, dropped = reply
        self._hand_over(handed, dropped)
        return bool(released)

    def release_many(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        # One script call for them all; on Redis Cluster one per hash slot, as a
        # script's keys must share one. A key of another kind than a lock's has no line nor
        # lock prefix: it is released on its own.
        released = [False] * len(places)
        # The locks of one lock prefix: a call reads and writes the last token of one prefix.
        groups: dict[tuple[int, str | None], list[int]] = {}
        cluster = _is_cluster(self.client)
        for i, (key, owner) in enumerate(places):
            if lock_kind(key) is None:
                released[i] = self.release(key, owner)
            else:
                slot = self.client.keyslot(key) if cluster else 0  # type: ignore[union-attr]
                groups.setdefault((slot, prefix_of(key)), []).append(i)
        for group in groups.values():
            keys = [*self._slot_keys(places[group[0]][0]), *(places[i][0] for i in group)]
            reply = self._call("release_many", keys, [places[i][1] for i in group])
            handed, dropped = [], []
            if reply and isinstance(reply[0], list):
                reply, handed, dropped = reply
            for i, answer in zip(group, reply, strict=True):
                released[i] = bool(answer)
            if handed or dropped:
                self._hand_over(handed, dropped)
        return released

    def replace(
        self,
        key: str,
        owner: str,
        *,
        replaced_key: str,
        limit: int,
        ttl: int | None,
        holder: Holder,
        extend: int = 0,
        debounce_cap: int | None = None,
        healing: bool = False,
    ) -> Acquisition:
        reply = self._call(
            "replace",
            [key, replaced_key, debounce_key(key)],
            [owner, limit, ttl or 0, extend, holder.encode(owner), REPLACED_TTL, debounce_cap or 0],
            slot=self._place_keys(key, healing=healing),
        )
        return self._acquisition_handing_over(reply)

    def _acquisition_handing_over(self, reply: list[Any] | int) -> Acquisition:
        """The answer of ``acquire.lua`` or ``replace.lua``, which hand the lock's free places to
        its line first where messages wait there: then ``{answer, handed, dropped}``."""
        if isinstance(reply, list) and reply and isinstance(reply[0], list):
            reply, handed, dropped = reply
            self._hand_over(handed, dropped)
        return _acquisition(reply)

    def claim(
        self, key: str, owner: str, *, replaced_key: str | None, release: bool, holder: Holder, starting: str = ""
    ) -> str:
        reply, handed, dropped = self._call(
            "claim",
            [key, *self._slot_keys(key), *([] if replaced_key is None else [replaced_key])],
            [owner, "release" if release else "run", holder.encode(owner), starting],
        )
        self._hand_over(handed, dropped)
        return {1: HELD, 0: LAPSED, -1: SUPERSEDED, -3: STARTED_BEFORE}[reply]

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
        waiter: Waiter | None = None,
        starting: str = "",
    ) -> Acquisition:
        args = [release_owner, owner, limit, ttl or 0, holder.encode(owner), starting]
        if waiter is not None:
            args += ["start", *_waiter_args(waiter, holder, limit)]
        reply, handed, dropped = self._call(
            "swap",
            [
                release_key,
                acquire_key,
                replaced_key,
                line_key(release_key),
                line_key(acquire_key),
                waiters_key(release_key),
                served_key(release_key),
            ],
            args,
            slot=self._place_keys(acquire_key),
        )
        self._hand_over(handed, dropped)
        return _acquisition(reply)

    def renew(self, key: str, owner: str, *, ttl: int, deadline: int | None = None) -> int | None:
        reply = int(self._call("renew", [key], [owner, ttl, deadline or 0]))
        return None if reply < 0 else reply

    def renew_many(self, leases: Sequence[Lease]) -> list[int | None | LockBackendError]:
        # One script call for them all; on Redis Cluster one per hash slot, as a script's keys
        # must share one.
        groups: dict[int, list[int]] = {}
        cluster = _is_cluster(self.client)
        for i, lease in enumerate(leases):
            groups.setdefault(key_slot(lease.key.encode()) if cluster else 0, []).append(i)
        calls = [
            (
                [leases[i].key for i in group],
                [arg for i in group for arg in (leases[i].owner, leases[i].ttl, leases[i].deadline or 0)],
            )
            for group in groups.values()
        ]
        answers: list[int | None | LockBackendError] = [None] * len(leases)
        for group, reply in zip(groups.values(), self._call_many("renew_many", calls), strict=True):
            for at, i in enumerate(group):
                answers[i] = reply if isinstance(reply, LockBackendError) else _renewal(reply[at])
        return answers

    def request_stop(self, key: str, message_ids: Sequence[str] = (), *, by: str) -> list[str]:
        return [_text(message_id) for message_id in self._call("request_stop", [key], [by, *message_ids])]

    def heartbeat(self, key: str, worker_id: str, *, ttl: int, in_hand: MessagesInHand | None = None) -> int:
        if in_hand is None:
            return int(self._call("heartbeat", [key], [worker_id, ttl]))
        return int(self._call("heartbeat", [key, in_hand_key(key)], [worker_id, ttl, in_hand.encode()]))

    def heartbeats(self, key: str) -> tuple[int, dict[str, int]]:
        reply = self._call("heartbeats", [key], [], writes=False)
        entries = reply[1:]
        return int(reply[0]), {_text(entries[i]): int(float(entries[i + 1])) for i in range(0, len(entries), 2)}

    def messages_in_hand(self, key: str) -> tuple[int, dict[str, int], dict[str, MessagesInHand]]:
        now, registry, published = self._call("messages_in_hand", [key, in_hand_key(key)], [], writes=False)
        alive_until = {_text(registry[i]): int(float(registry[i + 1])) for i in range(0, len(registry), 2)}
        in_hand = {
            _text(published[i]): MessagesInHand.decode(_text(published[i + 1])) for i in range(0, len(published), 2)
        }
        return int(now), alive_until, in_hand

    def forget_workers(self, key: str, *, worker_id: str | None = None, before: int | None = None) -> int:
        which = ["worker", worker_id] if worker_id is not None else ["before", before]
        return int(self._call("forget_workers", [key, in_hand_key(key)], which))

    def scan(self, prefix: str, cursor: str, count: int, *, digest_start: str = "") -> tuple[str, list[LockRecord]]:
        # A glob character in the prefix is escaped. SCAN costs O(count) per step; MATCH filters
        # on the server, so a key of another digest costs neither a reply nor a GET.
        # Only hashes are listed: a digest's other keys (the replaced set) are no locks.
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in digest_keys_start(prefix) + digest_start) + "*"
        try:
            if _is_cluster(self.client):
                next_cursor, keys = self._scan_cluster(cursor, pattern, count)
            else:
                position, keys = self.client.scan(int(cursor), match=pattern, count=count, _type="string")  # type: ignore[misc, unused-ignore]
                next_cursor = str(position)
            keys = [key for key in map(_text, keys) if lock_kind(key)]
            # One GET a key: a client of one node of a cluster cannot MGET keys of several slots.
            contents = self._get_each(keys)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        records: list[LockRecord] = []
        for key, value in zip(keys, contents, strict=True):
            if value is not None:
                records.extend(parse_lock(key, _read_text(value)))
        return next_cursor, records

    def _get_each(self, keys: Sequence[str]) -> list[Any]:
        """The values at ``keys``, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call, unused-ignore]
        for key in keys:
            pipe.get(key)
        return list(pipe.execute())

    def _scan_cluster(self, cursor: str, pattern: str, count: int) -> tuple[str, list[Any]]:
        # Node by node, primaries in a stable order: the cursor is "<node index>:<node cursor>".
        client: Any = self.client  # a RedisCluster: its scan takes target_nodes
        nodes = sorted(client.get_primaries(), key=lambda node: node.name)
        node_index, _, node_cursor = cursor.partition(":") if cursor != "0" else ("0", "", "0")
        index, position = int(node_index), int(node_cursor or 0)
        if index >= len(nodes):
            return "0", []
        # RedisCluster.scan answers ({node name: cursor}, keys).
        cursors, keys = client.scan(position, match=pattern, count=count, _type="string", target_nodes=nodes[index])
        position = int(next(iter(cursors.values())) if isinstance(cursors, dict) else cursors)
        if position == 0:
            index, position = index + 1, 0
        return ("0" if index >= len(nodes) else f"{index}:{position}"), list(keys)

    def epochs(self, prefix: str) -> dict[str, str]:
        # Not waited for by replicas (min_replicas): a failover to a replica that missed it is a loss too.
        # On one node, a mark this process saw that went is refused in the same step (new_places_refused).
        refusal = [refusal_key(prefix)] if prefix in self._marks_seen and not _is_cluster(self.client) else []
        marks = {
            key: _text(self._call("epoch", [key, *refusal], [uuid.uuid4().hex], writes=False))
            for key in self._epoch_keys(prefix)
        }
        self._marks_seen.add(prefix)
        self._marks_forgotten = False
        return marks

    def refuse_new_places(self, prefix: str, *, ttl: int) -> None:
        # Not waited for by replicas (min_replicas): a failover loses the refusal with the data it guards.
        try:
            if not _is_cluster(self.client):
                self.client.set(refusal_key(prefix), "healing", px=ttl)
                return
            pipe = self.client.pipeline()  # type: ignore[no-untyped-call, unused-ignore]
            for tag in _slot_tags():
                pipe.set(refusal_key(prefix, tag), "healing", px=ttl)
            pipe.execute()
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e

    def accept_new_places(self, prefix: str) -> None:
        try:
            if not _is_cluster(self.client):
                self.client.delete(refusal_key(prefix))
                return
            pipe = self.client.pipeline()  # type: ignore[no-untyped-call, unused-ignore]
            for tag in _slot_tags():
                pipe.delete(refusal_key(prefix, tag))
            pipe.execute()
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e

    def refusing(self, prefix: str) -> bool:
        if not _is_cluster(self.client):
            return self._exists(refusal_key(prefix))
        # Every slot's refusal is written at once: one is enough to tell.
        return self._exists(refusal_key(prefix, _slot_tags()[0]))

    def forget_epochs(self) -> None:
        self._marks_seen.clear()
        self._marks_looked_for.clear()
        # Until this process reads the marks again, no script of it looks for one.
        self._marks_forgotten = True

    def _refusal_keys(self, key: str) -> list[str]:
        """The keys a script that takes a new place in the lock at ``key`` checks first: the
        refusal of its hash slot and, on one node, the mark of the store's data, if seen."""
        prefix = prefix_of(key)
        if prefix is None:
            return []  # not a lock: the reaper's and the healer's own locks are never refused
        if _is_cluster(self.client):
            # The mark of each master is in a slot of its own, out of the script's reach.
            return [refusal_key(prefix, _slot_tags()[key_slot(key.encode())])]
        return [refusal_key(prefix), epoch_key(prefix)] if self._saw_mark(prefix) else [refusal_key(prefix)]

    def _slot_keys(self, key: str) -> list[str]:
        """The key of the hash slot of the lock at ``key`` that a script issuing tokens there
        reads: its format key, which keeps the last token issued there (none for a key of
        another kind, the reaper's and the healer's own locks)."""
        prefix = prefix_of(key)
        if prefix is None:
            return []
        if _is_cluster(self.client):
            return [format_key(prefix, _slot_tags()[key_slot(key.encode())])]
        return [format_key(prefix)]

    def _place_keys(self, key: str, *, healing: bool = False) -> list[str]:
        """The keys a script that takes a new place in the lock at ``key`` reads with it: those of
        its hash slot, then the refusal and the mark (none for the healing's own places)."""
        return [*self._slot_keys(key), *(() if healing else self._refusal_keys(key))]

    def _lock_keys(self, key: str) -> list[str]:
        """The lock at ``key``, the keys of its line and of its hash slot: those of a script that
        may hand its free places to its line."""
        return [key, *_line_keys(key), *self._slot_keys(key)] if lock_kind(key) is not None else [key]

    def _moving(self, key: str) -> bool:
        """Whether the hash slot of ``key`` was found moving between masters a moment ago."""
        until = self._moving_slots.get(key_slot(key.encode())) if self._moving_slots else None
        return until is not None and time.monotonic() < until

    def _exists(self, key: str) -> bool:
        try:
            return bool(self.client.exists(key))
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e

    def _saw_mark(self, prefix: str) -> bool:
        if prefix in self._marks_seen:
            return True
        if self._marks_forgotten:
            return False
        looked = self._marks_looked_for.get(prefix)
        if looked is not None and time.monotonic() - looked < _MARK_LOOKS_EVERY:
            return False
        try:
            written = bool(self.client.exists(epoch_key(prefix)))
        except _REDIS_ERRORS:
            return False  # the script's call reports the failure
        if written:
            self._marks_seen.add(prefix)
        else:
            self._marks_looked_for[prefix] = time.monotonic()
        return written

    def _epoch_keys(self, prefix: str) -> list[str]:
        """One mark on a single Redis; on a cluster, one on each master, under the first
        hash tag that places a mark there."""
        if not isinstance(self.client, redis.RedisCluster):
            return [epoch_key(prefix)]
        client: Any = self.client
        try:
            masters = {node.name for node in client.get_primaries()}
            keys: dict[str, str] = {}
            for shard in range(_SLOTS * 4):
                key = epoch_key(prefix, str(shard))
                keys.setdefault(client.nodes_manager.get_node_from_slot(client.keyslot(key)).name, key)
                if len(keys) >= len(masters):
                    break
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        return sorted(keys.values())

    def release_record(self, key: str, owner: str, record: str) -> bool:
        released, handed, dropped, *waiting = self._call(
            "release_record", self._lock_keys(key), [owner, record, self._no_broker()]
        )
        if waiting:
            raise LineNeedsBroker(key, int(waiting[0]))
        self._hand_over(handed, dropped)
        return bool(released)

    def lines(self, keys: Sequence[str]) -> dict[str, tuple[str, ...]]:
        try:
            pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call, unused-ignore]
            for key in keys:
                pipe.lrange(line_key(key), 0, -1)
            # A line key of another type (not written by this version) answers for itself alone.
            answers = pipe.execute(raise_on_error=False)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        for answer in answers:
            if isinstance(answer, _REDIS_ERRORS) and not isinstance(answer, redis.ResponseError):
                raise _backend_error(answer) from answer
        return {
            key: tuple(map(_read_text, ids))
            for key, ids in zip(keys, answers, strict=True)
            if ids and not isinstance(ids, Exception)
        }

    def still_waiting(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        if not places:
            return []
        keys = list(dict.fromkeys(key for key, _ in places))
        try:
            # One pipeline: each lock's value (a message handed a place holds it under its
            # message_id, marked handed) and each message among its digest's waiters (a
            # cluster's pipeline routes each command by its key).
            pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call, unused-ignore]
            for key in keys:
                pipe.get(key)
            for key, message_id in places:
                pipe.hexists(waiters_key(key), message_id)
            answers = pipe.execute(raise_on_error=False)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        for answer in answers:
            if isinstance(answer, _REDIS_ERRORS) and not isinstance(answer, redis.ResponseError):
                raise _backend_error(answer) from answer
        # A key of another type (not written by this version) answers for itself alone: no waiter.
        handed = {
            key: set()
            if value is None or isinstance(value, Exception)
            else {place.owner for place in parse_lock(key, _read_text(value)) if place.holder.get("handed")}
            for key, value in zip(keys, answers, strict=False)
        }
        return [
            (answer is True or answer == 1) and message_id not in handed[key]
            for (key, message_id), answer in zip(places, answers[len(keys) :], strict=True)
        ]

    def _hand_over(self, handed: Sequence[Any], dropped: Sequence[Any]) -> None:
        """Report the waiters a script ``dropped``, then pass the messages it ``handed`` a place on."""
        _report_dropped(dropped)
        self.hand_over(handed)

    def _no_broker(self) -> str:
        """The scripts' flag of a caller that cannot enqueue the messages a line is handed."""
        return "1" if self.handoffs is None else ""

    def waiting_message(self, key: str, message_id: str) -> bytes | None:
        try:
            entry = self.client.hget(waiters_key(key), message_id)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        if entry is None:
            return None
        # Recorded after the number of places it waits for and its holder (holders.lua's waiters).
        limit, _, rest = _bytes(entry).partition(b"\n")
        holder, newline, message = rest.partition(b"\n")
        if not (limit.isdigit() and holder and newline):
            _logger.warning(
                "The entry of message %r among the waiters of lock %r (digest %s) cannot be read (written by "
                "another version, or by hand): it is taken for no message waiting.",
                message_id,
                key,
                digest_of(key),
            )
            return None
        return message

    def time(self) -> int:
        try:
            seconds, micros = self.client.time()  # type: ignore[misc, unused-ignore]
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        return int(seconds) * 1000 + int(micros) // 1000

    def read(self, keys: Sequence[str]) -> tuple[int, list[LockRecord]]:
        reply = self._call("read", list(keys), [], writes=False)
        records = [
            read_place(keys[int(reply[i]) - 1], _read_text(reply[i + 1]), _read_text(reply[i + 2]))
            for i in range(1, len(reply), 3)
        ]
        return int(reply[0]), records

    def read_many(self, keys: Sequence[str]) -> list[LockRecord]:
        if _is_cluster(self.client):
            return super().read_many(keys)  # one call per digest: its hash slot
        # One Redis: the read script takes the locks of every digest at once.
        return self.read(keys)[1] if keys else []

    def release_records(self, key: str, records: Mapping[str, str]) -> list[str]:
        args = [self._no_broker(), *(value for owner, record in records.items() for value in (owner, record))]
        released, handed, dropped, *waiting = self._call("release_records", self._lock_keys(key), args)
        if waiting:
            raise LineNeedsBroker(key, int(waiting[0]))
        self._hand_over(handed, dropped)
        return [_text(owner) for owner in released]

    def get_value(self, key: str) -> str | None:
        try:
            value = self.client.get(key)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        return None if value is None else _read_text(value)

    def set_value(self, key: str, value: str, *, ttl: int) -> None:
        try:
            self.client.set(key, value, px=ttl)
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e

    def add_counts(self, counts: Mapping[str, Mapping[str, int]], *, ttl: int) -> None:
        args: list[Any] = [ttl]
        for fields in counts.values():
            args.append(len(fields))
            for field, count in fields.items():
                args += (field, count)
        # Activity counters need no replica: a failover may lose a few seconds of counts, no lock.
        self._call("add_counts", list(counts), args, writes=False)

    def add_history(self, key: str, entries: Sequence[Mapping[str, str]], *, max_entries: int, retention: int) -> None:
        args: list[Any] = [max_entries, retention]
        for entry in entries:
            args.append(len(entry))
            for field, value in entry.items():
                args += (field, value)
        # The trail needs no replica: a failover may lose its last entries, no lock.
        self._call("add_history", [key], args, writes=False)

    def read_history(
        self,
        key: str,
        *,
        since: int | None = None,
        actor: str | None = None,
        digest: str | None = None,
        within: int | None = None,
        limit: int,
    ) -> tuple[int, list[tuple[str, dict[str, str]]]]:
        args = [
            "" if since is None else since,
            actor or "",
            digest or "",
            limit,
            HISTORY_MARGIN,
            "" if within is None else within,
        ]
        now, *reply = self._call("read_history", [key], args, writes=False)
        entries = []
        for i in range(0, len(reply), 2):
            fields = reply[i + 1]
            entries.append(
                (_text(reply[i]), {_text(fields[f]): _read_text(fields[f + 1]) for f in range(0, len(fields), 2)})
            )
        return int(now), entries

    def read_counts(self, keys: Sequence[str]) -> list[dict[str, int]]:
        try:
            pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call, unused-ignore]
            for key in keys:
                pipe.hgetall(key)
            contents = pipe.execute()
        except _REDIS_ERRORS as e:
            raise _backend_error(e) from e
        return [{_text(field): int(count) for field, count in fields.items()} for fields in contents]

    def _call(
        self, script: str, keys: list[str], args: list[Any], *, writes: bool = True, slot: Sequence[str] = ()
    ) -> Any:
        """Run the script named ``script`` in one round trip; a script that ``writes`` also waits for
        ``min_replicas`` replicas in that round trip. ``slot``: the keys of the hash slot that a
        script taking a place reads last (see _place_keys)."""
        deadline = None
        while True:
            if slot and self._moving(keys[0]):
                # A slot moving between masters answers TRYAGAIN to a script whose keys are not all
                # on one side. The refusal key seldom exists: it is looked at alone (a redirect is
                # followed for one key), and the script runs without the slot's keys: its tokens
                # follow the clock alone until the move ends.
                refusal = slot[1:2]
                if refusal and self._exists(refusal[0]):
                    raise LockStoreHealing()
                slot = ()
            try:
                if writes and self.min_replicas:
                    return self._call_replicated(script, [*keys, *slot], args)
                return self._scripts(script, [*keys, *slot], args)
            except (redis.exceptions.ClusterError, redis.exceptions.TryAgainError) as e:
                if slot:  # (redis-py's retries of TRYAGAIN end in either error)
                    self._moving_slots[key_slot(keys[0].encode())] = time.monotonic() + _MOVING_SLOT_SECONDS
                    continue
                # redis-py gave up on redirects and TRYAGAIN answers, or the cluster is down.
                deadline = deadline or time.monotonic() + self.cluster_retry_seconds
                if time.monotonic() >= deadline:
                    raise _backend_error(e) from e
                time.sleep(0.05)
            except _REDIS_ERRORS as e:
                raise self._failed(e, [*keys, *slot]) from e

    def _call_many(self, script: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        """Run ``script`` once for each ``(keys, args)`` of ``calls``, as :meth:`_call` does; the
        keys of each call share one hash slot on Redis Cluster. Returns the reply of each, or the
        :class:`LockBackendError` it failed with: a failed call leaves the others' replies.

        On Redis Cluster, the calls to one master go in one pipeline of that master (redis-py's
        cluster pipeline refuses script calls), with its WAIT for ``min_replicas``: one round trip
        per master. A call that failed there (a master without the scripts, a slot that moved)
        runs again on its own through :meth:`_call`; a master that could not be reached fails its
        calls only."""
        replies: list[Any] = [None] * len(calls)
        if len(calls) == 1 or not _is_cluster(self.client):
            for n, (keys, args) in enumerate(calls):
                try:
                    replies[n] = self._call(script, keys, args)
                except LockBackendError as e:
                    replies[n] = e
            return replies
        masters: dict[int, tuple[Any, list[int]]] = {}
        try:
            for n, (keys, _) in enumerate(calls):
                master = self._primary_for(keys[0])
                masters.setdefault(id(master), (master, []))[1].append(n)
        except _REDIS_ERRORS as e:
            return [self._failed(e)] * len(calls)
        for master, group in masters.values():
            pipe = master.pipeline(transaction=False)
            for n in group:
                keys, args = calls[n]
                self._scripts.pipeline_call(pipe, script, keys, args)
            if self.min_replicas:
                self._append_wait(pipe)
            try:
                pipelined = pipe.execute(raise_on_error=False)
                if self.min_replicas:
                    self._check_wait(pipelined.pop())
            except (LockBackendError, *_REDIS_ERRORS) as e:
                error = e if isinstance(e, LockBackendError) else self._failed(e)
                for n in group:
                    replies[n] = error
                continue
            for n, reply in zip(group, pipelined, strict=True):
                if isinstance(reply, Exception):
                    try:
                        reply = self._call(script, *calls[n])
                    except LockBackendError as e:
                        reply = e
                replies[n] = reply
        return replies

    def _failed(self, e: Exception, keys: Sequence[str] = ()) -> LockBackendError:
        """The :class:`LockBackendError` of a call of ``keys`` that failed with ``e``."""
        if isinstance(e, (redis.ConnectionError, redis.TimeoutError)) and _is_cluster(self.client):
            self._stale_slots = True  # a master may have failed over: ask for the slot map again
        if isinstance(e, redis.ResponseError) and str(e).startswith("WRONGTYPE") and keys:
            return self._wrong_type(keys, e)
        return _backend_error(e, keys)

    def _wrong_type(self, keys: Sequence[str], e: redis.ResponseError) -> LockBackendError:
        """The error of a script that met one of its ``keys`` holding another type than this
        version writes there (another program's key, a hand edit): it names that key."""
        # A script on the hot path names the keys of a lock's line itself (holders.lua's line_of).
        keys = [*keys, *(line for key in keys for line in _line_keys(key))]
        try:
            pipe = self.client.pipeline(transaction=False)  # type: ignore[no-untyped-call, unused-ignore]
            for key in keys:
                pipe.type(key)
            found = [_text(kind) for kind in pipe.execute()]
        except _REDIS_ERRORS:
            return _backend_error(e)
        for key, kind in zip(keys, found, strict=True):
            expected = next((written for end, written in _KEY_TYPES if key.endswith(end)), None)
            if expected is not None and kind not in (expected, "none"):
                if kind == "hash" and expected == "string" and not key.endswith(":debounce"):
                    return LockBackendError(
                        f"The Redis lock backend left key {key!r} as it is: it holds a lock in the format of "
                        "dramatiq-unique 0.1 (a hash), which this version neither reads nor writes. Let the workers "
                        "of 0.1 finish, then remove the keys of 0.1 (see Upgrading in the docs)."
                    )
                return LockBackendError(
                    f"The Redis lock backend left key {key!r} as it is: it holds a {kind}, not the {expected} this "
                    "version writes there (written by another program, or by hand). Remove that key (see Errors in "
                    "the docs) to use this lock again."
                )
        return _backend_error(e)

    def _call_replicated(self, script: str, keys: list[str], args: list[Any]) -> Any:
        # WAIT counts the replicas that have every write of the connection it is sent on: it goes
        # in one pipeline with the script, to the node that owns the keys. redis-py's cluster
        # pipeline would send a redirected script on another connection than its WAIT, so the
        # node is chosen here, and a redirect sends both again.
        node, asking = self._primary_for(keys[0]), False
        for _ in range(_REDIRECTS):
            pipe = node.pipeline(transaction=False)
            if asking:
                pipe.execute_command("ASKING")
            self._scripts.pipeline_call(pipe, script, keys, args)
            self._append_wait(pipe)
            *_, reply, acknowledged = pipe.execute(raise_on_error=False)
            if self._scripts.missing(reply):
                # The server lost its scripts (a restart, a failover): the script did not run.
                self._scripts.load_on(node, script)
                continue
            if isinstance(reply, redis.exceptions.MovedError):
                # The slot is served by another master now; the script did not run.
                self._refresh_slots()
                node, asking = self._primary_for(keys[0]), False
                continue
            if isinstance(reply, redis.exceptions.AskError):
                # The slot is migrating and the keys are on the importing master already.
                node, asking = self._node_at(reply.host, reply.port), True
                continue
            if isinstance(reply, Exception):
                raise reply
            self._check_wait(acknowledged)
            return reply
        # A slot that keeps moving: _call tries again for cluster_retry_seconds.
        raise redis.exceptions.ClusterError(f"Redis Cluster redirected a lock script {_REDIRECTS} times.")

    def _append_wait(self, pipe: Any) -> None:
        """Append ``WAIT`` for ``min_replicas`` to a pipeline of lock scripts, after them: its
        answer (the pipeline's last) tells whether enough replicas have every script's writes.
        Check it with :meth:`_check_wait`. A pipeline of a cluster must hold the scripts of one
        node only, and be that node's pipeline, as WAIT answers for its own connection."""
        pipe.execute_command("WAIT", self.min_replicas, self.replica_timeout)

    def _check_wait(self, acknowledged: Any) -> None:
        """Raise :class:`LockBackendError` unless ``acknowledged``, the answer of the WAIT that
        :meth:`_append_wait` appended, counts ``min_replicas`` replicas."""
        if isinstance(acknowledged, Exception):
            raise LockBackendError(
                "The Redis lock backend failed: the server refused WAIT "
                f"({type(acknowledged).__name__}: {acknowledged}); RedisBackend(min_replicas=...) needs a "
                "server that accepts WAIT from clients."
            )
        if int(acknowledged) < self.min_replicas:
            raise LockBackendError(
                f"The Redis lock backend failed: {int(acknowledged)} of the {self.min_replicas} replicas that "
                f"RedisBackend(min_replicas={self.min_replicas}) asks for acknowledged the change within "
                f"replica_timeout={self.replica_timeout} ms. It was made on the primary, but a failover "
                "now may lose it."
            )

    def _primary_for(self, key: str) -> Any:
        """The client to send a change of ``key`` to: the master that owns it, for a cluster."""
        client: Any = self.client
        if not _is_cluster(client):
            return client
        if self._stale_slots:
            self._refresh_slots()
        return client.get_redis_connection(client.get_node_from_key(key))

    def _node_at(self, host: str, port: int) -> Any:
        client: Any = self.client
        node = client.get_node(host=host, port=port)
        if node is None:
            self._refresh_slots()
            node = client.get_node(host=host, port=port)
        if node is None:
            raise redis.exceptions.ClusterError(f"Redis Cluster redirected to an unknown node {host}:{port}.")
        return client.get_redis_connection(node)

    def _refresh_slots(self) -> None:
        client: Any = self.client
        client.nodes_manager.initialize()
        self._stale_slots = False


_LUA_SCRIPTS = LuaScripts(
    constants={
        "FORMAT": RECORD_FORMAT,
        "WRITER": __version__,
        "LINE_RETENTION": LINE_RETENTION,
        "UNHEALED_REFUSAL": UNHEALED_REFUSAL,
        "SERVED_RETENTION": SERVED_RETENTION,
    }
)


def _check_integer(name: str, value: Any, *, minimum: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"RedisBackend has an invalid {name}={value!r}: it must be an integer >= {minimum} ({unit}).")


def _check_socket_timeout(client: Any, replica_timeout: int) -> None:
    # A change that waits for its replicas longer than the socket allows would fail with a
    # timeout, and redis-py's retry would run it again.
    pool = getattr(client, "connection_pool", None)
    socket_timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout")
    if socket_timeout is not None and socket_timeout * 1000 <= replica_timeout:
        raise ValueError(
            f"RedisBackend has replica_timeout={replica_timeout} ms, but its client's socket_timeout is "
            f"{socket_timeout} s: a change waiting for its replicas would time out first. Make socket_timeout "
            "longer than replica_timeout, or replica_timeout shorter."
        )


def _client_from_sentinels(
    url: str | None,
    sentinels: Sequence[tuple[str, int]] | None,
    service_name: str | None,
    sentinel_parameters: Mapping[str, Any] | None,
    parameters: dict[str, Any],
) -> redis.Redis:
    # No error quotes a value: a sentinel entry or a parameter may hold a password.
    usage = (
        "Pass RedisBackend(sentinels=[(host, port), ...], service_name=..., sentinel_parameters={...}, "
        "**parameters), or a client= of your own."
    )
    if url is not None:
        raise InvalidBackendOptions(f"RedisBackend takes either url or sentinels, not both. {usage}")
    if sentinels is None or service_name is None:
        missing = "sentinels" if sentinels is None else "service_name"
        raise InvalidBackendOptions(f"RedisBackend needs {missing} to connect through Redis Sentinel. {usage}")
    if isinstance(sentinels, (str, bytes)) or not isinstance(sentinels, Sequence) or not sentinels:
        raise InvalidBackendOptions(f"RedisBackend's sentinels must be a non-empty list of (host, port). {usage}")
    for i, entry in enumerate(sentinels):
        if (
            not isinstance(entry, (tuple, list))
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise InvalidBackendOptions(
                f"RedisBackend's sentinels[{i}] is not a (host, port) pair of a str and an int "
                "(it is not quoted, as it may hold a password)."
            )
    if not isinstance(service_name, str) or not service_name:
        raise InvalidBackendOptions(f"RedisBackend's service_name must be a non-empty str. {usage}")
    if sentinel_parameters is not None and not isinstance(sentinel_parameters, Mapping):
        raise InvalidBackendOptions(f"RedisBackend's sentinel_parameters must be a dict. {usage}")
    sentinel = redis.sentinel.Sentinel(
        [(host, port) for host, port in sentinels],
        sentinel_kwargs=dict(sentinel_parameters) if sentinel_parameters is not None else None,
        **parameters,
    )
    # Its connections ask the sentinels for the primary's address whenever they (re)connect.
    client: redis.Redis = sentinel.master_for(service_name)
    return client


def _client_from_url(url: str, parameters: dict[str, Any]) -> redis.Redis:
    # No error may quote the URL: urllib reads the text after the first ':' of a
    # password that holds '/', '#' or '?' as a port, and its error quotes it.
    scheme, _, rest = url.partition("://")
    if scheme not in ("redis", "rediss", "unix"):
        raise InvalidBackendOptions(_url_error("it must start with redis://, rediss:// or unix://"))
    # Such a password ends the authority early, which leaves its '@' further on; redis-py may
    # even accept the rest, as another host, port or socket path.
    authority = re.split("[/?#]", rest, maxsplit=1)[0]
    if authority and "@" not in authority and "@" in rest[len(authority) :]:
        problem = "an '@' follows its host part, so its password or username holds '/', '#' or '?'"
        raise InvalidBackendOptions(_url_error(problem))
    try:
        return redis.Redis.from_url(url, **parameters)  # type: ignore[no-any-return, unused-ignore]
    except ValueError:
        raise InvalidBackendOptions(
            _url_error(
                "redis-py cannot parse it; it must look like redis://[[username]:password@]host[:port][/db], "
                "rediss://... or unix://[[username]:password@]/path"
            )
        ) from None


def _url_error(problem: str) -> str:
    return (
        f"RedisBackend cannot use its url: {problem} (the url is not quoted, as it may hold a password). "
        "Percent-encode a password that holds '/', '#', '?', '@' or '%' (urllib.parse.quote(password, safe='')), "
        "or leave it out of the url and pass it as RedisBackend(url=..., password=...)."
    )


def _backend_error(e: Exception, keys: Sequence[str] = ()) -> LockBackendError:
    if isinstance(e, redis.ResponseError) and str(e).startswith(_UNREADABLE):
        return _unreadable_lock(str(e))
    if isinstance(e, redis.ResponseError) and str(e).startswith(_NEWER_FORMAT):
        return _newer_format(str(e)[len(_NEWER_FORMAT) :], keys)
    # The error names host and port at most, never credentials.
    return LockBackendError(f"The Redis lock backend failed: {type(e).__name__}: {e}")


#: The type of each key of a digest that the scripts write, by the end of its name (keys.py).
_KEY_TYPES = (
    ("}", "string"),
    ("}:run", "string"),
    (":line", "list"),
    (":waiting", "hash"),
    (":served", "zset"),
    (":replaced", "set"),
    (":debounce", "string"),
    # The library's own locks.
    (":reaper", "string"),
    (":reaper:schedule", "string"),
    (":healing", "string"),
)

#: How a script's error starts when a lock holds what this version cannot read (holders.lua's
#: refuse_unreadable), followed by what it found, in JSON.
_UNREADABLE = "UNREADABLE "


#: How a script's error starts when the format marker of a lock's slot is not this version's
#: (holders.lua's refuse_format), followed by the marker.
_NEWER_FORMAT = "FORMAT "

#: The lock prefixes whose newer format this process said it met, once each.
_newer_formats_told: set[str] = set()


def _newer_format(marker: str, keys: Sequence[str]) -> LockBackendError:
    """The error of a script that met a format marker of another version, said once per prefix
    as an ERROR: the process locks nothing there until it is upgraded."""
    prefix = next((found for key in keys if (found := prefix_of(key)) is not None), "?")
    # The server adds where the script failed; the format key's value ends with the last token.
    error = NewerLockFormat(prefix, " ".join(marker.split(" script: ")[0].split()[:2]))
    if prefix not in _newer_formats_told:
        _newer_formats_told.add(prefix)
        _logger.error("%s", error)
    return error


def _unreadable_lock(error: str) -> LockBackendError:
    """The error of a script that met a lock holding what this version cannot read."""
    try:
        found, _ = json.JSONDecoder().raw_decode(error, len(_UNREADABLE))
        key = found["key"]
    except (ValueError, TypeError, KeyError):
        return LockBackendError(f"The Redis lock backend met a lock it cannot read: {error}")
    value = found["value"] + ("…" if found.get("cut") else "")
    return LockBackendError(
        f"The Redis lock backend took no place in lock {key!r}: the place of {found['field']!r} holds {value!r}, "
        "which is not a record of this version (written by another version, or by hand), and no place is taken "
        "beside what cannot be read. Remove that line of the lock's value, or the key (see Errors in the docs), to "
        "use this lock again."
    )


def _report_dropped(dropped: Sequence[Any]) -> None:
    """Say which waiters a script dropped: ``dropped`` holds a lock key and a message id for each."""
    for key, message_id in zip(dropped[::2], dropped[1::2], strict=True):
        # A message id written by hand may be no UTF-8: it is told all the same.
        key, message_id = _bytes(key).decode(errors="replace"), _bytes(message_id).decode(errors="replace")
        _logger.warning(
            "The entry of message %r among the waiters of lock %r (digest %s) cannot be read (written by another "
            "version, or by hand): it was dropped from the line, which goes on with the next.",
            message_id,
            key,
            digest_of(key),
        )


def _server_name(client: Any) -> str:
    """``host:port`` of a client of one server, its socket path, or its Sentinel service name."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if "path" in kwargs:
        return str(kwargs["path"])
    if hasattr(pool, "service_name"):
        return f"the primary of Sentinel service {pool.service_name}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _read_text(value: Any) -> str:
    """A value read for a reader, which says what it cannot read: bytes that are no UTF-8 (no
    script of this version writes them) become replacement characters instead of an error."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _bytes(value: Any) -> bytes:
    """A reply that holds a message, as Dramatiq's encoder wrote it (a client that decodes its
    replies gives it as text)."""
    return value if isinstance(value, bytes) else str(value).encode()


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


@functools.cache
def _slot_tags() -> tuple[str, ...]:
    """For each hash slot of a Redis Cluster, the shortest decimal that a hash tag places there."""
    tags: dict[int, str] = {}
    number = 0
    while len(tags) < _SLOTS:
        tags.setdefault(key_slot(str(number).encode()), str(number))
        number += 1
    return tuple(tags[slot] for slot in range(_SLOTS))


def _line_keys(key: str) -> list[str]:
    """The keys of the line of the lock at ``key`` (holders.lua's line_at); none for a key of
    another kind (the reaper's leader lock, the healing lock), which has no line."""
    if lock_kind(key) is None:
        return []
    return [line_key(key), waiters_key(key), served_key(key)]


def _waiter_args(waiter: Waiter, holder: Holder, limit: int) -> list[Any]:
    """The arguments of a script that puts a message in a line: its entry among the waiters
    (the lock's limit, the place handed to it, recorded as queued, and the message), the line's
    limit, and whether the newest keeps the last place of a full line."""
    queued = dataclasses.replace(holder, state="queued", worker_id=None, redis_message_id=None)
    entry = f"{limit}\n{queued.encode(holder.message_id)}\n".encode() + waiter.message
    return [entry, waiter.line_limit, "1" if waiter.keeps_latest else ""]


def _acquisition(reply: list[Any] | int) -> Acquisition:
    if isinstance(reply, int):
        return Acquisition(acquired=True, token=reply)  # a new place that never lapses
    if reply[0] == -2:
        raise LockStoreHealing()
    if reply[0] == -1:
        return Acquisition(acquired=False, superseded=True)
    if reply[0] == -3:
        return Acquisition(acquired=False, started_before=True)
    strings = tuple(s.decode() if isinstance(s, bytes) else s for s in reply[1:])
    if reply[0] == 3:
        return Acquisition(acquired=False, waiting=int(reply[1]), displaced=strings[1] or None, holders=strings[2:])
    if reply[0] == -4:
        return Acquisition(acquired=False, line_full=True, holders=strings)
    if reply[0] == 1:
        replaced = strings[2] if len(strings) > 2 else None
        due_within = int(reply[4]) if len(reply) > 4 else None
        return Acquisition(
            acquired=True,
            token=int(reply[1]),
            expires_at=int(reply[2]) or None,
            replaced=replaced,
            due_within=due_within,
        )
    return Acquisition(acquired=False, holders=strings)


def _renewal(answer: Any) -> int | None:
    """One answer of ``renew_many.lua``: an expiry, a negative number for a place not held, or
    ``"!"``, the expiry, ``"|"`` and who asked (escaped) for a holder asked to stop."""
    if isinstance(answer, bytes | str):
        text = _text(answer)
        if text.startswith("!"):
            expires_at, _, by = text[1:].partition("|")
            return StopRequested(expires_at, unescape(by))
        answer = text
    value = int(answer)
    return None if value < 0 else value
