"""Readers meet what no script of this version wrote: a line of a lock's value of another version
or a hand edit, a lock key of another type, a junk reaper cursor (issue 32, points 1 and 3; the
lock format of issue 33). Each reader skips it, says which key and why, and goes on with the rest;
nothing stops at it."""

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

#: Lines of a lock's value that no script of this version writes, each with the owner its reader
#: names (what comes before the line's first "|", or the whole line): a record of junk, a record
#: whose holder is no holder, a holder of too few parts, one of too many (a seventh part is its
#: call, an eighth nothing), a holder with a flag this version lacks, a holder in JSON as 0.1 wrote
#: it, a line without "|", bytes that are no UTF-8.
FOREIGN_LINES = [
    ("A|junk", "A"),
    ("x|1|2|3|not a holder", "x"),
    ("x|1|||qe|||settle|payments", "x"),
    ("x|1|||qe|||settle|payments||settle()|more", "x"),
    ("x|1|||qe-|||settle|payments|", "x"),
    ('x|1|2|3|{"message_id": "m", "state": "queued"}', "x"),
    ("junk", "junk"),
    (b"A|\xff\xfe", "A"),
]
FOREIGN_IDS = [
    "junk",
    "not-a-holder",
    "too-few-parts",
    "too-many-parts",
    "unknown-flag",
    "json-holder",
    "no-bar",
    "bytes",
]

HELD, FOREIGN = "a" * 22, "b" * 22


def plant_foreign(client, digest: str, line: str | bytes, *, with_holder: bool = True) -> str:
    """A lock of ``digest`` whose value holds a line no script of this version wrote, after a
    readable holder's."""
    backend, key = RedisBackend(client=client), enqueue_key(PREFIX, digest)
    line = line if isinstance(line, bytes) else line.encode()
    if with_holder:
        holder = Holder("readable", "report", "default", "until_executed", "queued")
        assert backend.acquire(key, "readable", limit=2, ttl=None, holder=holder).acquired
        client.append(key, b"\n" + line)
    else:
        client.set(key, line)
    return key


def shown(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def reaper_warnings(caplog) -> list[str]:
    """The reaper's WARNING lines but those of each lock it released."""
    return [
        r.getMessage() for r in caplog.records if r.name == "test.foreign" and "released lock" not in r.getMessage()
    ]


@pytest.mark.parametrize(("line", "owner"), FOREIGN_LINES, ids=FOREIGN_IDS)
def test_one_reaper_run_frees_every_orphan_past_a_place_it_cannot_read(redis_client, caplog, line, owner):
    # Issue 32 (1): every run raised "not enough values to unpack" at the same key and resumed at
    # its saved cursor: with 300 orphans, three runs freed 103.
    backend = RedisBackend(client=redis_client)
    orphans = plant_orphans(backend, redis_client, 60)
    key = plant_foreign(redis_client, FOREIGN, line, with_holder=False)
    reaper = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0)
    with caplog.at_level(logging.WARNING, logger="test.foreign"):
        report = reaper.run(broker=RedisBroker(client=redis_client))
    assert report.complete and report.released == 60 and report.unreadable == 1
    assert not orphans & scan_all(backend)
    assert redis_client.get(key) == (line if isinstance(line, bytes) else line.encode())  # as it was
    (warning,) = reaper_warnings(caplog)
    assert warning.startswith(
        f"The orphan reaper left 1 lock record it cannot read untouched: in {key!r}, the place of {owner!r} holds "
    )
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


@pytest.mark.parametrize(("line", "owner"), FOREIGN_LINES, ids=FOREIGN_IDS)
def test_locks_list_and_get_leave_out_a_place_they_cannot_read(redis_client, caplog, line, owner):
    key = plant_foreign(redis_client, FOREIGN, line)
    backend = RedisBackend(client=redis_client)
    holder = Holder("other", "report", "default", "until_executed", "queued")
    assert backend.acquire(enqueue_key(PREFIX, HELD), "other", limit=1, ttl=None, holder=holder).acquired
    locks = Locks(backend)
    listed = {lock.digest: [h.message_id for h in lock.holders] for lock in locks.list()}
    assert listed == {HELD: ["other"], FOREIGN: ["readable"]}
    assert list(locks.unreadable) == [key] and "not a record of this version" in locks.unreadable[key][owner]
    reason = locks.unreadable[key][owner]
    assert [h.message_id for lock in locks.get(FOREIGN) for h in lock.holders] == ["readable"]
    assert locks.unreadable == {key: {owner: reason}}
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("dramatiq_unique")]
    assert warnings == [f"A record in lock {key!r} is left out: {reason}."]  # once


def test_the_command_lists_and_shows_past_a_place_it_cannot_read(redis_client, redis_url):
    # Issue 32 (1): list died with a traceback; show exited 2 (a usage error) with the raw message.
    key = plant_foreign(redis_client, FOREIGN, "A|junk")
    listed = cli("--url", redis_url, "list")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert "readable" in listed.stdout
    assert f"A record in lock {key!r} is left out: the place of 'A' holds 'junk'" in listed.stderr
    shown = cli("--url", redis_url, "show", FOREIGN)
    assert shown.returncode == 0, shown.stderr
    assert "readable" in shown.stdout
    assert f"Lock {key!r} holds 1 record this version cannot read:" in shown.stdout
    redis_client.set(key, "A|junk")  # only the foreign line is left
    alone = cli("--url", redis_url, "show", FOREIGN)
    assert alone.returncode == 0, alone.stderr
    assert f"Lock {key!r} holds 1 record this version cannot read:" in alone.stdout


