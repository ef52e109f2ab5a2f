"""Prometheus counters of lock events, for ``UniqueJobs(..., metrics=True)``.

They are built as one subscriber of the lock events, with the labels
``queue_name`` and ``actor_name`` of Dramatiq's own metrics (never a digest:
one series per lock would grow without bound).

``prometheus_client`` decides when it is first imported whether values go to
the files of its multiprocess mode, which Dramatiq's ``Prometheus``
middleware switches on in each worker process after it boots. So with the
default registry, the counters are built, and ``prometheus_client``
imported, only once the worker boots, or at the first event: then they land
in the files that middleware's endpoint reads.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Any

from dramatiq import Broker, Middleware

from .events import (
    ACQUIRED,
    BACKEND_ERROR,
    CANCELLED,
    CONFLICT,
    DATA_LOST,
    HANDED_OVER,
    LEASE_LOST,
    REAPED,
    RELEASED,
    WAITING,
    LockEvent,
)
from .forks import reset_in_child

#: Each counter: the event kind it counts, its name, its help and its labels beyond queue and actor.
COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    ACQUIRED: ("dramatiq_unique_acquisitions", "The number of places taken in locks.", ()),
    CONFLICT: (
        "dramatiq_unique_conflicts",
        "The number of messages that met a lock held by others, by side and conflict strategy.",
        ("side", "strategy"),
    ),
    RELEASED: ("dramatiq_unique_releases", "The number of places given up in locks.", ()),
    REAPED: ("dramatiq_unique_reaped", "The number of orphaned lock places released by the orphan reaper.", ()),
    BACKEND_ERROR: ("dramatiq_unique_backend_errors", "The number of failed calls to the lock backend.", ()),
    DATA_LOST: (
        "dramatiq_unique_data_losses",
        "The number of times this process found that the lock store had lost its data.",
        (),
    ),
    LEASE_LOST: (
        "dramatiq_unique_leases_lost",
        "The number of run locks that lapsed while their message was running.",
        (),
    ),
    WAITING: (
        "dramatiq_unique_waits",
        "The number of messages that joined a lock's line, by side: less handoffs, those in line.",
        ("side",),
    ),
    HANDED_OVER: (
        "dramatiq_unique_handoffs",
        "The number of messages that waited in a lock's line and were handed a place.",
        (),
    ),
    CANCELLED: (
        "dramatiq_unique_cancellations",
        "The number of running messages interrupted because their holder was asked to stop.",
        (),
    ),
}

#: The counter of the messages waiting in lines that a loss of the store's data took (data_lost's
#: ``waiting_lost``), by the name it is built under beside the counters of the event kinds.
LOST_WAITING = "lost_waiting"
LOST_WAITING_COUNTER = (
    "dramatiq_unique_lost_waiting_messages",
    "The number of messages this process parked in the lines of run locks that a loss of the lock store's data took.",
)

#: The counters built in each registry: a registry refuses a second counter of a name.
_BUILT: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_BUILT_MUTEX = threading.Lock()


def _reset_built_mutex_in_child() -> None:
    global _BUILT_MUTEX
    _BUILT_MUTEX = threading.Lock()


reset_in_child(_reset_built_mutex_in_child)


class PrometheusMetrics:
    """The subscriber that counts lock events in Prometheus counters.

    Parameters:
      registry(CollectorRegistry): Where the counters are registered; ``None``
        for prometheus_client's default registry, built on first use.
    """

    #: The event kinds it counts.
    kinds = frozenset(COUNTERS)

    def __init__(self, registry: Any = None):
        self._registry = registry
        self._counters: dict[str, Any] | None = None
        self._mutex = threading.Lock()
        reset_in_child(self._reset_in_child)
        if registry is not None:
            self.setup()

    def _reset_in_child(self) -> None:
        # A thread of the parent may have held the mutex at the fork (building the counters).
        self._mutex = threading.Lock()

    def setup(self) -> dict[str, Any]:
        """Build the counters (once) and return them by event kind."""
        with self._mutex:
            if self._counters is None:
                import prometheus_client

                registry = self._registry if self._registry is not None else prometheus_client.REGISTRY
                with _BUILT_MUTEX:
                    counters = _BUILT.get(registry)
                    if counters is None:
                        counters = _BUILT[registry] = {
                            kind: prometheus_client.Counter(
                                name, documentation, ["queue_name", "actor_name", *labels], registry=registry
                            )
                            for kind, (name, documentation, labels) in COUNTERS.items()
                        }
                        counters[LOST_WAITING] = prometheus_client.Counter(
                            *LOST_WAITING_COUNTER, ["queue_name", "actor_name"], registry=registry
                        )
                self._counters = counters
            return self._counters

    def __call__(self, event: LockEvent) -> None:
        counters = self._counters or self.setup()
        counter = counters[event.kind]
        if event.kind == CONFLICT:
            counter.labels(event.queue_name, event.actor_name, event.side or "", event.strategy or "").inc()
        elif event.kind == WAITING:
            counter.labels(event.queue_name, event.actor_name, event.side or "").inc()
        else:
            counter.labels(event.queue_name, event.actor_name).inc()
        if event.kind == DATA_LOST and event.waiting_lost:
            counters[LOST_WAITING].labels(event.queue_name, event.actor_name).inc(event.waiting_lost)


def warn_if_prometheus_follows(broker: Broker, unique: Middleware, logger: logging.Logger) -> None:
    """Warn when Dramatiq's ``Prometheus`` middleware comes after ``unique``
    on ``broker``: its in-progress gauge then goes negative, as every message
    that ``unique`` skips or reschedules before it starts is counted as
    finished without having been counted as started."""
    module = sys.modules.get("dramatiq.middleware.prometheus")
    if module is None:  # never imported, so not on any broker
        return
    middleware = broker.middleware
    following = [m for m in middleware[middleware.index(unique) + 1 :] if isinstance(m, module.Prometheus)]
    if following:
        logger.warning(
            "Dramatiq's Prometheus middleware comes after UniqueJobs on this broker, so its gauge "
            "dramatiq_messages_inprogress goes below zero for every message UniqueJobs skips or reschedules "
            "before it starts. Add Prometheus before UniqueJobs: "
            "broker.add_middleware(Prometheus(), before=UniqueJobs)."
        )
