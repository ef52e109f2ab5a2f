"""Conflicts as both sides meet them: which strategy deals with one, and what it is told."""

from __future__ import annotations

from dramatiq import Broker

from .backends import Acquisition
from .calls import message_call
from .events import WAITING
from .keys import ENQUEUE, RUN
from .lock import MessageLock
from .outcome import AnyMessage, has_followers
from .strategies import CLIENT, Conflict, ConflictStrategy, Reschedule

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


def waited_in_line(lock: MessageLock, acquisition: Acquisition, side: str) -> None:
    """Tell that the message of ``lock`` waits in its lock's line, as ``acquisition`` answered:
    one INFO line, the only one of a message that waits in the worker (see ``skip_log``)."""
    message, strategy = lock.message, lock.config.client_strategy if side == CLIENT else lock.config.server_strategy
    kind, then = ("enqueue", "is enqueued") if side == CLIENT else ("run", "runs")
    displaced = (
        f"; it took the line position of message {acquisition.displaced!r}, which is dropped"
        if acquisition.displaced
        else ""
    )
    holders = acquisition.holders
    behind = (
        ("holder " if len(holders) == 1 else "holders ") + ", ".join(map(repr, holders))
        if holders
        else "the messages ahead of it"
    )
    lock.logger.info(
        "Message %s waits in line for the %s lock %s at position %d (1 is next), behind %s: it %s when a "
        "slot frees up (strategy %r, message id %r)%s.",
        message_call(message),
        kind,
        lock.digest,
        acquisition.waiting,
        behind,
        then,
        strategy.name,
        message.message_id,
        displaced,
    )
    lock.emit(
        WAITING,
        lock_kind=ENQUEUE if side == CLIENT else RUN,
        side=side,
        strategy=strategy.name,
        holders=acquisition.holders,
        replaced=acquisition.displaced,
    )
