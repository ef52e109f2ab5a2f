"""A lock's own marks and its holders never meet (issue 18, defect 3): a message whose id is
the name of one of 0.1's lock fields ("fence", "names"), starts with its escape mark, or holds
the separators of the lock's string since issue 33 ("|", "%", a newline, the "~" of a waiting
line), holds its lock like any other; tokens keep growing after the last holder left and the key
went (the slot's counter); and a lock of 0.1 (a hash) is refused, never overwritten."""

from __future__ import annotations

import base64
import logging
import uuid

import pytest

from dramatiq_unique import LockBackendError, Locks, RedisBackend, StubBackend, enqueue_outcome, reap_orphans
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import enqueue_key, registry_key
from dramatiq_unique.version import __version__

from .support import Gate, scan_all, wait_for

#: Ids that are, or look like, the names of a lock's own fields and their escaped forms.
FIELD_LIKE_IDS = ["fence", "names", "@fence", "@names", "@@fence", "@", "@x", "f"]

KEY = "dramatiq-unique:{abc}"
RUN_KEY = "dramatiq-unique:{abc}:run"
REPLACED_KEY = "dramatiq-unique:{abc}:replaced"


def queued(message_id: str) -> Holder:
    return Holder(message_id, "settle", "payments", "until_executed", "queued", replaceable=True)


def running(message_id: str) -> Holder:
    return Holder(message_id, "settle", "payments", "until_and_while_executing", "running", worker_id="h:1:ab")


@pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)
@pytest.mark.parametrize("message_id", FIELD_LIKE_IDS)
def test_a_message_whose_id_is_a_field_name_holds_its_lock(env, message_id):
    # Issue 18, defect 3: on main the holder "names" or "fence" and the lock's own field of that
    # name overwrite each other, so a second copy is enqueued and runs beside the first.
    gate = Gate()

    @env.actor(queue_name="payments", lock="until_executed")
    def settle(event_id):
        gate.enter(event_id)

    first = env.broker.enqueue(settle.message("evt_1").copy(message_id=message_id))
    outcome = enqueue_outcome(first)
    assert outcome.status == "enqueued"
    copy = enqueue_outcome(settle.send("evt_1"))
    assert (copy.status, copy.holder) == ("duplicate", message_id)

    locks = Locks.from_middleware(env.middleware)
    (listed,) = locks.list()
    assert [(h.message_id, h.state, h.token) for h in listed.holders] == [(message_id, "queued", outcome.token)]
    explained = locks.explain(settle, "evt_1")
    assert [h.message_id for lock in explained.locks for h in lock.holders] == [message_id]

    env.worker()
    wait_for(lambda: gate.count("evt_1") == 1)
    while_running = enqueue_outcome(settle.send("evt_1"))
    assert (while_running.status, while_running.holder) == ("duplicate", message_id)
    gate.open()
    env.join(settle)
    assert gate.runs == ["evt_1"]
    assert env.is_free(outcome.digest)  # released once it ran

    later = enqueue_outcome(settle.send("evt_1"))
    assert later.status == "enqueued" and later.token > outcome.token


@pytest.mark.parametrize("env", ["stub", "redis", "cluster"], indirect=True)
@pytest.mark.parametrize("lock", ["until_executing", "until_and_while_executing", "until_expired"])
@pytest.mark.parametrize("message_id", ["fence", "names"])
def test_every_lock_type_keeps_out_the_copies_of_such_a_message(env, lock, message_id):
    # Issue 18, defect 3: the enqueue lock is given up when the message starts (claim), swapped
    # for a run lock, or kept until its TTL; each time the place found is the message's own.
    gate = Gate()

    @env.actor(queue_name="payments", lock=lock, lock_ttl=60_000)
    def settle(event_id):
        gate.enter(event_id)

    outcome = enqueue_outcome(env.broker.enqueue(settle.message("evt_1").copy(message_id=message_id)))
    assert outcome.status == "enqueued"
    copy = enqueue_outcome(settle.send("evt_1"))
    assert (copy.status, copy.holder) == ("duplicate", message_id)
    env.worker()
    wait_for(lambda: gate.count("evt_1") == 1)
    holds = {"until_executing": False, "until_and_while_executing": False, "until_expired": True}[lock]
    assert env.is_free(outcome.digest) is not holds  # given up at start, or kept until its TTL
    gate.open()
    env.join(settle)
    assert gate.runs == ["evt_1"]
    assert env.is_free(outcome.digest, run=True)
    assert env.is_free(outcome.digest) is not holds


