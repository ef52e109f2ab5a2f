"""Lock backends: where locks are stored."""

from .base import (
    Acquisition,
    EvictionRisk,
    Holder,
    Lease,
    LockBackend,
    LockRecord,
    MessagesInHand,
    StopRequested,
    Waiter,
)
from .redis import RedisBackend
from .stub import StubBackend

__all__ = [
    "Acquisition",
    "EvictionRisk",
    "Holder",
    "Lease",
    "LockBackend",
    "LockRecord",
    "MessagesInHand",
    "StopRequested",
    "Waiter",
    "RedisBackend",
    "StubBackend",
]
