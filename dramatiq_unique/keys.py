"""Lock key names (SPEC S4).

Every key starts with the lock prefix, and the keys of one digest share the
hash tag ``{<digest>}``, so one Lua script can touch both of them on Redis
Cluster.
"""

from __future__ import annotations


def enqueue_key(prefix: str, digest: str) -> str:
    """The key of the lock taken when a message is enqueued."""
    return f"{prefix}:{{{digest}}}"


def run_key(prefix: str, digest: str) -> str:
    """The key of the lock taken while a message runs."""
    return f"{prefix}:{{{digest}}}:run"


def replaced_key(prefix: str, digest: str) -> str:
    """The key of the set of queued messages whose place a newer message took (``replace``)."""
    return f"{prefix}:{{{digest}}}:replaced"
