"""The timeline pictures of the docs (docs/_ext/timelines.py) show what the lock types do.

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
