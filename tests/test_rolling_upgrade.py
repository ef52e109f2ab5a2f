"""Rolling upgrades: the previous release and this version side by side on one lock store.

During a rolling upgrade some processes still run the previous release while others run this
version, senders and workers in any order; a rollback mixes them the other way round. Each test
starts one process of each version (``tests/upgrade_fleet.py``): the previous release is built
from its git tag into a wheel (``tests/previous_release.py``), this version is the checkout. One
version holds a lock and the other meets it, in both directions ("upgrade": the previous release
holds, this version meets it; "rollback": the other way round), on one Redis and on a
three-master Redis Cluster (locks on the cluster, messages on a Redis). What a user notices is
recorded apart from the locks, in the broker's Redis: each run with its version, start and end,
and each message a worker skipped.

They guard that a mixed fleet lets no duplicate in (a copy sent or started while the other
version holds the lock is refused, rescheduled or waits), runs each accepted message exactly
once, never runs two copies at once, hands a line's place across versions, reads and reaps the
other version's locks, and leaves no key of a lock without an expiry once its messages are done.

Run them with::

    CI=1 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_rolling_upgrade.py

A clone that has neither the previous release's tag nor its commit (``tests/previous-release.txt``)
skips them: ``git fetch --tags``. Without a Redis Cluster the cluster runs are skipped, except in
CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

import dramatiq_unique

from .previous_release import Release, build_previous_release
from .support import wait_for
from .upgrade_fleet import POLLING_DELAY, RUNS, SKIPS

FLEET = Path(__file__).with_name("upgrade_fleet.py")
#: The package of this version: the checkout the tests import.
CHECKOUT = Path(dramatiq_unique.__file__).resolve().parents[1]
PREFIX = "dramatiq-unique"
#: The keys under the lock prefix that are meant to stay without an expiry: the mark of the
#: store's data (one per master of a cluster) and the worker registry.
PERMANENT = re.compile(rf"{PREFIX}:(epoch(:\{{[^}}]*\}})?|workers)")

#: "upgrade": the previous release holds the lock and this version meets it; "rollback": the other way round.
DIRECTIONS = pytest.mark.parametrize("direction", ["upgrade", "rollback"])

#: How long the first of two copies of a while_executing message runs.
HOLD = 0.8


@pytest.fixture(scope="session")
def previous_release(tmp_path_factory) -> Release:
    return build_previous_release(tmp_path_factory.mktemp("previous-release"))


@dataclass(frozen=True)
class Store:
    kind: str
    broker_url: str
    locks_url: str
    #: The broker's Redis, where the fleet records what it ran.
    records: redis.Redis
    #: The servers the locks are on (every master of a cluster).
    nodes: list[redis.Redis]


@pytest.fixture(params=["redis", "cluster"])
def store(request, redis_url, redis_client) -> Store:
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        request.getfixturevalue("cluster_client")  # every master flushed before and after the test
        return Store("cluster", redis_url, f"redis://127.0.0.1:{cluster.ports[0]}/0", redis_client, cluster.nodes)
    return Store("redis", redis_url, redis_url, redis_client, [redis_client])


class Agent:
    """A process of one version running tests/upgrade_fleet.py, which sends and works when told."""

    def __init__(self, version: str, package_dir: Path, store: Store, directory: Path):
        self.version = version
        self.directory = directory
        self.env = {
            **os.environ,
            # First on the path, the version's package; Dramatiq and redis-py from this environment.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(package_dir), os.environ.get("PYTHONPATH")])),
            "UPGRADE_VERSION": version,
            "UPGRADE_PACKAGE_DIR": str(package_dir),
            "UPGRADE_BROKER_URL": store.broker_url,
            "UPGRADE_LOCKS_URL": store.locks_url,
            "UPGRADE_LOCKS_CLUSTER": "1" if store.kind == "cluster" else "",
        }
        directory.mkdir()
        # A copy beside nothing else: the tests directory is not on the process's import path.
        shutil.copy(FLEET, directory / FLEET.name)
        self.log_path = directory / "process.log"
        self._log = open(self.log_path, "wb")  # closed by close()
        self.process = subprocess.Popen(
            [sys.executable, FLEET.name],
            cwd=directory,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

    def _answer(self, what: str, timeout: float = 20) -> dict[str, Any]:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"version {self.version} gave no answer to {what}:\n{self.log()}")
        answer = json.loads(line)
        assert "error" not in answer, f"version {self.version} failed {what}:\n{answer['error']}"
        return answer

    def ready(self) -> None:
        hello = self._answer("its start")
        assert hello["version"] == self.version, hello

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        return self._answer(f"{op} {fields}")

    def send(self, actor: str, *args: Any) -> dict[str, Any]:
        return self.call("send", actor=actor, args=list(args))

    def work(self, *queues: str) -> None:
        self.call("work", queues=list(queues))

    def cli(self, *args: str) -> Any:
        """``python -m dramatiq_unique --app upgrade_fleet ... --json`` of this version, its JSON."""
        done = subprocess.run(
            [sys.executable, "-m", "dramatiq_unique", "--app", "upgrade_fleet", *args, "--json"],
            cwd=self.directory,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, f"version {self.version}: dramatiq-unique {args}:\n{done.stdout}{done.stderr}"
        return json.loads(done.stdout)

    def log(self) -> str:
        return self.log_path.read_text()[-4000:]

    def warnings(self) -> list[str]:
        """The WARNING and ERROR lines the library logged in this process, but the one this version
        logs at boot about the test cluster, which keeps nothing on disk (the previous release
        does not check it): what the versions say of each other's locks."""
        return [
            line
            for line in self.log_path.read_text().splitlines()
            if re.match(r"\S+ \S+ dramatiq_unique\.\S* (WARNING|ERROR|CRITICAL) ", line)
            and "keeps nothing on disk" not in line
        ]

    def close(self) -> None:
        # A closed stdin ends the process: it stops its worker first, before the test flushes the store.
        try:
            self.process.stdin.close()
            self.process.wait(timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.process.stdout.close()
            self._log.close()


@pytest.fixture
def fleet(previous_release, store, tmp_path, direction):
    """The process that holds the lock and the one that meets it: (previous release, this version)
    for an upgrade, the other way round for a rollback."""
    old = Agent(previous_release.version, previous_release.site, store, tmp_path / "previous")
    try:
        new = Agent(dramatiq_unique.__version__, CHECKOUT, store, tmp_path / "this")
    except BaseException:
        old.close()
        raise
    agents = (old, new) if direction == "upgrade" else (new, old)
    try:
        assert old.version != new.version
        for agent in agents:
            agent.ready()
        yield agents
    finally:
        for agent in agents:
            agent.close()
            # Shown with a failed test only: what each process logged.
            print(f"--- the process of version {agent.version} ---\n{agent.log()}")


def records(store: Store, key: str) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in store.records.lrange(key, 0, -1)]


