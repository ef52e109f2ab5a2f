"""A redis-py connection on the sockets gevent saved before it patched the ``socket`` module.

Its I/O blocks the calling thread (releasing the GIL), never a gevent hub: a native thread of a
monkey-patched process can use it while the hub of the main thread is busy, and any other thread
can use it too, blocking its hub for the round trip.
"""

from __future__ import annotations

import socket
from typing import Any

import redis

from ..native import original


class NativeConnection(redis.Connection):
    """A TCP connection to Redis made with the original :func:`socket.getaddrinfo` and
    :class:`socket.socket`; otherwise a :class:`redis.Connection`."""

    def _connect(self) -> Any:
        # As redis.Connection._connect does: every address in turn, with its socket options.
        new_socket, getaddrinfo = original("socket", "socket"), original("socket", "getaddrinfo")
        error: OSError | None = None
        for family, socktype, proto, _, address in getaddrinfo(
            self.host, self.port, self.socket_type, socket.SOCK_STREAM
        ):
            sock = None
            try:
                sock = new_socket(family, socktype, proto)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.socket_keepalive:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                    for option, value in self.socket_keepalive_options.items():
                        sock.setsockopt(socket.IPPROTO_TCP, option, value)
                sock.settimeout(self.socket_connect_timeout)
                sock.connect(address)
                sock.settimeout(self.socket_timeout)
                return sock
            except OSError as e:
                error = e
                if sock is not None:
                    sock.close()
        raise error or OSError("socket.getaddrinfo returned an empty list")


def native_client(client: Any) -> redis.Redis | None:
    """A client of the same server and database as ``client``, with a connection pool of its own
    made of :class:`NativeConnection`; ``None`` for a client this cannot copy (a cluster, a
    Sentinel-managed master, TLS or a Unix socket)."""
    if type(client) is not redis.Redis:
        return None
    pool = client.connection_pool
    if type(pool) not in (redis.ConnectionPool, redis.BlockingConnectionPool) or pool.connection_class is not (
        redis.Connection
    ):
        return None
    kwargs = dict(pool.connection_kwargs)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=NativeConnection, **kwargs))
