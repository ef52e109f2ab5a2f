"""Worker liveness: this process's heartbeat, the leases of the run
locks its messages hold, and the releases that failed and are tried again.

One daemon thread per process does all three, once per heartbeat interval:

* it records the process in the worker registry, a sorted set
  ``<prefix>:workers`` of worker id -> the time until which it counts as
  alive (its heartbeat plus its lease period, by the server clock), which
  the orphan reaper reads to tell live workers from dead ones: in the
  registry of every lock prefix its actors use, so that a run lock's worker
  is known under the prefix of the lock;
* it renews each run lock whose lease has less than two heartbeat intervals
  left, so a message running for a long time costs about one renewal per
  lease period, and a dead process's run locks lapse within one
  lease period;
* it gives up the locks whose release failed while the backend was down.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .backends import LockBackend
from .errors import LockBackendError
from .events import BACKEND_ERROR, LEASE_LOST, Events, LockEvent
from .keys import RUN

if TYPE_CHECKING:
    from .lock import MessageLock

_worker_id: tuple[int, str] | None = None


def worker_id() -> str:
    """This process, as recorded in the run locks it holds and in the worker
    registry: host, pid and a random part, so that a new process that reuses
    a pid is another worker (and a forked child gets its own id)."""
    global _worker_id
    pid = os.getpid()
    if _worker_id is None or _worker_id[0] != pid:
        _worker_id = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
    return _worker_id[1]


def registry_key(prefix: str) -> str:
    """The key of the worker registry."""
    return f"{prefix}:workers"


@dataclass
class _Lease:
    expires_at: int
    deadline: int | None
    lock: MessageLock | None


class Liveness:
    """The heartbeat thread of one process and what it looks after.

    Parameters:
      backend(LockBackend): Where the registries and the locks are.
      prefix(str): The lock prefix of the first registry (the middleware's);
        :meth:`add_prefix` adds others.
      lease_period(int): Milliseconds a run lock is held without a renewal.
      heartbeat_interval(int): Milliseconds between two heartbeats.
      logger(logging.Logger): Where to report.
      events(Events): Where lost leases and backend errors are told.
    """

    def __init__(
        self,
        backend: LockBackend,
        *,
        prefix: str,
        lease_period: int,
        heartbeat_interval: int,
        logger: logging.Logger,
        events: Events | None = None,
    ):
        self.backend = backend
        self.events = events if events is not None else Events(logger=logger)
        self.registry_key = registry_key(prefix)
        #: The registries of the other lock prefixes this process's actors use.
        self._other_registries: tuple[str, ...] = ()
        self.lease_period = lease_period
        self.heartbeat_interval = heartbeat_interval
        self.logger = logger
        #: Called by the thread after each heartbeat (the reaper's trigger).
        self.on_tick: Callable[[int], None] | None = None
        #: Called by the thread after each heartbeat, and once more when it stops (the activity counters).
        self.on_flush: Callable[[], None] | None = None
        self._mutex = threading.Lock()
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._pending: dict[tuple[str, str], int] = {}
        self._users = 0
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        #: The backend's clock at the last heartbeat (ms), and our monotonic clock then (s).
        self._synced: tuple[int, float] | None = None
        #: Heartbeats that failed in a row.
        self._failed_heartbeats = 0

    @property
    def worker_id(self) -> str:
        return worker_id()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def registry_keys(self) -> tuple[str, ...]:
        """Every registry this process heartbeats into."""
        return (self.registry_key, *self._other_registries)

    def add_prefix(self, prefix: str) -> None:
        """Heartbeat into the registry of ``prefix`` too: the lock prefix of an actor."""
        key = registry_key(prefix)
        with self._mutex:
            if key != self.registry_key and key not in self._other_registries:
                self._other_registries += (key,)

    def backend_time(self) -> int | None:
        """Now on the backend's clock, in milliseconds, estimated from the last
        heartbeat's answer; ``None`` before one was answered. Times the backend
        recorded are compared with this, never with this machine's clock."""
        # SPEC S3: time decisions follow the server's clock.
        if self._synced is None:
            return None
        now, at = self._synced
        return now + int((time.monotonic() - at) * 1000)

    # Lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Register this process and start the thread; called once per Worker
        started in the process, before the Worker takes any message."""
        with self._mutex:
            self._users += 1
            if self.running:
                return
            self._stopped.clear()
            self._thread = threading.Thread(target=self._run, name="dramatiq-unique-heartbeat", daemon=True)
        # The first heartbeat is synchronous: the worker is registered before it takes a message.
        now = self._beat()
        if now is not None:
            for key in self.registry_keys:
                try:  # processes killed long ago leave the registry, reaper or not
                    self.backend.forget_workers(key, before=now - 10 * self.lease_period)
                except LockBackendError:
                    pass
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread when the last Worker of this process stopped, and leave the registry."""
        with self._mutex:
            self._users -= 1
            if self._users > 0 or self._thread is None:
                return
            thread, self._thread = self._thread, None
        self._stopped.set()
        thread.join()
        self._flush()
        self._retry_releases()
        for key, owner in self._pending:
            self.logger.error(
                "The lock %r of %r could not be released before this worker stopped; "
                "the orphan reaper or its lock_ttl will free it.",
                key,
                owner,
            )
        for key in self.registry_keys:
            try:
                self.backend.forget_workers(key, worker_id=self.worker_id)
            except LockBackendError:
                self.logger.warning(
                    "Worker %r could not leave the worker registry %r.", self.worker_id, key, exc_info=True
                )

    # What the thread looks after ---------------------------------------------

    def hold(
        self, key: str, owner: str, *, expires_at: int | None, deadline: int | None, lock: MessageLock | None = None
    ) -> None:
        """Renew this run lock until :meth:`drop`; a place that never lapses needs nothing.

        Parameters:
          lock(MessageLock): The message's locks, whose events tell of a lost lease.
        """
        if expires_at and (deadline is None or expires_at < deadline):
            with self._mutex:
                self._leases[(key, owner)] = _Lease(expires_at=expires_at, deadline=deadline, lock=lock)

    def drop(self, key: str, owner: str) -> None:
        with self._mutex:
            self._leases.pop((key, owner), None)

    def retry_release(self, key: str, owner: str) -> None:
        """Give up ``owner``'s place at ``key`` later, if a worker runs in this
        process: its release just failed. The caller says so."""
        if self.running:
            with self._mutex:
                self._pending[(key, owner)] = 0

    def tick(self) -> None:
        """One round of the thread: heartbeat, renewals, failed releases, then ``on_tick``."""
        now = self._beat()
        if now is None:
            return
        self._renew_due()
        self._retry_releases()
        self._flush()
        if self.on_tick is not None:
            try:
                self.on_tick(now)
            except Exception:
                self.logger.exception("The heartbeat thread's periodic task failed.")

    def _run(self) -> None:
        interval = self.heartbeat_interval / 1000
        while not self._stopped.wait(interval):
            try:
                self.tick()
            except Exception:  # the thread must outlive anything
                self.logger.exception("The heartbeat of worker %r failed.", self.worker_id)

    def _beat(self) -> int | None:
        sent = time.monotonic()
        try:
            now = self.backend.heartbeat(self.registry_key, self.worker_id, ttl=self.lease_period)
        except LockBackendError as e:
            self._heartbeat_failed(e)
            self._backend_failed("heartbeat", e)
            return None
        # The server read its clock about halfway through the round trip. Our monotonic
        # clock, unlike our wall clock, does not step.
        self._synced = (now, (sent + time.monotonic()) / 2)
        # A run lock's worker must count as alive under the lock's prefix (issue 8, defect 4).
        # Leases are renewed only after every registry heard of it: a worker never holds a
        # renewed run lock while some registry has given it up for dead.
        for key in self._other_registries:
            try:
                self.backend.heartbeat(key, self.worker_id, ttl=self.lease_period)
            except LockBackendError as e:
                self._heartbeat_failed(e)
                self._backend_failed("heartbeat", e)
                return None
        self._heartbeat_answered()
        return now

    def _heartbeat_failed(self, error: LockBackendError) -> None:
        # One line per outage, not one per heartbeat interval.
        self._failed_heartbeats += 1
        level = logging.WARNING if self._failed_heartbeats == 1 else logging.DEBUG
        self.logger.log(
            level,
            "Worker %r could not send its heartbeat: %s. It tries again every %d ms and renews no lease until then.",
            self.worker_id,
            error,
            self.heartbeat_interval,
        )

    def _heartbeat_answered(self) -> None:
        if self._failed_heartbeats:
            self.logger.info(
                "Worker %r sends its heartbeat again, after %d that failed.", self.worker_id, self._failed_heartbeats
            )
            self._failed_heartbeats = 0

    def _renew_due(self) -> None:
        now = self.backend_time()
        if now is None:
            return
        horizon = now + 2 * self.heartbeat_interval
        with self._mutex:
            due = [(k, lease) for k, lease in self._leases.items() if lease.expires_at <= horizon]
        for (key, owner), lease in due:
            try:
                expires_at = self.backend.renew(key, owner, ttl=self.lease_period, deadline=lease.deadline)
            except LockBackendError as e:
                self.logger.warning("The lease of run lock %r could not be renewed: %s", key, e)
                if lease.lock is not None:
                    lease.lock.emit(BACKEND_ERROR, lock_kind=RUN, reason="renewal", error=e)
                continue
            with self._mutex:
                if (key, owner) not in self._leases:
                    continue  # released meanwhile
                if expires_at is None:
                    del self._leases[(key, owner)]
                elif lease.deadline is not None and expires_at >= lease.deadline:
                    del self._leases[(key, owner)]  # lock_ttl ends it; nothing more to renew
                else:
                    lease.expires_at = expires_at
            if expires_at is None:
                self.logger.warning(
                    "The run lock %r lapsed while its message was still running: its lease ran out "
                    "before this worker renewed it. Another copy may run now.",
                    key,
                )
                if lease.lock is not None:
                    lease.lock.emit(LEASE_LOST, lock_kind=RUN)

    def _retry_releases(self) -> None:
        with self._mutex:
            pending = list(self._pending)
        for key, owner in pending:
            try:
                self.backend.release(key, owner)
            except LockBackendError as e:
                with self._mutex:
                    self._pending[(key, owner)] += 1
                self._backend_failed("release", e)
                continue
            with self._mutex:
                self._pending.pop((key, owner), None)
            self.logger.info("The lock %r of %r was released on a later attempt.", key, owner)

    def _flush(self) -> None:
        if self.on_flush is not None:
            try:
                self.on_flush()
            except Exception:
                self.logger.exception("The heartbeat thread's flush failed.")

    def _backend_failed(self, what: str, error: LockBackendError) -> None:
        """Tell of a failure outside any message (a heartbeat, a release tried again)."""
        self.events.notify(
            BACKEND_ERROR,
            "",
            lambda: LockEvent(kind=BACKEND_ERROR, actor_name="", queue_name="", reason=what, error=error),
        )
