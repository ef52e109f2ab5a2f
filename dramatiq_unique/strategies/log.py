from __future__ import annotations

from dramatiq.middleware import SkipMessage

from ..errors import EnqueueCancelled
from ..outcome import DUPLICATE, EnqueueOutcome, record_outcome
from .base import ConflictStrategy


class Log(ConflictStrategy):
    """Drop the duplicate with one INFO line (SPEC C1); the default.

    On the client ``send()`` returns normally and the returned message's
    :func:`~dramatiq_unique.enqueue_outcome` names the holder. In the worker
    the duplicate is acked without running.
    """

    name = "log"

    def on_client_conflict(self, conflict):
        message = conflict.message
        conflict.logger.info(
            "Message %r of actor %r was not enqueued: lock %r is held by message %s (strategy %r).",
            message.message_id,
            message.actor_name,
            conflict.digest,
            conflict.holders_text,
            self.name,
        )
        record_outcome(message, EnqueueOutcome(status=DUPLICATE, digest=conflict.digest, holder=conflict.holders[0]))
        raise EnqueueCancelled("The message is a duplicate and was not enqueued.", message)

    def on_server_conflict(self, conflict):
        message = conflict.message
        conflict.logger.info(
            "Message %r of actor %r was dropped without running: lock %r is held by message %s (strategy %r).",
            message.message_id,
            message.actor_name,
            conflict.digest,
            conflict.holders_text,
            self.name,
        )
        raise SkipMessage("The message is a duplicate of a running message.")
