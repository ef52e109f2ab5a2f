from __future__ import annotations

import dataclasses
import logging

from dramatiq.middleware import SkipMessage

from ..events import RESCHEDULED as RESCHEDULED_EVENT
from ..outcome import enqueue_outcome, record_outcome, send_later
from ..presentation import format_duration
from .base import Conflict, ConflictStrategy
from .reject import Reject


class Reschedule(ConflictStrategy):
    """Try again later: the duplicate is enqueued again after
    ``reschedule_delay`` milliseconds, keeping its message_id and any lock it
    holds. It does not use up ``max_retries``; after ``max_reschedules`` it
    is rejected to the dead-letter queue.
    """

    name = "reschedule"

    def on_client_conflict(self, conflict: Conflict) -> None:
        message = conflict.message
        reschedules = enqueue_outcome(message).reschedules + 1
        if self._exhausted(conflict, reschedules):
            return Reject().on_client_conflict(conflict)
        delay = max(conflict.delay or 0, conflict.reschedule_delay)
        self._log(conflict, reschedules, delay)
        conflict.emit(RESCHEDULED_EVENT, holders=conflict.holders, delay=delay)
        send_later(
            conflict.broker,
            message,
            digest=conflict.digest,
            holder=conflict.holders[0],
            reschedules=reschedules,
            delay=delay,
        )

    def on_server_conflict(self, conflict: Conflict) -> None:
        message, delay = conflict.message, conflict.reschedule_delay
        outcome = enqueue_outcome(message)
        reschedules = outcome.reschedules + 1
        if self._exhausted(conflict, reschedules):
            return Reject().on_server_conflict(conflict)
        self._log(conflict, reschedules, delay)
        conflict.emit(RESCHEDULED_EVENT, holders=conflict.holders, delay=delay)
        # The copy keeps the message_id, so it keeps the enqueue lock the message holds.
        again = message.copy()
        record_outcome(again, dataclasses.replace(outcome, reschedules=reschedules))
        conflict.broker.enqueue(again, delay=delay)
        raise SkipMessage("The message was rescheduled.")

    def _log(self, conflict: Conflict, reschedules: int, delay: int) -> None:
        conflict.log(logging.INFO, f"is rescheduled in {delay} ms (reschedule {reschedules})", self.name)

    @staticmethod
    def _exhausted(conflict: Conflict, reschedules: int) -> bool:
        limit = conflict.max_reschedules
        if limit is None or reschedules <= limit:
            return False
        conflict.logger.warning(
            "Message %r of actor %r was rescheduled %d times (max_reschedules) and is rejected.",
            conflict.message.message_id,
            conflict.message.actor_name,
            limit,
        )
        return True

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        if max_reschedules == 0:
            # The first conflict is one reschedule too many already.
            return Reject().explain(side, reschedule_delay=reschedule_delay, max_reschedules=max_reschedules)
        return f"be rescheduled to try again in {format_duration(reschedule_delay)}"
