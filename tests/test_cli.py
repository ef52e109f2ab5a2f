"""The command line (SPEC O2; issue 10), run as a subprocess (``python -m dramatiq_unique``) against
a real redis-server and a real Redis Cluster, with locks in every state: queued, running, lapsed,
several holders of one digest, an actor's own prefix."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import time
import uuid
from dataclasses import replace
from pathlib import Path

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import Locks, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.backends import Holder, LockRecord
from dramatiq_unique.cli import (
    RET_ABORTED,
    RET_CONNECT,
    RET_IMPORT,
    RET_LINE,
    RET_NOT_FOUND,
    RET_OK,
    RET_URL,
    RET_USAGE,
)
from dramatiq_unique.held import HolderInfo, LockInfo
from dramatiq_unique.keys import registry_key
from dramatiq_unique.presentation import lock_table

from .support import wait_for

ROOT = Path(__file__).resolve().parent.parent
LOCK_KEYS = {"digest", "kind", "actor", "queue", "lock", "holders", "waiting"}
HOLDER_KEYS = {"message_id", "state", "worker_id", "acquired_at", "expires_at", "token", "call", "stop_requested_by"}
#: The command's own; tests/cli_app.py reads CLI_APP_URL, which the fixture sets.
URL_VARIABLES = ("DRAMATIQ_UNIQUE_URL", "REDIS_URL")


def cli(*args: str, env: dict[str, str] | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in URL_VARIABLES}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dramatiq_unique", *args],
        cwd=ROOT,
        env=environment,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == RET_OK, result.stderr
    return result.stdout


def assert_error(result: subprocess.CompletedProcess[str], code: int, *secrets: str) -> str:
    """One line on stderr, no traceback, the exit code, and none of the secrets anywhere."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("dramatiq-unique: error: ")
    for secret in secrets:
        assert secret not in result.stderr
    return line


@pytest.fixture
def app(redis_url, monkeypatch):
    """tests/cli_app.py on the test server, with locks in every state."""
    monkeypatch.setenv("CLI_APP_URL", redis_url)
    # A fresh broker for each test: a Worker leaves its middleware on the broker it ran on.
    module = importlib.reload(sys.modules["tests.cli_app"]) if "tests.cli_app" in sys.modules else None
    if module is None:
        import tests.cli_app as module
    sent = {
        "settle": module.settle_payment.send("evt_123", {"amount": 100}),
        "report_a": module.build_report.send("2024-06-30"),
        "report_b": module.build_report.send("2024-06-30"),
        "invoice": module.send_invoice.send(7),
        # A lock_ttl of 50 ms for this message only: it lapses before the commands run. On the actor, it
        # would add the WARNING of a lock_ttl that looks like seconds to every command's stderr.
        "reminder": module.send_reminder.send_with_options(args=(1,), lock_ttl=50),
        "sync": module.sync_account_balance.send(42),
    }
    worker = Worker(module.broker, worker_timeout=100, worker_threads=1, queues={"sync"})
    worker.start()
    locks = Locks.from_middleware(module.unique)
    wait_for(lambda: any(lock.kind == "run" for lock in locks.list(state="running")))
    time.sleep(0.06)  # the reminder's lock_ttl of 50 ms runs out
    try:
        yield module, sent
    finally:
        module.gate.set()
        worker.stop()
        module.gate.clear()
        module.broker.flush_all()


def digest(message) -> str:
    return enqueue_outcome(message).digest


def test_list_prints_json_with_the_documented_keys(app, redis_url):
    module, sent = app
    listed = json.loads(ok(cli("--url", redis_url, "list", "--json")))
    assert all(set(lock) == LOCK_KEYS for lock in listed)
    assert all(set(holder) == HOLDER_KEYS for lock in listed for holder in lock["holders"])
    by_actor = {lock["actor"]: lock for lock in listed}
    # The lapsed reminder is free; the invoice lives under its actor's own prefix.
    assert set(by_actor) == {"settle_payment", "build_report", "sync_account_balance"}
    settle = by_actor["settle_payment"]
    assert (settle["digest"], settle["kind"], settle["queue"], settle["lock"]) == (
        digest(sent["settle"]),
        "enqueue",
        "payments",
        "until_executed",
    )
    (holder,) = settle["holders"]
    assert holder["message_id"] == sent["settle"].message_id
    assert (holder["state"], holder["worker_id"], holder["expires_at"]) == ("queued", None, None)
    assert holder["token"] == enqueue_outcome(sent["settle"]).token
    assert abs(holder["acquired_at"] - time.time() * 1000) < 60_000  # epoch milliseconds
    (running,) = by_actor["sync_account_balance"]["holders"]
    assert by_actor["sync_account_balance"]["kind"] == "run"
    assert running["state"] == "running" and running["worker_id"] and running["expires_at"] > running["acquired_at"]
    assert [h["message_id"] for h in by_actor["build_report"]["holders"]] == [
        sent["report_a"].message_id,
        sent["report_b"].message_id,
    ]

    with_billing = json.loads(
        ok(cli("--url", redis_url, "--prefix", "dramatiq-unique", "--prefix", "billing", "list", "--json"))
    )
    assert "send_invoice" in {lock["actor"] for lock in with_billing}

    # Filters, the URL from the environment, the fallback to REDIS_URL.
    (report,) = json.loads(ok(cli("list", "--actor", "build_report", "--json", env={"DRAMATIQ_UNIQUE_URL": redis_url})))
    assert len(report["holders"]) == 2
    (sync,) = json.loads(ok(cli("list", "--state", "running", "--json", env={"REDIS_URL": redis_url})))
    assert sync["actor"] == "sync_account_balance"
    assert len(json.loads(ok(cli("--url", redis_url, "list", "--limit", "1", "--json")))) == 1


