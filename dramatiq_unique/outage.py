"""What a lock backend outage does: ``on_backend_error`` on each side."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .errors import LockBackendError, LockBackendRetry
from .events import BACKEND_ERROR
from .keys import ENQUEUE, RUN
from .options import ALLOW
from .outcome import AnyMessage

if TYPE_CHECKING:
    from .lock import MessageLock


class Outage:
    """The policy for a lock backend that fails to answer.

    Parameters:
      on_backend_error(str): ``"raise"`` (fail closed) or ``"allow"`` (go on without the lock).
      logger(logging.Logger): Where the failures are reported.
      releases_retried(collections.abc.Callable): Whether this process tries a failed release again.
    """

    def __init__(self, *, on_backend_error: str, logger: logging.Logger, releases_retried: Callable[[], bool]):
        self.allows = on_backend_error == ALLOW
        self.logger = logger
        self.releases_retried = releases_retried

    def failed(self, message: AnyMessage, what: str, error: LockBackendError) -> None:
        """Apply ``on_backend_error``: raise ``error``, or log a warning and let
        the message be ``what`` (enqueued, run) without its lock."""
        if not self.allows:
            if what != "run":
                raise error  # send() raises: the error is the caller's one report
            self.logger.warning(
                "Message %r of actor %r cannot take its lock because the lock backend failed (%s); "
                "Retries tries it again.",
                message.message_id,
                message.actor_name,
                error,
            )
            raise LockBackendRetry(str(error)) from error
        self.logger.warning(
            "Message %r of actor %r is %s without its lock because the lock backend failed "
            "(on_backend_error='allow'): %s",
            message.message_id,
            message.actor_name,
            what,
            error,
        )

    def release(self, release: Callable[[MessageLock], None], lock: MessageLock, when: str) -> None:
        """Call ``release(lock)``; a backend failure is logged, never raised: the
        release is tried again, or the lock's lease, its TTL or the orphan reaper frees it."""
        try:
            release(lock)
        except LockBackendError as e:
            message = lock.message
            lock.emit(BACKEND_ERROR, reason="release", error=e)
            self.logger.warning(
                "The lock of message %r of actor %r could not be released %s: %s. %s",
                message.message_id,
                message.actor_name,
                when,
                e,
                self._what_frees(lock),
                exc_info=self.logger.isEnabledFor(logging.DEBUG),
            )

    def _what_frees(self, lock: MessageLock) -> str:
        """What becomes of a lock whose release just failed."""
        retried = self.releases_retried()
        if lock.failed_release == RUN and lock.liveness is not None:
            period = lock.liveness.lease_period
            lease = f"no longer renewed, the lock's lease frees it within lease_period ({period} ms)"
            if retried:
                return f"This worker tries again at each heartbeat until the lock backend answers; {lease} anyway."
            return f"It is not tried again: {lease}."
        if lock.failed_release == ENQUEUE and retried:
            return (
                "This worker tries again at each heartbeat until the lock backend answers; "
                "the orphan reaper or the lock's lock_ttl frees it if the worker stops first."
            )
        return "The orphan reaper or the lock's lock_ttl frees it."