@pytest.mark.parametrize(("line", "owner"), FOREIGN_LINES, ids=FOREIGN_IDS)
def test_the_web_page_shows_the_locks_and_says_what_it_cannot_read(redis_client, line, owner):
    # Issue 32 (1): the page answered 400 with the raw message, or 500 for an unknown flag.
    key = plant_foreign(redis_client, FOREIGN, line)
    page = Client(make_wsgi_app(RedisBackend(client=redis_client)), script_name="/ops/locks")
    for path in ("/", "/locks/" + FOREIGN):
        answer = page.get(path)
        assert answer.status == 200
        assert "readable" in answer.text
        assert "Records this version cannot read are left out" in answer.text and key in answer.text


@pytest.mark.parametrize("line", ["bytes", "another type"])
def test_locks_are_listed_past_a_line_this_version_did_not_write(redis_client, line):
    # Issue 32 (1): a waiter id of bytes that are no UTF-8 in one lock's line, or a line key of
    # another type, made every listing, explain and unlock raise.
    key = plant_foreign(redis_client, FOREIGN, "A|junk")
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
    key = plant_foreign(redis_client, digest, "A|junk", with_holder=False)
    explained = locks.explain(report, "2026-12-04")
    assert explained.on_send.startswith(f"A new send would fail with LockBackendError: in lock {key!r}, the place of")
    with pytest.raises(LockBackendError):
        report.send("2026-12-04")
    unlocked = cli("--url", redis_url, "unlock", digest, "--yes")
    assert unlocked.returncode == RET_NOT_FOUND
    assert f"The locks of digest {digest!r} hold only records this version cannot read: in {key!r}" in unlocked.stderr


def plant_other_type(client, key: str, kind: str) -> None:
    """A key of another type than a lock's at the lock's name: a lock of 0.1 (a hash), or a list."""
    if kind == "list":
        client.rpush(key, "m1")
    else:
        client.hset(key, mapping={"fence": 1, "m1": '|1|1|{"message_id":"m1","state":"queued"}'})


@pytest.mark.parametrize("kind", ["hash of 0.1", "list"])
def test_the_readers_pass_over_a_lock_key_of_another_type(redis_client, kind):
    # Issue 33: a lock is a string now. A key of another type at a lock's name (a lock of 0.1, a
    # hand edit) is no lock the readers list or the reaper frees: they go on with the others.
    backend = RedisBackend(client=redis_client)
    orphans = plant_orphans(backend, redis_client, 10)
    key = enqueue_key(PREFIX, HELD)
    plant_other_type(redis_client, key, kind)
    plant_foreign(redis_client, FOREIGN, "A|junk")
    assert [lock.digest for lock in Locks(backend).list() if lock.digest == HELD] == []
    report = Reaper(backend, prefix=PREFIX, logger=LOGGER, batch=10, min_age=0).run(
        broker=RedisBroker(client=redis_client)
    )
    assert report.complete and report.released == 10 and not orphans & scan_all(backend)
    assert redis_client.type(key) == (b"list" if kind == "list" else b"hash")  # as it was


@pytest.mark.parametrize("kind", ["hash of 0.1", "list"])
def test_a_send_to_a_lock_key_of_another_type_raises_naming_the_key(redis_client, kind):
    # Issue 33: a send to a lock key of another type fails naming that key (a lock of 0.1 says
    # so), and leaves the key as it is.
    # FAILS on the issue 33 code (a bug, left for the code's fix): the place-taking scripts read
    # the lock in one MGET (holders.lua read_for_place), which answers nil for a key of another
    # type instead of WRONGTYPE, so the send takes the lock and SET writes over the 0.1 hash or
    # the list: the send succeeds and the 0.1 holder's place is gone.
    backend = RedisBackend(client=redis_client)
    key = enqueue_key(PREFIX, HELD)
    plant_other_type(redis_client, key, kind)
    holder = Holder("m2", "report", "default", "until_executed", "queued")
    with pytest.raises(LockBackendError) as raised:
        backend.acquire(key, "m2", limit=1, ttl=None, holder=holder)
    assert f"left key {key!r} as it is" in str(raised.value)
    assert ("dramatiq-unique 0.1" in str(raised.value)) == (kind == "hash of 0.1")
    assert redis_client.type(key) == (b"list" if kind == "list" else b"hash")  # as it was


@pytest.mark.parametrize("line", ["x|+5|||qe|||a|b|", "x|5|-3||qe|||a|b|", "x|1_0|||qe|||a|b|"])
def test_the_readers_call_unreadable_what_the_scripts_cannot_read(redis_client, line):
    # Issue 33: a record whose numbers are not plain digits is one the scripts cannot read (a
    # send there fails); Locks must say so too, not list it as a holder.
    # FAILS on the issue 33 code (a bug, left for the code's fix): LockRecord.parse reads the
    # numbers with int(), which takes a sign, spaces and "_", where holders.lua's parse takes
    # digits only: Locks lists 'x' as a holder and explain would call the lock taken, while
    # every send to it fails with LockBackendError.
    key = plant_foreign(redis_client, FOREIGN, line, with_holder=False)
    backend = RedisBackend(client=redis_client)
    holder = Holder("m", "report", "default", "until_executed", "queued")
    with pytest.raises(LockBackendError):
        backend.acquire(key, "m", limit=2, ttl=None, holder=holder)
    locks = Locks(backend)
    assert list(locks.list()) == [] and list(locks.unreadable) == [key]
