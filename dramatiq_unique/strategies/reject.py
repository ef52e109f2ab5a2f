from __future__ import annotations

import logging

from dramatiq.middleware import SkipMessage

from ..events import REJECTED as REJECTED_EVENT
from ..outcome import REJECTED, AnyMessage, EnqueueOutcome, enqueue_outcome, record_outcome
from .base import Conflict, ConflictStrategy


class Reject(ConflictStrategy):
    """Send the duplicate to its queue's dead-letter queue without running it.

    The duplicate is enqueued marked as rejected, holding no lock, and the
    first worker to receive it dead-letters it; the mark, with the holder and
    the reason, stays on the dead message (``enqueue_outcome(dead_message)``).
    On the client ``send()`` returns normally with status ``"rejected"``.
    """

    name = "reject"

    def on_client_conflict(self, conflict: Conflict) -> None:
        conflict.log(logging.WARNING, "goes to the dead-letter queue", self.name)
        mark_rejected(conflict.message, conflict, "lock held at enqueue")

    def on_server_conflict(self, conflict: Conflict) -> None:
        message = conflict.message
        conflict.log(logging.WARNING, "goes to the dead-letter queue", self.name)
        # The dead-letter queue keeps the payload as it was enqueued, so the
        # mark can only reach it on a copy that goes round once more.
        conflict.release_enqueue_lock()
        rejected = message.copy()
        mark_rejected(rejected, conflict, "lock held at start")
        conflict.broker.enqueue(rejected)
        raise SkipMessage("The message was rejected as a duplicate.")

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        return "go to the dead-letter queue without running"


def mark_rejected(message: AnyMessage, conflict: Conflict, reason: str) -> None:
    conflict.emit(REJECTED_EVENT, holders=conflict.holders, reason=reason)
    record_outcome(
        message,
        EnqueueOutcome(
            status=REJECTED,
            digest=conflict.digest,
            holder=conflict.holders[0],
            reschedules=enqueue_outcome(message).reschedules,
            reason=f"{reason} by message {conflict.holders[0]}",
        ),
    )