@pytest.fixture(params=["stub", "redis", "cluster"])
def backend(request):
    if request.param == "stub":
        return StubBackend()
    name = "cluster_client" if request.param == "cluster" else "redis_client"
    return RedisBackend(client=request.getfixturevalue(name))


def test_owners_named_like_the_locks_fields_are_holders_like_any_other(backend):
    # Issue 18, defect 3, at the backend: every transition finds these owners' own places, the
    # readers give them back, and tokens keep growing.
    owners = FIELD_LIKE_IDS
    limit = len(owners)
    tokens = []
    for owner in owners:
        taken = backend.acquire(KEY, owner, limit=limit, ttl=60_000, holder=queued(owner))
        assert taken.acquired
        tokens.append(taken.token)
    assert tokens == sorted(set(tokens))
    refused = backend.acquire(KEY, "m1", limit=limit, ttl=None, holder=queued("m1"))
    assert sorted(refused.holders) == sorted(owners)
    for owner in owners:  # a re-entry keeps its place and its token
        assert backend.acquire(KEY, owner, limit=limit, ttl=60_000, holder=queued(owner)).token in tokens
    assert backend.renew(KEY, "fence", ttl=120_000) is not None

    _, read = backend.read([KEY, RUN_KEY])
    assert sorted((r.owner, r.holder["message_id"], r.holder["actor"]) for r in read) == sorted(
        (owner, owner, "settle") for owner in owners
    )
    assert sorted((r.owner, r.record) for r in scan_all(backend)) == sorted((r.owner, r.record) for r in read)

    # replace takes the oldest queued place: "fence"'s, which is told when it starts.
    taken = backend.replace(KEY, "m1", replaced_key=REPLACED_KEY, limit=limit, ttl=None, holder=queued("m1"))
    assert (taken.acquired, taken.replaced) == (True, "fence")
    assert (
        backend.claim(KEY, "fence", replaced_key=REPLACED_KEY, release=False, holder=running("fence")) == "superseded"
    )
    assert backend.claim(KEY, "names", replaced_key=REPLACED_KEY, release=False, holder=running("names")) == "held"
    # until_and_while_executing: "@fence" swaps its queued place for a run lock place.
    swapped = backend.swap(
        release_key=KEY,
        release_owner="@fence",
        replaced_key=REPLACED_KEY,
        acquire_key=RUN_KEY,
        owner="names",
        limit=1,
        ttl=None,
        holder=running("@fence"),
    )
    assert swapped.acquired and swapped.token > max(tokens)
    assert backend.release(RUN_KEY, "names")

    by_owner = {r.owner: r for r in backend.read([KEY])[1]}
    assert set(by_owner) == {*owners, "m1"} - {"fence", "@fence"}
    assert by_owner["names"].holder["state"] == "running"
    assert backend.release_record(KEY, "@", by_owner["@"].record)
    freed = backend.release_records(KEY, {o: by_owner[o].record for o in ("@@fence", "@names")})
    assert freed == ["@@fence", "@names"]
    assert backend.release_many([(KEY, "names"), (KEY, "@x"), (KEY, "f"), (KEY, "m1"), (KEY, "names")]) == [
        True,
        True,
        True,
        True,
        False,
    ]
    assert backend.read([KEY])[1] == [] and scan_all(backend) == []
    assert backend.acquire(KEY, "fence", limit=1, ttl=None, holder=queued("fence")).token > swapped.token


# Locks of 0.1, and the token counter of a hash slot (issue 33) ------------------------------


@pytest.fixture(params=["redis", "cluster"])
def redis_backend(request):
    name = "cluster_client" if request.param == "cluster" else "redis_client"
    return RedisBackend(client=request.getfixturevalue(name))


