"""The check of the lock store's eviction policy, at a worker's boot or at the first send.

A Redis that evicts keys when its memory is full drops held locks without a word, and a
duplicate then runs. The check asks the backend once per process, before the first lock
is taken, and says so at WARNING while nothing has been lost yet.
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import groupby

from .backends import EvictionRisk, LockBackend
from .forks import reset_in_child

#: Seconds before a policy that could not be read is read again.
_RETRY_AFTER = 60.0
#: The units of ``maxmemory`` in redis.conf, largest first.
_UNITS = (("gb", 1024**3), ("mb", 1024**2), ("kb", 1024))


class EvictionCheck:
    """Reads the lock store's eviction policy the first time it is called, and logs a WARNING
    for each policy that may evict locks. Later calls cost nothing: the check sits on the
    path of every send.

    Parameters:
      backend(LockBackend): The lock store.
      logger(logging.Logger): Where to report.
    """

    def __init__(self, backend: LockBackend, *, logger: logging.Logger):
        self.backend = backend
        self.logger = logger
        self._done = False
        #: When to read the policy again after a read that failed (monotonic, s), and whether one failed.
        self._retry_at = 0.0
        self._failed = False
        self._mutex = threading.Lock()
        reset_in_child(self._reset_in_child)

    def _reset_in_child(self) -> None:
        # A thread of the parent may have held the mutex at the fork.
        self._mutex = threading.Lock()

    def __call__(self) -> None:
        if self._done or time.monotonic() < self._retry_at:
            return
        with self._mutex:
            if self._done or time.monotonic() < self._retry_at:
                return
            # One read at a time; one a minute while it fails, so a send during an outage costs nothing more.
            self._retry_at = time.monotonic() + _RETRY_AFTER
        try:
            risks = self.backend.eviction_risks()
        except Exception as e:
            # Only advice is lost: an ACL that denies INFO, or a store that is down now, must not
            # stop a worker's boot or a send. No traceback: the send or the heartbeat that meets an
            # outage reports it, and the error names what refused.
            if not self._failed:
                self._failed = True
                self.logger.info(
                    "The lock store's maxmemory-policy could not be read (%s). Make sure it is noeviction: "
                    "a store that evicts keys when its memory is full drops locks, and duplicates run.",
                    e,
                )
            return
        self._done = True
        for policy, same in groupby(sorted(risks, key=lambda r: r.policy), key=lambda r: r.policy):
            self.logger.warning(eviction_warning(policy, list(same)))


def eviction_warning(policy: str, risks: list[EvictionRisk]) -> str:
    """The WARNING for the servers of ``risks``, which all have ``policy``."""
    servers = ", ".join(risk.server for risk in risks)
    sizes = ", ".join(sorted({_size(risk.maxmemory) for risk in risks}))
    if policy.startswith("allkeys-"):
        evicted = "any lock"
    elif policy.startswith("volatile-"):
        evicted = "the locks that expire: every run lock, and the enqueue locks of messages with a lock_ttl"
    else:
        evicted = "locks"
    return (
        f"The lock store's Redis ({servers}) has maxmemory-policy {policy}: when its data reaches maxmemory "
        f"({sizes}), it evicts {evicted}, and a duplicate of the message that held it can be enqueued and run. "
        "Set maxmemory-policy to noeviction (CONFIG SET maxmemory-policy noeviction, and the same in redis.conf; "
        "on a managed service, in its parameter group), or accept the risk with "
        f"RedisBackend(accepted_eviction_policy={policy!r})."
    )


def _size(maxmemory: int) -> str:
    """``maxmemory`` as redis.conf writes it, e.g. ``20mb``."""
    for unit, size in _UNITS:
        if maxmemory % size == 0:
            return f"{maxmemory // size}{unit}"
    return f"{maxmemory} bytes"
