"""The crash-safety part of the middleware: the heartbeat thread's lifecycle,
and the orphan reaper's actor and trigger. :class:`UniqueJobs` inherits these hooks."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq import Broker
from dramatiq.results import Results

from .backends import Holder

if TYPE_CHECKING:
    from .liveness import Liveness
    from .reaper import Reaper
    from .releases import BackgroundReleases

#: The name of the orphan reaper actor.
REAPER_ACTOR_NAME = "dramatiq_unique_reaper"


class CrashSafety:
    """Hooks and helpers of :class:`UniqueJobs` for crashes."""

    liveness: Liveness
    releases: BackgroundReleases | None
    reaper: Reaper
    reaper_enabled: bool
    reaper_interval: int | None
    reaper_queue: str
    reaper_actor: Any

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
