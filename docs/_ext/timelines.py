"""Timeline pictures of the lock types, drawn from an observed run.

``{lock-timeline} until_executed`` in a page runs one message of that lock type through a real
Dramatiq ``Worker`` (a ``StubBroker`` with ``UniqueJobs`` and a ``StubBackend``): it is sent,
starts, fails once, waits for its retry, runs again and returns. At each of those moments the
run reads which of the digest's two locks, the enqueue lock and the run lock, are held, from the
lock backend as ``Locks`` reports them. The SVG shows what was read, so the picture cannot drift
from what the lock classes do; ``tests/test_timelines.py`` checks the same run against the
documented behaviour, on ``StubBackend`` and on a real Redis.

``{line-timeline} wait`` (or ``keep_latest``, ``debounce``) sends three messages of one lock, A,
B and C, through a real ``Worker`` the same way, and draws one lane a message along a time axis:
when it was sent, waited in the lock's line or in the delay queue, ran, and ended or was dropped.
The times are recorded as it happens, by the actor and by the lock events
(``UniqueJobs.subscribe``).

The module runs without Sphinx (the tests import it); Sphinx and docutils are imported in
:func:`setup` only.
"""

from __future__ import annotations

import functools
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

from dramatiq_unique import Cancelled, LockBackend, Locks, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.events import CONFLICT, HANDED_OVER, REPLACED, WAITING
from dramatiq_unique.handoffs import Handoffs
from dramatiq_unique.lock import MessageLock
from dramatiq_unique.locks import LOCK_TYPES, LockType
from dramatiq_unique.strategies.wait import Wait
from dramatiq_unique.worker import WorkerSide

#: ``dramatiq.actor``, called with the lock options that its overloads do not know of.
declare: Any = dramatiq.actor

#: The lock kinds, as ``LockInfo.kind`` names them, and the lane each is drawn in.
LANES = (("enqueue", "enqueue lock"), ("run", "run lock"))