def test_list_prints_an_aligned_table_with_held_lease_and_expiry_apart(app, redis_url):
    module, sent = app
    # --app: the application's backend and every prefix its actors use. --wide: every value whole.
    lines = ok(cli("--app", "tests.cli_app", "list", "--wide", env={"CLI_APP_URL": redis_url})).splitlines()
    first, header, *rows, blank, footer = lines
    assert first == f"Locks on Redis {redis_url.removeprefix('redis://')} under prefixes 'dramatiq-unique', 'billing':"
    # With --app, the RedisBroker tells each queued holder's call by its message id.
    assert header.split() == [
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
    ]
    assert blank == "" and footer == "5 holders in 4 locks."
    assert len(rows) == 5
    columns = [
        re.search(rf"\b{name}\b", header).start()
        for name in ("KIND", "ACTOR", "MESSAGE", "STATE", "HELD", "LEASE", "EXPIRES", "WORKER")
    ]
    for row in rows:
        assert all(row[c - 1] == " " and row[c] != " " for c in columns)  # aligned
    settle = next(row for row in rows if sent["settle"].message_id in row)
    assert settle.endswith("  settle_payment('evt_123', {'amount': 100})")
    settle = settle.removesuffix("settle_payment('evt_123', {'amount': 100})")
    assert settle.split()[:5] == [digest(sent["settle"]), "enqueue", "settle_payment", "payments", "until_executed"]
    # An enqueue lock without lock_ttl: held for some time, no lease, never expires.
    assert settle.split()[6:] == ["queued", settle.split()[7], "-", "never", "-"]
    assert re.fullmatch(r"\d+(ms|s)", settle.split()[7])
    # A running holder of a run lock: its lease (renewed while it runs), no lifetime of its own.
    sync = next(row for row in rows if sent["sync"].message_id in row)
    # Its call is not known: a run lock's holder records no broker id, and it has no enqueue lock.
    assert re.search(r"running\s+\d+(ms|s)\s+\d+s\s+-\s+\S+:\d+:\S+\s+-$", sync)
    assert any(sent["invoice"].message_id in row for row in rows)

    assert ok(cli("--url", redis_url, "list", "--actor", "nobody")) == (
        f"No locks are held on Redis {redis_url.removeprefix('redis://')} under prefix 'dramatiq-unique' "
        "for actor 'nobody'.\n"
    )


def test_show_prints_the_locks_of_one_digest(app, redis_url):
    module, sent = app
    report = digest(sent["report_a"])
    lines = ok(cli("--url", redis_url, "show", report, "--wide")).splitlines()
    assert lines[:2] == [
        f"enqueue lock dramatiq-unique:{{{report}}}: 2 holders",
        "  actor build_report, queue reports, lock until_executed",
    ]
    assert lines[2].split() == ["MESSAGE", "STATE", "HELD", "LEASE", "EXPIRES", "TOKEN", "WORKER"]
    assert [line.split()[0] for line in lines[3:]] == [sent["report_a"].message_id, sent["report_b"].message_id]
    # Fitted (the default): the first characters of each message id.
    fitted = ok(cli("--url", redis_url, "show", report)).splitlines()
    assert [line.split()[0] for line in fitted[3:]] == [
        sent["report_a"].message_id[:8],
        sent["report_b"].message_id[:8],
    ]
    # The key of a lock, as log lines name it, works too.
    (shown,) = json.loads(ok(cli("--url", redis_url, "show", f"dramatiq-unique:{{{report}}}", "--json")))
    assert set(shown) == LOCK_KEYS and len(shown["holders"]) == 2


