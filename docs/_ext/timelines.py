"""Timeline pictures of the lock types, drawn from an observed run.

``{lock-timeline} until_executed`` in a page runs one message of that lock type through a real
Dramatiq ``Worker`` (a ``StubBroker`` with ``UniqueJobs`` and a ``StubBackend``): it is sent,
starts, fails once, waits for its retry, runs again and returns. At each of those moments the
run reads which of the digest's two locks, the enqueue lock and the run lock, are held, from the
lock backend as ``Locks`` reports them. The SVG shows what was read, so the picture cannot drift
from what the lock classes do; ``tests/test_timelines.py`` checks the same run against the
documented behaviour, on ``StubBackend`` and on a real Redis.

The module runs without Sphinx (the tests import it); Sphinx and docutils are imported in
:func:`setup` only.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from html import escape
from typing import Any

import dramatiq
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import LockBackend, Locks, StubBackend, UniqueJobs
from dramatiq_unique.lock import MessageLock
from dramatiq_unique.locks import LOCK_TYPES, LockType
from dramatiq_unique.worker import WorkerSide

#: The lock kinds, as ``LockInfo.kind`` names them, and the lane each is drawn in.
LANES = (("enqueue", "enqueue lock"), ("run", "run lock"))

#: How long an ``until_expired`` lock lasts in the observed run: longer than the run itself.
TTL_IN_RUN = 1000


@dataclass(frozen=True)
class Phase:
    """A stretch of the message's life, and the locks held during it.

    Parameters:
      name(str): What the message does meanwhile, e.g. ``"runs"``.
      begins(tuple[str]): The label of the moment it begins, one item a line, e.g. ``("starts",)``.
      moment(str): That moment in a sentence, e.g. ``"its start"``.
      held(frozenset[str]): The kinds of lock held (``"enqueue"``, ``"run"``).
    """

    name: str
    begins: tuple[str, ...]
    moment: str
    held: frozenset[str]


class _Watch(dramatiq.Middleware):
    """Reads the locks once a message has left the worker, after ``UniqueJobs`` gave up what it gives up."""

    def __init__(self, read: Any) -> None:
        self.read = read

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None, exception: Any = None) -> None:
        self.read("waits for its retry" if exception is not None else "has returned")


@contextmanager
def _quiet() -> Any:
    """Keep the failing attempt's tracebacks and the retry warnings out of the build's output."""
    loggers = [logging.getLogger(name) for name in ("dramatiq", "dramatiq_unique")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def observe(lock: str, backend: LockBackend | None = None) -> tuple[Phase, ...]:
    """Run one message of lock type ``lock`` that fails once and succeeds on its retry, and
    read which locks are held in each phase of its life.

    Parameters:
      lock(str): A lock type, as given to ``@dramatiq.actor(lock=...)``.
      backend(LockBackend): Where the locks are kept; a new ``StubBackend`` by default.
    """
    if lock not in LOCK_TYPES:
        raise ValueError(f"{lock!r} is not a lock type; choose one of {', '.join(sorted(LOCK_TYPES))}.")
    backend = backend if backend is not None else StubBackend()
    prefix = f"timeline-{uuid.uuid4().hex[:8]}"
    broker = StubBroker()
    broker.emit_after("process_boot")
    unique = UniqueJobs(backend=backend, lock_prefix=prefix, activity=False)
    broker.add_middleware(unique, before=TimeLimit)
    locks = Locks(backend, lock_prefix=prefix)
    readings: list[tuple[str, frozenset[str]]] = []
    mutex = threading.Lock()

    def read(name: str) -> None:
        # A finished message's enqueue lock is given up by the worker's release thread: the
        # picture shows the locks once it has.
        while unique.releases is not None and not unique.releases.idle:
            time.sleep(0.001)
        held = frozenset(info.kind for info in locks.list())
        with mutex:
            readings.append((name, held))

    broker.add_middleware(_Watch(read), before=UniqueJobs)
    attempts = []

    def fails_once() -> None:
        attempts.append(None)
        read("runs" if len(attempts) == 1 else "runs again")
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails")

    actor = dramatiq.actor(
        fails_once,
        broker=broker,
        actor_name=f"timeline_{lock}",
        lock=lock,
        lock_ttl=TTL_IN_RUN if LOCK_TYPES[lock].requires_ttl else None,
        max_retries=1,
        min_backoff=10,
        max_backoff=10,
    )
    worker = Worker(broker, worker_threads=1, worker_timeout=50)
    with _quiet():
        try:
            sent_at = time.monotonic()
            actor.send()
            read("queued")
            worker.start()
            broker.join(actor.queue_name, timeout=10_000, fail_fast=False)
            worker.join()
            if LOCK_TYPES[lock].requires_ttl:
                time.sleep(max(0.0, sent_at + (TTL_IN_RUN + 100) / 1000 - time.monotonic()))
                read("after lock_ttl")
        finally:
            worker.stop()
            broker.close()
    return _phases(readings)


#: The moment that begins each phase: its label in the picture, one item a line, and how the
#: description of the picture names it.
_BEGINS = {
    "queued": (("send()",), "send()"),
    "runs": (("starts",), "its start"),
    "waits for its retry": (("fails;", "retry queued"), "its failure"),
    "runs again": (("retry", "starts"), "its retry's start"),
    "has returned": (("returns",), "its return"),
    "after lock_ttl": (("lock_ttl", "runs out"), "the end of lock_ttl"),
}


def _phases(readings: list[tuple[str, frozenset[str]]]) -> tuple[Phase, ...]:
    names = [name for name, _ in readings]
    if names[:5] != list(_BEGINS)[:5]:
        raise RuntimeError(f"The observed run went another way than a failure and a retry: {names}")
    return tuple(
        Phase(name=name, begins=_BEGINS[name][0], moment=_BEGINS[name][1], held=held) for name, held in readings
    )


def spans(phases: tuple[Phase, ...], kind: str) -> list[tuple[int, int]]:
    """The stretches in which ``kind`` is held, as ``(first phase, phase after the last)`` indices."""
    found: list[tuple[int, int]] = []
    for index, phase in enumerate(phases):
        if kind not in phase.held:
            continue
        if found and found[-1][1] == index:
            found[-1] = (found[-1][0], index + 1)
        else:
            found.append((index, index + 1))
    return found


def describe(lock: str, phases: tuple[Phase, ...]) -> str:
    """The picture in words, for screen readers and for builders that show no SVG."""
    parts = []
    for kind, label in LANES:
        held = spans(phases, kind)
        if not held:
            parts.append(f"The {label} is never held.")
            continue
        stretches = [
            f"between {phases[a].moment} and {phases[b].moment}" if b < len(phases) else f"from {phases[a].moment} on"
            for a, b in held
        ]
        parts.append(f"The {label} is held {', and '.join(stretches)}.")
    return f"{lock}, a message that fails once and succeeds on its retry: " + " ".join(parts)


# The picture --------------------------------------------------------------------------------

_LEFT = 104  # room for the lane labels
_PHASE_WIDTH = 112
_TOP = 26
_LANE_HEIGHT = 24
_LANE_GAP = 10
_COLOURS = {"enqueue": "#2f7dd1", "run": "#d9822b"}


def render_svg(lock: str, phases: tuple[Phase, ...]) -> str:
    """The timeline of ``lock`` as an SVG document (text colours follow the page's)."""
    width = _LEFT + _PHASE_WIDTH * len(phases) + 16
    lanes_bottom = _TOP + len(LANES) * (_LANE_HEIGHT + _LANE_GAP)
    height = lanes_bottom + 40
    title_id = f"timeline-{lock}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="lock-timeline" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" aria-labelledby="{title_id}" '
        'font-family="system-ui, sans-serif" font-size="12">',
        f'<title id="{title_id}">{escape(describe(lock, phases))}</title>',
    ]
    for index, phase in enumerate(phases):
        x = _LEFT + index * _PHASE_WIDTH
        out.append(
            f'<text x="{x + _PHASE_WIDTH / 2:g}" y="{_TOP - 10}" text-anchor="middle" fill="currentColor" '
            f'font-style="italic" opacity="0.8">{escape(phase.name)}</text>'
        )
        out.append(
            f'<line x1="{x}" y1="{_TOP - 4}" x2="{x}" y2="{lanes_bottom + 2}" stroke="currentColor" '
            'stroke-opacity="0.45" stroke-dasharray="3 3"/>'
        )
        for line_number, words in enumerate(phase.begins):
            out.append(
                f'<text x="{x}" y="{lanes_bottom + 16 + 13 * line_number}" text-anchor="middle" '
                f'fill="currentColor">{escape(words)}</text>'
            )
    for lane, (kind, label) in enumerate(LANES):
        y = _TOP + lane * (_LANE_HEIGHT + _LANE_GAP)
        out.append(
            f'<text x="{_LEFT - 8}" y="{y + _LANE_HEIGHT / 2 + 4:g}" text-anchor="end" '
            f'fill="currentColor">{escape(label)}</text>'
        )
        out.append(
            f'<rect x="{_LEFT}" y="{y}" width="{_PHASE_WIDTH * len(phases)}" height="{_LANE_HEIGHT}" '
            'fill="currentColor" fill-opacity="0.06"/>'
        )
        for first, after_last in spans(phases, kind):
            out.append(
                f'<rect class="held held-{kind}" x="{_LEFT + first * _PHASE_WIDTH + 2}" y="{y + 3}" '
                f'width="{(after_last - first) * _PHASE_WIDTH - 4}" height="{_LANE_HEIGHT - 6}" rx="4" '
                f'fill="{_COLOURS[kind]}"/>'
            )
    out.append("</svg>")
    return "\n".join(out)


