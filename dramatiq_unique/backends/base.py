"""The storage interface every lock backend implements.

A lock is named by a key string (see :mod:`dramatiq_unique.keys`) and has up
to ``limit`` holders at once. Each holder is identified by an *owner*
string: the message_id for enqueue locks, so Dramatiq's own re-enqueues of a
message re-enter its lock, and a fresh token per processing attempt for run
locks. Every transition is atomic, and release and swap only ever touch the
caller's own place.
"""

from __future__ import annotations

import abc
import base64
import binascii
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import LockBackendError
from ..keys import ENQUEUE, RUN, digest_of, lock_kind
from ..locks import LOCK_TYPES

#: The one-letter codes of states and lock types in a compact holder.
_STATE_CODES = {"queued": "q", "running": "r"}
_LOCK_CODES = {name: lock_type.code for name, lock_type in LOCK_TYPES.items()}
_STATES = {code: name for name, code in _STATE_CODES.items()}
_LOCKS = {code: name for name, code in _LOCK_CODES.items()}

_logger = logging.getLogger(__name__)

#: The lock code of a holder of one of the library's own locks (the reaper's, the healing's),
#: which are no lock type.
_OWN_LOCK = "o"

#: What a record escapes in the values it holds: its separators, and the escape itself.
_ESCAPES = {"%": "%25", "|": "%7C", "\n": "%0A"}
_ESCAPED = re.compile("[%|\n]")
_ESCAPE_CODE = re.compile("%([0-9A-Fa-f]{2})")


def escape(text: str) -> str:
    """``text`` as a lock's record holds it: ``%``, ``|`` and newlines written ``%25``, ``%7C``
    and ``%0A``, so that no value ends a field or a record."""
    if "%" in text or "|" in text or "\n" in text:
        return _ESCAPED.sub(lambda m: _ESCAPES[m.group()], text)
    return text


def unescape(text: str) -> str:
    """The value that :func:`escape` wrote as ``text``."""
    return _ESCAPE_CODE.sub(lambda m: chr(int(m.group(1), 16)), text) if "%" in text else text


@dataclass(frozen=True)
class Holder:
    """Who holds a lock. The backend records it with the acquisition
    time, the expiry and the fencing token, all taken from its own clock.

    Parameters:
      message_id(str): The message that holds the lock.
      actor(str): The actor of that message.
      queue(str): The canonical queue of that message.
      lock(str): The lock type, e.g. ``"until_executed"``.
      state(str): ``"queued"`` for enqueue locks, ``"running"`` for run locks.
      worker_id(str): The worker process running the message, for run locks.
      redis_message_id(str): The message's id in a ``RedisBroker`` queue, for
        enqueue locks: the orphan reaper asks the broker whether it still exists.
      replaceable(bool): Whether a newer message may take this queued holder's
        place (``replace``): only a holder that checks, when it starts, whether
        it was replaced is ever replaced, so a replaced message never runs.
      call(str): The holder's actor call as a person reads it, e.g. ``reindex('acme', 200)``,
        already cut to its actor's ``lock_info`` bound; ``None``, the default, records none and
        costs no byte.
      stop_requested_by(str): Who asked this running holder to stop, as a person reads it:
        ``message <message_id>`` for a newer message (``cancel_in_progress``), ``operator <who>``
        for an operator's cancel; ``None``, the default, for a holder not asked. Its worker
        learns it at its next lease renewal. The request goes with the holder's place.
    """

    message_id: str
    actor: str
    queue: str
    lock: str
    state: str
    worker_id: str | None = None
    redis_message_id: str | None = None
    replaceable: bool = False
    call: str | None = None
    stop_requested_by: str | None = None

    def to_json(self) -> str:
        """The holder as compact JSON; fields that are not set, and ``replaceable`` when false, are left out."""
        fields: dict[str, Any] = {
            "message_id": self.message_id,
            "actor": self.actor,
            "queue": self.queue,
            "lock": self.lock,
            "state": self.state,
        }
        if self.worker_id is not None:
            fields["worker_id"] = self.worker_id
        if self.redis_message_id is not None:
            fields["redis_message_id"] = self.redis_message_id
        if self.replaceable:
            fields["replaceable"] = True
        if self.call:
            fields["call"] = self.call
        if self.stop_requested_by is not None:
            fields["stop_requested_by"] = self.stop_requested_by
        return json.dumps(fields, separators=(",", ":"))

    def encode(self, owner: str) -> str:
        """The holder as the backends record it for ``owner``: a few dozen bytes (see
        :doc:`How the Redis backend stores locks </backend-internals>`)."""
        # Every held lock pays for these bytes.
        lock = _LOCK_CODES.get(self.lock, _OWN_LOCK)
        # RedisBroker's ids are UUIDs: 22 characters instead of 36. Another id that would read
        # as one has its first character escaped.
        redis_message_id = self.redis_message_id or ""
        short_id = _short_uuid(redis_message_id) if redis_message_id else None
        if short_id is not None:
            redis_message_id = short_id
        elif _SHORT_UUID_TEXT.fullmatch(redis_message_id):
            redis_message_id = f"%{ord(redis_message_id[0]):02X}{redis_message_id[1:]}"
        else:
            redis_message_id = escape(redis_message_id)
        stop = "" if self.stop_requested_by is None else "!"
        flags = f"{_STATE_CODES[self.state]}{lock}{stop}{'+' if self.replaceable else ''}"
        # Left out when it is the owner, as it is for every enqueue lock.
        message_id = "" if self.message_id == owner else escape(self.message_id)
        worker_id, actor, queue = escape(self.worker_id or ""), escape(self.actor), escape(self.queue)
        holder = f"{flags}|{worker_id}|{redis_message_id}|{actor}|{queue}|{message_id}"
        # A seventh field, only for an actor with lock_info, and an eighth, only for a holder
        # asked to stop (the seventh empty then, without a call). Their "*" is escaped too: a
        # lock's value without one holds no place that a line handed, which its release reads fast.
        if self.stop_requested_by is not None:
            return f"{holder}|{_escape_all(self.call or '')}|{_escape_all(self.stop_requested_by)}"
        if not self.call:
            return holder
        return f"{holder}|{_escape_all(self.call)}"


