"""`dramatiq-unique cancel` as a subprocess of the real command, against a real `dramatiq` worker
process and a real redis-server (issue 35)."""

from __future__ import annotations

import getpass
import json
import socket
import time

import dramatiq
import pytest

from dramatiq_unique import Locks, RedisBackend, enqueue_outcome
from dramatiq_unique.backends import Holder
from dramatiq_unique.cli import RET_NOT_FOUND
from dramatiq_unique.keys import run_key

from .support import wait_for
from .test_cancel_workers import cancelled_events, deploy, events, log_of, runs, trail, worker  # noqa: F401 (fixtures)
from .test_cli import cli, ok
from .test_concurrency import processes  # noqa: F401 (fixture)


@pytest.mark.slow
def test_cancel_from_the_command_line_stops_a_running_holder_which_keeps_its_place_until_it_stopped(
    worker,  # noqa: F811
    deploy,  # noqa: F811
    redis_client,
    redis_url,
):
    # An actor without cancel_in_progress: an operator cancels any run lock's holder; its lease is
    # renewed only when due, so the request reaches it within lease_period (3 s here).
    reindex = dramatiq.actor(
        lambda app, seq: None,
        actor_name="reindex",
        broker=deploy.broker,
        queue_name="deploys",
        lock="while_executing",
        lock_args_method=lambda app, seq: [app],
    )
    process = worker()
    message = reindex.send("shop", 0)
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    digest = enqueue_outcome(message).digest
    refused = cli("--url", redis_url, "cancel", digest, stdin="n\n")
    assert "Nothing was cancelled." in refused.stdout
    time.sleep(0.5)
    assert events(redis_client) == ["start 0"]
    asked_at = time.time()
    out = ok(cli("--url", redis_url, "cancel", digest, "--yes"))
    assert f"Asked 1 running message of digest {digest!r} to stop" in out
    # Until it stopped, its place is held: no second copy can start beside it.
    (held,) = RedisBackend(client=redis_client).read([run_key("dramatiq-unique", digest)])[1]
    operator = f"operator {getpass.getuser()}@{socket.gethostname()}"
    assert held.holder["stop_requested_by"] == operator
    wait_for(lambda: "end 0" in events(redis_client), timeout=10)
    ended_at = next(at for what, seq, at in runs(redis_client) if (what, seq) == ("end", 0))
    print(f"interrupted {ended_at - asked_at:.3f} s after the cancel")
    assert ended_at - asked_at < 3 + 1
    wait_for(lambda: RedisBackend(client=redis_client).read([run_key("dramatiq-unique", digest)])[1] == [])
    assert events(redis_client) == ["start 0", "end 0"]
    # The worker's log, its cancelled event and the conflict trail name the operator who asked.
    wait_for(lambda: "is neither retried nor dead-lettered" in log_of(process), timeout=10)
    log = log_of(process)
    assert f"Message {message.message_id!r} of actor 'reindex' was asked to stop by {operator} while it ran" in log
    assert f"was cancelled while it ran: it was asked to stop by {operator} while it held lock {digest!r}" in log
    assert cancelled_events(redis_client) == [f"{message.message_id} {operator}"]
    (entry,) = trail(redis_client, "reindex")
    assert (entry.message_id, entry.cancelled_by) == (message.message_id, operator)
    assert f"{message.message_id[:8]} asked to stop by {operator}" in ok(cli("--url", redis_url, "history", "reindex"))
    # Nothing runs any more: nothing to cancel.
    assert cli("--url", redis_url, "cancel", digest, "--yes").returncode == RET_NOT_FOUND


def test_show_and_list_say_a_holder_was_asked_to_stop_and_by_whom(redis_client, redis_url):
    """Issue 35, point 3: a running holder asked to stop reads "stopping", and `show` names who asked."""
    backend = RedisBackend(client=redis_client)
    digest = "c" * 64
    holder = Holder("m-1", "reindex", "default", "while_executing", "running", worker_id="vm:1:ab", call="reindex(1)")
    assert backend.acquire(run_key("dramatiq-unique", digest), "owner-1", limit=1, ttl=60_000, holder=holder).acquired
    (asked,) = Locks(backend).cancel(digest, by="alice|ops%1")
    assert asked.holders[0].stop_requested_by == "operator alice|ops%1"
    shown = ok(cli("--url", redis_url, "show", digest))
    assert "stopping" in shown
    assert "message 'm-1' was asked to stop by operator alice|ops%1; it stops at its next renewal" in shown
    assert "call of message 'm-1': reindex(1)" in shown
    assert "stopping" in ok(cli("--url", redis_url, "list"))
    (lock,) = json.loads(ok(cli("--url", redis_url, "show", digest, "--json")))
    assert lock["holders"][0]["stop_requested_by"] == "operator alice|ops%1"
    # A second request keeps the first who asked.
    Locks(backend).cancel(digest, by="bob")
    (held,) = backend.read([run_key("dramatiq-unique", digest)])[1]
    assert held.holder["stop_requested_by"] == "operator alice|ops%1" and held.holder["call"] == "reindex(1)"


def test_a_name_with_a_line_break_asks_on_one_line(redis_client, redis_url):
    """Review of issue 35: who asked is written into the worker's log lines; a line break in an
    operator's name (a web server's REMOTE_USER) made a log line of its own."""
    backend = RedisBackend(client=redis_client)
    digest = "d" * 64
    holder = Holder("m-1", "reindex", "default", "while_executing", "running", worker_id="vm:1:ab")
    assert backend.acquire(run_key("dramatiq-unique", digest), "owner-1", limit=1, ttl=60_000, holder=holder).acquired
    (asked,) = Locks(backend).cancel(digest, by="mallory\nWARNING all locks freed")
    assert asked.holders[0].stop_requested_by == "operator mallory\ufffdWARNING all locks freed"
    shown = ok(cli("--url", redis_url, "show", digest))
    assert "asked to stop by operator mallory\ufffdWARNING all locks freed;" in shown
