from __future__ import annotations

from ..errors import DuplicateMessage, LockConflict
from .base import ConflictStrategy


class Raise(ConflictStrategy):
    """Make the duplicate an error (SPEC C2).

    On the client ``send()`` raises :class:`~dramatiq_unique.DuplicateMessage`.
    In the worker :class:`~dramatiq_unique.LockConflict` takes Dramatiq's
    exception path: Retries retries the message with backoff, and it counts
    against ``max_retries``.
    """

    name = "raise"

    def on_client_conflict(self, conflict):
        message = conflict.message
        conflict.logger.info(
            "Message %r of actor %r was not enqueued: lock %r is held by message %s (strategy 'raise').",
            message.message_id,
            message.actor_name,
            conflict.digest,
            conflict.holders_text,
        )
        raise DuplicateMessage(
            f"Actor {message.actor_name!r} already has a message holding lock {conflict.digest!r}: "
            f"message {conflict.holders[0]!r}.",
            digest=conflict.digest,
            holder=conflict.holders[0],
        )

    def on_server_conflict(self, conflict):
        message = conflict.message
        conflict.logger.info(
            "Message %r of actor %r will be retried: lock %r is held by message %s (strategy 'raise').",
            message.message_id,
            message.actor_name,
            conflict.digest,
            conflict.holders_text,
        )
        raise LockConflict(
            f"Lock {conflict.digest!r} of actor {message.actor_name!r} is held by message {conflict.holders[0]!r}.",
            digest=conflict.digest,
            holder=conflict.holders[0],
        )