def test_explain_computes_the_digest_with_the_actors_lock_args_method(app, redis_url):
    module, sent = app
    # No URL: the backend of the module's UniqueJobs.
    out = ok(
        cli("explain", "tests.cli_app:settle_payment", '["evt_123", {"amount": 999}]', env={"CLI_APP_URL": redis_url})
    )
    lines = out.splitlines()
    assert lines[:5] == [
        f"locks on   Redis {redis_url.removeprefix('redis://')} under prefix 'dramatiq-unique'",
        "actor      settle_payment (queue payments)",
        "lock       until_executed (lock_limit 1)",
        'lock args  ["evt_123"]',
        f"digest     {digest(sent['settle'])}",
    ]
    assert lines[9].strip().startswith(sent["settle"].message_id[:8] + " ")
    # Then the conflict trail's last hour of the job (tests/test_history.py).
    assert lines[-2:] == ["", "The conflict trail has no message of this job in the last hour."]
    assert lines[-3].startswith(
        f"A new send would be dropped as a duplicate of message {sent['settle'].message_id!r} (queued, held for "
    )
    assert lines[-3].endswith(", never expires) (strategy 'log').")

    explained = json.loads(
        ok(
            cli(
                "--url",
                redis_url,
                "explain",
                "tests.cli_app:settle_payment",
                '["evt_123"]',
                "--kwargs",
                '{"payload": {"amount": 5}}',
                "--json",
            )
        )
    )
    assert explained["digest"] == digest(sent["settle"]) and explained["lock_args"] == ["evt_123"]
    assert explained["locks"][0]["holders"][0]["message_id"] == sent["settle"].message_id
    assert explained["on_start"] is None

    free = ok(cli("--url", redis_url, "explain", "tests.cli_app:settle_payment", '["evt_456"]'))
    assert free.splitlines()[-3] == "A new send would take the enqueue lock: it is free."
    sync = ok(cli("--url", redis_url, "explain", "tests.cli_app:sync_account_balance", "[42]")).splitlines()
    assert sync[-4] == "A new send would be enqueued: while_executing takes no lock at enqueue."
    assert sync[-3].startswith("A message with these arguments, started now, would be rescheduled to try again in 5s")
    assert ok(cli("--url", redis_url, "explain", "tests.cli_app:ping")).splitlines()[-1].startswith("No lock:")


def test_unlock_frees_one_holder_or_a_digest_and_dry_run_frees_nothing(app, redis_url):
    module, sent = app
    report = digest(sent["report_a"])
    out = ok(cli("--url", redis_url, "unlock", report, "--dry-run"))
    assert out.splitlines()[0] == f"Would unlock 2 holders in 1 lock of digest {report!r}:"
    assert len(json.loads(ok(cli("--url", redis_url, "show", report, "--json")))[0]["holders"]) == 2

    out = ok(cli("--url", redis_url, "unlock", report, "--message-id", sent["report_a"].message_id))
    assert out.splitlines()[0] == f"Unlocked 1 holder in 1 lock of digest {report!r}:"
    (left,) = json.loads(ok(cli("--url", redis_url, "show", report, "--json")))
    assert [h["message_id"] for h in left["holders"]] == [sent["report_b"].message_id]

    settle = digest(sent["settle"])
    ok(cli("--url", redis_url, "unlock", settle))
    assert_error(cli("--url", redis_url, "show", settle), RET_NOT_FOUND)
    # What a user notices: the job can be sent again.
    assert enqueue_outcome(module.settle_payment.send("evt_123")).status == "enqueued"

    line = assert_error(cli("--url", redis_url, "unlock", report, "--message-id", "nobody"), RET_NOT_FOUND)
    assert "Message 'nobody' holds none of the locks of digest" in line


def test_unlock_leaves_a_lock_with_a_line_to_the_command_with_the_app(app, redis_url, redis_client):
    # Issue 31 (2): with --url, the freed place went to the message waiting in line, which the
    # command could not enqueue: it held the place for ever, and every later send waited behind it.
    module, _ = app
    first = module.export_orders.send("2026-12-04", 1)
    second = module.export_orders.send("2026-12-04", 2)
    assert enqueue_outcome(second).status == "waiting"
    export = digest(first)
    # Issue 34, point 4: "1 message wait in its line".
    explained = ok(cli("explain", "tests.cli_app:export_orders", '["2026-12-04", 3]', env={"CLI_APP_URL": redis_url}))
    # The sentence on a send, before the conflict trail's last hour.
    assert explained.splitlines()[-3].endswith("(strategy 'wait'); 1 message waits in its line.")
    line = assert_error(cli("--url", redis_url, "unlock", export), RET_LINE)
    assert "has 1 message(s) waiting in its line, and was left held" in line and "--app" in line
    (held,) = json.loads(ok(cli("--url", redis_url, "show", export, "--json")))
    assert [h["message_id"] for h in held["holders"]] == [first.message_id]
    assert held["waiting"] == [second.message_id]

    out = ok(cli("--app", "tests.cli_app", "unlock", export))
    assert out.splitlines()[0] == f"Unlocked 1 holder in 1 lock of digest {export!r}:"
    # The command enqueued the message it handed the place: a worker runs both, and the job is
    # free again afterwards.
    environment = {k: v for k, v in os.environ.items() if k not in URL_VARIABLES}
    worker = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "tests.cli_app", "--queues", "exports", "--processes", "1"],
        cwd=ROOT,
        env={**environment, "CLI_APP_URL": redis_url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: sorted(redis_client.lrange("tests:exports", 0, -1)) == [b"1", b"2"], timeout=60)
        wait_for(lambda: not Locks.from_middleware(module.unique).get(export))
        assert enqueue_outcome(module.export_orders.send("2026-12-04", 3)).status == "enqueued"
    finally:
        worker.terminate()
        worker.wait(30)


