"""A worker process cut off from the lock store, and what it says until the store answers.

No heartbeat of the process has been answered for a whole lease period, or none since it booted:
the leases of its run locks have lapsed, so a copy of a job it runs may start elsewhere. With
``on_backend_error="raise"`` it runs no message with a lock until the store answers again: each
one that a worker thread takes goes back to the broker, to be delivered again later
(:meth:`~dramatiq_unique.worker.WorkerSide.start`), without using up a retry.

Its consumers go on. Dramatiq's pause of a consumer would stop taking messages, but a paused
consumer of RedisBroker sends no broker heartbeat, so that after ``heartbeat_timeout`` another
worker gives its messages back to the queue, those that run too, which then run twice; and
RabbitMQ redelivers every message of a closed channel, those that run too.

With ``on_backend_error="allow"`` the messages run without their locks, as on any failure of the
store, and only the outage is reported.
"""

from __future__ import annotations

import logging

from .liveness import worker_id


class CutOff:
    """Says when a worker process is cut off from the lock store, and when it reaches it again.

    Parameters:
      holds_back(bool): Whether the worker runs no message with a lock while cut off
        (``on_backend_error="raise"``).
      logger(logging.Logger): Where the cut and its end are reported.
    """

    def __init__(self, *, holds_back: bool, logger: logging.Logger):
        self.holds_back = holds_back
        self.logger = logger

    def changed(self, cut_off: bool, since: int | None) -> None:
        """The periodic thread found the process cut off from the store (``cut_off``) or reaching
        it again, ``since`` milliseconds after its last answered heartbeat (``None``: none was
        answered since it booted)."""
        if cut_off:
            self._cut(since)
        else:
            self._restored(since)

    def _cut(self, since: int | None) -> None:
        what = (
            "cannot reach the lock store as it boots"
            if since is None
            else f"has not reached the lock store for {since} ms, longer than its lease period"
        )
        self.logger.error(
            "Worker %r %s: %s",
            worker_id(),
            what,
            "until the lock store answers, it runs no message with a lock: each one it receives goes back to "
            "the broker, to be delivered again."
            if self.holds_back
            else "the run locks of its messages lapse, and its messages run without their locks "
            "(on_backend_error='allow') until the lock store answers.",
        )

    def _restored(self, since: int | None) -> None:
        self.logger.info(
            "Worker %r reaches the lock store%s: %s",
            worker_id(),
            "" if since is None else f" again, {since} ms after its last heartbeat",
            "it runs messages with locks again." if self.holds_back else "its messages take their locks again.",
        )