_observed: dict[str, tuple[Phase, ...]] = {}


def observed(lock: str) -> tuple[Phase, ...]:
    """:func:`observe` on a ``StubBackend``, once per lock type and build."""
    if lock not in _observed:
        _observed[lock] = observe(lock)
    return _observed[lock]


# The Sphinx extension -----------------------------------------------------------------------


def setup(app: Any) -> dict[str, Any]:
    """Register the ``lock-timeline`` directive."""
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.util.docutils import SphinxDirective

    class LockTimeline(SphinxDirective):
        """``{lock-timeline} <lock type>``: the observed timeline of that lock type, as an SVG."""

        required_arguments = 1
        has_content = False

        def run(self) -> list[Any]:
            lock = self.arguments[0]
            if lock not in LOCK_TYPES:
                raise self.error(
                    f"lock-timeline: {lock!r} is not a lock type; choose one of {', '.join(sorted(LOCK_TYPES))}."
                )
            phases = observed(lock)
            # The picture depends on the lock classes and the worker side that reads their facts:
            # rebuild the page when they change.
            for source in (type(LOCK_TYPES[lock]), LockType, MessageLock, WorkerSide):
                self.env.note_dependency(inspect.getfile(source))
            figure = nodes.container(classes=["lock-timeline"])
            figure += nodes.raw("", render_svg(lock, phases), format="html")
            only = addnodes.only(expr="not html")
            only += nodes.paragraph(text=describe(lock, phases))
            figure += only
            caption = nodes.paragraph(
                classes=["lock-timeline-caption"],
                text=f"{lock}: the locks a message holds while it is queued, runs, fails once, waits "
                "for its retry and succeeds, as read from the lock backend in a run made when these "
                "docs were built.",
            )
            figure += caption
            return [figure]

    app.add_directive("lock-timeline", LockTimeline)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
