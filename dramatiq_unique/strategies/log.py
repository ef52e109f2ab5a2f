from __future__ import annotations

import logging

from dramatiq.middleware import SkipMessage

from ..errors import EnqueueCancelled
from ..outcome import DUPLICATE, EnqueueOutcome, record_outcome
from .base import CLIENT, Conflict, ConflictStrategy


class Log(ConflictStrategy):
    """Drop the duplicate with one INFO line; the default.

    On the client ``send()`` returns normally and the returned message's
    :func:`~dramatiq_unique.enqueue_outcome` names the holder. In the worker
    the duplicate is acked without running.
    """

    name = "log"
    drops_duplicates = True

    def on_client_conflict(self, conflict: Conflict) -> None:
        message = conflict.message
        conflict.log(logging.INFO, "was not enqueued", self.name)
        record_outcome(message, EnqueueOutcome(status=DUPLICATE, digest=conflict.digest, holder=conflict.holders[0]))
        raise EnqueueCancelled("The message is a duplicate and was not enqueued.", message)

    def on_server_conflict(self, conflict: Conflict) -> None:
        conflict.log(logging.INFO, "was dropped without running", self.name)
        raise SkipMessage("The message is a duplicate of a running message.")

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        return "be dropped" if side == CLIENT else "be dropped without running"
