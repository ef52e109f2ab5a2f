"""Lock types: when a message takes its locks and when it gives them up."""

from .base import LockType
from .until_and_while_executing import UntilAndWhileExecuting
from .until_executed import UntilExecuted
from .until_executing import UntilExecuting
from .until_expired import UntilExpired
from .while_executing import WhileExecuting

#: Every lock type, by the name given to ``@dramatiq.actor(lock=...)``.
LOCK_TYPES: dict[str, LockType] = {
    lock_type.name: lock_type
    for lock_type in (UntilExecuting(), UntilExecuted(), UntilExpired(), WhileExecuting(), UntilAndWhileExecuting())
}

__all__ = [
    "LOCK_TYPES",
    "LockType",
    "UntilAndWhileExecuting",
    "UntilExecuted",
    "UntilExecuting",
    "UntilExpired",
    "WhileExecuting",
]