def _escape_all(text: str) -> str:
    """``text`` as a holder's last fields hold it: escaped, its ``*`` written ``%2A`` too."""
    return escape(text).replace("*", "%2A")


def format_record(*, expires_at: int | None, token: int, acquired_at: int, holder: str) -> str:
    """A holder's place as a lock stores it, ``holder`` being :meth:`Holder.encode`'s answer."""
    late = token // 1000 - acquired_at
    lifetime = "" if expires_at is None else expires_at - acquired_at
    return f"{token}|{late or ''}|{lifetime}|{holder}"


#: The length of a UUID in base64url, and what one looks like.
_SHORT_UUID = 22
_SHORT_UUID_TEXT = re.compile(f"[A-Za-z0-9_-]{{{_SHORT_UUID}}}")


def _short_uuid(text: str) -> str | None:
    """A UUID written as ``str(uuid.UUID)`` does, in base64url; ``None`` for other text."""
    if len(text) != 36 or text[8] != "-" or text[13] != "-" or text[18] != "-" or text[23] != "-":
        return None
    try:
        value = bytes.fromhex(text.replace("-", ""))
    except ValueError:
        return None
    if len(value) != 16 or text != text.lower():
        return None
    return base64.urlsafe_b64encode(value)[:_SHORT_UUID].decode()


def _long_uuid(text: str) -> str:
    try:
        h = base64.urlsafe_b64decode(text + "==").hex()
    except (binascii.Error, ValueError):
        return text
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _decode(owner: str, holder: str) -> dict[str, Any]:
    """The fields of a recorded holder, named as :class:`Holder` names them."""
    parts = holder.split("|")
    stop_requested_by = parts.pop() if len(parts) == 8 else None
    call = parts.pop() if len(parts) == 7 else ""
    flags, worker_id, redis_message_id, actor, queue, message_id = parts
    if not re.fullmatch("[qr][a-z][!]?[+]?[*]?", flags):
        raise ValueError(f"no holder's flags: {flags!r}")
    if (stop_requested_by is None) == ("!" in flags):
        raise ValueError(f"a holder asked to stop names who asked, and only it: {holder!r}")
    fields: dict[str, Any] = {"message_id": unescape(message_id) if message_id else owner}
    fields["actor"], fields["queue"] = unescape(actor), unescape(queue)
    fields["lock"], fields["state"] = _LOCKS.get(flags[1], "internal"), _STATES[flags[0]]
    if worker_id:
        fields["worker_id"] = unescape(worker_id)
    if redis_message_id:
        fields["redis_message_id"] = (
            _long_uuid(redis_message_id) if _SHORT_UUID_TEXT.fullmatch(redis_message_id) else unescape(redis_message_id)
        )
    if "+" in flags:
        fields["replaceable"] = True
    if flags.endswith("*"):
        fields["handed"] = True
    if stop_requested_by is not None:
        fields["stop_requested_by"] = unescape(stop_requested_by)
    if call:
        fields["call"] = unescape(call)
    return fields


