"""The getting-started page, step by step, with real processes: each step prints what the page shows.

The page includes ``examples/getting_started/*.expected``. Each file starts with the command a
reader types (``$ python send.py``), which this test runs in that directory, and goes on with what
the command prints. As in tests/test_examples.py, a word in angle brackets stands for a part that
changes from run to run; here ``<digest>`` and a word ending in `` id>`` also stand for the same
text wherever they appear on the page: the ``<first id>`` that holds the lock in ``explain`` is the
message ``send.py`` enqueued first. To fit the page width, a line indented by four spaces continues
the line before it (a space joins them), and a run of spaces between columns compares as two.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys

import pytest

from .support import wait_for
from .test_examples import EXAMPLES, PLACEHOLDER

HERE = EXAMPLES / "getting_started"
#: How the programs the page names are run here: with this interpreter and this checkout.
PROGRAMS = {
    "python": [sys.executable],
    "dramatiq": [sys.executable, "-m", "dramatiq"],
    "dramatiq-unique": [sys.executable, "-m", "dramatiq_unique"],
}
SAME_TEXT = re.compile(r"<(?:digest|[a-z ]* id)>")
CONTINUATION = "    "
#: What the actor prints when it runs: the record that it ran, in the worker's output.
RAN = "Sending the welcome email to user 42"


def read_step(name: str) -> tuple[list[str], list[str]]:
    """The command of ``<name>.expected`` and the lines it states, wrapped lines joined."""
    command, *rest = (HERE / f"{name}.expected").read_text().splitlines()
    assert command.startswith("$ "), f"{name}.expected must start with the command, as '$ ...'"
    program, *arguments = shlex.split(command[2:])
    lines: list[str] = []
    for line in rest:
        if line.startswith(CONTINUATION) and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return [*PROGRAMS[program], *arguments], lines


def columns(line: str) -> str:
    return re.sub(r" {2,}", "  ", line)


class Page:
    """Matches printed lines against the page's, and remembers what ``<digest>`` and ``<... id>`` were."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def pattern(self, expected: str) -> tuple[re.Pattern[str], dict[str, str]]:
        """The pattern of one line the page states, and which placeholder each of its groups is."""
        parts, groups, start = [], {}, 0
        for placeholder in PLACEHOLDER.finditer(expected):
            parts.append(re.escape(expected[start : placeholder.start()]))
            word = placeholder.group()
            if not SAME_TEXT.fullmatch(word):
                parts.append(".+?")
            elif word in self.seen:
                parts.append(re.escape(self.seen[word]))
            elif word in groups:
                parts.append(f"(?P={groups[word]})")
            else:
                groups[word] = f"g{len(groups)}"
                parts.append(f"(?P<{groups[word]}>.+?)")
            start = placeholder.end()
        parts.append(re.escape(expected[start:]))
        return re.compile("".join(parts) + r"\Z"), {group: word for word, group in groups.items()}

    def match(self, expected: str, printed: str) -> bool:
        pattern, words = self.pattern(columns(expected))
        found = pattern.match(columns(printed))
        if found:
            self.seen.update({words[group]: text for group, text in found.groupdict().items()})
        return found is not None

    def mismatches(self, name: str, printed: str) -> list[str]:
        """How ``printed`` differs from what ``<name>.expected`` states, line by line."""
        _, expected = read_step(name)
        lines = printed.splitlines()
        found = [
            f"line {number}: expected {want!r}, printed {got!r}"
            for number, (want, got) in enumerate(zip(expected, lines, strict=False), start=1)
            if not self.match(want, got)
        ]
        if len(lines) != len(expected):
            found.append(f"{len(lines)} lines printed, {len(expected)} expected")
        return found

    def assert_prints(self, name: str, result: subprocess.CompletedProcess[str]) -> None:
        assert result.returncode == 0, f"{name}: exit code {result.returncode}:\n{result.stdout}"
        mismatches = self.mismatches(name, result.stdout)
        assert not mismatches, f"{name}.expected is not what was printed:\n" + "\n".join(
            [*mismatches, "--- printed:", result.stdout]
        )


