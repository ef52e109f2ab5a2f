"""The crash-safety part of the middleware: the heartbeat thread's lifecycle,
the orphan reaper's actor and trigger, and the backend outage policy. :class:`UniqueJobs` inherits these hooks."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq import Broker
from dramatiq.results import Results

from .backends import Holder
from .errors import InvalidLockOptions, LockBackendError, LockBackendRetry
from .outcome import AnyMessage

if TYPE_CHECKING:
    from .liveness import Liveness
    from .reaper import Reaper
    from .releases import BackgroundReleases

#: ``on_backend_error`` values: fail closed, or fail open.
RAISE = "raise"
ALLOW = "allow"

#: The name of the orphan reaper actor.
REAPER_ACTOR_NAME = "dramatiq_unique_reaper"


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
    """Hooks and helpers of :class:`UniqueJobs` for crashes and outages."""

    liveness: Liveness
    releases: BackgroundReleases | None
    reaper: Reaper
    reaper_enabled: bool
    reaper_interval: int | None
    reaper_queue: str
    reaper_actor: Any
    on_backend_error: str

    # Worker lifecycle ----------------------------------------------------------

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        if self.reaper_enabled:
            self.declare_reaper(broker)
        # Before the consumers start: the worker is in the registry before it holds any run lock.
        self.liveness.start()
        if self.releases is not None:
            self.releases.start()

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # After the worker threads finished their messages: the leases were
        # renewed until then. The last releases go first, so that the
        # heartbeat thread tries again those that fail before it stops.
        if self.releases is not None:
            self.releases.stop()
        self.liveness.stop()

    # The orphan reaper ----------------------------------------------------------

    def declare_reaper(self, broker: Broker) -> Any:
        """Declare the orphan reaper actor on ``broker`` (once) and return it.

        Send it yourself to run a reaper cycle, e.g. from a scheduler: it
        accepts ``max_passes`` (``None``: until every lock was inspected) and
        logs its report in one line. Only one runs at a time. With Dramatiq's
        ``Results`` middleware on the broker, it also returns the report as a dict.
        """
        if self.reaper_actor is not None:
            return self.reaper_actor
        reaper = self.reaper

        def dramatiq_unique_reaper(max_passes: int | None = None) -> dict[str, Any] | None:
            report = reaper.run(broker=broker, max_passes=max_passes)
            # Dramatiq warns of every value returned where no Results middleware keeps it.
            return report.as_dict() if any(isinstance(m, Results) for m in broker.middleware) else None

        self.reaper_actor = dramatiq.actor(
            broker=broker,
            actor_name=REAPER_ACTOR_NAME,
            queue_name=self.reaper_queue,
            max_retries=0,
            lock=None,
        )(dramatiq_unique_reaper)
        return self.reaper_actor

    def _maybe_trigger_reaper(self, now: int) -> None:
        """Called by the heartbeat thread: the first worker to take the
        schedule lock of this interval sends the reaper (one per interval
        across the deployment)."""
        if self.reaper_actor is None or self.reaper_interval is None:
            return
        # Each process asks at most once per interval: one round trip per interval, not per heartbeat.
        if now < getattr(self, "_next_reaper_try", 0):
            return
        self._next_reaper_try = now + self.reaper_interval
        owner = uuid.uuid4().hex
        holder = Holder(
            message_id=owner, actor=REAPER_ACTOR_NAME, queue=self.reaper_queue, lock="schedule", state="queued"
        )
        acquisition = self.liveness.backend.acquire(
            self.reaper.schedule_key, owner, limit=1, ttl=self.reaper_interval, holder=holder
        )
        if acquisition.acquired:
            self.reaper_actor.send()

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
