"""Locks for a person to read: durations, ages, times left, tables and
sentences, the same on the command line, on the web page and in ``explain``.

Ages and times left are measured against when a lock was read, on the
backend's clock, never against this machine's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .held import ConflictInfo, HolderInfo, LockInfo
from .keys import RUN


def format_duration(ms: int) -> str:
    """A duration in milliseconds, in units a person reads: ``850ms``, ``42s``, ``4m 05s``, ``3h 07m``, ``2d 05h``."""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    seconds = ms // 1000
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def format_time(ms: int) -> str:
    """A time in epoch milliseconds, in UTC to the second: ``2024-06-30 12:00:05 UTC``."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def age(holder: HolderInfo, lock: LockInfo) -> str:
    """How long ``holder`` has held its lock, when ``lock`` was read (its "held for")."""
    return format_duration(lock.read_at - holder.acquired_at)


def has_lease(holder: HolderInfo, lock: LockInfo) -> bool:
    """Whether ``holder``'s end is a lease its worker renews while the message runs: a place in
    a run lock that lapses. The record keeps one end only: for a run lock it is the lease,
    which ``lock_ttl``, when set, caps; for an enqueue lock, the lifetime that ``lock_ttl`` sets."""
    return lock.kind == RUN and holder.expires_at is not None


def lease(holder: HolderInfo, lock: LockInfo, *, none: str = "-") -> str:
    """How long ``holder``'s lease had left when ``lock`` was read; ``none`` without a lease."""
    if not has_lease(holder, lock) or holder.expires_at is None:
        return none
    return format_duration(holder.expires_at - lock.read_at)


def expires(holder: HolderInfo, lock: LockInfo, *, never: str = "never", none: str = "-") -> str:
    """How long until ``holder``'s hold expires whatever becomes of its message (its
    ``lock_ttl``-bound lifetime), when ``lock`` was read; ``never`` without one, ``none`` when
    its end is a lease (:func:`lease`)."""
    if has_lease(holder, lock):
        return none
    return never if holder.expires_at is None else format_duration(holder.expires_at - lock.read_at)


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 lock``, ``2 locks``; ``plural`` for a noun that does not just take an s."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def holder_count(locks: Sequence[LockInfo]) -> int:
    """How many holders ``locks`` have together."""
    return sum(len(lock.holders) for lock in locks)


def holders(locks: Sequence[LockInfo]) -> str:
    """How many holders in how many locks: ``3 holders in 2 locks``."""
    return f"{count(holder_count(locks), 'holder')} in {count(len(locks), 'lock')}"


def prefixes_phrase(prefixes: Sequence[str]) -> str:
    """``prefix 'a'``, or ``prefixes 'a', 'b'``."""
    return ("prefix " if len(prefixes) == 1 else "prefixes ") + ", ".join(map(repr, prefixes))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str = "") -> list[str]:
    """Aligned columns, two spaces apart."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return [
        (indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))).rstrip()
        for row in (headers, *rows)
    ]


#: The width of a table when nobody gives one: that of a terminal of 100 columns.
DEFAULT_WIDTH = 100
#: How many characters of a digest and of a message id a table that fits shows: as many as
#: the web page shows of a digest, and a unique prefix of it in practice (``show`` takes one).
SHORT_DIGEST = 12
SHORT_MESSAGE_ID = 8
#: The lock types' names in a table that must fit.
SHORT_LOCK_NAMES = {
    "until_executing": "executing",
    "until_executed": "executed",
    "until_expired": "expired",
    "while_executing": "while",
    "until_and_while_executing": "until+while",
}
#: The narrowest the CALL column is shown, which takes what is left of the width; the other
#: columns are narrowed to leave it CALL_ROOM when they can.
CALL_WIDTH = 12
CALL_ROOM = 24


def cut(text: str, width: int) -> str:
    """``text``, cut to ``width`` characters with ``…`` at the end when it is longer."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def short_worker(worker_id: str) -> str:
    """A worker id (``host:pid:random``) without its random part: ``host:pid``."""
    return worker_id.rpartition(":")[0] if worker_id.count(":") >= 2 else worker_id


@dataclass(frozen=True)
class Fit:
    """One step of fitting a table to a width, taken while it is wider: ``shorten`` a column's
    cells with ``how``, ``cut`` them to ``width`` at least, or ``drop`` the column."""

    action: str
    column: str
    width: int = 0
    how: Callable[[str], str] | None = None


