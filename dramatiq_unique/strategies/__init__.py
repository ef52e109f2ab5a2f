"""Conflict strategies: what becomes of a duplicate."""

from .base import CLIENT, SERVER, Conflict, ConflictStrategy
from .cancel import CancelInProgress
from .log import Log
from .raise_ import Raise
from .reject import Reject
from .replace import Replace
from .reschedule import Reschedule
from .wait import KeepLatest, Wait

#: Every conflict strategy, by the name given to ``@dramatiq.actor(on_conflict=...)``.
STRATEGIES: dict[str, ConflictStrategy] = {
    strategy.name: strategy
    for strategy in (Log(), Raise(), Reject(), Replace(), Reschedule(), Wait(), KeepLatest(), CancelInProgress())
}


def register_strategy(strategy: ConflictStrategy) -> None:
    """Make a strategy of your own usable by name in ``on_conflict``.

    Register it before declaring the actors that name it.

    Raises:
      ValueError: If a strategy of that name is registered already.
    """
    if strategy.name in STRATEGIES:
        raise ValueError(f"A conflict strategy named {strategy.name!r} is registered already.")
    STRATEGIES[strategy.name] = strategy


__all__ = [
    "CLIENT",
    "SERVER",
    "STRATEGIES",
    "CancelInProgress",
    "Conflict",
    "ConflictStrategy",
    "KeepLatest",
    "Log",
    "Raise",
    "Reject",
    "Replace",
    "Reschedule",
    "Wait",
    "register_strategy",
]
