"""The timeline pictures of the docs (docs/_ext/timelines.py) show what the lock types and the lines do.

The extension draws each picture from a run it observes on StubBackend when the docs are built;
these tests hold that run to the documented behaviour of every lock type (docs/lock-types.md,
"At a glance"), and check that a real Redis gives the same timeline.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from dramatiq_unique import RedisBackend
from dramatiq_unique.locks import LOCK_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs" / "_ext"))
import timelines  # noqa: E402

E, R = "enqueue", "run"

#: Locks held while queued, running, waiting for the retry, running again, after returning
#: (and, for until_expired, after lock_ttl), as docs/lock-types.md states them.
DOCUMENTED = {
    "until_executing": [{E}, set(), {E}, set(), set()],
    "until_executed": [{E}, {E}, {E}, {E}, set()],
    "until_expired": [{E}, {E}, {E}, {E}, {E}, set()],
    "while_executing": [set(), {R}, set(), {R}, set()],
    "until_and_while_executing": [{E}, {R}, {E}, {R}, set()],
}


def held(phases):
    return [set(phase.held) for phase in phases]


def test_every_lock_type_has_a_documented_timeline():
    assert set(DOCUMENTED) == set(LOCK_TYPES)


@pytest.mark.parametrize("lock", sorted(LOCK_TYPES))
def test_the_observed_run_is_what_the_docs_say(lock):
    phases = timelines.observe(lock)
    assert held(phases) == DOCUMENTED[lock]
    assert (E in phases[0].held) == LOCK_TYPES[lock].locks_at_enqueue


@pytest.mark.parametrize("lock", sorted(LOCK_TYPES))
def test_a_real_redis_gives_the_same_timeline(lock, redis_client):
    assert held(timelines.observe(lock, RedisBackend(client=redis_client))) == DOCUMENTED[lock]


def test_the_picture_draws_what_was_observed():
    phases = timelines.observe("until_and_while_executing")
    svg = ET.fromstring(timelines.render_svg("until_and_while_executing", phases))
    ns = {"svg": "http://www.w3.org/2000/svg"}
    bars = [rect.get("class") for rect in svg.findall("svg:rect", ns) if rect.get("class")]
    assert bars == ["held held-enqueue", "held held-enqueue", "held held-run", "held held-run"]
    labels = [text.text for text in svg.findall("svg:text", ns)]
    phase_names = ["queued", "runs", "waits for its retry", "runs again", "has returned"]
    assert [label for label in labels if label in phase_names] == phase_names
    assert svg.find("svg:title", ns).text == timelines.describe("until_and_while_executing", phases)
    assert (
        "between send() and its start, and between its failure and its retry's start" in svg.find("svg:title", ns).text
    )


def test_an_unknown_lock_type_is_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="'until_done' is not a lock type; choose one of until_and_while"):
        timelines.observe("until_done")


# Lines: the pictures of wait, keep_latest and debounce show three messages of one lock, A, B and
# C, sent in that order, as the actor and the lock events recorded them.


def runs_of(lanes):
    return {lane.name: lane.during("runs") for lane in lanes}


def check_wait(lanes):
    a, b, c = lanes
    assert [lane.status for lane in lanes] == ["enqueued", "waiting", "waiting"]
    assert [lane.fate for lane in lanes] == ["done"] * 3
    runs = runs_of(lanes)
    assert all(len(stretches) == 1 for stretches in runs.values())
    # B and C wait in line from their send until the run before theirs is over, then run in order.
    for lane, before in ((b, a), (c, b)):
        (line,) = lane.during("in line")
        assert line.begins == lane.sent and line.ends >= before.during("runs")[0].ends
        assert lane.during("runs")[0].begins >= before.during("runs")[0].ends
    assert not a.during("in line")


def check_keep_latest(lanes):
    a, b, c = lanes
    assert [lane.status for lane in lanes] == ["enqueued", "waiting", "waiting"]
    assert [lane.fate for lane in lanes] == ["done", "dropped", "done"]
    # B waited until C took its place, and never ran; C ran after A, once.
    (b_line,) = b.during("in line")
    assert b_line.ends >= c.sent and not b.during("runs")
    assert len(c.during("runs")) == 1 and c.during("runs")[0].begins >= a.during("runs")[0].ends


def check_debounce(lanes):
    a, b, c = lanes
    assert [lane.status for lane in lanes] == ["delayed"] * 3
    assert [lane.fate for lane in lanes] == ["dropped", "dropped", "done"]
    assert not a.during("runs") and not b.during("runs")
    # Each was replaced by the next send, and waited in the delay queue until it came due.
    for lane, newer in ((a, b), (b, c)):
        (replaced,) = lane.during("replaced")
        assert replaced.begins >= newer.sent - 1
        assert replaced.ends >= lane.sent + timelines.QUIET_MS - 1
    # Only the last runs, once its quiet period is over (whole ms, as Dramatiq's eta).
    (run,) = c.during("runs")
    assert run.begins >= c.sent + timelines.QUIET_MS - 1


def check_cancel_in_progress(lanes):
    # Issue 35: A is interrupted once B asked it to stop; C took B's place in the run lock's line,
    # and runs once A has stopped, never beside it.
    a, b, c = lanes
    assert [lane.status for lane in lanes] == ["enqueued"] * 3
    assert [lane.fate for lane in lanes] == ["cancelled", "dropped", "done"]
    (b_line,) = b.during("in line")
    assert b_line.ends >= c.sent - 1 and not b.during("runs")
    (a_run,) = a.during("runs")
    (c_run,) = c.during("runs")
    assert a_run.ends < timelines.RUN_MS * 20  # interrupted within a few heartbeats, not its 5 s
    assert c_run.begins >= a_run.ends


CHECKS = {
    "wait": check_wait,
    "keep_latest": check_keep_latest,
    "debounce": check_debounce,
    "cancel_in_progress": check_cancel_in_progress,
}


def test_every_line_scenario_is_checked():
    assert set(CHECKS) == set(timelines.LINE_SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(timelines.LINE_SCENARIOS))
def test_the_observed_line_is_what_the_pages_say(scenario):
    CHECKS[scenario](timelines.observe_line(scenario))


@pytest.mark.parametrize("scenario", sorted(timelines.LINE_SCENARIOS))
def test_a_real_redis_gives_the_same_line(scenario, redis_client):
    CHECKS[scenario](timelines.observe_line(scenario, RedisBackend(client=redis_client)))


def test_the_line_picture_draws_what_was_observed():
    lanes = timelines.observe_line("keep_latest")
    svg = ET.fromstring(timelines.render_line_svg("keep_latest", lanes))
    ns = {"svg": "http://www.w3.org/2000/svg"}
    bars = [
        rect.get("class") for rect in svg.findall("svg:rect", ns) if (rect.get("class") or "").startswith("stretch")
    ]
    drawn = [f"stretch stretch-{s.state.replace(' ', '-')}" for lane in lanes for s in lane.stretches]
    assert bars == drawn
    assert [text.text for text in svg.findall("svg:text", ns) if text.get("class") == "fate"] == [
        "done",
        "dropped",
        "done",
    ]
    assert svg.find("svg:title", ns).text == timelines.describe_line("keep_latest", lanes)
    assert "B is sent at" in svg.find("svg:title", ns).text and "and is dropped." in svg.find("svg:title", ns).text


def test_an_unknown_line_scenario_is_refused_with_the_valid_ones():
    valid = "cancel_in_progress, debounce, keep_latest"
    with pytest.raises(ValueError, match=f"'replace' is not a line scenario; choose one of {valid}"):
        timelines.observe_line("replace")
