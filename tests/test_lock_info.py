"""A lock shows what job it is (issue 34, point 3): an actor with ``lock_info`` keeps each
holder's call in its lock, through the steps that write the holder again (a lease's renewal, the
start's swap, a line's handoff), against a real redis-server with real Workers; an actor without
it writes its records as before."""

from __future__ import annotations

import importlib
import json
import sys
import threading

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from dramatiq_unique import InvalidLockOptions, Locks, RedisBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.keys import enqueue_key, run_key
from dramatiq_unique.web import from_middleware, make_wsgi_app

from .support import Env, wait_for
from .test_browser import browser, serve_page  # noqa: F401  (browser: a real headless chromium)
from .test_cli import cli, ok
from .web_client import Client

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def leased_env(redis_client):
    """RedisBroker and RedisBackend, with leases short enough to be renewed within a test."""
    broker = RedisBroker(client=redis_client)
    broker.emit_after("process_boot")
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lease_period=1500, heartbeat_interval=300))
    with env.running():
        yield env


def holders(env: Env, message) -> list[tuple[str, str, str | None]]:
    """The places of the message's digest: (kind, state, call) of each, enqueue lock first."""
    locks = Locks.from_middleware(env.middleware).get(enqueue_outcome(message).digest)
    return [(lock.kind, h.state, h.call) for lock in locks for h in lock.holders]


@pytest.mark.parametrize("value", ["yes", 0, 19, 1001, 1.5, None, [120]])
def test_an_invalid_lock_info_is_refused_when_the_actor_is_declared(stub_env, value):
    with pytest.raises(InvalidLockOptions) as raised:

        @dramatiq.actor(lock="until_executed", lock_info=value)
        def reindex(tenant, batch):
            pass

    assert str(raised.value) == (
        f"Actor 'reindex' has an invalid lock_info={value!r}: it must be True (the holder's call, up to 120 "
        "characters), False (none), or an integer from 20 to 1000 (characters)."
    )
    assert "reindex" not in stub_env.broker.actors


def test_lock_info_is_a_default_of_the_middleware_and_an_option_of_one_message(redis_client):
    with pytest.raises(InvalidLockOptions, match=r"^UniqueJobs has an invalid lock_info='long': it must be True"):
        UniqueJobs(backend=RedisBackend(client=redis_client), lock_info="long")
    broker = RedisBroker(client=redis_client)
    backend = RedisBackend(client=redis_client)
    env = Env("redis", broker, backend, UniqueJobs(backend=backend, lock_info=24))
    with env.running():

        @env.actor(lock="until_executed")
        def reindex(tenant, batch):
            pass

        @env.actor(lock="until_executed", lock_info=False)
        def quiet(tenant, batch):
            pass

        assert holders(env, reindex.send("acme", 200)) == [("enqueue", "queued", "reindex('acme', 200)")]
        assert holders(env, reindex.send("a" * 30, 1)) == [("enqueue", "queued", "reindex('aaaaaaaaaaaaaa…")]
        assert holders(env, quiet.send("acme", 200)) == [("enqueue", "queued", None)]
        one = quiet.send_with_options(args=("acme", 201), lock_info=True)
        assert holders(env, one) == [("enqueue", "queued", "quiet('acme', 201)")]


