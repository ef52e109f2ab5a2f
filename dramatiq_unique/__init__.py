"""Job-uniqueness locks for Dramatiq."""

from .activity import ActivityReport, MinuteActivity, read_activity
from .backends import LockBackend, RedisBackend, StubBackend
from .current import HeldLock, current_lock, require_current_lock
from .errors import (
    Cancelled,
    DuplicateMessage,
    EnqueueCancelled,
    InvalidBackendOptions,
    InvalidLockOptions,
    LineNeedsBroker,
    LockArgumentsError,
    LockBackendError,
    LockBackendRetry,
    LockConflict,
    LockStoreHealing,
    NewerLockFormat,
    NoLockHeld,
    UniqueError,
)
from .events import EVENT_KINDS, LockEvent
from .held import ConflictInfo, Explanation, HolderInfo, LockInfo, WorkerInfo
from .middleware import UniqueJobs
from .operations import Locks
from .outcome import EnqueueOutcome, enqueue_outcome, record_outcome
from .reaper import ReapReport, reap_orphans
from .strategies import ConflictStrategy, register_strategy
from .version import __version__

__all__ = [
    "__version__",
    # Middleware
    "UniqueJobs",
    # Backends
    "LockBackend",
    "RedisBackend",
    "StubBackend",
    # Conflict strategies
    "ConflictStrategy",
    "register_strategy",
    "record_outcome",
    # Inside and around actors
    "HeldLock",
    "current_lock",
    "require_current_lock",
    "EnqueueOutcome",
    "enqueue_outcome",
    # Operations
    "Locks",
    "LockInfo",
    "HolderInfo",
    "WorkerInfo",
    "Explanation",
    "ConflictInfo",
    # Crash safety
    "ReapReport",
    "reap_orphans",
    # Events and activity
    "EVENT_KINDS",
    "LockEvent",
    "ActivityReport",
    "MinuteActivity",
    "read_activity",
    # Errors
    "UniqueError",
    "InvalidLockOptions",
    "InvalidBackendOptions",
    "LockArgumentsError",
    "LockBackendError",
    "LockBackendRetry",
    "DuplicateMessage",
    "LockConflict",
    "LockStoreHealing",
    "NewerLockFormat",
    "LineNeedsBroker",
    "NoLockHeld",
    "EnqueueCancelled",
    "Cancelled",
]
