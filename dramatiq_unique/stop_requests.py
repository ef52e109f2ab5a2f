"""What a message of a ``cancel_in_progress`` actor does about requests to stop: it asks the
running holders it meets to stop, and tells of its own cancellation once interrupted (see
:mod:`~dramatiq_unique.cancellation` for the interruption itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dramatiq import Broker
from dramatiq.broker import MessageProxy
from dramatiq.results import Results

from .errors import Cancelled, LockBackendError
from .events import BACKEND_ERROR, CANCELLED
from .keys import RUN

if TYPE_CHECKING:
    from .lock import MessageLock


def ask_to_stop(lock: MessageLock, holders: tuple[str, ...]) -> None:
    """The message of ``lock`` waits in the run lock's line (``cancel_in_progress``): ask the
    running ``holders`` to stop. Never raises: without an answer it waits until they finish."""
    message = lock.message
    try:
        asked = lock.ask_holders_to_stop(holders)
    except LockBackendError as e:
        lock.emit(BACKEND_ERROR, reason="request to stop", error=e)
        lock.logger.warning(
            "Message %r of actor %r could not ask running message %s to stop (lock %r): %s. It waits until they end.",
            message.message_id,
            message.actor_name,
            ", ".join(map(repr, holders)),
            lock.digest,
            e,
        )
        return
    if asked:
        lock.logger.info(
            "Message %r of actor %r asked running message %s to stop (lock %r, strategy %r); it runs once stopped.",
            message.message_id,
            message.actor_name,
            ", ".join(map(repr, asked)),
            lock.digest,
            lock.config.server_strategy.name,
        )


def tell_cancelled(
    broker: Broker, message: MessageProxy, lock: MessageLock, exception: BaseException, by: str | None
) -> None:
    """The message of ``lock`` was interrupted with ``Cancelled``, having been asked to stop
    ``by`` whom: log it, tell the event, and store the error for a Results backend. Never
    raises (it runs in a Dramatiq hook)."""
    try:
        fate = (
            "it had used up its retries, so Dramatiq dead-letters it"
            if message.failed
            else "it is neither retried nor dead-lettered"
        )
        lock.logger.warning(
            "Message %r of actor %r was cancelled while it ran: it was asked to stop by %s while it held lock %r; %s.",
            message.message_id,
            message.actor_name,
            by or "somebody",
            lock.digest,
            fate,
        )
        lock.emit(CANCELLED, lock_kind=RUN, cancelled_by=by)
        _store_error(broker, message, lock.digest, by)
    except Exception:
        lock.logger.exception("What became of cancelled message %r could not be told.", message.message_id)


def _store_error(broker: Broker, message: MessageProxy, digest: str, by: str | None) -> None:
    """Store the error in a Results backend, for an actor that stores results: its caller
    sees ``Cancelled``, not a timeout."""
    for middleware in broker.middleware:
        if not isinstance(middleware, Results):
            continue
        actor = broker.get_actor(message.actor_name)
        store = message.options.get("store_results", actor.options.get("store_results", middleware.store_results))
        if store:
            ttl = message.options.get("result_ttl", actor.options.get("result_ttl", middleware.result_ttl))
            error = Cancelled(
                f"Message {message.message_id} was cancelled: its holder of lock {digest} was asked to stop"
                + (f" by {by}." if by else ".")
            )
            middleware.backend.store_exception(message, error, ttl)
