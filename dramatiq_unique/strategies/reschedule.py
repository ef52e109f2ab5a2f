from __future__ import annotations

import dataclasses
import logging
from typing import NoReturn

from dramatiq import Broker
from dramatiq.common import q_name
from dramatiq.middleware import SkipMessage

from ..errors import EnqueueCancelled
from ..events import RESCHEDULED as RESCHEDULED_EVENT
from ..outcome import RESCHEDULED, AnyMessage, EnqueueOutcome, enqueue_outcome, record_outcome
from .base import Conflict, ConflictStrategy
from .reject import Reject


def send_later(
    broker: Broker, message: AnyMessage, *, digest: str, holder: str, reschedules: int, delay: int
) -> NoReturn:
    """Send ``message`` again in ``delay`` ms instead of now, recorded as
    rescheduled: it passes ``before_enqueue`` on its way to the delay queue
    and tries its lock again when it is due.

    Raises:
      EnqueueCancelled: Always, with the message sent to the delay queue.
    """
    record_outcome(message, EnqueueOutcome(status=RESCHEDULED, digest=digest, holder=holder, reschedules=reschedules))
    rescheduled = broker.enqueue(message.copy(queue_name=q_name(message.queue_name)), delay=delay)
    raise EnqueueCancelled("The message was rescheduled.", rescheduled)


class Reschedule(ConflictStrategy):
    """Try again later: the duplicate is enqueued again after
    ``reschedule_delay`` milliseconds, keeping its message_id and any lock it
    holds. It does not use up ``max_retries``; after ``max_reschedules`` it
    is rejected to the dead-letter queue.
    """

    name = "reschedule"

    def on_client_conflict(self, conflict: Conflict) -> None:
        message, config = conflict.message, conflict.lock.config
        reschedules = enqueue_outcome(message).reschedules + 1
        if self._exhausted(conflict, reschedules):
            return Reject().on_client_conflict(conflict)
        delay = max(conflict.delay or 0, config.reschedule_delay)
        self._log(conflict, reschedules, delay)
        conflict.lock.emit(RESCHEDULED_EVENT, holders=conflict.holders, delay=delay)
        send_later(
            conflict.broker,
            message,
            digest=conflict.digest,
            holder=conflict.holders[0],
            reschedules=reschedules,
            delay=delay,
        )

    def on_server_conflict(self, conflict: Conflict) -> None:
        message, config = conflict.message, conflict.lock.config
        outcome = enqueue_outcome(message)
        reschedules = outcome.reschedules + 1
        if self._exhausted(conflict, reschedules):
            return Reject().on_server_conflict(conflict)
        self._log(conflict, reschedules, config.reschedule_delay)
        conflict.lock.emit(RESCHEDULED_EVENT, holders=conflict.holders, delay=config.reschedule_delay)
        # The copy keeps the message_id, so it keeps the enqueue lock the message holds.
        again = message.copy()
        record_outcome(again, dataclasses.replace(outcome, reschedules=reschedules))
        conflict.broker.enqueue(again, delay=config.reschedule_delay)
        raise SkipMessage("The message was rescheduled.")

    def _log(self, conflict: Conflict, reschedules: int, delay: int) -> None:
        conflict.log(logging.INFO, f"is rescheduled in {delay} ms (reschedule {reschedules})", self.name)

    @staticmethod
    def _exhausted(conflict: Conflict, reschedules: int) -> bool:
        limit = conflict.lock.config.max_reschedules
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
        from ..presentation import format_duration

        return f"be rescheduled to try again in {format_duration(reschedule_delay)}"
