"""An in-memory lock backend for tests."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import LineNeedsBroker, LockBackendError, LockStoreHealing
from ..keys import debounce_key, digest_keys_start, epoch_key, line_key, lock_kind, prefix_of, served_key, waiters_key
from .base import (
    HELD,
    HISTORY_MARGIN,
    LAPSED,
    LINE_RETENTION,
    SERVED_RETENTION,
    STARTED_BEFORE,
    SUPERSEDED,
    Acquisition,
    EvictionRisk,
    Holder,
    Lease,
    LockBackend,
    LockRecord,
    MessagesInHand,
    StopRequested,
    Waiter,
    format_record,
)


@dataclass
class _Place:
    holder: Holder
    token: int
    acquired_at: int
    expires_at: int | None
    #: A line handed it the place: its message is among the waiters until it starts.
    handed: bool = False

    def record(self, owner: str) -> str:
        # The format RedisBackend stores, so release_record compares the same thing.
        holder = self.holder.encode(owner)
        if self.handed:
            flags, rest = holder.split("|", 1)
            holder = f"{flags}*|{rest}"
        return format_record(expires_at=self.expires_at, token=self.token, acquired_at=self.acquired_at, holder=holder)


@dataclass
class _Lock:
    places: dict[str, _Place] = field(default_factory=dict)


@dataclass(frozen=True)
class _Waiting:
    """A message that waits in a line, or was handed a place and has not started."""

    limit: int
    holder: Holder
    message: bytes


class StubBackend(LockBackend):
    """An in-memory lock backend with the semantics of :class:`RedisBackend`,
    for unit tests with Dramatiq's ``StubBroker``. It is thread-safe and
    lives in one process.
    """

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, _Lock] = {}
        self._replaced: dict[str, set[str]] = {}
        #: The deadline (ms) of each series of debounced sends, by its key.
        self._deadlines: dict[str, int] = {}
        self._workers: dict[str, dict[str, int]] = {}
        self._in_hand: dict[str, dict[str, MessagesInHand]] = {}
        self._marks: dict[str, str] = {}
        #: The lock prefixes whose new places are refused while a worker heals: -> until when (ms).
        self._refusals: dict[str, int] = {}
        self._values: dict[str, tuple[str, int]] = {}
        #: Counters: key -> (field -> count, expires_at).
        self._counts: dict[str, tuple[dict[str, int], int]] = {}
        #: Conflict trails: key -> (entries as (ms, seq, fields), oldest first; expires_at; last id).
        self._history: dict[str, tuple[list[tuple[int, int, dict[str, str]]], int, tuple[int, int]]] = {}
        #: The last token of each lock, kept after its last holder: tokens increase
        #: whatever this process's clock does.
        self._fences: dict[str, int] = {}
        #: The lines: the key of each -> the message ids that wait, in order.
        self._lines: dict[str, list[str]] = {}
        #: The waiters of each digest: key -> message id -> what it waits with.
        self._waiters: dict[str, dict[str, _Waiting]] = {}
        #: The copies of messages that started after they waited, per digest: key -> copy -> when (ms).
        self._served: dict[str, dict[str, int]] = {}

    def for_native_thread(self) -> StubBackend:
        """Itself: it holds no sockets."""
        return self

    def eviction_risks(self) -> tuple[EvictionRisk, ...]:
        """None: it keeps every lock until it is released or lapses, however many there are."""
        return ()

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
        handed: list[bytes] = []
        try:
            with self._mutex:
                refused = not healing and self._refusing(key)
                if waiter is None:
                    # As on Redis, those in line are handed the free places before a newcomer.
                    handed += self._hand_over(key)
                    return self._acquire(
                        key, owner, limit=limit, ttl=ttl, holder=holder, extend=extend, refused=refused
                    )
                return self._take_or_wait(
                    key, owner, limit=limit, ttl=ttl, holder=holder, extend=extend, refused=refused,
                    waiter=waiter, starting=starting, handed=handed,
                )  # fmt: skip
        finally:
            # As on Redis, the places handed before a refusal (LockStoreHealing) are handed.
            self.hand_over(handed)

    def release(self, key: str, owner: str) -> bool:
        handed: list[bytes] = []
        with self._mutex:
            released = self._release(key, owner, handed)
        self.hand_over(handed)
        return released

    def release_many(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        handed: list[bytes] = []
        with self._mutex:
            released = [self._release(key, owner, handed) for key, owner in places]
        self.hand_over(handed)
        return released

    def record_handoff(self, key: str, owner: str, *, holder: Holder, handoff: int) -> Acquisition:
        with self._mutex:
            place = self._live_place(key, owner, _now())
            if place is None or place.holder.state != "queued" or place.token != handoff:
                return Acquisition(acquired=False)
            place.holder, place.handed = holder, True
            return Acquisition(acquired=True, token=place.token, expires_at=place.expires_at)

    def hand_again(self, key: str, owner: str, record: str) -> bytes | None:
        with self._mutex:
            place = self._live_place(key, owner, _now())
            waiting = self._waiters.get(waiters_key(key), {}).get(place.holder.message_id) if place else None
            if place is None or waiting is None or place.record(owner) != record:
                return None
            now_us = time.time_ns() // 1000
            place.token = self._fences[key] = max(self._fences.get(key, 0) + 1, now_us)
            place.acquired_at = now_us // 1000
            return b"%d\n%b" % (place.token, waiting.message)

    def lines(self, keys: Sequence[str]) -> dict[str, tuple[str, ...]]:
        with self._mutex:
            return {key: tuple(line) for key in keys if (line := self._lines.get(line_key(key)))}

    def waiting_message(self, key: str, message_id: str) -> bytes | None:
        with self._mutex:
            waiting = self._waiters.get(waiters_key(key), {}).get(message_id)
            return None if waiting is None else waiting.message

    def still_waiting(self, places: Sequence[tuple[str, str]]) -> list[bool]:
        answers = []
        with self._mutex:
            for key, message_id in places:
                # As on Redis: among the waiters, and not handed a place in the lock (one that never lapses).
                place = self._locks[key].places.get(message_id) if key in self._locks else None
                handed = place is not None and place.handed
                answers.append(message_id in self._waiters.get(waiters_key(key), {}) and not handed)
        return answers

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
        handed: list[bytes] = []
        try:
            with self._mutex:
                refused = not healing and self._refusing(key)
                now = _now()
                # As on Redis, those in line are handed the free places before a holder is replaced.
                handed += self._hand_over(key)
                lock = self._live(key, now)
                held_before = owner in lock.places
                victim = None
                # While the store heals, no holder loses its place: a newer message is a conflict.
                if len(lock.places) >= limit and owner not in lock.places and not refused:
                    queued = [
                        (p.token, o)
                        for o, p in lock.places.items()
                        if p.holder.state == "queued" and p.holder.replaceable
                    ]
                    if queued:
                        victim = min(queued)[1]
                        del lock.places[victim]
                        self._replaced.setdefault(replaced_key, set()).add(victim)
                acquisition = self._acquire(
                    key, owner, limit=limit, ttl=ttl, holder=holder, extend=extend, refused=refused
                )
                if not acquisition.acquired or held_before:
                    return acquisition
                due_within = None
                if debounce_cap:
                    series = debounce_key(key)
                    if victim:
                        # The series goes on until its deadline. Gone, it passed: the series is due now.
                        due_within = max(0, self._deadlines.get(series, now) - now)
                    else:
                        self._deadlines[series] = now + debounce_cap
                        due_within = debounce_cap
                return dataclasses.replace(acquisition, replaced=victim, due_within=due_within)
        finally:
            self.hand_over(handed)

    def claim(
        self, key: str, owner: str, *, replaced_key: str | None, release: bool, holder: Holder, starting: str = ""
    ) -> str:
        handed: list[bytes] = []
        with self._mutex:
            answer = self._claim(
                key, owner, replaced_key=replaced_key, release=release, holder=holder, starting=starting, handed=handed
            )
        self.hand_over(handed)
        return answer

    def _claim(
        self,
        key: str,
        owner: str,
        *,
        replaced_key: str | None,
        release: bool,
        holder: Holder,
        starting: str,
        handed: list[bytes],
    ) -> str:
        if replaced_key is not None and self._forget_replaced(replaced_key, owner):
            self._release(key, owner, handed)
            return SUPERSEDED
        if release and not starting:
            # As on Redis, a start that gives its place up is a release (until_executing): a
            # message that waited in the line without a place leaves it too.
            return HELD if self._release(key, owner, handed) else LAPSED
        lock = self._live(key, time.time_ns() // 1_000_000)
        place = lock.places.get(owner)
        if starting and (
            self._served_before(key, owner, starting) or self._handed_to_another(key, owner, place, starting)
        ):
            # This copy takes nothing, but the places that lapsed go to the line, as at any other start.
            handed += self._hand_over(key)
            return STARTED_BEFORE
        if place is None:
            handed += self._hand_over(key)
            return LAPSED
        self._serve(key, owner, starting)
        if release:
            self._release(key, owner, handed)
        else:
            place.holder, place.handed = holder, False
            handed += self._hand_over(key)
        return HELD

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
        handed: list[bytes] = []
        try:
            with self._mutex:
                return self._swap(
                    release_key, release_owner, replaced_key, acquire_key, owner,
                    limit=limit, ttl=ttl, holder=holder, waiter=waiter, starting=starting, handed=handed,
                )  # fmt: skip
        finally:
            self.hand_over(handed)

    def _swap(
        self,
        release_key: str,
        release_owner: str,
        replaced_key: str,
        acquire_key: str,
        owner: str,
        *,
        limit: int,
        ttl: int | None,
        holder: Holder,
        waiter: Waiter | None,
        starting: str,
        handed: list[bytes],
    ) -> Acquisition:
        if self._forget_replaced(replaced_key, release_owner):
            self._release(release_key, release_owner, handed)
            return Acquisition(acquired=False, superseded=True)
        # As swap.lua, which reads this place alone, lapsed or not: the lock's lapsed places stay
        # for a step that hands them to its line.
        lock = self._locks.get(release_key)
        place = lock.places.get(release_owner) if starting and lock is not None else None
        if starting and (
            self._served_before(release_key, release_owner, starting)
            or self._handed_to_another(release_key, release_owner, place, starting)
        ):
            return Acquisition(acquired=False, started_before=True)
        refused = self._refusing(acquire_key)
        if waiter is None:
            handed += self._hand_over(acquire_key)
            acquisition = self._acquire(
                acquire_key, owner, limit=limit, ttl=ttl, holder=holder, extend=0, refused=refused
            )
        else:
            acquisition = self._take_or_wait(
                acquire_key, owner, limit=limit, ttl=ttl, holder=holder, extend=0, refused=refused,
                waiter=waiter, starting=starting, handed=handed,
            )  # fmt: skip
        if acquisition.acquired:
            self._serve(release_key, release_owner, starting)
        if acquisition.acquired or acquisition.waiting:
            self._release(release_key, release_owner, handed, stays_waiting=bool(acquisition.waiting))
        return acquisition

    def renew(self, key: str, owner: str, *, ttl: int, deadline: int | None = None) -> int | None:
        with self._mutex:
            renewed = self._renew(Lease(key, owner, ttl, deadline), _now())
            return None if renewed is None else int(renewed)

    def renew_many(self, leases: Sequence[Lease]) -> list[int | None | LockBackendError]:
        # In one step with one clock, as RedisBackend's script does.
        with self._mutex:
            now = _now()
            return [self._renew(lease, now) for lease in leases]

    def _renew(self, lease: Lease, now: int) -> int | None:
        place = self._live_place(lease.key, lease.owner, now)
        if place is None:
            return None
        by = place.holder.stop_requested_by
        if place.expires_at is None:
            return 0 if by is None else StopRequested(0, by)
        target = now + lease.ttl if lease.deadline is None else min(now + lease.ttl, lease.deadline)
        place.expires_at = max(place.expires_at, target)
        return place.expires_at if by is None else StopRequested(place.expires_at, by)

    def request_stop(self, key: str, message_ids: Sequence[str] = (), *, by: str) -> list[str]:
        with self._mutex:
            now = _now()
            if key in self._locks and not self._lines.get(line_key(key)):
                self._drop_lapsed(key, now)
            lock = self._locks.get(key)
            asked: list[str] = []
            for place in lock.places.values() if lock is not None else ():
                lapsed = place.expires_at is not None and place.expires_at <= now
                message_id = place.holder.message_id
                if lapsed or place.holder.state != "running" or (message_ids and message_id not in message_ids):
                    continue
                if place.holder.stop_requested_by is None:
                    place.holder = dataclasses.replace(place.holder, stop_requested_by=by)
                asked.append(message_id)
            return asked

    def heartbeat(self, key: str, worker_id: str, *, ttl: int, in_hand: MessagesInHand | None = None) -> int:
        with self._mutex:
            now = _now()
            self._workers.setdefault(key, {})[worker_id] = now + ttl
            if in_hand is not None:
                self._in_hand.setdefault(key, {})[worker_id] = in_hand
            return now

    def heartbeats(self, key: str) -> tuple[int, dict[str, int]]:
        with self._mutex:
            return _now(), dict(self._workers.get(key, {}))

    def messages_in_hand(self, key: str) -> tuple[int, dict[str, int], dict[str, MessagesInHand]]:
        with self._mutex:
            return _now(), dict(self._workers.get(key, {})), dict(self._in_hand.get(key, {}))

    def forget_workers(self, key: str, *, worker_id: str | None = None, before: int | None = None) -> int:
        with self._mutex:
            workers = self._workers.get(key, {})
            gone = [w for w, alive in workers.items() if w == worker_id or (before is not None and alive < before)]
            published = self._in_hand.get(key, {})
            for w in gone:
                del workers[w]
                published.pop(w, None)
            if worker_id is not None:
                published.pop(worker_id, None)
            return len(gone)

    def scan(self, prefix: str, cursor: str, count: int, *, digest_start: str = "") -> tuple[str, list[LockRecord]]:
        # The cursor is the last key seen, so a step resumes after it whatever changed meanwhile.
        with self._mutex:
            after = "" if cursor == "0" else cursor[2:]
            start = digest_keys_start(prefix) + digest_start
            keys = sorted(k for k in self._locks if k.startswith(start) and lock_kind(k) and k > after)[:count]
            # As on Redis, a lapsed place is found until an operation on its lock drops it, while
            # its lock lasts: until its longest-lived place lapses (LINE_RETENTION later while
            # messages wait in its line).
            now = _now()
            records = [
                LockRecord.parse(key, owner, place.record(owner))
                for key in keys
                if self._lasts(key, now)
                for owner, place in self._locks[key].places.items()
            ]
            return ("0" if len(keys) < count else "k:" + keys[-1]), records

    def release_record(self, key: str, owner: str, record: str) -> bool:
        return bool(self.release_records(key, {owner: record}))

    def time(self) -> int:
        return _now()

    def read(self, keys: Sequence[str]) -> tuple[int, list[LockRecord]]:
        with self._mutex:
            now = _now()
            # As read.lua, which writes nothing: a lapsed place stays for a step that hands it to the line.
            records = [
                LockRecord.parse(key, owner, place.record(owner))
                for key in keys
                if key in self._locks
                for owner, place in self._locks[key].places.items()
                if place.expires_at is None or place.expires_at > now
            ]
            return now, records

    def release_records(self, key: str, records: Mapping[str, str]) -> list[str]:
        handed: list[bytes] = []
        with self._mutex:
            waiting = len(self._lines.get(line_key(key), []))
            if waiting and self.handoffs is None:
                raise LineNeedsBroker(key, waiting)
            read = dict(self._locks[key].places) if key in self._locks else {}
            if len(read) == 1 and not waiting:
                # On Redis, a lock of one place and no line expires with that place.
                read = {o: p for o, p in read.items() if p.expires_at is None or p.expires_at > _now()}
            places = self._live(key, _now()).places
            freed = [
                owner for owner, record in records.items() if owner in read and read[owner].record(owner) == record
            ]
            for owner in freed:
                if owner in places:
                    self._release(key, owner, handed, unlocked=True)
                else:  # it lapsed as read: the read dropped it, and its message leaves the waiters
                    self._waiters.get(waiters_key(key), {}).pop(read[owner].holder.message_id, None)
            handed += self._hand_over(key)
        self.hand_over(handed)
        return freed

    def get_value(self, key: str) -> str | None:
        with self._mutex:
            value, expires_at = self._values.get(key, (None, 0))
            return value if expires_at > _now() else None

    def set_value(self, key: str, value: str, *, ttl: int) -> None:
        with self._mutex:
            self._values[key] = (value, _now() + ttl)

    def add_counts(self, counts: Mapping[str, Mapping[str, int]], *, ttl: int) -> None:
        with self._mutex:
            now = _now()
            for key, fields in counts.items():
                kept, expires_at = self._counts.get(key, ({}, 0))
                if expires_at <= now:
                    kept = {}
                for name, count in fields.items():
                    kept[name] = kept.get(name, 0) + count
                self._counts[key] = (kept, now + ttl)

    def read_counts(self, keys: Sequence[str]) -> list[dict[str, int]]:
        with self._mutex:
            now = _now()
            answers = []
            for key in keys:
                kept, expires_at = self._counts.get(key, ({}, 0))
                answers.append(dict(kept) if expires_at > now else {})
            return answers

    def add_history(self, key: str, entries: Sequence[Mapping[str, str]], *, max_entries: int, retention: int) -> None:
        with self._mutex:
            now = _now()
            kept, expires_at, last = self._history.get(key, ([], 0, (0, 0)))
            if expires_at <= now:
                kept = []
            for fields in entries:
                # As a stream's ids: the time it was added, made greater than the last one.
                last = (now, 0) if now > last[0] else (last[0], last[1] + 1)
                kept.append((*last, dict(fields)))
                del kept[: max(0, len(kept) - max_entries)]
            kept = [entry for entry in kept if entry[0] >= now - retention]
            self._history[key] = (kept, now + retention, last)

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
        with self._mutex:
            now = _now()
            if within is not None and (since is None or now - within > since):
                since = now - within
            kept, expires_at, _ = self._history.get(key, ([], 0, (0, 0)))
            found: list[tuple[str, dict[str, str]]] = []
            for ms, seq, fields in reversed(kept if expires_at > now else []):
                if len(found) >= limit or (since is not None and ms < since - HISTORY_MARGIN):
                    break
                if (
                    (actor is None or fields.get("actor") == actor)
                    and (digest is None or fields.get("digest") == digest)
                    and (since is None or _integer(fields.get("at")) >= since)
                ):
                    found.append((f"{ms}-{seq}", dict(fields)))
            return now, found

    def epochs(self, prefix: str) -> dict[str, str]:
        key = epoch_key(prefix)
        with self._mutex:
            return {key: self._marks.setdefault(key, uuid.uuid4().hex)}

    def refuse_new_places(self, prefix: str, *, ttl: int) -> None:
        with self._mutex:
            self._refusals[prefix] = _now() + ttl

    def refusing(self, prefix: str) -> bool:
        with self._mutex:
            return self._refusals.get(prefix, 0) > _now()

    def accept_new_places(self, prefix: str) -> None:
        with self._mutex:
            self._refusals.pop(prefix, None)

    def flush(self) -> None:
        """Drop every lock, worker, value and counter: the data a restart without persistence loses."""
        with self._mutex:
            self._marks.clear()
            self._refusals.clear()
            self._locks.clear()
            self._replaced.clear()
            self._deadlines.clear()
            self._workers.clear()
            self._in_hand.clear()
            self._values.clear()
            self._fences.clear()
            self._counts.clear()
            self._history.clear()
            self._lines.clear()
            self._waiters.clear()
            self._served.clear()

    def _refusing(self, key: str) -> bool:
        prefix = prefix_of(key)
        return prefix is not None and self._refusals.get(prefix, 0) > _now()

    def _forget_replaced(self, replaced_key: str, owner: str) -> bool:
        replaced = self._replaced.get(replaced_key, set())
        if owner not in replaced:
            return False
        replaced.discard(owner)
        return True

    def _acquire(
        self, key: str, owner: str, *, limit: int, ttl: int | None, holder: Holder, extend: int, refused: bool = False
    ) -> Acquisition:
        """As on Redis; ``refused``: new places are refused while the store heals (a place kept,
        or a conflict, is answered)."""
        now_us = time.time_ns() // 1000
        now = now_us // 1000
        lock = self._live(key, now)
        expires_at = now + ttl + extend if ttl else None
        place = lock.places.get(owner)
        if place is not None:
            if place.expires_at is None or expires_at is None:
                expires_at = None
            else:
                expires_at = max(place.expires_at, expires_at)
            token, acquired_at, handed = place.token, place.acquired_at, place.handed
        elif len(lock.places) >= limit:
            return Acquisition(acquired=False, holders=tuple(p.holder.message_id for p in lock.places.values()))
        elif any(p.holder.message_id == holder.message_id for p in lock.places.values()):
            return Acquisition(acquired=False, holders=(holder.message_id,))
        elif refused:
            raise LockStoreHealing()
        else:
            # As on Redis: tokens follow the clock in microseconds, and the last one.
            token = self._fences[key] = max(self._fences.get(key, 0) + 1, now_us)
            acquired_at, handed = now, False
        lock.places[owner] = _Place(holder, token, acquired_at, expires_at, handed)
        self._locks[key] = lock
        return Acquisition(acquired=True, token=token, expires_at=expires_at)

    def _release(
        self, key: str, owner: str, handed: list[bytes], *, stays_waiting: bool = False, unlocked: bool = False
    ) -> bool:
        """Give up ``owner``'s place, and hand the free places to the line (adding the messages
        handed a place to ``handed``); its message leaves the waiters unless it ``stays_waiting``:
        one an operator or the reaper ``unlocked`` always does."""
        lock = self._live(key, time.time_ns() // 1_000_000)
        place = lock.places.pop(owner, None)
        line = self._lines.get(line_key(key), [])
        # As on Redis, a release looks at the waiters only for a place a line handed, or while
        # messages wait in the lock's line.
        if place is not None and not stays_waiting and (place.handed or line or unlocked):
            self._waiters.get(waiters_key(key), {}).pop(place.holder.message_id, None)
        if place is None and owner in line:
            # It waited without a place (a send whose answer was lost, given up): it leaves the line.
            line.remove(owner)
            self._waiters.get(waiters_key(key), {}).pop(owner, None)
        handed += self._hand_over(key)
        if not lock.places:
            self._locks.pop(key, None)
        return place is not None

    # Lines, as holders.lua keeps them --------------------------------------------------

    def _hand_over(self, key: str) -> list[bytes]:
        lock = self._live(key, _now())
        line, waiters = self._lines.get(line_key(key), []), self._waiters.get(waiters_key(key), {})
        handed = []
        while line:
            head = line[0]
            waiting = waiters.get(head)
            if waiting is not None and head in lock.places:
                del waiters[head]
            elif waiting is not None:
                if len(lock.places) >= waiting.limit:
                    break
                now_us = time.time_ns() // 1000
                token = self._fences[key] = max(self._fences.get(key, 0) + 1, now_us)
                lock.places[head] = _Place(waiting.holder, token, now_us // 1000, None, handed=True)
                self._locks[key] = lock
                handed.append(b"%d\n%b" % (token, waiting.message))
            line.pop(0)
        return handed

    def _served_before(self, key: str, message_id: str, copy: str | None) -> bool:
        """As holders.lua's served_before; the served copies map message ids to their tokens, kept
        until a later start drops those older than SERVED_RETENTION."""
        started = self._served.get(served_key(key), {}).get(message_id)
        return started is not None and str(started) != copy

    def _handed_to_another(self, key: str, message_id: str, place: _Place | None, copy: str | None) -> bool:
        """As holders.lua's handed_to_another: a pending handoff is a queued place of a message that
        is still among the waiters."""
        return (
            place is not None
            and bool(copy)
            and place.holder.state == "queued"
            and str(place.token) != copy
            and message_id in self._waiters.get(waiters_key(key), {})
        )

    def _serve(self, key: str, message_id: str, copy: str | None) -> None:
        if self._waiters.get(waiters_key(key), {}).pop(message_id, None) is not None and copy:
            served = self._served.setdefault(served_key(key), {})
            oldest = _now() * 1000 - SERVED_RETENTION * 1000
            for old in [m for m, token in served.items() if token <= oldest]:
                del served[old]
            served[message_id] = int(copy)

    def _take_or_wait(
        self,
        key: str,
        owner: str,
        *,
        limit: int,
        ttl: int | None,
        holder: Holder,
        extend: int,
        refused: bool,
        waiter: Waiter,
        starting: str | None,
        handed: list[bytes],
    ) -> Acquisition:
        """As holders.lua's take_or_wait."""
        handed += self._hand_over(key)
        lock = self._live(key, _now())
        line_of = line_key(key)
        line, waiters = self._lines.setdefault(line_of, []), self._waiters.setdefault(waiters_key(key), {})
        message_id = holder.message_id
        reserved = False
        if starting is not None:
            place = lock.places.get(message_id)
            handed_to = place.token if place and owner != message_id and place.holder.state == "queued" else None
            if self._served_before(key, message_id, starting) or (handed_to is not None and str(handed_to) != starting):
                return Acquisition(acquired=False, started_before=True)
            if handed_to is not None:
                del lock.places[message_id]
                reserved = True
        if not reserved and owner not in lock.places and message_id in waiters and message_id in line:
            return Acquisition(acquired=False, waiting=line.index(message_id) + 1)
        if not reserved and owner not in lock.places and line:
            acquisition = Acquisition(acquired=False, holders=tuple(p.holder.message_id for p in lock.places.values()))
        else:
            acquisition = self._acquire(key, owner, limit=limit, ttl=ttl, holder=holder, extend=extend, refused=refused)
        if acquisition.acquired:
            if starting is not None:
                self._serve(key, message_id, starting)
            return acquisition
        if message_id in acquisition.holders:
            return acquisition
        entry = _Waiting(
            limit=limit,
            holder=dataclasses.replace(holder, state="queued", worker_id=None, redis_message_id=None),
            message=waiter.message,
        )
        self._served.get(served_key(key), {}).pop(message_id, None)
        if len(line) < waiter.line_limit:
            line.append(message_id)
            waiters[message_id] = entry
            return Acquisition(acquired=False, waiting=len(line), holders=acquisition.holders)
        if waiter.keeps_latest and line:
            displaced = line[-1]
            waiters.pop(displaced, None)
            line[-1] = message_id
            waiters[message_id] = entry
            return Acquisition(acquired=False, waiting=len(line), displaced=displaced, holders=acquisition.holders)
        return Acquisition(acquired=False, line_full=True, holders=acquisition.holders)

    def _lasts(self, key: str, now: int) -> bool:
        """Whether the lock at ``key`` would still be in Redis, whose key expires with its
        longest-lived place (RedisBackend)."""
        expiries = [place.expires_at for place in self._locks[key].places.values()]
        if not expiries or None in expiries:
            return bool(expiries)
        latest = max(e for e in expiries if e is not None)
        if self._lines.get(line_key(key)):
            latest += LINE_RETENTION
        return now < latest

    def _live_place(self, key: str, owner: str, now: int) -> _Place | None:
        """``owner``'s place if it has not lapsed, read as holders.lua's scripts that cannot hand a
        place to the lock's line read it: while messages wait in the line, the lapsed places stay
        for a step that hands them over; else they go."""
        if key in self._locks and not self._lines.get(line_key(key)):
            self._drop_lapsed(key, now)
        lock = self._locks.get(key)
        place = lock.places.get(owner) if lock is not None else None
        return place if place is not None and (place.expires_at is None or place.expires_at > now) else None

    def _drop_lapsed(self, key: str, now: int) -> None:
        lock = self._live(key, now)
        if lock.places:
            self._locks[key] = lock
        else:
            self._locks.pop(key, None)

    def _live(self, key: str, now: int) -> _Lock:
        lock = self._locks.get(key) or _Lock()
        lock.places = {o: p for o, p in lock.places.items() if p.expires_at is None or p.expires_at > now}
        return lock


def _integer(text: str | None) -> int:
    """A field read as Lua's tonumber reads it, 0 when it is none."""
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _now() -> int:
    return time.time_ns() // 1_000_000