def fit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int,
    steps: Sequence[Fit] = (),
    rest: str | None = None,
    indent: str = "",
) -> list[str]:
    """:func:`table`, fitted to ``width`` characters: each step is taken, in order, while the
    table is wider. The column ``rest`` (the last one) takes the width left, cut to it; it is
    left out when narrower than :data:`CALL_WIDTH`, or when it holds nothing but ``-``."""
    columns = {header: [row[i] for row in rows] for i, header in enumerate(headers)}
    last = columns.pop(rest) if rest is not None and rest in columns else None
    if last is not None and all(cell == "-" for cell in last):
        last = None

    uncut: dict[str, list[str]] = {}

    def wide(cells: Sequence[str], header: str) -> int:
        return max([len(header), *map(len, cells)])

    def total() -> int:
        return len(indent) + sum(wide(cells, h) for h, cells in columns.items()) + 2 * (len(columns) - 1)

    # The other columns leave the last one CALL_ROOM, or less when its values are shorter.
    room_wanted = min(CALL_ROOM, wide(last, rest)) if last is not None and rest is not None else 0
    for budget in ((width - room_wanted - 2) if last is not None else width, width):
        for step in steps:
            if total() <= budget:
                break
            if step.column not in columns:
                continue
            cells = columns[step.column]
            if step.action == "drop":
                del columns[step.column]
            elif step.action == "shorten" and step.how is not None:
                columns[step.column] = [step.how(cell) for cell in cells]
            elif step.action == "cut":
                uncut.setdefault(step.column, cells)
                narrowest = max(step.width, len(step.column))
                to = max(narrowest, wide(cells, step.column) - (total() - budget))
                columns[step.column] = [cut(cell, to) for cell in cells]
        # A column cut before a later step made room gets that room back, the last cut first.
        for header, cells in reversed(uncut.items()):
            if header in columns and total() < budget:
                to = min(wide(cells, header), wide(columns[header], header) + budget - total())
                columns[header] = [cut(cell, to) for cell in cells]
        room = width - total() - 2
        if last is None or room >= CALL_WIDTH:
            break
        last = None  # no room left for it: the other columns take the whole width
    if last is not None and rest is not None:
        columns[rest] = [cut(cell, room) for cell in last]
    return table(list(columns), list(zip(*columns.values(), strict=True)) if rows else [], indent=indent)


#: How the table of ``list`` fits a width, step by step.
LIST_FIT = (
    Fit("shorten", "LOCK", how=lambda name: SHORT_LOCK_NAMES.get(name, name)),
    Fit("cut", "ACTOR", 16),
    Fit("shorten", "WORKER", how=short_worker),
    Fit("drop", "QUEUE"),
    Fit("drop", "LOCK"),
    Fit("cut", "ACTOR", 12),
    Fit("cut", "WORKER", 10),
    Fit("drop", "WORKER"),
    Fit("cut", "ACTOR", 8),
)

#: How the table of one lock's holders fits a width, step by step.
HOLDERS_FIT = (
    Fit("shorten", "WORKER", how=short_worker),
    Fit("cut", "WORKER", 10),
    Fit("drop", "WORKER"),
    Fit("drop", "TOKEN"),
)


def _whole(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: str) -> list[str]:
    """:func:`table`, without the last column (CALL) when no holder's call is known."""
    if rows and any(row[-1] != "-" for row in rows):
        return table(headers, rows, indent=indent)
    return table(headers[:-1], [row[:-1] for row in rows], indent=indent)


def _first(text: str, length: int, short: bool) -> str:
    return text[:length] if short else text


def _call(holder: HolderInfo) -> str:
    return holder.call if holder.call is not None else "-"


def holder_state(holder: HolderInfo) -> str:
    """A holder's state as the tables show it: ``stopping`` for a running holder asked to stop."""
    return "stopping" if holder.stop_requested_by is not None else holder.state


def lock_table(locks: Iterable[LockInfo], *, indent: str = "", width: int | None = None) -> list[str]:
    """One row per holder, with its lock, then one per message waiting in its line.

    Parameters:
      width(int): The width to fit, with short digests and message ids; ``None`` for every
        column and value whole.
    """
    locks = list(locks)
    short = width is not None
    headers = (
        "DIGEST",
        "KIND",
        "ACTOR",
        "QUEUE",
        "LOCK",
        "MESSAGE",
        "STATE",
        "HELD",
        "LEASE",
        "EXPIRES",
        "WORKER",
        "CALL",
    )
    rows: list[tuple[str, ...]] = []
    for lock in locks:
        digest = _first(lock.digest, SHORT_DIGEST, short)
        rows += [
            (
                digest,
                lock.kind,
                holder.actor,
                holder.queue,
                holder.lock,
                _first(holder.message_id, SHORT_MESSAGE_ID, short),
                holder_state(holder),
                age(holder, lock),
                lease(holder, lock),
                expires(holder, lock),
                holder.worker_id or "-",
                _call(holder),
            )
            for holder in lock.holders
        ]
        # What waits in its line follows the lock's holders, the next first.
        rows += [
            (
                digest,
                lock.kind,
                lock.actor,
                lock.queue,
                lock.lock,
                _first(message_id, SHORT_MESSAGE_ID, short),
                f"waiting {place}",
                *("-",) * 5,
            )
            for place, message_id in enumerate(lock.waiting, 1)
        ]
    if width is None:
        return _whole(headers, rows, indent=indent)
    return fit_table(headers, rows, width=width, steps=LIST_FIT, rest="CALL", indent=indent)