def run_of(store: Store, message_id: str) -> dict[str, Any]:
    """The one run of a message: the version that ran it, its start and end."""
    events = [entry for entry in records(store, RUNS) if entry["message_id"] == message_id]
    assert [entry["event"] for entry in events] == ["start", "end"], events
    return {"version": events[0]["version"], "start": events[0]["at"], "end": events[1]["at"]}


def ended(store: Store, message_id: str) -> bool:
    return any(e["message_id"] == message_id and e["event"] == "end" for e in records(store, RUNS))


def broker_idle(store: Store) -> bool:
    """Whether every message the broker was given is done: none waits in a queue or a delay queue,
    or runs (a message's payload stays in ``<queue>.msgs`` until it is acked)."""
    return not any(not key.endswith(b".XQ.msgs") for key in store.records.scan_iter("dramatiq:*.msgs"))


def dead_letters(store: Store) -> list[bytes]:
    return list(store.records.scan_iter("dramatiq:*.XQ.msgs"))


def keys_without_expiry(store: Store) -> list[str]:
    """The keys under the lock prefix that never expire, but for those meant to stay."""
    found = []
    for node in store.nodes:
        for key in node.scan_iter(match=f"*{PREFIX}*", count=1000):
            name = key.decode()
            if not PERMANENT.fullmatch(name) and node.pttl(key) == -1:
                found.append(name)
    return found