@dataclass(frozen=True)
class LockRecord:
    """One holder's place in a lock, as stored, found by :meth:`~dramatiq_unique.LockBackend.scan`.

    Parameters:
      key(str): The lock's key.
      owner(str): The owner of the place.
      record(str): The place exactly as stored; :meth:`~dramatiq_unique.LockBackend.release_record`
        only gives the place up while it is still this.
      expires_at(int): When the place lapses, in ms of the backend's clock; ``None`` for never.
      token(int): The place's fencing token.
      acquired_at(int): When the place was taken, in ms of the backend's clock.
      holder(dict): The :class:`Holder` fields recorded with the place.
      unreadable(str): Why the place cannot be read, when it is not one this version wrote (another
        version's, a hand edit): its other fields are then empty, and readers skip it.
    """

    key: str
    owner: str
    record: str
    expires_at: int | None
    token: int
    acquired_at: int
    holder: dict[str, Any]
    unreadable: str | None = None

    @property
    def kind(self) -> str:
        """``"enqueue"`` or ``"run"``: which lock of its digest the place is in, told by the key."""
        return RUN if lock_kind(self.key) == RUN else ENQUEUE

    @classmethod
    def parse(cls, key: str, owner: str, record: str) -> LockRecord:
        """Read a place as ``format_record()`` wrote it."""
        first, second, third, holder = record.split("|", 3)
        # Digits only, as the scripts read them (int() would take "+5", " 5" or "1_0").
        if not (first.isascii() and first.isdigit()) or not all(
            n.isascii() and n.isdigit() for n in (second, third) if n
        ):
            raise ValueError(f"no record's numbers: {record!r}")
        token = int(first)
        acquired_at = token // 1000 - int(second or 0)
        return cls(
            key=key,
            owner=owner,
            record=record,
            expires_at=acquired_at + int(third) if third else None,
            token=token,
            acquired_at=acquired_at,
            holder=_decode(owner, holder),
        )


#: The first line of a lock whose line has messages waiting (holders.lua).
_WAITS = "~"


def parse_lock(key: str, value: str) -> list[LockRecord]:
    """The places recorded in the value of the lock at ``key``, as :meth:`LockRecord.parse` reads
    each; a place it cannot read comes as a record that says why (``unreadable``)."""
    places = []
    for line in value.split("\n"):
        if line and line != _WAITS:
            escaped, bar, record = line.partition("|")
            places.append(read_place(key, unescape(escaped) if bar else line, record if bar else line))
    return places


def read_place(key: str, owner: str, record: str) -> LockRecord:
    """A place as a backend answers it, owner and record apart; a place it cannot read comes as a
    record that says why (``unreadable``)."""
    try:
        return LockRecord.parse(key, owner, record)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        pass
    shown = record if len(record) <= 100 else record[:100] + "…"
    reason = (
        f"the place of {owner!r} holds {shown!r}, which is not a record of this version (written by another "
        "version, or by hand)"
    )
    return LockRecord(key, owner, record, None, 0, 0, {}, unreadable=reason)


@dataclass(frozen=True)
class Acquisition:
    """The answer to an acquisition attempt.

    Parameters:
      acquired(bool): Whether the caller holds the lock now.
      token(int): The fencing token of the caller's place.
      expires_at(int): When the caller's place lapses, in milliseconds of the
        backend's clock; ``None`` when it never does.
      holders(tuple[str]): When not acquired, the message_ids holding the lock.
      replaced(str): The queued holder whose place the caller took (:meth:`~dramatiq_unique.LockBackend.replace`).
      superseded(bool): The caller's own queued place was taken by a newer
        message (:meth:`~dramatiq_unique.LockBackend.swap`): the caller must not run.
      started_before(bool): This copy of a message that waited in line started before
        (``starting``): the caller must not run.
      waiting(int): The caller's message waits in the lock's line (a :class:`~dramatiq_unique.backends.Waiter`), at this
        place (1 is next); ``holders`` names those that hold the lock.
      displaced(str): The message_id of the waiter whose place in a full line the caller took
        (a :class:`~dramatiq_unique.backends.Waiter` that ``keeps_latest``); it is dropped.
      line_full(bool): The caller's message could not wait: the line is full.
      due_within(int): Milliseconds within which the caller's message is due at the latest: the
        time left until its series of debounced sends must run (:meth:`~dramatiq_unique.LockBackend.replace`
        with ``debounce_cap``); ``None`` otherwise.
    """

    acquired: bool
    token: int | None = None
    expires_at: int | None = None
    holders: tuple[str, ...] = ()
    replaced: str | None = None
    superseded: bool = False
    started_before: bool = False
    waiting: int | None = None
    displaced: str | None = None
    line_full: bool = False
    due_within: int | None = None


@dataclass(frozen=True)
class Waiter:
    """A message that waits in the lock's line when every place is taken, to be handed a place
    when one frees up, in the order they came.

    Parameters:
      message(bytes): The message, encoded by Dramatiq's encoder (``Message.encode()``: JSON by
        default, or any bytes, such as a ``PickleEncoder``'s), as it is to be enqueued when it is
        handed a place.
      line_limit(int): How many messages may wait in the line.
      keeps_latest(bool): When the line is full, this message takes the place of the last one
        waiting, which is dropped, instead of being refused.
    """

    message: bytes
    line_limit: int
    keeps_latest: bool = False