def test_unlock_all_of_an_actor_asks_for_confirmation(app, redis_url):
    module, sent = app
    held = lambda: json.loads(ok(cli("--url", redis_url, "list", "--actor", "build_report", "--json")))  # noqa: E731

    refused = cli("--url", redis_url, "unlock", "--actor", "build_report", "--all", stdin="n\n")
    assert refused.returncode == RET_ABORTED
    assert (
        refused.stderr == "Unlock 2 holders in 1 lock of actor 'build_report'? Their messages are not stopped, "
        "and duplicates of them can be sent then. [y/N] \n"
    )
    assert refused.stdout == "Nothing was unlocked.\n"
    assert cli("--url", redis_url, "unlock", "--actor", "build_report", "--all").returncode == RET_ABORTED  # no answer
    dry = ok(cli("--url", redis_url, "unlock", "--actor", "build_report", "--all", "--dry-run"))
    assert dry.startswith("Would unlock 2 holders in 1 lock of actor 'build_report':")
    assert len(held()[0]["holders"]) == 2

    confirmed = cli("--url", redis_url, "unlock", "--actor", "build_report", "--all", stdin="y\n")
    assert confirmed.returncode == RET_OK
    assert confirmed.stdout.startswith("Unlocked 2 holders in 1 lock of actor 'build_report':")
    assert held() == []

    yes = cli("--url", redis_url, "unlock", "--actor", "settle_payment", "--all", "--yes")
    assert yes.returncode == RET_OK and yes.stderr == ""
    assert {lock["actor"] for lock in json.loads(ok(cli("--url", redis_url, "list", "--json")))} == {
        "sync_account_balance"
    }
    assert cli("--url", redis_url, "unlock", "--actor", "settle_payment").returncode == RET_USAGE


def test_reap_releases_the_run_locks_of_dead_workers(redis_client, redis_url):
    backend = RedisBackend(client=redis_client)
    now = backend.time()
    redis_client.zadd(registry_key("dramatiq-unique"), {"dead-host:1:0000": now - 600_000})
    holder = Holder("m1", "sync", "default", "while_executing", "running", worker_id="dead-host:1:0000")
    assert backend.acquire("dramatiq-unique:{d1}:run", "t1", limit=1, ttl=600_000, holder=holder).acquired
    report = json.loads(ok(cli("--url", redis_url, "reap", "--json")))
    assert report["released_dead_workers"] == 1 and report["released"] == 1 and report["complete"] is True
    assert set(report) >= {
        "passes",
        "inspected",
        "released_missing_messages",
        "forgotten_workers",
        "skipped",
        "seconds",
    }
    out = ok(cli("--url", redis_url, "reap", "--max-passes", "1")).splitlines()
    assert re.fullmatch(
        r"The orphan reaper inspected 0 holders of locks in 1 pass \(a full cycle\) in \d+\.\d\ds and released 0: "
        r"0 of dead workers, 0 of messages that no longer exist\.",
        out[0],
    )
    assert out[1] == "Enqueue locks were left alone: pass --app to let the reaper ask your broker about them."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_errors_are_one_line_with_distinct_exit_codes_and_no_secret(tmp_path, redis_url):
    codes = set()
    password = "s3cr/et#pw"
    unreachable = f"redis://app:{password.replace('/', '%2F').replace('#', '%23')}@127.0.0.1:{free_port()}/0"
    line = assert_error(cli("--url", unreachable, "list"), RET_CONNECT, password, unreachable, "s3cr")
    assert "ConnectionError" in line
    codes.add(RET_CONNECT)

    bad = f"redis://app:{password}@127.0.0.1:6379/0"  # a password holding '/' and '#', not percent-encoded
    line = assert_error(cli("list", env={"DRAMATIQ_UNIQUE_URL": bad}), RET_URL, password, bad, "s3cr", "et#pw")
    assert "cannot use its url" in line
    assert_error(cli("list"), RET_URL)
    codes.add(RET_URL)

    assert_error(cli("--url", redis_url, "show", "0" * 64), RET_NOT_FOUND)
    codes.add(RET_NOT_FOUND)

    line = assert_error(cli("--url", redis_url, "explain", "no_such_module:actor"), RET_IMPORT)
    assert "Cannot import module 'no_such_module': ModuleNotFoundError" in line
    assert_error(
        cli("--url", redis_url, "explain", "tests.cli_app:nothing", env={"CLI_APP_URL": redis_url}), RET_IMPORT
    )
    # A module whose import fails on the URL: what urllib quotes of the password is not shown.
    (tmp_path / "broken_app.py").write_text(
        "import os\nfrom dramatiq.brokers.redis import RedisBroker\nRedisBroker(url=os.environ['REDIS_URL'])\n"
    )
    line = assert_error(
        cli("--path", str(tmp_path), "--url", redis_url, "explain", "broken_app:actor", env={"REDIS_URL": bad}),
        RET_IMPORT,
        "s3cr",
        "et#pw",
        bad,
    )
    assert "Cannot import module 'broken_app': ValueError" in line
    (tmp_path / "plain_app.py").write_text(
        "import dramatiq\nfrom dramatiq.brokers.stub import StubBroker\ndramatiq.set_broker(StubBroker())\n"
        "@dramatiq.actor\ndef plain():\n    pass\n"
    )
    line = assert_error(cli("--path", str(tmp_path), "--url", redis_url, "explain", "plain_app:plain"), RET_IMPORT)
    assert "has no UniqueJobs middleware" in line
    line = assert_error(
        cli("--url", redis_url, "explain", "tests.cli_app:event_of", env={"CLI_APP_URL": redis_url}), RET_IMPORT
    )
    assert "is not a Dramatiq actor" in line
    (tmp_path / "factory_app.py").write_text("def make_broker():\n    raise RuntimeError('no settings')\n")
    line = assert_error(cli("--path", str(tmp_path), "--app", "factory_app:make_broker", "list"), RET_IMPORT)
    assert line.endswith("'factory_app:make_broker' failed: RuntimeError: no settings")
    codes.add(RET_IMPORT)

    assert_error(
        cli("--url", redis_url, "explain", "tests.cli_app:settle_payment", "{}", env={"CLI_APP_URL": redis_url}),
        RET_USAGE,
    )
    codes.add(RET_USAGE)
    assert len(codes) == 5


