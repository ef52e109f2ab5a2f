"""The check, at a worker's boot, that a lock store which keeps waiting messages keeps them on disk.

A message that waits in a lock's line (``wait``, ``keep_latest``) exists only in the lock store:
the client never enqueued it, or the worker acked it. A store without persistence loses every one
of them when it restarts, and nothing else has them.
"""

from __future__ import annotations

import logging

from .backends import LockBackend


def warn_if_lines_unpersisted(backend: LockBackend, actors: list[str], *, logger: logging.Logger) -> None:
    """Log one WARNING when ``actors`` wait in lines and a server of the lock store keeps nothing
    on disk. Never raises: only advice is at stake, and a store that is down now is reported
    by the heartbeat that meets it."""
    if not actors:
        return
    try:
        servers = backend.unpersisted_servers()
    except Exception as e:
        logger.info("Whether the lock store keeps its data on disk could not be read (%s).", e)
        return
    if servers:
        logger.warning(
            "Actors %s wait in lines, and the lock store's Redis (%s) keeps nothing on disk: a message waiting "
            "in line exists only in the lock store, so a restart, a flush or a failover to a replica without "
            "it loses every such message, and nothing else has them. Turn persistence on (appendonly yes, and "
            "the same in redis.conf; see Deploying the lock store in the docs).",
            ", ".join(map(repr, actors)),
            ", ".join(servers),
        )
