from __future__ import annotations

import logging

from ..errors import DuplicateMessage, LockConflict
from .base import CLIENT, Conflict, ConflictStrategy


class Raise(ConflictStrategy):
    """Make the duplicate an error.

    On the client ``send()`` raises :class:`~dramatiq_unique.DuplicateMessage`.
    In the worker :class:`~dramatiq_unique.LockConflict` takes Dramatiq's
    exception path: Retries retries the message with backoff, and it counts
    against ``max_retries``.
    """

    name = "raise"
    fails_send = True

    def on_client_conflict(self, conflict: Conflict) -> None:
        conflict.log(logging.INFO, "was not enqueued", self.name)
        raise DuplicateMessage(self._reason(conflict), digest=conflict.digest, holder=conflict.holders[0])

    def on_server_conflict(self, conflict: Conflict) -> None:
        conflict.log(logging.INFO, "will be retried", self.name)
        raise LockConflict(self._reason(conflict), digest=conflict.digest, holder=conflict.holders[0])

    @staticmethod
    def _reason(conflict: Conflict) -> str:
        return (
            f"Lock {conflict.digest!r} of actor {conflict.message.actor_name!r} "
            f"is held by message {conflict.holders[0]!r}."
        )

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        return "make send() raise DuplicateMessage" if side == CLIENT else "fail with LockConflict, to be retried"