#: How long a lock whose line has messages waiting outlives its longest-lived holder, in
#: milliseconds: a place that lapsed there is handed on by the next step that finds it.
LINE_RETENTION = 20 * 60 * 1000

#: How long, in milliseconds, the copies of messages that started after they waited in line are
#: remembered: a second copy of one (after a crash mid-handoff) is skipped within that time.
SERVED_RETENTION = 3_600_000

#: How long, in milliseconds, a lock store that lost its data refuses new places when no
#: worker heals it: a worker that heals keeps refusing until it is done.
UNHEALED_REFUSAL = 30_000

#: Answers of :meth:`~dramatiq_unique.LockBackend.claim`.
#: Milliseconds by which an entry of the conflict trail may be older than the time it was added
#: at, as a reader of the entries since a time looks for them: a process's estimate of the
#: backend's clock may be that far off.
HISTORY_MARGIN = 60_000

HELD = "held"
LAPSED = "lapsed"
SUPERSEDED = "superseded"
STARTED_BEFORE = "started_before"


@dataclass(frozen=True)
class MessagesInHand:
    """What a worker publishes with its heartbeat of the messages in its hands:
    received from the broker and not yet acknowledged (waiting in its memory,
    delayed until due, or running), on a broker that cannot be asked for a
    message by its id.

    Parameters:
      message_ids(frozenset[str]): The ids of those messages that carry a lock.
      complete(bool): Whether they are all of them: ``False`` when the worker
        could not tell at that moment.
      taken_at(int): A time, in ms of the backend's clock, before which they
        were not counted: every message the worker held then and still holds is in it.
      interval(int): Milliseconds until its next publication (its heartbeat interval).
    """

    message_ids: frozenset[str]
    complete: bool
    taken_at: int
    interval: int

    def encode(self) -> str:
        return json.dumps(
            {"ids": sorted(self.message_ids), "complete": self.complete, "at": self.taken_at, "every": self.interval}
        )

    @classmethod
    def decode(cls, text: str) -> MessagesInHand:
        data = json.loads(text)
        return cls(frozenset(data["ids"]), bool(data["complete"]), int(data["at"]), int(data["every"]))


class StopRequested(int):
    """A renewal's answer (:meth:`~dramatiq_unique.LockBackend.renew_many`): the place's new
    expiry, whose holder was asked to stop (:meth:`~dramatiq_unique.LockBackend.request_stop`).

    Parameters:
      expires_at(int): The place's new expiry, the value of this int.
      by(str): Who asked, as :meth:`~dramatiq_unique.LockBackend.request_stop` was told.
    """

    by: str

    def __new__(cls, expires_at: int | str, by: str) -> StopRequested:
        answer = super().__new__(cls, expires_at)
        answer.by = by
        return answer


@dataclass(frozen=True)
class Lease:
    """A run lock's place to renew (:meth:`~dramatiq_unique.LockBackend.renew_many`), with
    :meth:`~dramatiq_unique.LockBackend.renew`'s arguments.

    Parameters:
      key(str): The lock's key.
      owner(str): The owner of the place.
      ttl(int): Milliseconds from now that the place is pushed back to.
      deadline(int): When the place must lapse at the latest, in ms of the backend's
        clock; ``None`` for no limit.
    """

    key: str
    owner: str
    ttl: int
    deadline: int | None = None


@dataclass(frozen=True)
class EvictionRisk:
    """A server of the lock store that evicts keys when its memory is full, so that it may
    drop held locks: its ``maxmemory-policy`` is not ``noeviction`` and its ``maxmemory`` is set.

    Parameters:
      server(str): The server, e.g. ``"10.0.0.5:6379"``.
      policy(str): Its ``maxmemory-policy``, e.g. ``"allkeys-lru"``.
      maxmemory(int): Its memory limit, in bytes.
    """

    server: str
    policy: str
    maxmemory: int