def server_now(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("env", ["redis", "cluster"], indirect=True)
def test_a_send_to_a_lock_of_0_1_raises_naming_the_key_and_enqueues_nothing(env):
    # Issue 33 (0.1's records, fields "fence" and "names" and holders that left their actor to
    # "names", are read no more; issue 18 had them keep their places): a lock held by 0.1 across
    # a rolling upgrade is still no free lock. A send raises LockBackendError naming the key and
    # saying 0.1 and Upgrading; nothing is enqueued and 0.1's hash is left as it is.
    #
    # FAILS on the format branch (a bug, not this test): acquire.lua reads the lock with MGET,
    # which answers nil for a hash instead of WRONGTYPE, so the send takes the lock as free and
    # SET writes its place over 0.1's hash: a duplicate runs beside 0.1's message.
    @env.actor(queue_name="payments", lock="until_executed")
    def settle(event_id):
        pass

    explained = Locks.from_middleware(env.middleware).explain(settle, "evt_1")
    key = enqueue_key(str(explained.prefix), str(explained.digest))
    client = env.backend.client
    token = server_now(client) * 1000
    client.hset(key, mapping={"fence": token, "names": "settle|payments", "m1": f"{token}||60000|qe+|||||"})
    written = client.hgetall(key)
    with pytest.raises(LockBackendError) as raised:
        settle.send("evt_1")
    assert f"left key {key!r} as it is" in str(raised.value)
    assert "dramatiq-unique 0.1 (a hash)" in str(raised.value) and "Upgrading" in str(raised.value)
    assert env.seen.enqueues == []
    assert client.hgetall(key) == written


def format_key_of(client) -> bytes:
    """The one format key under the default prefix, which keeps the last token of its hash slot
    (one Redis, or a cluster's slot)."""
    (key,) = client.scan_iter(match="dramatiq-unique:format*")
    return key


def last_token(client) -> int:
    return int(client.get(format_key_of(client)).split()[-1])


def test_tokens_keep_growing_after_the_last_holder_left_and_the_key_went(redis_backend):
    # Issue 33 (0.1 kept a "fence" field in a freed lock): a lock's key goes with its last holder,
    # and the last token issued in its hash slot is kept by the slot's format key, which no holder
    # can overwrite: set above the clock, as after a step back of it, it keeps every new token
    # above it, in this lock and in one never held before in that slot.
    client = redis_backend.client
    assert redis_backend.acquire(KEY, "fence", limit=1, ttl=None, holder=queued("fence")).acquired
    assert redis_backend.release(KEY, "fence")
    fence = (server_now(client) + 600_000) * 1000  # ten minutes ahead of the clock
    client.set(format_key_of(client), f"1 {__version__} {fence}")
    tokens = []
    for owner in ("fence", "names", "m1"):
        assert redis_backend.read([KEY])[1] == [] and not client.exists(KEY)
        assert redis_backend.release(KEY, owner) is False
        taken = redis_backend.acquire(KEY, owner, limit=1, ttl=None, holder=queued(owner))
        assert taken.acquired
        tokens.append(taken.token)
        assert redis_backend.release(KEY, owner)
    assert tokens == [fence + 1, fence + 2, fence + 3]
    assert not client.exists(KEY) and last_token(client) == fence + 3
    # Another lock of the same slot (its digest's hash tag, the run lock of this one).
    assert redis_backend.acquire(RUN_KEY, "t1", limit=1, ttl=None, holder=running("m1")).token == fence + 4


#: Owners holding what separates the lines and fields of a lock's string, or marks a line waiting.
SEPARATOR_LIKE_IDS = ["~", "~|", "a|b", "|", "a\nb", "\n", "%", "%7C", "%25", "%0A", "%zz", "a|b%7C\n%"]


def test_owners_holding_the_records_separators_are_holders_like_any_other(redis_backend):
    # Issue 33, as issue 18 did for 0.1's field names: owners (and the message ids of run lock
    # places) holding "|", "%", a newline or the "~" of a waiting line are holders: they keep
    # newcomers out, are read back exactly, and each gives its own place up.
    owners = SEPARATOR_LIKE_IDS
    limit = len(owners)
    for owner in owners:
        assert redis_backend.acquire(KEY, owner, limit=limit, ttl=60_000, holder=queued(owner)).acquired
        assert redis_backend.acquire(RUN_KEY, f"t{owner}", limit=limit, ttl=60_000, holder=running(owner)).acquired
    refused = redis_backend.acquire(KEY, "m1", limit=limit, ttl=None, holder=queued("m1"))
    assert sorted(refused.holders) == sorted(owners)
    again = redis_backend.acquire(RUN_KEY, "t-again", limit=limit + 1, ttl=None, holder=running("a\nb"))
    assert (again.acquired, again.holders) == (False, ("a\nb",))  # a redelivery meets its earlier attempt
    _, read = redis_backend.read([KEY, RUN_KEY])
    assert sorted((r.key, r.owner, r.holder["message_id"]) for r in read) == sorted(
        [(KEY, owner, owner) for owner in owners] + [(RUN_KEY, f"t{owner}", owner) for owner in owners]
    )
    assert sorted((r.key, r.owner, r.record) for r in scan_all(redis_backend)) == sorted(
        (r.key, r.owner, r.record) for r in read
    )
    assert all(r.unreadable is None for r in read)
    for owner in owners:
        assert redis_backend.release(RUN_KEY, f"t{owner}")
        assert redis_backend.release(KEY, owner)
        assert redis_backend.release(KEY, owner) is False
    assert not redis_backend.client.exists(KEY) and not redis_backend.client.exists(RUN_KEY)


@pytest.mark.parametrize("env", ["redis", "cluster"], indirect=True)
def test_the_reaper_frees_orphans_of_records_written_as_they_are_stored(env):
    # Locks written raw in this format (as any process of it writes them: the reaper reads them
    # without a process of its own having taken them): the run lock of a dead worker and the
    # enqueue lock of a message gone from the broker are reaped; a live worker's and a queued
    # message's stay, and what is read of them (actor, worker, broker id) is what the raw line says.
    client, backend = env.backend.client, env.backend
    now = server_now(client)
    client.zadd(registry_key("dramatiq-unique"), {"dead-host:1:0": now - 600_000, "live-host:2:0": now + 600_000})
    token = (now - 120_000) * 1000  # two minutes old: past the reaper's grace for enqueue locks
    queued_id = uuid.uuid4()
    env.broker.client.hset("dramatiq:default.msgs", str(queued_id), "{}")
    places = {
        "dramatiq-unique:{dead}:run": f"t1|{token}||600000|rw|dead-host:1:0||settle|default|gone-1",
        "dramatiq-unique:{live}:run": f"t2|{token}||600000|rw|live-host:2:0||settle|default|busy",
        "dramatiq-unique:{lost}": f"gone-2|{token}|||qe||{short_uuid(uuid.uuid4())}|settle|default|",
        "dramatiq-unique:{queued}": f"waits|{token}|||qe||{short_uuid(queued_id)}|settle|default|",
    }
    for key, line in places.items():
        client.set(key, line, px=480_000 if key.endswith(":run") else None)
    report = reap_orphans(backend, broker=env.broker, logger=logging.getLogger("test.lock_fields"))
    assert (report.released_dead_workers, report.released_missing_messages) == (1, 1)
    assert sorted(
        (r.key, r.owner, r.holder["actor"], r.holder.get("worker_id"), r.holder.get("redis_message_id"))
        for r in scan_all(backend)
    ) == [
        ("dramatiq-unique:{live}:run", "t2", "settle", "live-host:2:0", None),
        ("dramatiq-unique:{queued}", "waits", "settle", None, str(queued_id)),
    ]
    # The reaped locks left no key behind, and their next token is higher.
    assert not client.exists("dramatiq-unique:{dead}:run") and not client.exists("dramatiq-unique:{lost}")
    assert backend.acquire("dramatiq-unique:{dead}:run", "t3", limit=1, ttl=None, holder=running("x")).token > token


def short_uuid(value: uuid.UUID) -> str:
    """A UUID as the compact record writes a RedisBroker message id: 22 characters of base64url."""
    return base64.urlsafe_b64encode(value.bytes)[:22].decode()


def test_the_record_of_an_owner_holding_the_records_separators(redis_client):
    # Issue 33: a lock is one string, a line per holder, oldest first: "<owner>|<token>|<late>|
    # <lifetime>|<holder>", where the owner escapes "%", "|" and newlines (%25, %7C, %0A) and the
    # message id is left out where it is the owner. 0.1's fields and their "@" escape are gone:
    # "names" and "@fence" are written as they are, as every other owner (a UUID) is.
    backend = RedisBackend(client=redis_client)
    message_id = str(uuid.uuid4())
    tokens = [
        backend.acquire(KEY, owner, limit=4, ttl=None, holder=queued(owner)).token
        for owner in (message_id, "names", "@fence", "a|b%\nc")
    ]
    holder = "qe+|||settle|payments|"
    assert redis_client.get(KEY).decode().split("\n") == [
        f"{message_id}|{tokens[0]}|||{holder}",
        f"names|{tokens[1]}|||{holder}",
        f"@fence|{tokens[2]}|||{holder}",
        f"a%7Cb%25%0Ac|{tokens[3]}|||{holder}",
    ]
    assert last_token(redis_client) == tokens[3]
