"""`dramatiq-unique cancel` as a subprocess of the real command, against a real `dramatiq` worker
process and a real redis-server (issue 35)."""

from __future__ import annotations

import time

import dramatiq
import pytest

from dramatiq_unique import RedisBackend, enqueue_outcome
from dramatiq_unique.cli import RET_NOT_FOUND
from dramatiq_unique.keys import run_key

from .support import wait_for
from .test_cancel_workers import deploy, events, runs, worker  # noqa: F401 (fixtures)
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
    worker()
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
    assert held.holder["stop_requested"] is True
    wait_for(lambda: "end 0" in events(redis_client), timeout=10)
    ended_at = next(at for what, seq, at in runs(redis_client) if (what, seq) == ("end", 0))
    print(f"interrupted {ended_at - asked_at:.3f} s after the cancel")
    assert ended_at - asked_at < 3 + 1
    wait_for(lambda: RedisBackend(client=redis_client).read([run_key("dramatiq-unique", digest)])[1] == [])
    assert events(redis_client) == ["start 0", "end 0"]
    # Nothing runs any more: nothing to cancel.
    assert cli("--url", redis_url, "cancel", digest, "--yes").returncode == RET_NOT_FOUND