@pytest.mark.parametrize(
    ("prefix", "problem"),
    [
        ("{billing}", "it must be a non-empty string without '{' or '}'"),
        ("", "it must be a non-empty string without '{' or '}'"),
        (
            "billing:\udcff",
            "it holds a lone surrogate, which UTF-8 cannot encode, and the lock store's keys are UTF-8 text",
        ),
    ],
)
def test_a_prefix_no_actor_may_declare_is_a_usage_error(redis_url, prefix, problem):
    # Issue 32: braces, which would make a Redis Cluster hash tag of the prefix and which the actor's lock_prefix
    # refuses, said "No locks are held under prefix '{billing}'."; a byte that is not UTF-8 ended in a traceback.
    for command in (["list"], ["show", "0" * 64], ["unlock", "0" * 64]):
        result = cli("--url", redis_url, "--prefix", "billing", "--prefix", prefix, *command)
        assert result.returncode == RET_USAGE
        assert result.stdout == ""
        assert result.stderr.splitlines()[-1] == (
            f"dramatiq-unique: error: argument --prefix: {prefix!r} is no lock prefix: {problem}"
        )


def test_a_digest_with_bytes_that_are_not_utf8_is_a_usage_error(redis_url):
    # Issue 32: the error was the codec's, "'utf-8' codec can't encode character '\\udcff' ...".
    line = assert_error(cli("--url", redis_url, "show", "report-\udcff"), RET_USAGE)
    assert line == (
        "dramatiq-unique: error: 'report-\\udcff' is not a digest: a digest is the 22 characters between the braces "
        "of a lock key."
    )


def test_the_cli_on_a_redis_cluster_sees_every_master(redis_cluster, cluster_client):
    broker = StubBroker()
    unique = UniqueJobs(backend=RedisBackend(client=cluster_client))
    broker.add_middleware(unique, before=TimeLimit)

    @dramatiq.actor(broker=broker, lock="until_executed", lock_limit=2)
    def settle(n):
        pass

    sent = [settle.send(n) for n in range(12)]
    sent.append(settle.send(0))  # a second holder of one digest
    assert all(redis_cluster.keys_per_master("dramatiq-unique:*"))  # the locks are spread over every master
    url = f"redis://127.0.0.1:{redis_cluster.ports[0]}/0"
    listed = json.loads(ok(cli("--url", url, "list", "--json")))
    assert sorted(h["message_id"] for lock in listed for h in lock["holders"]) == sorted(m.message_id for m in sent)
    assert len(listed) == 12

    # The first line says it reads a cluster, by its masters' addresses.
    first = ok(cli("--url", url, "list")).splitlines()[0]
    assert re.fullmatch(
        r"Locks on Redis Cluster of \d masters \(127\.0\.0\.1:\d+(, 127\.0\.0\.1:\d+)+\) under prefix "
        r"'dramatiq-unique':",
        first,
    ), first

    zero = digest(sent[0])
    assert len(json.loads(ok(cli("--url", url, "show", zero, "--json")))[0]["holders"]) == 2
    # A digest prefix is looked up on every master.
    assert len(json.loads(ok(cli("--url", url, "show", zero[:6], "--json")))[0]["holders"]) == 2
    ok(cli("--url", url, "unlock", zero, "--message-id", sent[0].message_id))
    assert enqueue_outcome(settle.send(0)).status == "enqueued"
    assert ok(cli("--url", url, "unlock", "--actor", "settle", "--all", "--yes")).startswith(
        "Unlocked 13 holders in 12 locks of actor 'settle':"
    )
    assert json.loads(ok(cli("--url", url, "list", "--json"))) == []


def test_stats_counts_the_lock_events_of_the_last_minutes(app, redis_url):
    module, sent = app
    module.build_report.send("2024-06-30")  # a third copy: lock_limit=2 holds two
    module.unique.activity.flush()  # a worker's heartbeat thread does this once per interval
    report = json.loads(ok(cli("--url", redis_url, "stats", "--minutes", "5", "--json")))
    assert report["minutes"] == 5 and set(report) == {"now", "minutes", "rows", "totals"}
    totals = report["totals"]
    assert totals["build_report"] == {"acquired": 2, "conflict": 1}
    assert totals["settle_payment"]["acquired"] == 1
    assert all(set(row) == {"minute", "actor_name", "counts"} for row in report["rows"])

    lines = ok(cli("--url", redis_url, "stats")).splitlines()
    assert lines[0] == "Lock events of the last 60 minutes under prefix 'dramatiq-unique':"
    header = lines[1].split()
    assert header[:3] == ["ACTOR", "ACQUIRED", "CONFLICT"]  # kinds with events only
    [build] = [line.split() for line in lines[2:] if line.startswith("build_report")]
    assert build[header.index("CONFLICT")] == "1"

    assert_error(cli("--url", redis_url, "stats", "--minutes", "999"), RET_USAGE)