#: How long an ``until_expired`` lock lasts in the observed run: longer than the run itself, with
#: its retry, on a loaded machine too.
TTL_IN_RUN = 3000


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
    attempts: list[None] = []

    def fails_once() -> None:
        attempts.append(None)
        read("runs" if len(attempts) == 1 else "runs again")
        if len(attempts) == 1:
            raise RuntimeError("the first attempt fails")

    actor = declare(
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
            actor.send()
            read("queued")
            worker.start()
            broker.join(actor.queue_name, timeout=10_000, fail_fast=False)
            worker.join()
            if LOCK_TYPES[lock].requires_ttl:
                # Read once the lock's time is up, by the backend's clock: a retry that came late
                # on a loaded machine took it again for longer.
                expiries = [h.expires_at for info in locks.list() for h in info.holders if h.expires_at]
                while expiries and backend.time() <= max(expiries):
                    time.sleep(0.01)
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


@functools.cache
def observed(lock: str) -> tuple[Phase, ...]:
    """:func:`observe` on a ``StubBackend``, once per lock type and build."""
    return observe(lock)


# Lines: several messages of one lock ---------------------------------------------------------

#: The scenarios ``{line-timeline}`` can draw, and what each shows, in a sentence.
LINE_SCENARIOS = {
    "wait": 'on_conflict="wait": A runs; B and C, sent while it runs, wait in line and run after it, in order.',
    "keep_latest": 'on_conflict="keep_latest": A runs; B waits as its successor until C takes its place.',
    "debounce": "debounce: each of A, B and C waits its quiet period in the delay queue; a newer one takes "
    "its place, and only the last runs.",
    "cancel_in_progress": 'on_conflict="cancel_in_progress": A runs; B, at its start, asks A to stop and waits '
    "in the run lock's line until C takes its place; A is cancelled, then C runs.",
}

#: How long each run lasts in the observed scenarios, in ms.
RUN_MS = 60
#: How far apart A, B and C are sent, in ms.
SEND_GAP_MS = 15
#: The quiet period of the debounce scenario, in ms.
QUIET_MS = 120

#: The states a message goes through, as drawn: the label of the legend, and the bar's colour
#: and opacity.
STATES = {
    "queued": ("queued", "currentColor", 0.3),
    "delayed": ("in the delay queue", "currentColor", 0.3),
    "in line": ("waits in line", "#2f7dd1", 1.0),
    "replaced": ("replaced, waits to be dropped", "currentColor", 0.1),
    "runs": ("runs", "#d9822b", 1.0),
}


@dataclass(frozen=True)
class Stretch:
    """A stretch of a message's life in the observed run.

    Parameters:
      state(str): One of :data:`STATES`, e.g. ``"in line"``.
      begins(float): When it began, in ms after the first send.
      ends(float): When it ended, in ms after the first send.
    """

    state: str
    begins: float
    ends: float


@dataclass(frozen=True)
class Lane:
    """One message of the observed run.

    Parameters:
      name(str): ``"A"``, ``"B"``, ``"C"``, in the order they were sent.
      status(str): What ``enqueue_outcome()`` said after ``send()``.
      stretches(tuple[Stretch]): Its life from its send to its end, in order.
      fate(str): ``"done"`` when it ran and returned, ``"dropped"`` when it never ran,
        ``"cancelled"`` when it was interrupted while it ran.
    """

    name: str
    status: str
    stretches: tuple[Stretch, ...]
    fate: str

    @property
    def sent(self) -> float:
        return self.stretches[0].begins

    @property
    def ends(self) -> float:
        return self.stretches[-1].ends

    def during(self, state: str) -> list[Stretch]:
        """Its stretches in ``state``."""
        return [stretch for stretch in self.stretches if stretch.state == state]


class _Moments:
    """What happened to each message, and when: recorded by the sender, the actor and the lock events."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.mutex = threading.RLock()  # held across a send(), whose events come in its thread
        self.names: dict[str, str] = {}  # message_id -> "A"
        self.status: dict[str, str] = {}
        self.moments: dict[str, list[tuple[float, str]]] = {}  # name -> (ms, what)

    def at(self, name: str, what: str) -> None:
        with self.mutex:
            self.moments.setdefault(name, []).append(((time.monotonic() - self.t0) * 1000, what))

    def of_event(self, event: Any) -> None:
        with self.mutex:
            name = self.names.get(event.message_id or "")
            displaced = self.names.get(event.replaced or "")
        if event.kind == WAITING and event.side == "server":
            # A message that reached a worker joins the run lock's line, maybe in a waiter's place.
            if displaced:
                self.at(displaced, "replaced")
            if name:
                self.at(name, "waits")
        elif event.kind == HANDED_OVER and name:
            self.at(name, "handed over")
        elif event.kind in (REPLACED, WAITING) and displaced:
            self.at(displaced, "replaced")
        elif event.kind == CONFLICT and name and event.side == "client" and name in self.moments:
            # A replaced message that came due, and found a newer one holding the lock.
            self.at(name, "dropped")

    def finished(self, count: int, last: tuple[str, ...] = ("ends", "dropped")) -> bool:
        """Whether ``count`` messages met one of the ``last`` moments of a message."""
        with self.mutex:
            ends = [what for moments in self.moments.values() for _, what in moments if what in last]
            return len(ends) == count


#: What each recorded moment begins: the state that follows it (``None``: the message's end).
_AFTER = {
    "handed over": "queued",
    "replaced": "replaced",
    "waits": "in line",
    "starts": "runs",
    "ends": None,
    "dropped": None,
    "cancelled": None,
}


def _lane(name: str, status: str, moments: list[tuple[float, str]]) -> Lane:
    sent_at, first = moments[0]
    if first != "sent":
        raise RuntimeError(f"Message {name} was observed before it was sent: {moments}")
    state: str | None = {"waiting": "in line", "delayed": "delayed"}.get(status, "queued")
    begins, stretches, fate = sent_at, [], "still waiting"
    for when, what in moments[1:]:
        if state is None:
            raise RuntimeError(f"Message {name} was observed after its end: {moments}")
        if what == "replaced" and state == "in line":
            # A waiter whose place in the line was taken is dropped at once: it is in no queue.
            what = "dropped"
        stretches.append(Stretch(state, round(begins, 1), round(when, 1)))
        state, begins = _AFTER[what], when
        if what in ("ends", "dropped", "cancelled"):
            fate = {"ends": "done"}.get(what, what)
    return Lane(name=name, status=status, stretches=tuple(s for s in stretches if s.ends > s.begins), fate=fate)


def observe_line(scenario: str, backend: LockBackend | None = None) -> tuple[Lane, ...]:
    """Send three messages of one lock, A, B and C, through a real ``Worker`` and record what
    became of each: its phases from its ``send()`` to its end, read from the actor and the lock
    events.

    Parameters:
      scenario(str): One of :data:`LINE_SCENARIOS`.
      backend(LockBackend): Where the locks are kept; a new ``StubBackend`` by default.
    """
    if scenario not in LINE_SCENARIOS:
        raise ValueError(f"{scenario!r} is not a line scenario; choose one of {', '.join(sorted(LINE_SCENARIOS))}.")
    backend = backend if backend is not None else StubBackend()
    prefix = f"timeline-{uuid.uuid4().hex[:8]}"
    broker = StubBroker()
    broker.emit_after("process_boot")
    # A short heartbeat for cancel_in_progress: the request to stop reaches A within 0.1 s.
    fast = {"heartbeat_interval": 100, "lease_period": 1000} if scenario == "cancel_in_progress" else {}
    unique = UniqueJobs(backend=backend, lock_prefix=prefix, activity=False, **fast)
    broker.add_middleware(unique, before=TimeLimit)
    seen = _Moments()
    unique.subscribe([HANDED_OVER, REPLACED, WAITING, CONFLICT], seen.of_event)
    all_sent = threading.Event()

    def run(name: str) -> None:
        seen.at(name, "starts")
        if name == "A" and scenario == "cancel_in_progress":
            try:
                until = time.monotonic() + 5  # A runs until it is cancelled, in Python
                while time.monotonic() < until:
                    time.sleep(0.002)
            except Cancelled:
                seen.at(name, "cancelled")
                raise
        time.sleep(RUN_MS / 1000)
        if name == "A" and scenario != "debounce":
            all_sent.wait(5)  # A runs until B and C are sent, however slow the machine
        seen.at(name, "ends")

    options: dict[str, Any] = (
        {"lock": "until_executed", "on_conflict": {"client": "replace"}, "debounce": QUIET_MS}
        if scenario == "debounce"
        else {"lock": "while_executing", "on_conflict": scenario}
        if scenario == "cancel_in_progress"
        else {"lock": "until_executed", "on_conflict": scenario}
    )
    actor = declare(run, broker=broker, actor_name=f"line_{scenario}", lock_args_method=lambda name: [], **options)
    worker = Worker(broker, worker_threads=3, worker_timeout=20)
    with _quiet():
        try:
            worker.start()
            for index, name in enumerate("ABC"):
                if index:
                    time.sleep(SEND_GAP_MS / 1000)
                with seen.mutex:  # its events are told before send() returns
                    seen.moments[name] = [((time.monotonic() - seen.t0) * 1000, "sent")]
                    message = actor.send(name)
                    seen.names[message.message_id] = name
                outcome = enqueue_outcome(message)
                status = outcome.status
                seen.status[name] = "delayed" if status == "enqueued" and scenario == "debounce" else status
            all_sent.set()
            # With keep_latest, a message whose place in the line a newer one took is gone for good.
            last = (
                ("ends", "dropped", "replaced")
                if scenario in ("keep_latest", "cancel_in_progress")
                else ("ends", "dropped", "cancelled")
            )
            deadline = time.monotonic() + 10
            while not seen.finished(3, last) and time.monotonic() < deadline:
                time.sleep(0.005)
            broker.join(actor.queue_name, timeout=10_000, fail_fast=False)
            worker.join()
        finally:
            worker.stop()
            broker.close()
    # The times from A's send on.
    t0 = seen.moments["A"][0][0]
    moments = {name: [(when - t0, what) for when, what in seen.moments[name]] for name in "ABC"}
    return tuple(_lane(name, seen.status[name], moments[name]) for name in "ABC")


def describe_line(scenario: str, lanes: tuple[Lane, ...]) -> str:
    """The line's picture in words."""
    parts = [LINE_SCENARIOS[scenario]]
    for lane in lanes:
        steps = [f"{lane.name} is sent at {lane.sent:.0f} ms"]
        steps += [
            f"{STATES[stretch.state][0]} from {stretch.begins:.0f} to {stretch.ends:.0f} ms"
            for stretch in lane.stretches
            if round(stretch.ends) > round(stretch.begins)
        ]
        parts.append(", ".join(steps) + f", and is {lane.fate}.")
    return " ".join(parts)


_LINE_WIDTH = 560  # the time axis, in px
_LINE_LEFT = 40


def render_line_svg(scenario: str, lanes: tuple[Lane, ...]) -> str:
    """The observed run of ``scenario`` as an SVG document: one lane a message, along a time axis in ms."""
    end = max(lane.ends for lane in lanes)
    scale = _LINE_WIDTH / end

    def x(ms: float) -> str:
        return f"{_LINE_LEFT + ms * scale:.1f}"

    lanes_bottom = _TOP + len(lanes) * (_LANE_HEIGHT + _LANE_GAP)
    legend_y = lanes_bottom + 38
    width = _LINE_LEFT + _LINE_WIDTH + 70
    height = legend_y + 12
    title_id = f"line-timeline-{scenario}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="line-timeline" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" aria-labelledby="{title_id}" '
        'font-family="system-ui, sans-serif" font-size="12">',
        f'<title id="{title_id}">{escape(describe_line(scenario, lanes))}</title>',
    ]
    step = next(s for s in (10, 20, 50, 100, 200, 500, 1000) if end / s <= 8)
    for tick in range(0, int(end) + 1, step):
        out.append(
            f'<line x1="{x(tick)}" y1="{_TOP - 4}" x2="{x(tick)}" y2="{lanes_bottom + 2}" stroke="currentColor" '
            'stroke-opacity="0.25" stroke-dasharray="3 3"/>'
        )
        out.append(
            f'<text x="{x(tick)}" y="{lanes_bottom + 16}" text-anchor="middle" fill="currentColor" '
            f'opacity="0.8">{tick} ms</text>'
        )
    for index, lane in enumerate(lanes):
        y = _TOP + index * (_LANE_HEIGHT + _LANE_GAP)
        out.append(
            f'<text x="{_LINE_LEFT - 8}" y="{y + _LANE_HEIGHT / 2 + 4:g}" text-anchor="end" '
            f'fill="currentColor">{escape(lane.name)}</text>'
        )
        out.append(
            f'<rect x="{_LINE_LEFT}" y="{y}" width="{_LINE_WIDTH}" height="{_LANE_HEIGHT}" '
            'fill="currentColor" fill-opacity="0.06"/>'
        )
        for stretch in lane.stretches:
            _, colour, opacity = STATES[stretch.state]
            slug = stretch.state.replace(" ", "-")
            out.append(
                f'<rect class="stretch stretch-{slug}" x="{x(stretch.begins)}" y="{y + 3}" '
                f'width="{max(1.0, (stretch.ends - stretch.begins) * scale):.1f}" height="{_LANE_HEIGHT - 6}" '
                f'rx="4" fill="{colour}" fill-opacity="{opacity:g}"/>'
            )
        out.append(
            f'<line x1="{x(lane.sent)}" y1="{y}" x2="{x(lane.sent)}" y2="{y + _LANE_HEIGHT}" '
            'stroke="currentColor" stroke-width="2"/>'
        )
        out.append(
            f'<text class="fate" x="{float(x(lane.ends)) + 6:.1f}" y="{y + _LANE_HEIGHT / 2 + 4:g}" '
            f'fill="currentColor" font-style="italic" opacity="0.8">{escape(lane.fate)}</text>'
        )
    # The legend names the states that show: not the moment a handed-over message spends queued.
    shown = [state for state in STATES if any(s.ends - s.begins >= 1 for lane in lanes for s in lane.during(state))]
    legend_x = float(_LINE_LEFT)
    out.append(
        f'<line x1="{legend_x + 5:g}" y1="{legend_y - 10}" x2="{legend_x + 5:g}" y2="{legend_y + 2}" '
        'stroke="currentColor" stroke-width="2"/>'
    )
    out.append(f'<text x="{legend_x + 12:g}" y="{legend_y}" fill="currentColor">send()</text>')
    legend_x += 62
    for state in shown:
        label, colour, opacity = STATES[state]
        out.append(
            f'<rect x="{legend_x:g}" y="{legend_y - 10}" width="14" height="12" rx="3" fill="{colour}" '
            f'fill-opacity="{opacity:g}"/>'
        )
        out.append(f'<text x="{legend_x + 20:g}" y="{legend_y}" fill="currentColor">{escape(label)}</text>')
        legend_x += 34 + 6.2 * len(label)
    out.append("</svg>")
    return "\n".join(out)


