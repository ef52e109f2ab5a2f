"""Readers meet what no script of this version wrote: a lock place of another version, a hand
edit, a junk reaper cursor (issue 32, points 1 and 3). Each reader skips it, says which key and
why, and goes on with the rest; nothing stops at it."""

from __future__ import annotations

import json
import logging

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import LockBackendError, Locks, RedisBackend, UniqueJobs
from dramatiq_unique.backends import Holder
from dramatiq_unique.cli import RET_NOT_FOUND
from dramatiq_unique.keys import enqueue_key, line_key, reaper_cursor_key
from dramatiq_unique.reaper import Reaper
from dramatiq_unique.web import make_wsgi_app

from .test_cli import cli
from .test_reaper import PREFIX, plant_orphans, scan_all
from .web_client import Client

LOGGER = logging.getLogger("test.foreign")

#: Places no script of this version writes: junk, a record of too few parts, a JSON holder of
#: nothing, a JSON holder whose message id is a list, a holder with a flag this version lacks.
FOREIGN_PLACES = [
    "junk",
    "1|2|3",
    "1|2|3|{}",
    '1|2|3|{"message_id": [1], "state": "queued"}',
    "1|2||zz||||m",
    b"\xff\xfe",
]

HELD, FOREIGN = "a" * 64, "b" * 64


def plant_foreign(client, digest: str, place: str, *, with_holder: bool = True) -> str:
    """A lock of ``digest`` with a place no script of this version wrote (and a readable holder)."""
    backend, key = RedisBackend(client=client), enqueue_key(PREFIX, digest)
    if with_holder:
        holder = Holder("readable", "report", "default", "until_executed", "queued")
        assert backend.acquire(key, "readable", limit=2, ttl=None, holder=holder).acquired
    client.hset(key, "foreign", place)
    return key


def shown(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def reaper_warnings(caplog) -> list[str]:
    """The reaper's WARNING lines but those of each lock it released."""
    return [
        r.getMessage() for r in caplog.records if r.name == "test.foreign" and "released lock" not in r.getMessage()
    ]


@pytest.mark.parametrize("place", FOREIGN_PLACES)
def test_one_reaper_run_frees_every_orphan_past_a_place_it_cannot_read(redis_client, caplog, place):
    # Issue 32 (1): every run raised "not enough values to unpack" at the same key and resumed at
    # its saved cursor: with 300 orphans, three runs freed 103.
    backend = RedisBackend(client=redis_client)
    orphans = plant_orphans(backend, redis_client, 60)
    key = plant_foreign(redis_client, FOREIGN, place, with_holder=False)
    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0)
    with caplog.at_level(logging.WARNING, logger="test.foreign"):
        report = reaper.run(broker=RedisBroker(client=redis_client))
    assert report.complete and report.released == 60 and report.unreadable == 1
    assert not orphans & scan_all(backend)
    assert redis_client.hget(key, "foreign") == (place if isinstance(place, bytes) else place.encode())  # as it was
    (warning,) = reaper_warnings(caplog)
    assert warning.startswith(f"The orphan reaper left 1 lock places it cannot read as they are: in {key!r}, ")
    assert "not a record of this version" in warning


@pytest.mark.parametrize("cursor", ["junk", "[1]", '{"a": 1}', '["dramatiq-unique", "junk"]', b"\xff"])
def test_a_reaper_cursor_it_cannot_read_makes_the_run_start_over(redis_client, caplog, cursor):
    # Issue 32 (3): every run raised at the junk cursor, and the reaper never wrote over it.
    backend = RedisBackend(client=redis_client)
    orphans = plant_orphans(backend, redis_client, 20)
    redis_client.set(reaper_cursor_key(PREFIX), cursor)
    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0)
    with caplog.at_level(logging.WARNING, logger="test.foreign"):
        report = reaper.run(broker=RedisBroker(client=redis_client))
    assert report.complete and report.released == 20 and not orphans & scan_all(backend)
    (warning,) = reaper_warnings(caplog)
    assert warning == (
        f"The orphan reaper starts over from the first lock: where the last run stopped, "
        f"{reaper_cursor_key(PREFIX)!r} holds {shown(cursor)!r}, which is not a position this version writes."
    )
    prefix, saved = json.loads(redis_client.get(reaper_cursor_key(PREFIX)))
    assert prefix == PREFIX and saved == "0"  # its own position, written over the junk