def run(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command, _ = read_step(name)
    # One stream, as on a terminal: the log lines in their place between the printed ones.
    return subprocess.run(
        command, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=30
    )


def queued_message_ids(redis_client) -> list[str]:
    """The message_ids in the default queue of the page's broker (namespace ``dramatiq``)."""
    return sorted(json.loads(data)["message_id"] for data in redis_client.hvals("dramatiq:default.msgs"))


@pytest.mark.version_independent
def test_an_id_stands_for_the_same_text_wherever_it_appears():
    page = Page()
    assert page.match("<first id>: enqueued, held by <first id>", "a1: enqueued, held by a1")
    assert not page.match("<second id>: duplicate, held by <first id>", "b2: duplicate, held by b2")
    assert page.match("<second id>: duplicate, held by <first id>", "b2: duplicate, held by a1")
    assert page.match("taken <age> ago", "taken 20ms ago") and page.match("taken <age> ago", "taken 3s ago")
    assert page.match("  MESSAGE ID  STATE", "  MESSAGE ID                            STATE")
    assert not page.match("  MESSAGE ID STATE", "  MESSAGE ID  STATE")


@pytest.mark.version_independent
def test_a_wrapped_line_is_one_printed_line():
    command, lines = read_step("send")
    assert command == [sys.executable, "send.py"]
    assert lines[0].startswith("INFO ") and lines[0].endswith(" (strategy 'log').") and len(lines) == 3


def test_the_steps_of_the_getting_started_page(redis_url, redis_client, tmp_path):
    env = {name: value for name, value in os.environ.items() if name not in ("REDIS_URL", "DRAMATIQ_UNIQUE_URL")}
    env["REDIS_URL"] = redis_url
    env["PYTHONUNBUFFERED"] = "1"  # printed lines reach the pipe at once, as they reach a terminal
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES.parent), env.get("PYTHONPATH")]))
    page = Page()
    try:
        # Send twice, no worker running: the first is enqueued, the second dropped and logged.
        page.assert_prints("send", run("send", env))
        assert queued_message_ids(redis_client) == [page.seen["<first id>"]], "one message is queued: the first"

        # explain: the queued first message holds the enqueue lock.
        page.assert_prints("explain_queued", run("explain_queued", env))

        # Start a worker: it runs the first message, once.
        command, worker_lines = read_step("worker")
        log_path = tmp_path / "worker.log"
        with log_path.open("w") as log:
            worker = subprocess.Popen(
                command, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_for(lambda: RAN in log_path.read_text(), timeout=30)  # the worker ran the message
            # explain again: the lock is free once the actor has returned, a moment after its print.
            attempts = []

            def explained_free() -> bool:
                attempts.append(run("explain_free", env))
                return not page.mismatches("explain_free", attempts[-1].stdout)

            wait_for(explained_free, timeout=10)
            page.assert_prints("explain_free", attempts[-1])
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                code = worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                raise
        log_text = log_path.read_text()
        logged = log_text.splitlines()
        assert code == 0, f"the worker exited with {code}:\n{log_text}"
        # The worker's lines come from several processes, in no set order: each line the page shows
        # is somewhere in its output.
        missing = [want for want in worker_lines if not any(page.match(want, line) for line in logged)]
        assert not missing, f"the worker printed none of {missing}:\n{log_text}"
        assert worker_lines[-1] == RAN and logged.count(RAN) == 1, f"the message ran once:\n{log_text}"
        assert not [line for line in logged if "[ERROR]" in line or "[WARNING]" in line or "Traceback" in line], (
            log_text
        )
        assert queued_message_ids(redis_client) == [], "the queue is empty"
        assert redis_client.hlen("dramatiq:default.XQ.msgs") == 0, "nothing went to the dead-letter queue"
    finally:
        for prefix in ("dramatiq:", "dramatiq-unique:"):
            keys = list(redis_client.scan_iter(match=f"{prefix}*"))
            if keys:
                redis_client.delete(*keys)
    assert redis_client.dbsize() == 0, "the steps wrote only the broker's and the locks' keys"
