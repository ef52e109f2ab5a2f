"""The locks of one message and the transitions on them: acquire, claim, swap, release."""

from __future__ import annotations

import dataclasses
import functools
import logging
import uuid
from typing import TYPE_CHECKING

from dramatiq.common import current_millis, q_name

from .backends import Acquisition, Holder, LockBackend, Waiter
from .backends.base import HELD, STARTED_BEFORE, SUPERSEDED
from .backends.base import LAPSED as NOT_HELD
from .calls import message_call, short_call
from .cancellation import asked_by_message
from .current import HeldLock
from .digest import compute_digest, lock_arguments
from .errors import LockBackendError
from .events import ACQUIRED, LAPSED, RELEASED, REPLACED, TRAIL_KINDS, Events, EventSubject
from .frozen import frozen_instance
from .held import QUEUED
from .keys import ENQUEUE, RUN, enqueue_key, replaced_key, run_key
from .liveness import worker_id
from .options import LOCK_INFO_LENGTH, LONGEST_LOCK_DURATION, LockConfig
from .outcome import (
    ENQUEUED,
    WAITING,
    AnyMessage,
    EnqueueOutcome,
    enqueue_outcome,
    has_followers,
    plain_message,
    record,
)
from .strategies import ConflictStrategy

if TYPE_CHECKING:
    from .liveness import Liveness
    from .releases import BackgroundReleases

#: How close to its recorded expiry an enqueue lock is checked again when its
#: message starts, for the error of this process's estimate of the backend's clock.
LAPSE_MARGIN = 1000

#: The hub of locks built without one: nobody subscribes to it.
_NO_EVENTS = Events(logger=logging.getLogger(__name__))


__all__ = ["MessageLock", "worker_id"]