@pytest.mark.parametrize("place", FOREIGN_PLACES)
def test_locks_list_and_get_leave_out_a_place_they_cannot_read(redis_client, caplog, place):
    key = plant_foreign(redis_client, FOREIGN, place)
    backend = RedisBackend(client=redis_client)
    holder = Holder("other", "report", "default", "until_executed", "queued")
    assert backend.acquire(enqueue_key(PREFIX, HELD), "other", limit=1, ttl=None, holder=holder).acquired
    locks = Locks(backend)
    listed = {lock.digest: [h.message_id for h in lock.holders] for lock in locks.list()}
    assert listed == {HELD: ["other"], FOREIGN: ["readable"]}
    assert list(locks.unreadable) == [key] and "not a record of this version" in locks.unreadable[key]["foreign"]
    reason = locks.unreadable[key]["foreign"]
    assert [h.message_id for lock in locks.get(FOREIGN) for h in lock.holders] == ["readable"]
    assert locks.unreadable == {key: {"foreign": reason}}
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("dramatiq_unique")]
    assert warnings == [f"A place in lock {key!r} is left out: {reason}."]  # once


def test_the_command_lists_and_shows_past_a_place_it_cannot_read(redis_client, redis_url):
    # Issue 32 (1): list died with a traceback; show exited 2 (a usage error) with the raw message.
    key = plant_foreign(redis_client, FOREIGN, "junk")
    listed = cli("--url", redis_url, "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert "readable" in listed.stdout
    assert f"A place in lock {key!r} is left out: the place of 'foreign' holds 'junk'" in listed.stderr
    shown = cli("--url", redis_url, "show", FOREIGN)
    assert shown.returncode == 0, shown.stderr
    assert "readable" in shown.stdout
    assert f"Lock {key!r} holds 1 place this version cannot read:" in shown.stdout
    redis_client.hdel(key, "readable")  # only the foreign place is left
    alone = cli("--url", redis_url, "show", FOREIGN)
    assert alone.returncode == 0, alone.stderr
    assert f"Lock {key!r} holds 1 place this version cannot read:" in alone.stdout


@pytest.mark.parametrize("place", FOREIGN_PLACES)
def test_the_web_page_shows_the_locks_and_says_what_it_cannot_read(redis_client, place):
    # Issue 32 (1): the page answered 400 with the raw message, or 500 for an unknown flag.
    key = plant_foreign(redis_client, FOREIGN, place)
    page = Client(make_wsgi_app(RedisBackend(client=redis_client)), script_name="/ops/locks")
    for path in ("/", "/locks/" + FOREIGN):
        answer = page.get(path)
        assert answer.status == 200
        assert "readable" in answer.text
        assert "Places this version cannot read are left out" in answer.text and key in answer.text


@pytest.mark.parametrize("line", ["bytes", "another type"])
def test_locks_are_listed_past_a_line_this_version_did_not_write(redis_client, line):
    # Issue 32 (1): a waiter id of bytes that are no UTF-8 in one lock's line, or a line key of
    # another type, made every listing, explain and unlock raise.
    key = plant_foreign(redis_client, FOREIGN, "junk")
    if line == "bytes":
        redis_client.rpush(line_key(key), b"\xff\xfe")
    else:
        redis_client.set(line_key(key), "not a line")
    locks = Locks(RedisBackend(client=redis_client))
    (listed,) = locks.list()
    assert [h.message_id for h in listed.holders] == ["readable"]
    assert listed.waiting == (("\ufffd\ufffd",) if line == "bytes" else ())
    assert len(locks.get(FOREIGN)) == 1


def test_explain_and_unlock_say_a_lock_holds_only_a_place_they_cannot_read(redis_client, redis_url):
    # Issue 32 (1): explain called such a lock free, while every send of its job failed.
    broker = RedisBroker(client=redis_client)
    unique = UniqueJobs(backend=RedisBackend(client=redis_client))
    broker.add_middleware(unique, before=TimeLimit)
    report = dramatiq.actor(lambda day: None, actor_name="report", broker=broker, lock="until_executed")
    locks = Locks.from_middleware(unique)
    digest = locks.explain(report, "2026-12-04").digest
    key = plant_foreign(redis_client, digest, "junk", with_holder=False)
    explained = locks.explain(report, "2026-12-04")
    assert explained.on_send.startswith(f"A new send would fail with LockBackendError: in lock {key!r}, the place of")
    with pytest.raises(LockBackendError):
        report.send("2026-12-04")
    unlocked = cli("--url", redis_url, "unlock", digest, "--yes")
    assert unlocked.returncode == RET_NOT_FOUND
    assert f"The locks of digest {digest!r} hold only places this version cannot read: in {key!r}" in unlocked.stderr
