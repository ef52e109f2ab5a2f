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


def outlives_message(lock: object) -> bool:
    """Whether the lock type named ``lock`` (a holder's recorded ``lock``) is meant to outlive
    its message (``until_expired``): no step frees it when its message is gone."""
    lock_type = LOCK_TYPES.get(str(lock))
    return lock_type is not None and lock_type.outlives_message


__all__ = [
    "LOCK_TYPES",
    "LockType",
    "UntilAndWhileExecuting",
    "UntilExecuted",
    "UntilExecuting",
    "UntilExpired",
    "WhileExecuting",
]
