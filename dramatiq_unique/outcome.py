"""What happened to a message at enqueue time."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, NoReturn

from dramatiq import Broker, Message
from dramatiq.broker import MessageProxy
from dramatiq.common import q_name

from .errors import EnqueueCancelled
from .frozen import frozen_instance

#: A message as sent (``Message``) or as a worker processes it (``MessageProxy``).
AnyMessage = Message[Any] | MessageProxy

#: The message option that carries the outcome of the enqueue lock. It travels
#: with the message, so the worker knows the digest and that it holds the lock.
OUTCOME_OPTION = "unique_lock"

#: The message was enqueued; it holds its enqueue lock, if its lock type takes one.
ENQUEUED = "enqueued"
#: The message was not enqueued: another message holds the lock (``log``).
DUPLICATE = "duplicate"
#: The message goes to its queue's dead-letter queue without running (``reject``).
REJECTED = "rejected"
#: The message was enqueued with a delay, to try the lock again then (``reschedule``).
RESCHEDULED = "rescheduled"
#: The message was enqueued without its lock: the lock backend failed and
#: ``on_backend_error`` is ``"allow"``.
UNLOCKED = "unlocked"
#: The message waits in the lock's line, to be enqueued when it is handed a place
#: (``wait``, ``keep_latest``).
WAITING = "waiting"

#: The message options of Dramatiq's pipelines and groups that something waits for.
_FOLLOWER_OPTIONS = ("pipe_target", "group_completion_uuid")


@dataclass(frozen=True)
class EnqueueOutcome:
    """What ``send()`` did with a message.

    Parameters:
      status(str): ``"enqueued"``, ``"duplicate"`` (dropped), ``"rejected"``
        (on its way to the dead-letter queue), ``"rescheduled"`` (it tries
        the lock again after ``reschedule_delay``), ``"unlocked"`` (enqueued
        without its lock because the lock backend failed and
        ``on_backend_error`` is ``"allow"``) or ``"waiting"`` (in the lock's line:
        it is enqueued when a place frees up).
      holder(str): The message_id that holds the lock: the message itself when
        it was enqueued (or when the lock backend could not tell), the earlier
        message otherwise.
      digest(str): The lock's digest; ``None`` when the actor has no lock.
      token(int): The fencing token of the enqueue lock, when enqueued.
      expires_at(int): When the enqueue lock lapses (ms of the backend's clock),
        ``None`` when it does not.
      replaced(str): The message_id of the queued message whose place this one
        took (``replace``); it is skipped when it reaches a worker. For a waiting
        message, the one whose place in the line it took (``keep_latest``), which is dropped.
      reschedules(int): How often the message was rescheduled so far.
      reason(str): Why a rejected message goes to the dead-letter queue.
      position(int): A waiting message's place in the line when it joined (1 is next).
      line(str): The lock whose line a waiting message is in: ``"enqueue"`` or ``"run"``.
      handoff(int): The token of the place the line handed the message: only the copy of it
        enqueued with that token may take that place and start.
    """

    status: str
    holder: str
    digest: str | None = None
    token: int | None = None
    expires_at: int | None = None
    replaced: str | None = None
    reschedules: int = 0
    reason: str | None = None
    position: int | None = None
    line: str | None = None
    handoff: int | None = None

    @property
    def enqueued(self) -> bool:
        """Whether the message went onto its queue, and so will run. Its status
        says whether it holds its lock (``"enqueued"``) or not (``"unlocked"``)."""
        return self.status in (ENQUEUED, UNLOCKED)


#: Every field of an EnqueueOutcome, with its default (``None`` for those without one): an outcome is
#: read for every send and every message a worker processes, and built from these.
_UNRECORDED: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in fields(EnqueueOutcome)}


def enqueue_outcome(message: AnyMessage) -> EnqueueOutcome:
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
    if not isinstance(recorded, dict) or not recorded.get("status"):
        return frozen_instance(EnqueueOutcome, {**_UNRECORDED, "status": ENQUEUED, "holder": message.message_id})
    values = {**_UNRECORDED, **recorded}
    if len(values) > len(_UNRECORDED):  # names that are no field, written by another version: left out
        values = {name: values[name] for name in _UNRECORDED}
    if not values["holder"]:
        values["holder"] = message.message_id
    return frozen_instance(EnqueueOutcome, values)


def plain_message(message: AnyMessage) -> Message[Any]:
    """The message itself, out of a worker's proxy, which looks up each attribute read through it."""
    return message._message if isinstance(message, MessageProxy) else message


def has_followers(message: AnyMessage) -> bool:
    """Whether a pipeline's next step or a group's completion callbacks wait for the message."""
    return any(message.options.get(name) for name in _FOLLOWER_OPTIONS)


def record_outcome(message: AnyMessage, outcome: EnqueueOutcome) -> None:
    """Record what became of ``message`` at enqueue, for :func:`enqueue_outcome` to tell.

    A conflict strategy of your own that drops the duplicate on the client side records
    its outcome before it raises :class:`~dramatiq_unique.EnqueueCancelled`: otherwise
    :func:`enqueue_outcome` reports the message that ``send()`` returned as
    ``"enqueued"``. The outcome travels in the message's options.

    Examples:
      >>> duplicate = EnqueueOutcome(
      ...     status="duplicate", digest=conflict.digest, holder=conflict.holders[0]
      ... )
      >>> record_outcome(conflict.message, duplicate)

    Parameters:
      message(dramatiq.Message): The message, as sent or as a worker processes it.
      outcome(EnqueueOutcome): What became of it.
    """
    record(
        message,
        status=outcome.status,
        digest=outcome.digest,
        holder=outcome.holder,
        token=outcome.token,
        expires_at=outcome.expires_at,
        replaced=outcome.replaced,
        reschedules=outcome.reschedules,
        reason=outcome.reason,
        position=outcome.position,
        line=outcome.line,
        handoff=outcome.handoff,
    )


def record(
    message: AnyMessage,
    *,
    status: str,
    digest: str | None,
    holder: str,
    token: int | None = None,
    expires_at: int | None = None,
    replaced: str | None = None,
    reschedules: int = 0,
    reason: str | None = None,
    position: int | None = None,
    line: str | None = None,
    handoff: int | None = None,
) -> None:
    """Write the outcome with these fields (see :class:`EnqueueOutcome`) into the message's
    options, without building it: every send records one. Fields that are not set are left out."""
    recorded: dict[str, Any] = {"status": status, "digest": digest, "holder": holder}
    if token is not None:
        recorded["token"] = token
    if expires_at is not None:
        recorded["expires_at"] = expires_at
    if replaced is not None:
        recorded["replaced"] = replaced
    if reason is not None:
        recorded["reason"] = reason
    if position is not None:
        recorded["position"] = position
    if line is not None:
        recorded["line"] = line
    if handoff is not None:
        recorded["handoff"] = handoff
    if reschedules:
        recorded["reschedules"] = reschedules
    message.options[OUTCOME_OPTION] = recorded


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
