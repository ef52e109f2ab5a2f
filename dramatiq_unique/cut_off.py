"""A worker process cut off from the lock store, and what it does until the store answers.

No heartbeat of the process has been answered for a whole lease period: the leases of its run
locks have lapsed, so a copy of a job it runs may start elsewhere, and what it publishes of the
messages in its hands (on RabbitMQ) is out of date, so that the orphan reaper counts them as lost
once the worker registry forgets the process. With ``on_backend_error="raise"`` the worker holds
back until the store answers again:

* on RedisBroker and StubBroker its consumers pause. Dramatiq closes a paused consumer, which
  gives its delayed messages back to the broker; the other messages it received stay the
  broker's until they are acknowledged. Other brokers' consumers go on: RabbitMQ redelivers
  every message of a closed channel, those that run too, and Dramatiq 2 keeps the delayed
  messages of a closed RabbitMQ consumer, which then move to their queue twice;
* a message with a lock that a worker thread takes meanwhile does not run: it goes back to the
  broker, to be delivered again later (:meth:`~dramatiq_unique.worker.WorkerSide.start`).

With ``on_backend_error="allow"`` the messages run without their locks, as on any failure of the
store, and only the outage is reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from .liveness import worker_id


class CutOff:
    """Pauses and resumes the consumers of a worker process cut off from the lock store.

    Parameters:
      holds_back(bool): Whether the worker takes no message with a lock while cut off
        (``on_backend_error="raise"``).
      workers(collections.abc.Callable): The booted Workers of the process.
      logger(logging.Logger): Where the cut and its end are reported.
    """

    def __init__(self, *, holds_back: bool, workers: Callable[[], Iterable[Any]], logger: logging.Logger):
        self.holds_back = holds_back
        self._workers = workers
        self.logger = logger
        #: The consumer threads paused here, resumed when the store answers again.
        self._paused: list[Any] = []

    def changed(self, cut_off: bool, since: int) -> None:
        """The periodic thread found the process cut off from the store (``cut_off``) or
        reaching it again, ``since`` milliseconds after its last answered heartbeat."""
        if cut_off:
            self._cut(since)
        else:
            self._restored(since)

    def _cut(self, since: int) -> None:
        if not self.holds_back:
            self.logger.error(
                "Worker %r has not reached the lock store for %d ms, longer than its lease period: the run locks "
                "of its messages have lapsed, and its messages run without their locks (on_backend_error='allow') "
                "until the lock store answers again.",
                worker_id(),
                since,
            )
            return
        pausing = [
            consumer
            for worker in self._workers()
            for consumer in _pausable_consumers(worker)
            if not consumer.paused  # paused by someone else, who resumes it
        ]
        self.logger.error(
            "Worker %r has not reached the lock store for %d ms, longer than its lease period: the run locks of "
            "its messages have lapsed. Until the lock store answers again, it runs no message with a lock: each "
            "one it receives goes back to the broker%s.",
            worker_id(),
            since,
            ", and its consumers pause" if pausing else "",
        )
        for consumer in pausing:
            consumer.pause()
        self._paused += pausing

    def _restored(self, since: int) -> None:
        paused, self._paused = self._paused, []
        for consumer in paused:
            consumer.resume()
        self.logger.info(
            "Worker %r reaches the lock store again, %d ms after its last heartbeat: %s",
            worker_id(),
            since,
            "it runs messages with locks again." if self.holds_back else "its messages take their locks again.",
        )

    def reset_after_fork(self) -> None:
        """In a forked child: none of the parent's consumers is the child's."""
        self._paused = []


def _pausable_consumers(worker: Any) -> list[Any]:
    """The consumer threads of ``worker`` that pause: those whose closing gives back only their
    delayed messages."""
    consumers: dict[str, Any] = getattr(worker, "consumers", {})
    return list(consumers.values()) if _closes_safely(getattr(worker, "broker", None)) else []


def _closes_safely(broker: Any) -> bool:
    """Whether a closed consumer of ``broker`` gives back only its delayed messages, once each."""
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.brokers.stub import StubBroker

    return isinstance(broker, (RedisBroker, StubBroker))