def assert_every_lock_key_expires(store: Store, digest: str) -> None:
    """Once the messages of the lock of ``digest`` are done, every key under the lock prefix expires,
    but for those meant to stay: a key left without an expiry would stay for ever. (A worker sends
    its releases from a thread of its own, milliseconds after the run: the check waits for them.)"""
    deadline = time.monotonic() + 5
    while keys_without_expiry(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keys_without_expiry(store) == []
    # And the lock's keys are there, keeping its fence: the check above was not made on nothing.
    assert any(digest in key.decode() for node in store.nodes for key in node.scan_iter(match=f"{PREFIX}:*"))


@DIRECTIONS
def test_until_executed_held_by_one_version_is_a_duplicate_for_the_other_whose_worker_releases_it(fleet, store):
    holder, other = fleet
    first = holder.send("settle", "evt_1")
    assert first["status"] == "enqueued"

    duplicate = other.send("settle", "evt_1")
    assert (duplicate["status"], duplicate["holder"]) == ("duplicate", first["message_id"])

    other.work("payments")
    wait_for(lambda: ended(store, first["message_id"]))
    # The worker's release thread gives the lock up just after the run: until then a send of the
    # version that held it is a duplicate, then one is enqueued.
    sends = [holder.send("settle", "evt_1")]
    deadline = time.monotonic() + 10
    while sends[-1]["status"] == "duplicate" and time.monotonic() < deadline:
        time.sleep(0.05)
        sends.append(holder.send("settle", "evt_1"))
    again = sends[-1]
    assert again["status"] == "enqueued", sends
    wait_for(lambda: broker_idle(store))

    # Each send accepted ran once, in the worker of the version that met the lock; nothing else ran.
    assert run_of(store, first["message_id"])["version"] == other.version
    assert run_of(store, again["message_id"])["version"] == other.version
    assert {e["message_id"] for e in records(store, RUNS)} == {first["message_id"], again["message_id"]}
    assert_every_lock_key_expires(store, first["digest"])
    assert dead_letters(store) == []
    assert holder.warnings() == other.warnings() == []


@DIRECTIONS
def test_while_executing_copy_in_the_other_versions_worker_waits_for_the_run_to_end(fleet, store):
    holder, other = fleet
    holder.work("sync_first")
    other.work("sync_copy")
    first = holder.send("sync_first", "acct_1", HOLD)
    wait_for(lambda: any(e["message_id"] == first["message_id"] for e in records(store, RUNS)))
    copy = other.send("sync_copy", "acct_1", 0)
    assert copy["status"] == "enqueued"  # while_executing locks in the worker only
    wait_for(lambda: broker_idle(store), timeout=15)

    first_run, copy_run = run_of(store, first["message_id"]), run_of(store, copy["message_id"])
    assert (first_run["version"], copy_run["version"]) == (holder.version, other.version)
    # The copy reached the other version's worker while the first ran, met the run lock there and
    # was rescheduled: it ran once, after the first ended.
    assert copy_run["start"] >= first_run["end"]
    skipped = [s for s in records(store, SKIPS) if s["message_id"] == copy["message_id"]]
    assert skipped and {s["version"] for s in skipped} == {other.version}
    assert_every_lock_key_expires(store, first["digest"])
    assert dead_letters(store) == []
    assert holder.warnings() == other.warnings() == []


@DIRECTIONS
def test_a_line_waiting_on_one_versions_lock_is_handed_its_place_by_the_other(fleet, store):
    holder, other = fleet
    first = holder.send("post_first", "acct_1", 0)
    waiter = other.send("post_copy", "acct_1", 1)
    assert first["status"] == "enqueued"
    assert (waiter["status"], waiter["position"]) == ("waiting", 1)

    # The other version's worker runs the holder's message and, releasing it, hands the place to
    # the message waiting in line; the holder's version runs that one.
    other.work("post_first")
    holder.work("post_copy")
    # (The broker holds the waiter only once the place was handed to it.)
    wait_for(lambda: ended(store, waiter["message_id"]) and broker_idle(store))

    first_run, waiter_run = run_of(store, first["message_id"]), run_of(store, waiter["message_id"])
    assert (first_run["version"], waiter_run["version"]) == (other.version, holder.version)
    assert waiter_run["start"] >= first_run["end"]
    # Handed over by the release, not found by polling after reschedule_delay.
    assert waiter_run["start"] - first_run["end"] < POLLING_DELAY / 1000 / 6
    assert records(store, SKIPS) == []
    assert_every_lock_key_expires(store, first["digest"])
    assert dead_letters(store) == []
    assert holder.warnings() == other.warnings() == []


@DIRECTIONS
def test_one_versions_command_lists_the_others_lock_and_its_reaper_frees_it_when_the_message_is_lost(fleet, store):
    holder, other = fleet
    first = holder.send("settle", "evt_1")
    listed = other.cli("list")
    assert [(lock["kind"], lock["actor"], [h["message_id"] for h in lock["holders"]]) for lock in listed] == [
        ("enqueue", "settle", [first["message_id"]])
    ]

    holder.call("purge", queue="payments")  # the message is lost: its lock is an orphan
    report = other.call("reap")
    assert report["released_missing_messages"] == 1
    (released,) = other.warnings()
    assert "The orphan reaper released lock" in released and first["message_id"] in released
    assert_every_lock_key_expires(store, first["digest"])
    assert holder.send("settle", "evt_1")["status"] == "enqueued"
    assert holder.warnings() == []