def test_unlock_all_with_stdin_closed_is_not_confirmed(app, redis_url):
    # review3: with stdin closed (`<&-`, a cron job) Python's sys.stdin is None.
    result = subprocess.run(
        f"exec {sys.executable} -m dramatiq_unique --url {redis_url} unlock --actor build_report --all <&-",
        shell=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in URL_VARIABLES},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == RET_ABORTED, result.stderr
    assert result.stdout == "Nothing was unlocked.\n"
    assert "Traceback" not in result.stderr
    assert len(json.loads(ok(cli("--url", redis_url, "list", "--actor", "build_report", "--json")))[0]["holders"]) == 2


def test_explain_with_deeply_nested_json_arguments_is_a_usage_error(redis_url):
    # review3: json.loads raises RecursionError, not ValueError, past ~1000 levels.
    line = assert_error(
        cli(
            "--url", redis_url, "explain", "tests.cli_app:settle_payment", "[" * 100_000, env={"CLI_APP_URL": redis_url}
        ),
        RET_USAGE,
    )
    assert "ARGS_JSON must be a JSON array" in line


def test_path_before_the_subcommand_leaves_the_subcommand_alone(tmp_path, redis_url):
    # review3: --path took every word after it, the subcommand's name too.
    (tmp_path / "path_app.py").write_text("")
    assert ok(cli("-P", str(tmp_path), "--url", redis_url, "list")).startswith("No locks are held")
    assert ok(cli("--url", redis_url, "-P", str(tmp_path), "list")).startswith("No locks are held")
    assert ok(cli("--url", redis_url, "-P", str(tmp_path), "-P", ".", "list")).startswith("No locks are held")


def test_an_app_whose_unique_jobs_has_no_lock_store_is_told_what_to_set(tmp_path):
    # Issue 19, point 2: UniqueJobs() chooses its backend for the imported broker, or says why it cannot.
    (tmp_path / "stub_app.py").write_text(
        "from dramatiq.brokers.stub import StubBroker\n"
        "from dramatiq_unique import UniqueJobs\n"
        "broker = StubBroker(middleware=[UniqueJobs()])\n"
    )
    line = assert_error(cli("--path", str(tmp_path), "--app", "stub_app:broker", "list"), RET_URL)
    assert line == (
        "dramatiq-unique: error: UniqueJobs was given no lock backend, and its broker, a StubBroker, is no "
        "RedisBroker whose Redis could hold the locks. To name the Redis of the locks, set the DRAMATIQ_UNIQUE_URL "
        'environment variable to a Redis URL; or, in a Django project, set DRAMATIQ_UNIQUE = {"BACKEND_OPTIONS": '
        '{"url": "redis://..."}} in its settings; or pass UniqueJobs(backend=RedisBackend(url=...)).'
    )


#: A holder whose every field is long: the table must still fit.
LONG_ACTOR = "reindex_every_search_document_of_one_tenant"
LONG_WORKER = "worker-host-with-a-long-name.internal.example.com:123456:abcdef12"


def hold_long_locks(redis_client) -> dict[str, str]:
    """A run lock of a running holder and an enqueue lock with a lifetime, of long names and ids."""
    backend = RedisBackend(client=redis_client)
    run_digest, enqueue_digest = "Lng0" + "r" * 18, "Lng1" + "e" * 18
    run_id, enqueue_id = str(uuid.uuid4()), str(uuid.uuid4())
    queue, lock = "search_indexing_of_every_tenant", "until_and_while_executing"
    running = Holder(run_id, LONG_ACTOR, queue, lock, "running", worker_id=LONG_WORKER)
    queued = Holder(enqueue_id, LONG_ACTOR, queue, lock, "queued")
    assert backend.acquire(f"dramatiq-unique:{{{run_digest}}}:run", "t1", limit=1, ttl=600_000, holder=running).acquired
    assert backend.acquire(f"dramatiq-unique:{{{enqueue_digest}}}", "t2", limit=1, ttl=900_000, holder=queued).acquired
    return {"run": run_digest, "enqueue": enqueue_digest, "run_id": run_id, "enqueue_id": enqueue_id}