def holder_table(lock: LockInfo, *, indent: str = "  ", width: int | None = None) -> list[str]:
    """The holders of one lock; fitted to ``width`` with short message ids, or whole when ``None``.
    Their calls, whole, are :func:`holder_calls`'s lines."""
    short = width is not None
    headers = ("MESSAGE", "STATE", "HELD", "LEASE", "EXPIRES", "TOKEN", "WORKER")
    rows = [
        (
            _first(h.message_id, SHORT_MESSAGE_ID, short),
            holder_state(h),
            age(h, lock),
            lease(h, lock),
            expires(h, lock),
            str(h.token),
            h.worker_id or "-",
        )
        for h in lock.holders
    ]
    if width is None:
        return table(headers, rows, indent=indent)
    return fit_table(headers, rows, width=width, steps=HOLDERS_FIT, indent=indent)


def describe_lock(lock: LockInfo, *, width: int | None = None) -> list[str]:
    """A lock and its holders: its key, its holders' actors, queues and lock types, and a table
    of them, fitted to ``width`` (whole when ``None``)."""
    lines = [f"{lock.kind} lock {lock.key}: {count(len(lock.holders), 'holder')}"]
    owners = sorted({(h.actor, h.queue, h.lock) for h in lock.holders})
    lines += [
        cut(line, width) if width is not None else line
        for line in (f"  actor {actor}, queue {queue}, lock {kind}" for actor, queue, kind in owners)
    ]
    lines += holder_table(lock, width=width)
    if lock.waiting:
        lines.append(f"  {count(len(lock.waiting), 'message')} waiting in its line, the next first:")
        lines += [f"    {place}. {message_id}" for place, message_id in enumerate(lock.waiting, 1)]
    return lines


def holder_calls(lock: LockInfo, *, indent: str = "  ") -> list[str]:
    """A line per holder whose call is known: ``call of message '…': reindex('acme', 200)``."""
    return [f"{indent}call of message {h.message_id!r}: {h.call}" for h in lock.holders if h.call is not None]


def holder_stops(lock: LockInfo, *, indent: str = "  ") -> list[str]:
    """A line per holder asked to stop: ``message '…' was asked to stop by message …``."""
    return [
        f"{indent}message {h.message_id!r} was asked to stop by {h.stop_requested_by}; it stops at its next renewal"
        for h in lock.holders
        if h.stop_requested_by is not None
    ]


def record_fields(holder: HolderInfo) -> list[tuple[str, str]]:
    """A holder's record as its lock stores it, field by field, for a person: its owner, token,
    times, worker, broker id, flags in words and the call it keeps (``lock_info``)."""
    place, fields = holder.place, holder.place.holder
    flags = [holder.state, holder.lock]
    if fields.get("replaceable"):
        flags.append("a newer message may take its place")
    if fields.get("handed"):
        flags.append("handed by the lock's line, its message not started yet")
    if holder.stop_requested_by is not None:
        flags.append(f"asked to stop by {holder.stop_requested_by}")
    return [
        ("owner", place.owner),
        ("message", holder.message_id),
        ("token", str(place.token)),
        ("acquired", format_time(place.acquired_at)),
        ("expires", "never" if place.expires_at is None else format_time(place.expires_at)),
        ("worker", fields.get("worker_id") or "–"),
        ("redis message id", fields.get("redis_message_id") or "–"),
        ("flags", ", ".join(flags)),
        ("call", fields.get("call") or "– (not kept: its actor has no lock_info)"),
    ]


def describe_holder(holder: HolderInfo, now: int) -> str:
    """One holder, for a person: its message, state, how long it has held the lock and when its
    hold ends, e.g. ``message '…' (queued, held for 2m 03s, never expires)``."""
    state = holder.state
    if holder.worker_id:
        state += f" on worker {holder.worker_id!r}"
    if holder.expires_at is None:
        end = "never expires"
    elif holder.place.kind == RUN:
        end = f"lease {format_duration(holder.expires_at - now)} left, renewed while it runs"
    else:
        end = f"expires in {format_duration(holder.expires_at - now)}"
    return f"message {holder.message_id!r} ({state}, held for {format_duration(now - holder.acquired_at)}, {end})"


