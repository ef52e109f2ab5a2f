"""The crash-safety options of the middleware, and the backend outage policy. :class:`UniqueJobs` inherits it."""

from __future__ import annotations

from typing import Any

from .errors import InvalidLockOptions, LockBackendError, LockBackendRetry
from .outcome import AnyMessage

#: ``on_backend_error`` values: fail closed, or fail open.
RAISE = "raise"
ALLOW = "allow"


def check_crash_options(
    *, lease_period: Any, heartbeat_interval: Any, on_backend_error: Any, reaper_interval: Any
) -> None:
    """Validate the middleware's crash-safety options.

    Raises:
      InvalidLockOptions: Naming the option, the bad value and what it must be.
    """

    def integer(name: str, value: Any, minimum: int, optional: bool = False) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InvalidLockOptions(
                f"UniqueJobs has an invalid {name}={value!r}: it must be an integer >= {minimum} (milliseconds)"
                + (" or None." if optional else ".")
            )

    integer("lease_period", lease_period, 3)
    integer("heartbeat_interval", heartbeat_interval, 1)
    integer("reaper_interval", reaper_interval, 1, optional=True)
    if heartbeat_interval * 3 > lease_period:
        raise InvalidLockOptions(
            f"UniqueJobs has heartbeat_interval={heartbeat_interval!r} and lease_period={lease_period!r}: "
            "the heartbeat interval must be at most a third of the lease period, so that a live worker "
            "renews its run locks before they lapse."
        )
    if on_backend_error not in (RAISE, ALLOW):
        raise InvalidLockOptions(
            f"UniqueJobs has an invalid on_backend_error={on_backend_error!r}: "
            f"valid choices are {RAISE!r} and {ALLOW!r}."
        )


class CrashSafety:
    """The backend outage policy of :class:`UniqueJobs`."""

    on_backend_error: str

    # Backend outages (SPEC S6) --------------------------------------------------

    def _backend_failed(self, message: AnyMessage, what: str, error: LockBackendError) -> None:
        """Apply ``on_backend_error``: raise ``error``, or log a warning and let
        the message be ``what`` (enqueued, run) without its lock."""
        if self.on_backend_error != ALLOW:
            if what != "run":
                raise error  # send() raises: the error is the caller's one report
            self.logger.warning(  # type: ignore[attr-defined]
                "Message %r of actor %r cannot take its lock because the lock backend failed (%s); "
                "Retries tries it again.",
                message.message_id,
                message.actor_name,
                error,
            )
            raise LockBackendRetry(str(error)) from error
        self.logger.warning(  # type: ignore[attr-defined]
            "Message %r of actor %r is %s without its lock because the lock backend failed "
            "(on_backend_error='allow'): %s",
            message.message_id,
            message.actor_name,
            what,
            error,
        )