class MessageLock:
    """The enqueue lock and the run lock of one message.

    It remembers which of them it holds, so giving up a lock that is not held
    costs no round trip. It is used by one thread at a time.

    Parameters:
      backend(LockBackend): Where the locks are stored.
      config(LockConfig): The message's lock options.
      message(dramatiq.Message): The message.
      digest(str): The message's digest.
      outcome(EnqueueOutcome): What the message recorded when it was enqueued.
      logger(logging.Logger): Where to report a lapsed lock.
      liveness(Liveness): This process's heartbeat: its clock, and the
        periodic thread that renews the run lock's lease and retries failed
        releases. Without it, run locks last ``lock_ttl`` and failed releases
        are only logged.
      events(Events): Where the lock's events go.
      releases(BackgroundReleases): The releases that the release thread
        gives up for finished messages, if one runs in this process.
    """

    # The state of an attempt that has done nothing yet, as class attributes: set once, not for every message.
    #: The owner of this processing attempt's place in the run lock.
    run_owner: str | None = None
    run_token: int | None = None
    #: Whether Dramatiq enqueued the message again while it was being processed.
    requeued = False
    #: Whether a newer message took this queued message's place (``replace``): it must not run.
    superseded = False
    #: Whether another copy of this message started after it waited in line, so that this one must not run.
    started_before = False
    #: The lock whose release failed last, RUN or ENQUEUE (a running worker tries both again),
    #: or ``None``: what frees it depends on it.
    failed_release: str | None = None
    #: Whether a request to stop interrupts the message while it holds the run lock, which only
    #: an actor whose function tells when it returns allows (see ``WorkerSide.watch_return``).
    interruptible = False

    def __init__(
        self,
        *,
        backend: LockBackend,
        config: LockConfig,
        message: AnyMessage,
        digest: str,
        outcome: EnqueueOutcome,
        logger: logging.Logger,
        liveness: Liveness | None = None,
        events: Events | None = None,
        releases: BackgroundReleases | None = None,
    ):
        self.backend = backend
        self.liveness = liveness
        self.releases = releases
        self.events = events if events is not None else _NO_EVENTS
        self.config = config
        self.message = message
        #: The message itself, whose fields are read without a worker's proxy, which looks each
        #: one up (an AttributeError apiece).
        self.sent = plain_message(message)
        self.message_id: str = self.sent.message_id
        self.actor_name: str = self.sent.actor_name
        self.digest = digest
        self.logger = logger
        #: Whether the message holds its enqueue lock, as far as this process knows.
        self.holds_enqueue = (
            config.lock.locks_at_enqueue
            and outcome.status == ENQUEUED
            and outcome.holder == self.message_id
            and outcome.digest == digest
        )
        self.enqueue_token = outcome.token
        self.enqueue_expires_at = outcome.expires_at
        #: How often the message was rescheduled so far; the count carries over.
        self.reschedules = outcome.reschedules
        #: The token of the place a line handed the message, if one did (the message's copy), and
        #: which lock's line it was: only that copy may start, and only once.
        self.handoff = outcome.handoff
        self.handed_by = outcome.line if outcome.handoff is not None else None

    @property
    def cut_off(self) -> bool:
        """Whether this worker process has reached no lock store for a lease period
        (see ``dramatiq_unique.cut_off``): it can neither take nor keep a lock."""
        return self.liveness is not None and self.liveness.cut_off

    @property
    def enqueue_key(self) -> str:
        return enqueue_key(self.config.lock_prefix, self.digest)

    @property
    def run_key(self) -> str:
        return run_key(self.config.lock_prefix, self.digest)

    @property
    def replaced_key(self) -> str:
        return replaced_key(self.config.lock_prefix, self.digest)

    @property
    def subject(self) -> EventSubject:
        """What the events of this message's locks are about, for the threads that tell them."""
        return EventSubject(
            self.actor_name, q_name(self.sent.queue_name), self.digest, self.message_id, self.config.lock.name
        )

    def held(self) -> HeldLock | None:
        """The lock the message holds while its actor runs."""
        if self.run_token is not None:
            token = self.run_token
        elif self.holds_enqueue and self.enqueue_token is not None:
            token = self.enqueue_token
        else:
            return None
        return frozen_instance(
            HeldLock,
            {"digest": self.digest, "token": token, "lock": self.config.lock.name, "message_id": self.message_id},
        )

    def emit(
        self,
        kind: str,
        *,
        lock_kind: str | None = None,
        token: int | None = None,
        side: str | None = None,
        strategy: str | None = None,
        holders: tuple[str, ...] = (),
        delay: int | None = None,
        replaced: str | None = None,
        reason: str | None = None,
        error: Exception | None = None,
        cancelled_by: str | None = None,
    ) -> None:
        """Count what happened to this message's locks, and tell the
        subscribers of ``kind``; without subscribers, no event is built."""
        events = self.events
        events.count(self.actor_name, kind)
        if events.wants(kind):
            events.deliver(
                self.subject.event(
                    kind,
                    lock_kind=lock_kind,
                    token=token,
                    side=side,
                    strategy=strategy,
                    holders=holders,
                    delay=delay,
                    replaced=replaced,
                    reason=reason,
                    error=error,
                    cancelled_by=cancelled_by,
                    **(self._trail() if kind in TRAIL_KINDS else {}),
                )
            )

    def _trail(self) -> dict[str, str]:
        """What the events of the conflict trail's kinds tell besides: the message's call and
        its lock prefix. Built only with such an event."""
        return {"call": message_call(self.sent), "lock_prefix": self.config.lock_prefix}

    def acquire_enqueue(
        self,
        delay: int | None = None,
        *,
        may_replace: bool = True,
        may_wait: bool = False,
        holder: Holder | None = None,
        healing: bool = False,
    ) -> Acquisition:
        """Take the enqueue lock, or re-enter it when the message holds it already.

        The lock's TTL is extended by ``delay``, so it covers a delayed message
        until it is due. With the ``replace`` strategy (and ``may_replace``), a
        full lock gives up its oldest queued holder's place, and a message of a
        series of debounced sends is brought forward to the series' deadline
        (``debounce_cap``). On success the outcome is recorded in the message.

        Parameters:
          may_wait(bool): A message sent: with ``wait`` or ``keep_latest``, it waits in the
            lock's line when every place is taken (the answer's ``waiting``).
          holder(Holder): What to record; by default the message as queued.
          healing(bool): Take it even while the store heals after a loss of its data: the
            message held it before.
        """
        key = self.enqueue_key
        if self.releases is not None:
            # A message of this process that finished a moment ago gave this lock up.
            self.releases.settle(key)
        # A re-entry keeps the token: only a new place is an acquisition.
        previous = self.enqueue_token if self.holds_enqueue else None
        # Until the backend answers, the message may hold the lock: if the
        # answer is lost, release_enqueue() still gives the place up.
        self.holds_enqueue = True
        holder = holder or self._holder("queued")
        # A caller's delay (Dramatiq's, unbounded) extends the lock by the longest lock duration
        # at most: that outlasts any wait, and keeps the lock store's sums in range.
        limit, ttl, extend = self.config.lock_limit, self.config.lock_ttl, min(delay or 0, LONGEST_LOCK_DURATION)
        if may_replace and self.config.client_strategy.replaces_queued_holders:
            acquisition = self.backend.replace(
                key,
                self.message_id,
                replaced_key=self.replaced_key,
                limit=limit,
                ttl=ttl,
                holder=holder,
                extend=extend,
                debounce_cap=self.config.debounce_cap,
                healing=healing,
            )
        else:
            acquisition = self.backend.acquire(
                key,
                self.message_id,
                limit=limit,
                ttl=ttl,
                holder=holder,
                extend=extend,
                healing=healing,
                waiter=self._waiter(self.config.client_strategy, ENQUEUE) if may_wait else None,
            )
        self.holds_enqueue = acquisition.acquired
        if acquisition.acquired:
            self.enqueue_token = acquisition.token
            self.enqueue_expires_at = acquisition.expires_at
            self.record_enqueued(replaced=acquisition.replaced)
            if acquisition.due_within is not None:
                self._bring_forward(acquisition.due_within, delay)
            if acquisition.token != previous:
                self.emit(ACQUIRED, lock_kind=ENQUEUE, token=acquisition.token)
        if acquisition.replaced:
            self.logger.info(
                "Message %r of actor %r took lock %r from queued message %r, which will be skipped "
                "(strategy 'replace').",
                self.message_id,
                self.actor_name,
                self.digest,
                acquisition.replaced,
            )
            self.emit(REPLACED, lock_kind=ENQUEUE, replaced=acquisition.replaced)
        return acquisition

    def _bring_forward(self, due_within: int, delay: int | None) -> None:
        """Bring a delayed message forward to run within ``due_within`` ms, if that is sooner: its
        series of debounced sends reaches its ``debounce_cap``. The broker computed the eta before
        ``before_enqueue`` and encodes the message after it."""
        if delay is not None and due_within < delay:
            self.sent.options["eta"] = current_millis() + due_within

    def record_enqueued(self, replaced: str | None = None, *, status: str = ENQUEUED) -> None:
        """Record in the message that it is enqueued, with its digest and its enqueue lock, if any.

        The count of reschedules carries over: ``max_reschedules`` caps them all; so does the
        place a line handed it, which its retries keep.

        Parameters:
          status(str): ``"unlocked"`` when it goes out without the lock it should hold.
        """
        holds = self.holds_enqueue
        record(
            self.sent,
            status=status,
            digest=self.digest,
            holder=self.message_id,
            token=self.enqueue_token if holds else None,
            expires_at=self.enqueue_expires_at if holds else None,
            replaced=replaced,
            reschedules=self.reschedules,
            line=self.handed_by,
            handoff=self.handoff,
        )

    def start_releasing_enqueue(self) -> None:
        """The message starts and gives its enqueue lock up (until_executing)."""
        if self.holds_enqueue or self.handed_by == ENQUEUE:
            self._claim(release=True)

    def start_holding_enqueue(self) -> None:
        """The message starts and keeps its enqueue lock (until_executed, until_expired).

        When a newer message may take a queued holder's place (``replace``),
        the place is recorded as running, so that it is not taken any more,
        at the cost of one round trip; so it is with a line, so that a message
        handed its place by the line leaves the waiters.
        """
        strategy = self.config.client_strategy
        if self.handed_by == ENQUEUE:
            self._claim(release=False)
        elif strategy.replaces_queued_holders or strategy.waits_in_line:
            if self.holds_enqueue and self._claim(release=False) == NOT_HELD:
                self._retake_lapsed_enqueue()
        else:
            self.reenter_enqueue_if_lapsed()

    def reenter_enqueue_if_lapsed(self) -> None:
        """Take the enqueue lock again if its TTL may have run out before the
        message started. The message runs either way.

        Only a lock whose recorded expiry is near or past costs a round trip.
        """
        if not self.holds_enqueue or self.enqueue_expires_at is None:
            return
        # The expiry is on the backend's clock; without an estimate of it, ask the backend.
        now = self.liveness.backend_time() if self.liveness is not None else None
        if now is not None and now < self.enqueue_expires_at - LAPSE_MARGIN:
            return
        self._retake_lapsed_enqueue()

    def _retake_lapsed_enqueue(self) -> None:
        previous = self.enqueue_token if self.holds_enqueue else None
        # Recorded as running: a newer message never takes a running holder's place.
        acquisition = self.acquire_enqueue(may_replace=False, holder=self._running_holder(enqueue_lock=True))
        # Without a place before, the claim that found it lapsed said so already.
        if previous is not None and acquisition.token != previous:
            self.emit(LAPSED, lock_kind=ENQUEUE, holders=acquisition.holders)
        if not acquisition.acquired:
            self.holds_enqueue = False
            self.logger.warning(
                "Message %r of actor %r runs although its lock %r lapsed before it started "
                "and is now held by message %s. Raise lock_ttl if its messages wait longer than that.",
                self.message_id,
                self.actor_name,
                self.digest,
                ", ".join(map(repr, acquisition.holders)),
            )

    def release_enqueue(self, *, background: bool = False) -> None:
        """Give up the enqueue lock, if the message holds it.

        Parameters:
          background(bool): Let this process's release thread send it, if
            one runs: the message is done, and the caller need not wait.
        """
        if self.holds_enqueue:
            self.holds_enqueue = False
            key, releases = self.enqueue_key, self.releases
            # The lock itself is handed over: the thread that tells the release builds its event,
            # and only for a subscriber.
            if background and releases is not None and releases.hand_over(key, self.message_id, self):
                return
            try:
                released = self.backend.release(key, self.message_id)
            except LockBackendError:
                self.failed_release = ENQUEUE
                if self.liveness is not None:
                    self.liveness.retry_release(key, self.message_id)
                raise
            self.emit(RELEASED if released else LAPSED, lock_kind=ENQUEUE)

    def forget_enqueue_after_failure(self) -> None:
        """The backend failed to answer an acquisition of the enqueue lock,
        which may have taken a place: give it back now if the backend answers,
        else later from the heartbeat thread, if one runs in this process.
        The orphan reaper and ``lock_ttl`` free it otherwise."""
        try:
            self.release_enqueue()
        except LockBackendError:
            pass

    def take_handed_place(self) -> None:
        """The message was handed a place by the line it waited in, and is enqueued: its place
        records the message's id in the broker, for the orphan reaper to look for."""
        if self.handoff is None:
            return
        key = self.run_key if self.handed_by == RUN else self.enqueue_key
        acquisition = self.backend.record_handoff(
            key, self.message_id, holder=self._holder("queued"), handoff=self.handoff
        )
        if self.handed_by == ENQUEUE:
            self.holds_enqueue = acquisition.acquired
            self.enqueue_token, self.enqueue_expires_at = acquisition.token, acquisition.expires_at
        self.record_enqueued()

    def acquire_run(self) -> Acquisition:
        """Take a place in the run lock for this processing attempt, or wait in its line."""
        owner = uuid.uuid4().hex
        ttl = self._run_ttl()
        waiter = self._waiter(self.config.server_strategy, RUN)
        try:
            acquisition = self.backend.acquire(
                self.run_key,
                owner,
                limit=self.config.lock_limit,
                ttl=ttl,
                holder=self._running_holder(),
                waiter=waiter,
                starting=self.copy if waiter else None,
            )
        except LockBackendError:
            self._forget_run_after_failure(owner)
            raise
        self.started_before = acquisition.started_before
        self._took_run_lock(owner, acquisition, ttl)
        return acquisition

    def swap_enqueue_for_run(self) -> Acquisition:
        """Take a place in the run lock and give up the enqueue lock, atomically."""
        owner = uuid.uuid4().hex
        ttl = self._run_ttl()
        held = self.holds_enqueue
        try:
            acquisition = self.backend.swap(
                release_key=self.enqueue_key,
                release_owner=self.message_id,
                replaced_key=self.replaced_key,
                acquire_key=self.run_key,
                owner=owner,
                limit=self.config.lock_limit,
                ttl=ttl,
                holder=self._running_holder(),
                waiter=self._waiter(self.config.server_strategy, RUN),
                starting=self.copy,
            )
        except LockBackendError:
            self._forget_run_after_failure(owner)
            raise
        if acquisition.acquired or acquisition.waiting:
            self.holds_enqueue = False
        if acquisition.superseded:
            self.holds_enqueue = False
            self.superseded = True
        if acquisition.started_before:
            # Another copy of the message owns its place: this one gives nothing up.
            self.holds_enqueue = False
        self.started_before = acquisition.started_before
        self._took_run_lock(owner, acquisition, ttl)
        if acquisition.acquired and held:
            self.emit(RELEASED, lock_kind=ENQUEUE)
        return acquisition

    def _forget_run_after_failure(self, owner: str) -> None:
        """The backend failed to answer an acquisition of the run lock for ``owner``, which may
        have taken a place (e.g. made on a primary that no replica acknowledged in time): give
        it back now, else later from the heartbeat thread. Its lease frees it otherwise."""
        try:
            self.backend.release(self.run_key, owner)
        except LockBackendError:
            if self.liveness is not None:
                self.liveness.retry_release(self.run_key, owner)

    def actor_returned(self) -> None:
        """The actor returned or raised: the message is not interrupted any more, even while
        other middleware's hooks still run for it."""
        if self.run_owner is not None and self.liveness is not None:
            self.liveness.settle(self.run_key, self.run_owner)

    def release_run(self) -> None:
        """Give up this attempt's place in the run lock, if it has one."""
        if self.run_owner is not None:
            owner, self.run_owner, self.run_token = self.run_owner, None, None
            # Not renewed any more: if the release fails, it is tried again until the lease runs out.
            lease_ends = self.liveness.drop(self.run_key, owner) if self.liveness is not None else None
            try:
                released = self.backend.release(self.run_key, owner)
            except LockBackendError:
                self.failed_release = RUN
                if self.liveness is not None:
                    self.liveness.retry_release(self.run_key, owner, until=lease_ends)
                raise
            self.emit(RELEASED if released else LAPSED, lock_kind=RUN)

    def give_up_handed_run_place(self) -> None:
        """This copy, handed a place by the run lock's line, leaves without having started (a
        middleware before ours skipped it, such as AgeLimit): the place, while it is still the
        one handed this copy, goes to the next message in line."""
        if self.handoff is None:
            return
        for place in self.backend.read([self.run_key])[1]:
            handed_here = place.owner == self.message_id and place.token == self.handoff
            if (
                handed_here
                and place.holder.get("state") == QUEUED
                and self.backend.release_record(self.run_key, place.owner, place.record)
            ):
                self.emit(RELEASED, lock_kind=RUN)

    def _claim(self, *, release: bool) -> str:
        replaces = self.config.client_strategy.replaces_queued_holders
        answer = self.backend.claim(
            self.enqueue_key,
            self.message_id,
            replaced_key=self.replaced_key if replaces else None,
            release=release,
            holder=self._running_holder(enqueue_lock=True),
            starting=self.copy,
        )
        if release or answer != HELD:
            self.holds_enqueue = False
        self.superseded = answer == SUPERSEDED
        self.started_before = answer == STARTED_BEFORE
        if answer == NOT_HELD:
            self.emit(LAPSED, lock_kind=ENQUEUE)
        elif release and answer == HELD:
            self.emit(RELEASED, lock_kind=ENQUEUE)
        return answer

    def _run_ttl(self) -> int | None:
        """A run lock is a lease, cut short by ``lock_ttl`` if that is shorter."""
        lease = self.liveness.lease_period if self.liveness is not None else None
        ttl = self.config.lock_ttl
        if lease is None or (ttl is not None and ttl <= lease):
            return ttl
        return lease

    def _took_run_lock(self, owner: str, acquisition: Acquisition, ttl: int | None) -> None:
        if acquisition.acquired:
            self.run_owner = owner
            self.run_token = acquisition.token
            self.emit(ACQUIRED, lock_kind=RUN, token=acquisition.token)
            if self.liveness is not None and ttl is not None and acquisition.expires_at:
                # lock_ttl still ends the lock: renewals never go past it.
                deadline = None
                if self.config.lock_ttl is not None:
                    deadline = acquisition.expires_at - ttl + self.config.lock_ttl
                self.liveness.hold(
                    self.run_key,
                    owner,
                    expires_at=acquisition.expires_at,
                    deadline=deadline,
                    subject=self.subject,
                    limit=self.config.lock_limit,
                    holder=self._running_holder(),
                    eager=self.config.server_strategy.cancels_running_holders,
                    interruptible=self.interruptible,
                )

    def ask_holders_to_stop(self, holders: tuple[str, ...]) -> list[str]:
        """Ask the running ``holders`` of the run lock to stop (``cancel_in_progress``), in
        the name of this message.

        Returns:
          list[str]: The message_ids of those asked: the ones still running.
        """
        return self.backend.request_stop(self.run_key, holders, by=asked_by_message(self.message_id))

    @property
    def copy(self) -> str:
        """The token of the place a line handed the message, which tells its copies apart in the
        lock store, or ``""`` when no line handed it one."""
        return "" if self.handoff is None else str(self.handoff)

    def _waiter(self, strategy: ConflictStrategy, line: str) -> Waiter | None:
        """The message as it waits in the line of the lock ``line`` (enqueue or run), when the
        ``strategy`` of that side waits in line."""
        if not strategy.waits_in_line:
            return None
        message = self.sent
        # It is enqueued at once when handed a place: the line was its delay.
        waiting = message.copy(queue_name=q_name(message.queue_name))
        for option in ("eta", "redis_message_id"):
            waiting.options.pop(option, None)
        record(
            waiting, status=WAITING, digest=self.digest, holder=self.message_id, reschedules=self.reschedules, line=line
        )
        return Waiter(
            message=waiting.encode(),
            line_limit=1 if strategy.keeps_latest else self.config.line_limit,
            keeps_latest=strategy.keeps_latest,
        )

    def holder_in_hand(self) -> Holder:
        """The holder of a message in a worker's hands that may not have started, or may be
        running: recorded as queued, and never replaceable."""
        return dataclasses.replace(self._holder("queued"), replaceable=False)

    def _running_holder(self, *, enqueue_lock: bool = False) -> Holder:
        return self._holder("running", worker_id=worker_id(), enqueue_lock=enqueue_lock)

    def _holder(self, state: str, worker_id: str | None = None, *, enqueue_lock: bool = True) -> Holder:
        # Built without the dataclass's __init__: every send records one.
        return frozen_instance(
            Holder,
            {
                "message_id": self.message_id,
                "actor": self.actor_name,
                "queue": q_name(self.sent.queue_name),
                "lock": self.config.lock.name,
                "state": state,
                "worker_id": worker_id,
                # A place in the enqueue lock, queued or running, lets the orphan reaper ask a
                # RedisBroker whether its message still exists.
                "redis_message_id": self.sent.options.get("redis_message_id") if enqueue_lock else None,
                # Only a message that checks at start whether it was replaced may be: one
                # whose actor replaces, and that no group or pipeline waits for.
                "replaceable": state == "queued"
                and self.config.client_strategy.replaces_queued_holders
                and not has_followers(self.sent),
                # Only an actor with lock_info pays for its call, once per message.
                "call": self.call if self.config.lock_info else None,
                "stop_requested_by": None,
            },
        )

    @functools.cached_property
    def call(self) -> str | None:
        """The message's call as its holder keeps it (``lock_info``): ``reindex('acme', 200)``."""
        sent = self.sent
        return short_call(sent.actor_name, sent.args, sent.kwargs, self.config.lock_info or LOCK_INFO_LENGTH)


