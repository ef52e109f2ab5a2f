"""Locks for a person to read: durations, ages, times left, tables and
sentences, the same on the command line, on the web page and in ``explain``.

Ages and times left are measured against when a lock was read, on the
backend's clock, never against this machine's.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence

from .held import HolderInfo, LockInfo


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
    """How long ago ``holder`` took its place, when ``lock`` was read."""
    return format_duration(lock.read_at - holder.acquired_at)


def ttl(holder: HolderInfo, lock: LockInfo, *, never: str = "never") -> str:
    """How long ``holder``'s place had left when ``lock`` was read; ``never`` for a place that never lapses."""
    return never if holder.expires_at is None else format_duration(holder.expires_at - lock.read_at)


def count(number: int, noun: str, plural: str | None = None) -> str:
    """``1 lock``, ``2 locks``; ``plural`` for a noun that does not just take an s."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def places(locks: Sequence[LockInfo]) -> str:
    """How many places in how many locks: ``3 places in 2 locks``."""
    return f"{count(sum(len(lock.holders) for lock in locks), 'place')} in {count(len(locks), 'lock')}"


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


def lock_table(locks: Iterable[LockInfo], *, indent: str = "") -> list[str]:
    """One row per holder, with its lock, then one per message waiting in its line."""
    headers = ("DIGEST", "KIND", "ACTOR", "QUEUE", "LOCK", "MESSAGE ID", "STATE", "AGE", "TTL", "WORKER")
    rows = [
        (
            lock.digest,
            lock.kind,
            holder.actor,
            holder.queue,
            holder.lock,
            holder.message_id,
            holder.state,
            age(holder, lock),
            ttl(holder, lock),
            holder.worker_id or "-",
        )
        for lock in locks
        for holder in lock.holders
    ]
    rows += [
        (lock.digest, lock.kind, lock.actor, lock.queue, lock.lock, message_id, f"waiting {place}", "-", "-", "-")
        for lock in locks
        for place, message_id in enumerate(lock.waiting, 1)
    ]
    return table(headers, rows, indent=indent)


def holder_table(lock: LockInfo, *, indent: str = "  ") -> list[str]:
    """The holders of one lock."""
    headers = ("MESSAGE ID", "STATE", "AGE", "TTL", "TOKEN", "WORKER")
    rows = [(h.message_id, h.state, age(h, lock), ttl(h, lock), str(h.token), h.worker_id or "-") for h in lock.holders]
    return table(headers, rows, indent=indent)


def describe_lock(lock: LockInfo) -> list[str]:
    """A lock and its holders: its key, its holders' actors, queues and lock types, and a table of them."""
    lines = [f"{lock.kind} lock {lock.key}: {count(len(lock.holders), 'holder')}"]
    owners = sorted({(h.actor, h.queue, h.lock) for h in lock.holders})
    lines += [f"  actor {actor}, queue {queue}, lock {kind}" for actor, queue, kind in owners]
    lines += holder_table(lock)
    if lock.waiting:
        lines.append(f"  {count(len(lock.waiting), 'message')} waiting in its line, the next first:")
        lines += [f"    {place}. {message_id}" for place, message_id in enumerate(lock.waiting, 1)]
    return lines


def holder_calls(lock: LockInfo, *, indent: str = "  ") -> list[str]:
    """A line per holder whose call is known: ``call of message '…': reindex('acme', 200)``."""
    return [f"{indent}call of message {h.message_id!r}: {h.call}" for h in lock.holders if h.call is not None]


def record_fields(holder: HolderInfo) -> list[tuple[str, str]]:
    """A holder's record as its lock stores it, field by field, for a person: its owner, token,
    times, worker, broker id, flags in words and the call it keeps (``lock_info``)."""
    place, fields = holder.place, holder.place.holder
    flags = [holder.state, holder.lock]
    if fields.get("replaceable"):
        flags.append("a newer message may take its place")
    if fields.get("handed"):
        flags.append("handed by the lock's line, its message not started yet")
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
    """One holder, for a person: its message, state, age and remaining time, e.g.
    ``message '…' (queued, taken 2m 03s ago, never lapses)``."""
    state = holder.state
    if holder.worker_id:
        state += f" on worker {holder.worker_id!r}"
    lapses = "never lapses" if holder.expires_at is None else f"lapses in {format_duration(holder.expires_at - now)}"
    return f"message {holder.message_id!r} ({state}, taken {format_duration(now - holder.acquired_at)} ago, {lapses})"


def describe_holders(holders: Sequence[HolderInfo], now: int) -> str:
    """Holders, for a person: ``message '…' (…)``, or ``messages '…' (…), '…' (…)``."""
    described = [describe_holder(h, now) for h in holders]
    if len(described) == 1:
        return described[0]
    return "messages " + ", ".join(d.removeprefix("message ") for d in described)