@functools.cache
def observed_line(scenario: str) -> tuple[Lane, ...]:
    """:func:`observe_line` on a ``StubBackend``, once per scenario and build."""
    return observe_line(scenario)


# The Sphinx extension -----------------------------------------------------------------------


def setup(app: Any) -> dict[str, Any]:
    """Register the ``lock-timeline`` and ``line-timeline`` directives."""
    from docutils import nodes  # type: ignore[import-untyped]
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

    class LineTimeline(SphinxDirective):
        """``{line-timeline} <scenario>``: three messages of one lock in an observed run, as an SVG."""

        required_arguments = 1
        has_content = False

        def run(self) -> list[Any]:
            scenario = self.arguments[0]
            if scenario not in LINE_SCENARIOS:
                raise self.error(
                    f"line-timeline: {scenario!r} is not a line scenario; "
                    f"choose one of {', '.join(sorted(LINE_SCENARIOS))}."
                )
            lanes = observed_line(scenario)
            # The picture depends on the strategies, the lock and the handoffs: rebuild the page when they change.
            for source in (Wait, MessageLock, WorkerSide, Handoffs):
                self.env.note_dependency(inspect.getfile(source))
            figure = nodes.container(classes=["lock-timeline", "line-timeline"])
            figure += nodes.raw("", render_line_svg(scenario, lanes), format="html")
            only = addnodes.only(expr="not html")
            only += nodes.paragraph(text=describe_line(scenario, lanes))
            figure += only
            figure += nodes.paragraph(
                classes=["lock-timeline-caption"],
                text=f"{LINE_SCENARIOS[scenario]} Three messages of one lock, as recorded by the actor and "
                "the lock events in a run made when these docs were built.",
            )
            return [figure]

    app.add_directive("lock-timeline", LockTimeline)
    app.add_directive("line-timeline", LineTimeline)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