def test_the_call_is_kept_through_the_renewals_of_a_running_holder_and_its_start(leased_env, redis_client):
    env, started, done = leased_env, threading.Event(), threading.Event()

    @env.actor(lock="until_and_while_executing", lock_info=True)
    def reindex(tenant, batch):
        started.set()
        done.wait(20)

    message = reindex.send("acme", 200)
    digest = enqueue_outcome(message).digest
    assert holders(env, message) == [("enqueue", "queued", "reindex('acme', 200)")]
    env.worker(threads=1)
    try:
        assert started.wait(10)
        # The swap took the run lock with the call and gave the enqueue place up.
        assert holders(env, message) == [("run", "running", "reindex('acme', 200)")]
        (lock,) = Locks.from_middleware(env.middleware).get(digest)
        first_expiry = lock.holders[0].expires_at
        assert first_expiry is not None

        def renewed() -> bool:
            (lock,) = Locks.from_middleware(env.middleware).get(digest)
            return (lock.holders[0].expires_at or 0) > first_expiry

        wait_for(renewed, timeout=10)
        assert holders(env, message) == [("run", "running", "reindex('acme', 200)")]
        # As stored: the seventh field of the holder.
        assert redis_client.get(run_key("dramatiq-unique", digest)).decode().endswith("|reindex('acme', 200)")
    finally:
        done.set()
    env.join(reindex)
    assert holders(env, message) == []


def test_a_long_call_is_cut_at_the_bound_with_an_ellipsis(redis_env):
    @redis_env.actor(lock="until_executed", lock_info=40)
    def export(text, *, fmt="csv"):
        pass

    long = export.send("x" * 300, fmt="csv")
    ((_, _, call),) = holders(redis_env, long)
    assert call == "export('" + "x" * 31 + "…"
    assert len(call) == 40
    short = export.send("y", fmt="csv|%*")
    assert holders(redis_env, short) == [("enqueue", "queued", "export('y', fmt='csv|%*')")]


def test_a_place_a_line_hands_on_keeps_the_call_of_its_message(redis_env):
    runs, first_started, release = [], threading.Event(), {"a": threading.Event(), "b": threading.Event()}

    @redis_env.actor(
        lock="until_executed", on_conflict="wait", lock_info=True, lock_args_method=lambda name, part: [name]
    )
    def publish(name, part):
        runs.append(part)
        first_started.set()
        release[part].wait(20)

    redis_env.worker(threads=1)
    try:
        first = publish.send("report", "a")
        assert first_started.wait(10)
        second = publish.send("report", "b")
        assert enqueue_outcome(second).status == "waiting"
        # An operator frees a's place while a runs: the line hands it to b, enqueued, and the
        # one worker thread is busy with a. b's place as the line and the broker recorded it:
        locks = Locks.from_middleware(redis_env.middleware)
        assert locks.unlock(enqueue_outcome(first).digest, first.message_id)
        assert holders(redis_env, second) == [("enqueue", "queued", "publish('report', 'b')")]
        release["a"].set()
        wait_for(lambda: runs == ["a", "b"])
        # b started: its claim recorded it running, with its call.
        assert holders(redis_env, second) == [("enqueue", "running", "publish('report', 'b')")]
    finally:
        release["a"].set()
        release["b"].set()
    redis_env.join(publish)
    assert first.message_id != second.message_id


def test_an_actor_without_lock_info_writes_the_record_it_wrote_before(redis_env, redis_client):
    @redis_env.actor(lock="until_executed")
    def plain(tenant, batch):
        pass

    message = plain.send("acme", 200)
    outcome = enqueue_outcome(message)
    value = redis_client.get(enqueue_key("dramatiq-unique", outcome.digest)).decode()
    owner, token, late, lifetime, flags, worker, broker_id, actor, queue, message_id = value.split("|")
    assert (owner, int(token), late, lifetime, flags, worker) == (message.message_id, outcome.token, "", "", "qe", "")
    assert (len(broker_id), actor, queue, message_id) == (22, "plain", "default", "")
    assert holders(redis_env, message) == [("enqueue", "queued", None)]


@pytest.fixture
def app(redis_url, monkeypatch):
    """tests/lock_info_app.py on the test server."""
    monkeypatch.setenv("LOCK_INFO_APP_URL", redis_url)
    module = importlib.reload(sys.modules["tests.lock_info_app"]) if "tests.lock_info_app" in sys.modules else None
    if module is None:
        import tests.lock_info_app as module
    try:
        yield module
    finally:
        # Its sends' activity counts are written now, not into a later test's Redis.
        if module.unique.activity is not None:
            module.unique.activity.close()
        module.broker.flush_all()