class LockBackend(abc.ABC):
    """Stores locks. Implementations must be safe to share between threads.

    Every method raises :class:`dramatiq_unique.errors.LockBackendError`
    when the storage cannot be reached.

    A method that frees a place hands it to the first message waiting in the lock's line
    (:class:`~dramatiq_unique.backends.Waiter`), in the same step, and passes the messages handed a place to
    :attr:`handoffs` to be enqueued.
    """

    #: Called with the messages that were handed a place, each ``b"<token>\\n<encoded message>"``
    #: (the token of its place), to enqueue them; set by the middleware. Without it, they keep
    #: their places and the orphan reaper enqueues them.
    handoffs: Callable[[list[bytes]], None] | None = None

    def hand_over(self, messages: Sequence[Any]) -> None:
        """Pass the messages a transition handed a place to :attr:`handoffs`; without it, say
        that they wait for an orphan reaper that has the application's broker."""
        if not messages:
            return
        handoffs = self.handoffs
        if handoffs is None:
            _logger.warning(
                "%d message(s) handed a place by a lock's line cannot be enqueued by this process, whose lock "
                "backend has no broker: each keeps its place until an orphan reaper with the application's broker "
                "enqueues it.",
                len(messages),
            )
            return
        handoffs([m if isinstance(m, bytes) else str(m).encode() for m in messages])

    def record_handoff(self, key: str, owner: str, *, holder: Holder, handoff: int) -> Acquisition:
        """A message that the line of the lock at ``key`` handed ``owner``'s place reaches the
        broker: record ``holder`` (with its broker id) in that place, while it is still queued
        and still the place of token ``handoff``.

        Returns:
          Acquisition: Not acquired when ``owner`` holds no such place (a copy of the message
          started already, the place was handed again, or it was freed). This implementation
          has no lines.
        """
        return Acquisition(acquired=False)

    def hand_again(self, key: str, owner: str, record: str) -> bytes | None:
        """Renew the token of the place a line handed ``owner``, while it is still exactly
        ``record`` and its message has not started: the orphan reaper enqueues that message
        again, and the copy first handed the place may not take it any more.

        Returns:
          bytes: The message to enqueue, as :attr:`handoffs` gets it (``b"<token>\\n<message>"``);
          ``None`` when the place changed or went, or its message started. This
          implementation has no lines.
        """
        return None

    def lines(self, keys: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The message_ids that wait in the line of each lock at ``keys``, in order, in one round
        trip where the backend can; a lock whose line is empty is left out. This implementation
        has no lines."""
        return {}

    def waiting_message(self, key: str, message_id: str) -> bytes | None:
        """The message (encoded) of ``message_id`` while it waits in a line of the digest of the
        lock at ``key``, or was handed a place and has not started; ``None`` otherwise."""
        return None

    def still_waiting(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        """Whether each message still waits in the line of its lock, for each ``(key, message_id)``
        of ``places``: it is among the waiters of the lock's digest and holds no place the lock's line
        handed it (a message handed a place is in the broker already). In one round trip where the backend
        can. This implementation asks :meth:`waiting_message` once for each, which also answers
        for a message handed a place that has not started: a backend with lines says better."""
        return [self.waiting_message(key, message_id) is not None for key, message_id in places]

    def unpersisted_servers(self) -> tuple[str, ...]:
        """The servers of the lock store known to keep nothing on disk (neither an append-only
        file nor snapshots), so that a restart loses every lock and every message waiting in
        a line. ``()`` (the default) when none is, or the backend cannot tell."""
        return ()

    def for_native_thread(self) -> LockBackend | None:
        """This backend, for a native thread of a process that gevent monkey-patched: one that
        reaches the same storage without gevent's sockets, which belong to the hub of the thread
        that opened them. ``None`` (the default) when there is no such backend: the leases of a
        gevent worker's run locks are then renewed from a greenlet.
        """
        return None

    def eviction_risks(self) -> tuple[EvictionRisk, ...]:
        """The servers of the storage that may evict locks when their memory is full. This
        implementation knows of none: a backend that can tell says.

        Raises:
          LockBackendError: If the storage cannot be asked.
        """
        return ()

    @abc.abstractmethod
    def acquire(
        self,
        key: str,
        owner: str,
        *,
        limit: int,
        ttl: int | None,
        holder: Holder,
        extend: int = 0,
        healing: bool = False,
        waiter: Waiter | None = None,
        starting: str | None = None,
    ) -> Acquisition:
        """Take one of the ``limit`` places of the lock at ``key`` for ``owner``.

        If ``owner`` already has a place, it is kept with its token and its
        expiry is pushed back to at least ``ttl + extend`` from now: this is
        how re-enqueues of the same message pass their own lock. A message
        holds at most one place: when another owner holds one for the same
        ``holder.message_id`` (a redelivery meeting its earlier attempt), the
        answer is not acquired and names only that message.

        Parameters:
          key(str): The lock's key.
          owner(str): Who takes the place.
          limit(int): How many owners may hold the lock at once.
          ttl(int): Milliseconds until the place lapses, or ``None`` for never.
          holder(Holder): What to record about the holder.
          extend(int): Milliseconds added to ``ttl``, e.g. a message's delay.
          healing(bool): Take the place even while the store refuses new ones after a
            loss of its data (:meth:`refuse_new_places`): the places of the messages
            that held them before the loss.
          waiter(Waiter): Wait in the lock's line when every place is taken, or when others
            wait already: the answer's ``waiting`` says where (or ``line_full``).
          starting(str): The message starts, as the copy that a line handed the place of this
            token (``""`` for a message no line handed a place), and waits in line with
            ``waiter``: it takes the place its line handed it, if any; another copy of a message
            that started after it waited in line is answered ``started_before``.

        Raises:
          LockStoreHealing: If the store refuses new places; a place kept is never refused.
        """

    @abc.abstractmethod
    def release(self, key: str, owner: str) -> bool:
        """Give up ``owner``'s place in the lock at ``key``.

        Returns:
          bool: False when ``owner`` held no place (it lapsed, or never was).
        """

    def release_many(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        """Give up several places at once, each ``(key, owner)`` as in
        :meth:`release`, in as few round trips as the backend can. This
        implementation releases them one by one; a backend may do better.

        Returns:
          list[bool]: For each place, whether ``owner`` held it.

        Raises:
          LockBackendError: If the backend failed; some of the places may
            have been given up.
        """
        return [self.release(key, owner) for key, owner in places]

    @abc.abstractmethod
    def replace(
        self,
        key: str,
        owner: str,
        *,
        replaced_key: str,
        limit: int,
        ttl: int | None,
        holder: Holder,
        extend: int = 0,
        debounce_cap: int | None = None,
        healing: bool = False,
    ) -> Acquisition:
        """As :meth:`acquire`, but when every place is taken, first take the
        place of the oldest holder that is ``"queued"`` and ``replaceable``, and add that
        holder's owner to the set at ``replaced_key``. Holders that run keep
        their places. The answer names the replaced owner.

        Parameters:
          debounce_cap(int): The sends of the lock's digest are debounced, and a series of them
            runs at least once per this many milliseconds. A new place that replaced nobody
            starts a series, due within ``debounce_cap`` (its deadline, kept beside the lock at
            ``<prefix>:{<digest>}:debounce``); one that replaced a holder continues
            the series, due within what is left of its deadline (0 once it passed). The
            answer's ``due_within`` says which; ``None``, the default, starts or continues nothing.
          healing(bool): As for :meth:`acquire`: the place is taken, and a queued holder's taken,
            even while the store heals.
        """

    @abc.abstractmethod
    def claim(
        self, key: str, owner: str, *, replaced_key: str | None, release: bool, holder: Holder, starting: str = ""
    ) -> str:
        """A message that holds a place in the enqueue lock at ``key`` starts:
        give the place up (``release``) or record it as running (``holder``).

        Parameters:
          starting(str): The copy of the message that starts, as for :meth:`acquire`.

        Returns:
          str: ``"held"``; ``"lapsed"`` when ``owner`` held no place; or
          ``"superseded"`` when a newer message took its place, in which case
          the owner is removed from the set at ``replaced_key`` and must not run
          (``None`` for a message whose actor never replaces a queued holder:
          nothing to look at);
          or ``"started_before"`` when that copy of a message that waited in line
          started before, and must not run.
        """

    @abc.abstractmethod
    def swap(
        self,
        *,
        release_key: str,
        release_owner: str,
        replaced_key: str,
        acquire_key: str,
        owner: str,
        limit: int,
        ttl: int | None,
        holder: Holder,
        waiter: Waiter | None = None,
        starting: str = "",
    ) -> Acquisition:
        """In one atomic step, take a place in the lock at ``acquire_key``
        and, only if that succeeded, give up ``release_owner``'s place in the
        lock at ``release_key``. All keys belong to one digest. If a newer
        message took ``release_owner``'s place, nothing is taken and the
        answer is ``superseded``. With ``waiter`` and ``starting``, as for
        :meth:`acquire`; a message that waits in line gives up its place too.
        """

    # Leases and worker liveness -------------------------------------------------

    @abc.abstractmethod
    def renew(self, key: str, owner: str, *, ttl: int, deadline: int | None = None) -> int | None:
        """Push back the expiry of ``owner``'s place to ``ttl`` ms from now,
        but never past ``deadline`` and never earlier than it was (only the owner's own place is touched).

        Returns:
          int: The place's new expiry in ms of the backend's clock (0 for a
          place that never lapses), or ``None`` when ``owner`` holds no place:
          its lease ran out, or it was released.
        """

    def request_stop(self, key: str, message_ids: Sequence[str] = (), *, by: str) -> list[str]:
        """Ask running holders of the lock at ``key`` to stop: each is marked in its own record,
        with who asked, so the request goes with its place, and its worker learns it in the
        answer to its next renewal (a :class:`~dramatiq_unique.backends.StopRequested` from
        :meth:`renew_many`). Queued holders are left alone, and a holder asked before keeps
        the first who asked.
        This implementation raises: a backend that cannot mark its holders fails like a store
        that does not answer, so ``cancel_in_progress`` waits for the holder to end and
        :meth:`~dramatiq_unique.Locks.cancel` says why.

        Parameters:
          message_ids(list[str]): The messages whose running places to mark; empty for every
            running holder.
          by(str): Who asks, as a person reads it (``Holder.stop_requested_by``).

        Returns:
          list[str]: The message_ids of the holders asked (now or before), oldest first.
        """
        raise LockBackendError(f"{type(self).__name__} cannot ask a running holder to stop: it has no request_stop.")

    def renew_many(self, leases: Sequence[Lease]) -> list[int | None | LockBackendError]:
        """Renew several leases at once, each as :meth:`renew` does, in as few round trips as the
        backend can: a worker's heartbeat renews every lease that is due together. This
        implementation renews them one by one; a backend may do better. The expiry of a place
        whose holder was asked to stop is a :class:`~dramatiq_unique.backends.StopRequested`.

        Parameters:
          leases(list[Lease]): The places to renew; a key may come more than once (a lock with
            several places held by one worker).

        Returns:
          list: For each lease, :meth:`renew`'s answer: the new expiry, 0 for a place that never
          lapses, ``None`` for one that ``owner`` no longer holds; or the
          :class:`~dramatiq_unique.errors.LockBackendError` that kept it from being renewed.
          A failure of some leases (on Redis Cluster, those of one hash slot) leaves the
          others' answers.
        """
        answers: list[int | None | LockBackendError] = []
        for lease in leases:
            try:
                answers.append(self.renew(lease.key, lease.owner, ttl=lease.ttl, deadline=lease.deadline))
            except LockBackendError as e:
                answers.append(e)
        return answers

    @abc.abstractmethod
    def heartbeat(self, key: str, worker_id: str, *, ttl: int, in_hand: MessagesInHand | None = None) -> int:
        """Record in the registry at ``key`` that ``worker_id`` counts as alive
        for ``ttl`` ms from now (its lease period): until its next heartbeat, or its death.

        Parameters:
          in_hand(MessagesInHand): What the worker holds, published in the same
            step for :meth:`messages_in_hand`; ``None`` publishes nothing.

        Returns:
          int: Now, in ms of the backend's clock.
        """

    @abc.abstractmethod
    def heartbeats(self, key: str) -> tuple[int, dict[str, int]]:
        """The registry at ``key``: now, and the time until which each worker
        counts as alive, in ms of the backend's clock."""

    def messages_in_hand(self, key: str) -> tuple[int, dict[str, int], dict[str, MessagesInHand]]:
        """The registry at ``key`` as :meth:`heartbeats` reads it, and what each
        worker last published with its heartbeat of the messages in its hands, read at once.
        This implementation knows of no publication: a backend that stores them says."""
        now, alive_until = self.heartbeats(key)
        return now, alive_until, {}

    @abc.abstractmethod
    def forget_workers(self, key: str, *, worker_id: str | None = None, before: int | None = None) -> int:
        """Remove ``worker_id``, or every worker that counted as alive only
        until before ``before``, from the registry at ``key``, with what it
        published of the messages in its hands.

        Returns:
          int: How many were removed.
        """

    def epochs(self, prefix: str) -> dict[str, str]:
        """The mark of each part of the store (a node; each master of a Redis Cluster),
        written where it is missing: a random value that changes only when that part lost
        its data. Under ``prefix``, the middleware's lock prefix.

        Returns:
          dict: The key of each mark -> its value. This implementation knows of no part: a
          backend that can tell a loss of its data says.
        """
        return {}

    def refuse_new_places(self, prefix: str, *, ttl: int) -> None:
        """Refuse new places in the locks under ``prefix`` for ``ttl`` ms, or until
        :meth:`accept_new_places`: the store lost its data, and a worker heals it. Places
        kept, and those taken with ``healing``, are not refused. This implementation
        refuses none: a backend that can tell a loss of its data does.
        """
        return None

    def accept_new_places(self, prefix: str) -> None:
        """Take new places under ``prefix`` again: the worker that healed the store is done."""
        return None

    def refusing(self, prefix: str) -> bool:
        """Whether new places under ``prefix`` are refused now (:meth:`refuse_new_places`, or
        a script that found the store's data gone). This implementation refuses none."""
        return False

    def forget_epochs(self) -> None:
        """Forget which marks (:meth:`epochs`) this process saw: the last worker of the
        process stopped, and a store emptied from now on (a test suite's flush) is no
        loss this process can tell."""
        return None

    # The orphan reaper ----------------------------------------------------------

    @abc.abstractmethod
    def scan(self, prefix: str, cursor: str, count: int, *, digest_start: str = "") -> tuple[str, list[LockRecord]]:
        """One bounded step through the locks under ``prefix``: the
        enqueue and run locks, not the other keys of a digest.

        Parameters:
          prefix(str): The lock prefix.
          cursor(str): ``"0"`` to start, else what the previous step returned.
          count(int): About how many keys to look at in this step.
          digest_start(str): Only the locks whose digest starts with this (all when empty): a
            backend that can filter keys where they are stored reads no other lock.

        Returns:
          tuple: The cursor of the next step (``"0"`` when every lock was
          seen) and the places of the locks found in this step.
        """

    @abc.abstractmethod
    def release_record(self, key: str, owner: str, record: str) -> bool:
        """Give up ``owner``'s place only while it is still exactly ``record``
        (neither renewed, re-entered nor re-taken since it was read).

        Returns:
          bool: Whether the place was given up; a place that lapsed as it was read counts
          (this step drops it, and hands it to the line).

        Raises:
          LineNeedsBroker: If messages wait in the lock's line and :attr:`handoffs` is not set:
            nothing was freed.
        """

    # Operations: seeing and freeing held locks ---------------------------------

    @abc.abstractmethod
    def time(self) -> int:
        """Now, in ms of the backend's clock: the clock of every ``expires_at`` and ``acquired_at``."""

    @abc.abstractmethod
    def read(self, keys: Sequence[str]) -> tuple[int, list[LockRecord]]:
        """The places of the locks at ``keys``, all of one digest, read at once.

        Returns:
          tuple: Now, in ms of the backend's clock, and the places that have
          not lapsed.
        """

    def read_many(self, keys: Sequence[str]) -> list[LockRecord]:
        """The places of the locks at ``keys``, of any digests, as :meth:`read` reads them, in as
        few round trips as the store allows: by default one :meth:`read` per digest."""
        by_digest: dict[str | None, list[str]] = {}
        for key in keys:
            by_digest.setdefault(digest_of(key), []).append(key)
        return [record for group in by_digest.values() for record in self.read(group)[1]]

    @abc.abstractmethod
    def release_records(self, key: str, records: Mapping[str, str]) -> list[str]:
        """Give up, in one atomic step, the place of each owner in ``records``
        that is still exactly its record there (see :meth:`release_record`).

        Parameters:
          key(str): The lock's key.
          records(Mapping): owner -> the place as it was read (the ``record``
            of its :class:`~dramatiq_unique.backends.LockRecord`).

        Returns:
          list[str]: The owners whose places were given up.

        Raises:
          LineNeedsBroker: If messages wait in the lock's line and :attr:`handoffs` is not set:
            nothing was freed.
        """

    @abc.abstractmethod
    def get_value(self, key: str) -> str | None:
        """A small value stored at ``key``, e.g. the reaper's cursor."""

    @abc.abstractmethod
    def set_value(self, key: str, value: str, *, ttl: int) -> None:
        """Store a small value at ``key`` for ``ttl`` ms."""

    # Counters (lock activity per minute) ------------------------------------

    @abc.abstractmethod
    def add_counts(self, counts: Mapping[str, Mapping[str, int]], *, ttl: int) -> None:
        """Add to counters kept in hashes, in one round trip: for each key,
        each field's count is added, and the key is kept ``ttl`` ms from now.
        The keys share one hash tag.

        Parameters:
          counts(Mapping): key -> field -> how much to add.
          ttl(int): Milliseconds each of these keys is kept.
        """

    @abc.abstractmethod
    def read_counts(self, keys: Sequence[str]) -> list[dict[str, int]]:
        """The counters kept at each of ``keys`` (field -> count; empty for a
        key that does not exist), in one round trip. The keys share one hash tag."""

    # The conflict trail ------------------------------------------------------

    @abc.abstractmethod
    def add_history(self, key: str, entries: Sequence[Mapping[str, str]], *, max_entries: int, retention: int) -> None:
        """Add ``entries`` to the conflict trail at ``key``, in one round trip, in order, and
        bound it: the oldest entries beyond ``max_entries`` go, and so do those added more than
        ``retention`` ms ago; the whole trail goes when nothing was added for ``retention`` ms.

        An entry is a flat map of text fields; :meth:`read_history` filters on three of them:
        ``"at"`` (when it happened, ms of the backend's clock), ``"actor"`` and ``"digest"``.

        Parameters:
          key(str): The trail of one lock prefix (``keys.history_key``).
          entries(Sequence[Mapping]): The entries, oldest first.
          max_entries(int): The most entries the trail keeps.
          retention(int): Milliseconds an entry is kept.
        """

    @abc.abstractmethod
    def read_history(
        self,
        key: str,
        *,
        since: int | None = None,
        actor: str | None = None,
        digest: str | None = None,
        within: int | None = None,
        limit: int,
    ) -> tuple[int, list[tuple[str, dict[str, str]]]]:
        """The entries of the conflict trail at ``key``, newest added first, in one round trip.

        Parameters:
          since(int): Only the entries whose ``"at"`` is at least this, in ms of the backend's clock.
          within(int): Only the entries of the last ``within`` ms of the backend's clock.
          actor(str): Only the entries of this ``"actor"``.
          digest(str): Only the entries of this ``"digest"``.
          limit(int): The most entries returned.

        Returns:
          tuple: Now, in ms of the backend's clock, and the entries: each its id in the trail
          and its fields as added.
        """
