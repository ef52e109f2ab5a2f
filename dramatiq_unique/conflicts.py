"""Conflicts as both sides meet them: which strategy deals with one, and what it is told."""

from __future__ import annotations

from dramatiq import Broker

from .lock import MessageLock
from .outcome import AnyMessage, has_followers
from .strategies import Conflict, ConflictStrategy, Reschedule

#: What becomes of a message that must not be dropped and cannot take its lock
#: now: a redelivery meeting its own earlier attempt, a message that a group or
#: a pipeline waits for, a message that Dramatiq itself enqueues.
TRY_AGAIN = Reschedule()


def strategy_for(message: AnyMessage, strategy: ConflictStrategy) -> ConflictStrategy:
    """The strategy that deals with a conflict of ``message``, whose options name ``strategy``."""
    # A group or a pipeline waits for this message: dropping it would leave the
    # group incomplete and stop the pipeline, so it waits for the lock instead.
    if strategy.drops_duplicates and has_followers(message):
        return TRY_AGAIN
    return strategy


def conflict_of(
    lock: MessageLock, *, broker: Broker, holders: tuple[str, ...], side: str, delay: int | None = None
) -> Conflict:
    """What a strategy is told about the message of ``lock``, which met ``holders``."""
    config = lock.config
    return Conflict(
        broker=broker,
        message=lock.message,
        digest=lock.digest,
        holders=holders,
        side=side,
        logger=lock.logger,
        delay=delay,
        reschedule_delay=config.reschedule_delay,
        max_reschedules=config.max_reschedules,
        emit=lock.emit,
        release_enqueue_lock=lock.release_enqueue,
    )