def calls_listed(*args: str) -> dict[str, list[str | None]]:
    """``list --json`` run as the command: each lock's calls, by its actor."""
    listed = json.loads(ok(cli(*args, "list", "--json")))
    return {lock["actor"]: [holder["call"] for holder in lock["holders"]] for lock in listed}


def test_list_and_show_print_the_call_that_a_lock_keeps(app, redis_url):
    message = app.reindex.send("acme", 200)
    app.export.send("x" * 300)
    cut = "export('" + "x" * 31 + "…"
    assert calls_listed("--url", redis_url) == {"reindex": ["reindex('acme', 200)"], "export": [cut]}
    digest = enqueue_outcome(message).digest
    shown = ok(cli("--url", redis_url, "show", digest))
    assert f"  call of message {message.message_id!r}: reindex('acme', 200)\n" in shown
    (lock,) = json.loads(ok(cli("--url", redis_url, "show", digest, "--json")))
    assert lock["holders"][0]["call"] == "reindex('acme', 200)"


def test_without_lock_info_the_call_is_read_from_the_broker_with_the_app(app, redis_url):
    message = app.plain.send("acme", 200)
    digest = enqueue_outcome(message).digest
    # Without the application, no broker tells it.
    assert calls_listed("--url", redis_url) == {"plain": [None]}
    assert "call of message" not in ok(cli("--url", redis_url, "show", digest))
    assert calls_listed("--app", "tests.lock_info_app") == {"plain": ["plain('acme', 200)"]}
    shown = ok(cli("--app", "tests.lock_info_app", "show", digest))
    assert f"  call of message {message.message_id!r}: plain('acme', 200)\n" in shown
    # A message that left the broker (here: deleted from its queue's hash) tells none.
    app.broker.client.delete(f"{app.broker.namespace}:search.msgs")
    assert calls_listed("--app", "tests.lock_info_app") == {"plain": [None]}


def test_a_stub_broker_gives_the_call_of_a_message_not_yet_fetched(stub_env):
    @stub_env.actor(lock="until_executed")
    def plain(tenant, batch):
        pass

    @stub_env.actor(lock="while_executing")
    def runs(tenant):
        pass

    message = plain.send("acme", 200)
    locks = Locks.from_middleware(stub_env.middleware)
    found = locks.get(enqueue_outcome(message).digest)
    assert [h.call for lock in found for h in lock.holders] == [None]
    assert [h.call for lock in locks.with_calls(found, stub_env.broker) for h in lock.holders] == ["plain('acme', 200)"]
    assert [h.call for lock in locks.with_calls(found, None) for h in lock.holders] == [None]


