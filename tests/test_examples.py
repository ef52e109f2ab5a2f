"""Every example under examples/ runs against a real Redis and prints what its page says it prints.

Each ``examples/<name>.py`` has its output next to it in ``examples/<name>.expected``, which its
page includes, with the actor it shows first taken from the same file. A word in angle
brackets there, like ``<seconds>``, stands for a part that changes from run to run: it matches
any text within its line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_pages import WIDEST_CODE_LINE

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = sorted(path.stem for path in EXAMPLES.glob("*.expected"))
PLACEHOLDER = re.compile(r"<[a-z][a-z ]*>")
#: Examples whose messages go through RabbitMQ: like tests/test_rabbitmq.py, they skip where RabbitMQ is
#: not running, except in CI.
NEEDS_RABBITMQ = {"rabbitmq_broker"}


def line_pattern(expected: str) -> re.Pattern[str]:
    parts = PLACEHOLDER.split(expected)
    return re.compile(".+?".join(re.escape(part) for part in parts) + r"\Z")


def run_example(name: str, redis_url: str | None, rabbitmq_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    if redis_url:
        env["REDIS_URL"] = redis_url
    if rabbitmq_url:
        env["RABBITMQ_URL"] = rabbitmq_url
    # The examples import dramatiq_unique from this checkout, like the rest of the tests.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES.parent), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        cwd=EXAMPLES.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_prints_what_it_states(name: str, result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{name}.py exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    expected = (EXAMPLES / f"{name}.expected").read_text().splitlines()
    printed = result.stdout.splitlines()
    mismatches = [
        f"line {number}: expected {want!r}, printed {got!r}"
        for number, (want, got) in enumerate(zip(expected, printed, strict=False), start=1)
        if not line_pattern(want).match(got)
    ]
    if len(printed) != len(expected):
        mismatches.append(f"{len(printed)} lines printed, {len(expected)} expected")
    assert not mismatches, f"{name}.py did not print what {name}.expected states:\n" + "\n".join(
        mismatches + ["--- stdout:", result.stdout, "--- stderr:", result.stderr]
    )


@pytest.mark.version_independent
def test_placeholders_match_within_a_line_only():
    pattern = line_pattern("took <seconds> s, token <token>")
    assert pattern.match("took 0.31 s, token 1795967855906632")
    assert not pattern.match("took 0.31 s, token ")
    assert not pattern.match("took 0.31 s, TOKEN 17")
    assert line_pattern("plain").match("plain") and not line_pattern("plain").match("plain and more")


@pytest.mark.version_independent
def test_every_example_states_its_output():
    scripts = {path.stem for path in EXAMPLES.glob("*.py")} - {"demo", "redis_for_examples"}
    assert scripts == set(NAMES), "every example needs an .expected file, and every .expected file an example"


@pytest.mark.version_independent
def test_the_examples_fit_the_page_width():
    # The pages show the examples and their output: 88 characters a line, as ruff checks
    # for the code (examples/ruff.toml). A placeholder like <token> counts as written.
    files = [*EXAMPLES.glob("*.py"), *EXAMPLES.glob("*.expected"), *(EXAMPLES / "django_shop").rglob("*.py")]
    too_long = [
        f"{path.relative_to(EXAMPLES)}:{number}: {len(line)} characters"
        for path in sorted(files)
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if len(line) > WIDEST_CODE_LINE
    ]
    assert too_long == []


@pytest.mark.parametrize("name", NAMES)
def test_example(name, redis_url, redis_client, request):
    rabbitmq_url = request.getfixturevalue("rabbitmq_url") if name in NEEDS_RABBITMQ else None
    result = run_example(name, redis_url, rabbitmq_url)
    assert_prints_what_it_states(name, result)
    left = sorted(key.decode() for key in redis_client.scan_iter(match="example-*"))
    assert not left, f"{name}.py left keys behind: {left}"


def test_an_example_starts_its_own_valkey_server_without_redis_url():
    result = run_example("serialize_per_resource", redis_url=None)
    assert_prints_what_it_states("serialize_per_resource", result)