def test_list_fits_100_columns_unless_columns_says_otherwise_and_wide_prints_everything(redis_client, redis_url):
    # Issue 34, point 1: rows were 193 columns wide, whatever the terminal.
    held = hold_long_locks(redis_client)
    out = ok(cli("--url", redis_url, "list"))
    assert max(map(len, out.splitlines())) <= 100, out
    assert held["run"][:12] in out and held["run"] not in out  # a digest's first 12 characters
    assert held["run_id"][:8] in out and held["run_id"] not in out
    assert LONG_ACTOR not in out and LONG_ACTOR[:10] in out  # cut to fit, with an ellipsis
    rows = {line.split()[0]: line for line in out.splitlines()[2:-2]}
    # The run lock shows its lease and no lifetime; the enqueue lock its lifetime and no lease.
    assert re.search(r"running\s+\d+(ms|s)\s+(9|10)m \d\ds\s+-", rows[held["run"][:12]])
    assert re.search(r"queued\s+\d+(ms|s)\s+-\s+1[45]m \d\ds", rows[held["enqueue"][:12]])

    wide = ok(cli("--url", redis_url, "list", "--wide"))
    for whole in (
        held["run"],
        held["run_id"],
        held["enqueue_id"],
        LONG_ACTOR,
        LONG_WORKER,
        "until_and_while_executing",
    ):
        assert whole in wide
    assert max(map(len, wide.splitlines())) > 140

    for columns in (80, 140):
        fitted = ok(cli("--url", redis_url, "list", env={"COLUMNS": str(columns)}))
        assert max(map(len, fitted.splitlines())) <= columns, fitted
    # A wider terminal shows more: here the worker's host and pid.
    assert "WORKER" in ok(cli("--url", redis_url, "list", env={"COLUMNS": "140"})).splitlines()[1]
    assert "WORKER" not in out.splitlines()[1]
    # show and unlock --dry-run fit too.
    for command in (["show", held["run"]], ["unlock", "--dry-run", held["run"]]):
        shown = ok(cli("--url", redis_url, *command))
        assert max(map(len, shown.splitlines())) <= 100, shown
        assert held["run_id"][:8] in shown and LONG_WORKER not in shown


def test_list_fits_the_width_of_the_terminal_it_prints_on(redis_client, redis_url):
    # As ls and git do: on a terminal, its width; COLUMNS is left out here.
    hold_long_locks(redis_client)
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 132, 0, 0))
    environment = {k: v for k, v in os.environ.items() if k not in (*URL_VARIABLES, "COLUMNS", "LINES")}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "dramatiq_unique", "--url", redis_url, "list"],
            cwd=ROOT,
            env=environment,
            stdout=secondary,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(secondary)
    printed = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the terminal's other side is closed and everything was read
            break
        if not chunk:
            break
        printed += chunk
    os.close(primary)
    assert result.returncode == RET_OK, result.stderr
    lines = printed.decode().replace("\r\n", "\n").splitlines()
    assert 100 < max(map(len, lines)) <= 132, lines


def test_call_column_takes_the_width_left_and_is_cut_to_it():
    # The holder's call, when a lock or the broker tells it, fills what the other columns leave.
    record = LockRecord("dramatiq-unique:{" + "C" * 22 + "}", "o", "", None, 1, 0, {})
    call = "reindex('acme', " + ", ".join(str(n) for n in range(60)) + ")"
    holder = HolderInfo(
        message_id=str(uuid.uuid4()),
        state="queued",
        worker_id=None,
        acquired_at=0,
        expires_at=None,
        token=1,
        actor="reindex",
        queue="default",
        lock="until_executed",
        place=record,
        call=call,
    )
    lock = LockInfo(
        digest="C" * 22, kind="enqueue", prefix="dramatiq-unique", key=record.key, holders=(holder,), read_at=5000
    )
    header, row = lock_table([lock], width=100)
    assert header.endswith("CALL") and len(row) == 100 and row.endswith("…")
    assert row[header.index("CALL") :].startswith("reindex('acme', 0, 1, 2, 3")
    assert lock_table([lock], width=None)[1].endswith(call)  # --wide
    short = replace(holder, call="reindex('acme', 200)")
    header, row = lock_table([replace(lock, holders=(short,))], width=100)
    assert row.endswith("reindex('acme', 200)") and len(row) <= 100
    # A short call leaves the other columns more room than a long one does.
    assert "WORKER" in header and "WORKER" not in lock_table([lock], width=100)[0]
    # No room for a call worth reading: the other columns keep theirs.
    assert "CALL" not in lock_table([lock], width=70)[0]


