"""What happened to a message at enqueue time (SPEC C6)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dramatiq import Message

#: The message option that carries the outcome of the enqueue lock. It travels
#: with the message, so the worker knows the digest and that it holds the lock.
OUTCOME_OPTION = "unique_lock"

#: The message was enqueued; it holds its enqueue lock, if its lock type takes one.
ENQUEUED = "enqueued"
#: The message was not enqueued: another message holds the lock.
DUPLICATE = "duplicate"


@dataclass(frozen=True)
class EnqueueOutcome:
    """What ``send()`` did with a message.

    Parameters:
      status(str): ``"enqueued"`` or ``"duplicate"``.
      digest(str): The lock's digest; ``None`` when the message took no enqueue lock.
      holder(str): The message_id that holds the lock: the message itself when
        it was enqueued, the earlier message when this one is a duplicate.
      token(int): The fencing token of the enqueue lock, when enqueued.
      expires_at(int): When the enqueue lock lapses (ms of the backend's clock),
        ``None`` when it does not.
    """

    status: str
    digest: str | None = None
    holder: str | None = None
    token: int | None = None
    expires_at: int | None = None

    @property
    def enqueued(self) -> bool:
        """Whether the message went onto its queue."""
        return self.status == ENQUEUED


def enqueue_outcome(message: Message[Any]) -> EnqueueOutcome:
    """Tell what ``send()`` did with the message it returned.

    Examples:
      >>> message = settle_payment.send("evt_123")
      >>> outcome = enqueue_outcome(message)
      >>> if not outcome.enqueued:
      ...     print("already being handled by", outcome.holder)

    A message whose lock type takes no enqueue lock (or that has no lock)
    reports ``"enqueued"`` with no digest.
    """
    recorded = message.options.get(OUTCOME_OPTION)
    if not recorded:
        return EnqueueOutcome(status=ENQUEUED, holder=message.message_id)
    status = recorded["status"]
    return EnqueueOutcome(
        status=status,
        digest=recorded["digest"],
        holder=recorded["holder"],
        token=recorded.get("token"),
        expires_at=recorded.get("expires_at"),
    )


def record_outcome(message: Message[Any], outcome: EnqueueOutcome) -> None:
    """Write ``outcome`` into the message's options."""
    recorded: dict[str, Any] = {"status": outcome.status, "digest": outcome.digest, "holder": outcome.holder}
    if outcome.token is not None:
        recorded["token"] = outcome.token
    if outcome.expires_at is not None:
        recorded["expires_at"] = outcome.expires_at
    message.options[OUTCOME_OPTION] = recorded
