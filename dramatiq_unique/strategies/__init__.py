"""Conflict strategies: what becomes of a duplicate (SPEC C1-C8)."""

from .base import CLIENT, SERVER, Conflict, ConflictStrategy
from .log import Log

#: Every conflict strategy, by the name given to ``@dramatiq.actor(on_conflict=...)``.
STRATEGIES: dict[str, ConflictStrategy] = {strategy.name: strategy for strategy in (Log(),)}

__all__ = ["CLIENT", "SERVER", "STRATEGIES", "Conflict", "ConflictStrategy", "Log"]