def describe_holders(holders: Sequence[HolderInfo], now: int) -> str:
    """Holders, for a person: ``message '…' (…)``, or ``messages '…' (…), '…' (…)``."""
    described = [describe_holder(h, now) for h in holders]
    if len(described) == 1:
        return described[0]
    return "messages " + ", ".join(d.removeprefix("message ") for d in described)


# The conflict trail ---------------------------------------------------------------

#: What became of the messages of an outcome, after "3 sends ..." (``were dropped``).
_BECAME = {
    "dropped": ("was dropped", "were dropped"),
    "raised": ("raised", "raised"),
    "rejected": ("was rejected", "were rejected"),
    "rescheduled": ("was rescheduled", "were rescheduled"),
    "replaced": ("was replaced by a newer message", "were replaced by newer messages"),
    "waiting": ("waited in the line", "waited in the line"),
    "displaced": ("was displaced from the line", "were displaced from the line"),
    "healing": ("was refused while the lock store healed", "were refused while the lock store healed"),
    "outage": ("met a failing lock store", "met a failing lock store"),
    "cancelled": ("was cancelled while it ran", "were cancelled while they ran"),
}

#: The widest line of the trail as the command prints it.
TRAIL_WIDTH = 100


def short_id(message_id: str) -> str:
    """A message id as a table shows it: its first 8 characters."""
    return message_id[:8]


def holder_phrase(entry: ConflictInfo, *, full: bool = False) -> str:
    """Who held the lock: ``held by message '0b5e3c1a-…' (running on worker 'vm:1:ab')``, or
    short, without quotes: ``held by 0b5e3c1a (running on worker vm:1:ab)``; for a message
    cancelled, who asked it to stop: ``asked to stop by message 0b5e3c1a-…``."""
    if entry.cancelled_by:
        return f"asked to stop by {entry.cancelled_by}"
    if not entry.holders:
        return "no holder" if entry.outcome not in ("healing", "outage") else (entry.reason or "the store failed")
    name = f"message {entry.holders[0]!r}" if full else short_id(entry.holders[0])
    verb = "taken by" if entry.outcome in ("replaced", "displaced") else "held by"
    state = entry.holder_state or ""
    if entry.holder_worker:
        worker = repr(entry.holder_worker) if full else entry.holder_worker
        state = f"{state or 'running'} on worker {worker}"
    others = f" and {count(len(entry.holders) - 1, 'other')}" if len(entry.holders) > 1 else ""
    return f"{verb} {name}{others}" + (f" ({state})" if state else "")


def where_phrase(entry: ConflictInfo) -> str:
    """Where it met the lock, and by which strategy: ``at send (log)``, ``at start (reschedule)``."""
    side = {"client": "at send", "server": "at start"}.get(entry.side or "", "")
    strategy = f"({entry.strategy})" if entry.strategy else ""
    return " ".join(part for part in (side, strategy) if part)


def trail_lines(entries: Sequence[ConflictInfo], *, width: int = TRAIL_WIDTH) -> list[str]:
    """The trail as the command prints it, two lines an entry, at most ``width`` wide:
    when (UTC), outcome, where and the call; then the message and who held the lock, by the
    first 8 characters of their ids."""
    lines = []
    for entry in entries:
        when = format_time(entry.at).removesuffix(" UTC")
        head = f"{when}  {entry.outcome} {where_phrase(entry)}".rstrip()
        call = entry.call or f"{entry.actor}(…)"
        room = width - len(head) - 2
        if len(call) > room:
            call = call[: max(room - 1, 0)] + "…"
        lines.append(f"{head}  {call}")
        detail = f"    message {short_id(entry.message_id)} {holder_phrase(entry)}"
        lines.append(detail if len(detail) <= width else detail[: width - 1] + "…")
    return lines


def conflicts_summary(entries: Sequence[ConflictInfo], *, window: str = "in the last hour") -> list[str]:
    """The last conflicts of one job, a sentence per outcome and side, the commonest first:
    ``3 sends in the last hour were dropped: held by message '…' (running on worker '…').``"""
    groups: dict[tuple[str, str], list[ConflictInfo]] = {}
    for entry in entries:  # newest first: each group's first entry is its latest
        groups.setdefault((entry.side or "", entry.outcome), []).append(entry)
    lines = []
    for (side, outcome), group in sorted(groups.items(), key=lambda item: -len(item[1])):
        noun = {"client": "send", "server": "start"}.get(side, "message")
        singular, plural = _BECAME.get(outcome, (f"ended {outcome!r}", f"ended {outcome!r}"))
        latest = group[0]
        lines.append(
            f"{count(len(group), noun)} {window} {singular if len(group) == 1 else plural}: "
            f"{holder_phrase(latest, full=True)}, the latest at {format_time(latest.at)}."
        )
    return lines