class LockFactory:
    """Builds the locks of messages with this process's parts.

    Parameters:
      backend(LockBackend): Where the locks are stored.
      logger(logging.Logger): Where to report a lapsed lock.
      liveness(Liveness): This process's heartbeat thread, if any.
      events(Events): Where the locks' events go.
      releases(BackgroundReleases): This process's release thread, if one runs.
    """

    def __init__(
        self,
        *,
        backend: LockBackend,
        logger: logging.Logger,
        liveness: Liveness | None = None,
        events: Events | None = None,
        releases: BackgroundReleases | None = None,
    ):
        self.backend = backend
        self.logger = logger
        self.liveness = liveness
        self.events = events
        self.releases = releases

    def build(self, message: AnyMessage, config: LockConfig, outcome: EnqueueOutcome | None = None) -> MessageLock:
        """The locks of ``message``, with the digest it recorded when it was
        enqueued, or computed from its arguments.

        Parameters:
          outcome(EnqueueOutcome): The message's :func:`~dramatiq_unique.enqueue_outcome`, if the caller has it already.

        Raises:
          LockArgumentsError: If the digest cannot be computed.
        """
        sent = plain_message(message)
        if outcome is None:
            outcome = enqueue_outcome(sent)
        digest = outcome.digest or compute_digest(
            actor_name=sent.actor_name,
            queue_name=sent.queue_name,
            lock_args=lock_arguments(sent.actor_name, config.lock_args_method, sent.args, sent.kwargs),
            unique_across_actors=config.unique_across_actors,
            unique_across_queues=config.unique_across_queues,
        )
        return MessageLock(
            backend=self.backend,
            config=config,
            message=message,
            digest=digest,
            outcome=outcome,
            logger=self.logger,
            liveness=self.liveness,
            events=self.events,
            releases=self.releases,
        )
