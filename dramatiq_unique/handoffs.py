"""Enqueueing the messages that a lock's line handed a place.

The step that frees a place in a lock (a release, a start, the reaper) hands it,
in the same round trip, to the first message waiting in the lock's line, and
answers that message; :class:`Handoffs` enqueues it at once, in the thread that
took the step. A process that dies in between leaves the place to the message,
which stays recorded among the waiters: the orphan reaper enqueues it again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from dramatiq import Broker, Message
from dramatiq.common import q_name

from .events import HANDED_OVER, Events, LockEvent
from .outcome import enqueue_outcome, record_outcome

__all__ = ["Handoffs", "handed_message"]


def handed_message(handed: bytes) -> Message[Any]:
    """The message a line handed a place, stamped with the token of that place: only this copy
    of it may take the place (the backend's ``handoffs`` get ``b"<token>\\n<encoded message>"``)."""
    token, _, encoded = handed.partition(b"\n")
    message: Message[Any] = Message.decode(encoded)
    record_outcome(message, dataclasses.replace(enqueue_outcome(message), handoff=int(token)))
    return message


class Handoffs:
    """Enqueues each message that waited in line and was handed a place (the backend's ``handoffs``).

    Parameters:
      broker(dramatiq.Broker): Where the messages go.
      logger(logging.Logger): Where a message that cannot be enqueued is reported.
      events(Events): Where each handoff is told.
    """

    def __init__(self, broker: Broker, *, logger: logging.Logger, events: Events):
        self.broker = broker
        self.logger = logger
        self.events = events

    def __call__(self, messages: list[bytes]) -> None:
        """Enqueue ``messages`` (each ``b"<token>\\n<encoded message>"``), in order. Never raises: it
        runs inside the steps that free places."""
        for handed in messages:
            try:
                message = handed_message(handed)
            except Exception as e:
                self.logger.error("A message handed a place by a lock's line cannot be decoded, and waits: %s", e)
                continue
            try:
                self.broker.enqueue(message)
            except Exception as e:
                self.logger.warning(
                    "Message %r of actor %r, handed a place by the line it waited in, could not be enqueued (%s): "
                    "it keeps its place, and the orphan reaper enqueues it.",
                    message.message_id,
                    message.actor_name,
                    e,
                )
                continue
            self._tell(message)

    def _tell(self, message: Message[Any]) -> None:
        outcome = enqueue_outcome(message)
        self.events.notify(
            HANDED_OVER,
            message.actor_name,
            lambda: LockEvent(
                kind=HANDED_OVER,
                actor_name=message.actor_name,
                queue_name=q_name(message.queue_name),
                digest=outcome.digest,
                message_id=message.message_id,
                lock_kind=outcome.line,
            ),
        )