def test_show_and_unlock_take_a_unique_digest_prefix(app, redis_client, redis_url):
    # Issue 34, point 2: as git takes a unique prefix of a commit id.
    module, sent = app
    report = digest(sent["report_a"])
    (shown,) = json.loads(ok(cli("--url", redis_url, "show", report[:6], "--json")))
    assert shown["digest"] == report and len(shown["holders"]) == 2
    # Under an actor's own prefix too.
    invoice = digest(sent["invoice"])
    assert json.loads(ok(cli("--app", "tests.cli_app", "show", invoice[:5], "--json")))[0]["digest"] == invoice

    # Ambiguous: the error names each candidate, its actor, and what to do.
    backend = RedisBackend(client=redis_client)
    twins = ["Ab-_" + "x" * 18, "Ab-_" + "y" * 18]
    for n, twin in enumerate(twins):
        holder = Holder(f"m{n}", "build_report", "reports", "until_executed", "queued")
        assert backend.acquire(f"dramatiq-unique:{{{twin}}}", f"o{n}", limit=2, ttl=None, holder=holder).acquired
    server = f"Redis {redis_url.removeprefix('redis://')}"
    for command in (["show"], ["unlock"], ["unlock", "--dry-run"]):
        line = assert_error(cli("--url", redis_url, *command, "Ab-_"), RET_USAGE)
        assert line == (
            f"dramatiq-unique: error: The digest prefix 'Ab-_' is ambiguous: 2 held locks on {server} under prefix "
            f"'dramatiq-unique' start with it: {twins[0]} (actor build_report); {twins[1]} (actor build_report). "
            "Give more characters."
        )
    assert len(json.loads(ok(cli("--url", redis_url, "list", "--json")))) == 5  # nothing was unlocked

    line = assert_error(cli("--url", redis_url, "show", "Zz9-q"), RET_NOT_FOUND)
    assert line == (
        f"dramatiq-unique: error: No lock whose digest starts with 'Zz9-q' is held on {server} under prefix "
        "'dramatiq-unique' (a digest has 22 characters)."
    )
    line = assert_error(cli("--url", redis_url, "show", "Ab-"), RET_USAGE)
    assert "'Ab-' is too short a digest prefix: give at least 4 characters" in line

    # unlock by a prefix, and --message-id by the first characters a table shows.
    out = ok(cli("--url", redis_url, "unlock", report[:6], "--message-id", sent["report_a"].message_id[:8]))
    assert out.splitlines()[0] == f"Unlocked 1 holder in 1 lock of digest {report!r}:"
    (left,) = json.loads(ok(cli("--url", redis_url, "show", report, "--json")))
    assert [h["message_id"] for h in left["holders"]] == [sent["report_b"].message_id]
    assert ok(cli("--url", redis_url, "unlock", "Ab-_x")).startswith(
        f"Unlocked 1 holder in 1 lock of digest '{twins[0]}'"
    )


def test_unlock_of_a_running_holder_asks_first(app, redis_url):
    # Issue 34, point 6: it freed a running holder without a question, and another copy could run.
    module, sent = app
    (sync,) = json.loads(ok(cli("--url", redis_url, "list", "--state", "running", "--json")))
    (holder,) = sync["holders"]
    asked = cli("--url", redis_url, "unlock", sync["digest"], stdin="n\n")
    assert asked.returncode == RET_ABORTED and asked.stdout == "Nothing was unlocked.\n"
    assert asked.stderr == (
        f"Unlock 1 holder in 1 lock of digest {sync['digest']!r}? Message {holder['message_id']!r} on worker "
        f"{holder['worker_id']!r} is running: it is not stopped, and a duplicate of it can be sent and start "
        "beside it. [y/N] \n"
    )
    assert cli("--url", redis_url, "unlock", sync["digest"]).returncode == RET_ABORTED  # no answer
    closed = subprocess.run(
        f"exec {sys.executable} -m dramatiq_unique --url {redis_url} unlock {sync['digest']} <&-",
        shell=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in URL_VARIABLES},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert closed.returncode == RET_ABORTED and closed.stdout == "Nothing was unlocked.\n"
    assert json.loads(ok(cli("--url", redis_url, "show", sync["digest"], "--json")))[0]["holders"] == [holder]
    # A queued holder is unlocked without a question, as before.
    ok(cli("--url", redis_url, "unlock", digest(sent["settle"]), stdin=""))
    # --force (or --yes) skips the question.
    forced = cli("--url", redis_url, "unlock", sync["digest"], "--force")
    assert forced.returncode == RET_OK and forced.stderr == ""
    assert forced.stdout.startswith(f"Unlocked 1 holder in 1 lock of digest {sync['digest']!r}:")
    help_text = " ".join(ok(cli("unlock", "--help")).split())
    assert (
        "--yes, --force do not ask before unlocking every holder of an actor (--all) or a running holder, whose "
        "message goes on running while a duplicate can start" in help_text
    )


def test_list_and_explain_name_the_server_and_prefixes_they_read_first(app, redis_client, redis_url):
    # Issue 34, point 10: pointed at the wrong Redis, they answered "free" with confidence.
    module, sent = app
    password = "s3cr3t-pw-of-ops"
    redis_client.execute_command("ACL", "SETUSER", "ops", "on", f">{password}", "~*", "&*", "+@all")
    try:
        host = redis_url.removeprefix("redis://").removesuffix("/0")
        url = f"redis://ops:{password}@{host}/0"
        listed = cli("--url", url, "list")
        assert listed.stdout.splitlines()[0] == (f"Locks on Redis {host}/0 under prefix 'dramatiq-unique':")
        explained = cli("--url", url, "explain", "tests.cli_app:settle_payment", '["evt_9"]', env={"CLI_APP_URL": url})
        assert explained.stdout.splitlines()[0] == f"locks on   Redis {host}/0 under prefix 'dramatiq-unique'"
        for result in (listed, explained):
            assert result.returncode == RET_OK, result.stderr
            assert password not in result.stdout + result.stderr and "ops" not in result.stdout
        # Another database of the same server: the first line tells it apart.
        empty = ok(cli("--url", f"redis://{host}/5", "list"))
        assert empty == f"No locks are held on Redis {host}/5 under prefix 'dramatiq-unique'.\n"
    finally:
        redis_client.execute_command("ACL", "DELUSER", "ops")