def test_the_lock_page_shows_the_call_the_arguments_and_the_record_field_by_field(redis_env):
    @redis_env.actor(lock="until_executed", lock_info=True)
    def reindex(tenant, batch):
        pass

    @redis_env.actor(lock="until_executed")
    def plain(tenant, batch):
        pass

    kept, read, hostile = reindex.send("acme", 200), plain.send("acme", 200), reindex.send(SCRIPT, 1)
    page = Client(from_middleware(redis_env.middleware, broker=redis_env.broker))
    for message, call in ((kept, "reindex('acme', 200)"), (read, "plain('acme', 200)")):
        shown = page.get(f"/locks/{enqueue_outcome(message).digest}")
        # Message, actor, queue, lock type, state, taken, age, lapses, TTL left, worker, token, in the broker, call.
        ((*_, in_broker, cell),) = shown.rows
        assert (in_broker, cell) == ("yes", call)
        assert f"Arguments: those of {call}, the holder's call." in shown.text
        assert f"message{message.message_id}" in shown.text and "flagsqueued, until_executed" in shown.text
    # The record keeps the call of a lock_info actor only; the other's came from the broker.
    assert "callreindex('acme', 200)" in page.get(f"/locks/{enqueue_outcome(kept).digest}").text
    assert "call– (not kept: its actor has no lock_info)" in page.get(f"/locks/{enqueue_outcome(read).digest}").text
    # The list: digest, kind, actor, queue, lock type, message, state, age, TTL left, worker, token, call.
    # (The rows of 12 cells: the activity table below may have counted these sends by now.)
    assert {(row[2], row[11]) for row in page.get("/").rows if len(row) == 12} == {
        ("reindex", "reindex('acme', 200)"),
        ("plain", "plain('acme', 200)"),
        ("reindex", f"reindex({SCRIPT!r}, 1)"),
    }
    # A call is text: escaped as every other value.
    body = page.get(f"/locks/{enqueue_outcome(hostile).digest}").body
    assert SCRIPT not in body and "reindex(&#39;&lt;script&gt;alert(1)&lt;/script&gt;&#39;, 1)" in body

    # Without a broker, only the lock tells a call.
    for bare in (Client(make_wsgi_app(redis_env.backend)), Client(from_middleware(redis_env.middleware))):
        ((*_, cell),) = bare.get(f"/locks/{enqueue_outcome(read).digest}").rows
        assert cell == "–"
        ((*_, cell),) = bare.get(f"/locks/{enqueue_outcome(kept).digest}").rows
        assert cell == "reindex('acme', 200)"
    assert "The arguments are not known here" in bare.get(f"/locks/{enqueue_outcome(read).digest}").text


@pytest.fixture
def web_server(app, redis_url):
    """``dramatiq-unique --app tests.lock_info_app web`` serving the locks of tests/lock_info_app.py."""
    yield from serve_page(["--app", "tests.lock_info_app", "web"], LOCK_INFO_APP_URL=redis_url)


@pytest.mark.version_independent
def test_in_a_browser_the_pages_show_each_holders_call_and_its_record_field_by_field(app, web_server, browser):  # noqa: F811
    from selenium.webdriver.common.by import By

    kept, read = app.reindex.send("acme", 200), app.plain.send("acme", 200)
    browser.get(web_server + "/")
    rows = [
        [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "table.locks tbody tr")
    ]
    assert {(row[2], row[11]) for row in rows} == {("reindex", "reindex('acme', 200)"), ("plain", "plain('acme', 200)")}

    browser.find_element(By.CSS_SELECTOR, f"td.digest a[title='{enqueue_outcome(kept).digest}']").click()
    wait_for(lambda: "/locks/" in browser.current_url)
    (holder,) = browser.find_elements(By.CSS_SELECTOR, "table.holders tbody tr")
    assert holder.find_elements(By.TAG_NAME, "td")[-1].text == "reindex('acme', 200)"
    assert browser.find_element(By.CSS_SELECTOR, ".explain .args").text == (
        "Arguments: those of reindex('acme', 200), the holder's call."
    )
    # The record is folded away until the reader opens it.
    record = browser.find_element(By.CSS_SELECTOR, "dl.record")
    assert not record.is_displayed()
    browser.find_element(By.CSS_SELECTOR, "details summary").click()
    wait_for(record.is_displayed)
    fields = dict(zip(
        [dt.text for dt in record.find_elements(By.TAG_NAME, "dt")],
        [dd.text for dd in record.find_elements(By.TAG_NAME, "dd")],
        strict=True,
    ))  # fmt: skip
    assert fields["call"] == "reindex('acme', 200)" and fields["flags"] == "queued, until_executed"
    assert fields["message"] == kept.message_id and fields["token"] == str(enqueue_outcome(kept).token)
    assert fields["expires"] == "never" and fields["worker"] == "–"
    assert fields["redis message id"] == kept.options["redis_message_id"]

    browser.get(f"{web_server}/locks/{enqueue_outcome(read).digest}")
    (holder,) = browser.find_elements(By.CSS_SELECTOR, "table.holders tbody tr")
    assert holder.find_elements(By.TAG_NAME, "td")[-1].text == "plain('acme', 200)"
