"""A lock's own fields and its holders never meet (issue 18, defect 3): a message whose id is
the name of one of the lock hash's own fields ("fence", "names"), or starts with the escape mark,
holds its lock like any other; and a lock recorded by the previous release is still honoured:
its holders keep their places and its fence keeps tokens growing."""

from __future__ import annotations

import base64
import logging
import uuid

import pytest

from dramatiq_unique import Locks, RedisBackend, StubBackend, enqueue_outcome, reap_orphans
from dramatiq_unique.backends import Holder
from dramatiq_unique.keys import registry_key

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


# Locks as the previous release recorded them -------------------------------------------------


@pytest.fixture(params=["redis", "cluster"])
def redis_backend(request):
    name = "cluster_client" if request.param == "cluster" else "redis_client"
    return RedisBackend(client=request.getfixturevalue(name))


def server_now(client) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_lock_of_the_previous_release_keeps_its_holders_and_its_fence(redis_backend):
    # Issue 18, defect 3: a lock held across a rolling upgrade, written as the previous release
    # writes it (fields "fence" and "names", compact holders that leave their actor and queue to
    # "names"), is taken, re-entered, renewed, listed and released by this one; its fence, set
    # above the clock as after a step back of it, keeps every new token above it.
    client = redis_backend.client
    now = server_now(client)
    fence = (now + 600_000) * 1000  # ten minutes ahead of the clock
    token = now * 1000
    client.hset(KEY, mapping={"fence": fence, "names": "settle|payments", "m1": f"{token}||60000|qe+|||||"})
    worker = "old-host:7:0a1b2c3d"
    client.hset(
        RUN_KEY, mapping={"fence": fence, "names": "settle|payments", "t1": f"{token}||60000|ra|{worker}||||m1"}
    )

    refused = redis_backend.acquire(KEY, "m2", limit=1, ttl=None, holder=queued("m2"))
    assert (refused.acquired, refused.holders) == (False, ("m1",))
    again = redis_backend.acquire(KEY, "m1", limit=1, ttl=60_000, holder=queued("m1"))
    assert (again.acquired, again.token) == (True, token)
    redelivery = redis_backend.acquire(RUN_KEY, "t2", limit=2, ttl=None, holder=running("m1"))
    assert (redelivery.acquired, redelivery.holders) == (False, ("m1",))
    renewed = redis_backend.renew(RUN_KEY, "t1", ttl=120_000)
    assert renewed is not None and renewed >= now + 120_000

    _, records = redis_backend.read([KEY, RUN_KEY])
    assert sorted((r.key, r.owner, r.token, r.holder["message_id"], r.holder["actor"]) for r in records) == [
        (KEY, "m1", token, "m1", "settle"),
        (RUN_KEY, "t1", token, "m1", "settle"),
    ]
    run = next(r for r in records if r.key == RUN_KEY)
    assert (run.holder["worker_id"], run.expires_at) == (worker, renewed)

    assert redis_backend.release(KEY, "m1")
    assert redis_backend.release_records(RUN_KEY, {"t1": run.record}) == ["t1"]
    for key in (KEY, RUN_KEY):
        taken = redis_backend.acquire(key, "fence", limit=1, ttl=None, holder=queued("fence"))
        assert taken.acquired and taken.token == fence + 1  # above the old fence, not the clock's


def test_a_fence_alone_of_the_previous_release_keeps_tokens_growing(redis_backend):
    # A lock the previous release freed keeps its "fence" field alone; so does one whose holder
    # "fence" overwrote it there with its record (the defect): either is the last token issued.
    client = redis_backend.client
    now = server_now(client)
    fence = (now + 600_000) * 1000
    client.hset(KEY, mapping={"fence": fence})
    clobbered = "dramatiq-unique:{clobbered}"
    client.hset(clobbered, mapping={"fence": f"{fence}|||qe+|||settle|payments|"})
    for key in (KEY, clobbered):
        assert redis_backend.read([key])[1] == [] and redis_backend.release(key, "fence") is False
        first = redis_backend.acquire(key, "fence", limit=1, ttl=None, holder=queued("fence"))
        assert first.token == fence + 1
        assert redis_backend.acquire(key, "names", limit=2, ttl=None, holder=queued("names")).token == fence + 2
        assert sorted(r.owner for r in redis_backend.read([key])[1]) == ["fence", "names"]


def test_names_overwritten_by_a_holder_of_the_previous_release(redis_backend):
    # On the previous release, a holder "names" that came second wrote its record over the names
    # its first holder left its actor and queue to: that holder is still one (it keeps newcomers
    # out and is released), with no actor or queue rather than parts of a record for them.
    client = redis_backend.client
    token = server_now(client) * 1000
    client.hset(KEY, mapping={"fence": token + 1, "m1": f"{token}|||qe+|||||", "names": f"{token + 1}|||qe+|||||"})
    refused = redis_backend.acquire(KEY, "m2", limit=1, ttl=None, holder=queued("m2"))
    assert (refused.acquired, refused.holders) == (False, ("m1",))
    (m1,) = redis_backend.read([KEY])[1]
    assert (m1.owner, m1.token, m1.holder) == (
        "m1",
        token,
        {"message_id": "m1", "lock": "until_executed", "state": "queued", "replaceable": True},
    )
    (scanned,) = scan_all(redis_backend)
    assert scanned == m1
    assert redis_backend.release(KEY, "m1")
    taken = redis_backend.acquire(KEY, "names", limit=1, ttl=None, holder=queued("names"))
    assert taken.token > token + 1
    (names,) = redis_backend.read([KEY])[1]
    assert (names.owner, names.holder["actor"], names.holder["queue"]) == ("names", "settle", "payments")


@pytest.mark.parametrize("env", ["redis", "cluster"], indirect=True)
def test_the_reaper_frees_orphans_of_the_previous_release(env):
    # Locks recorded by the previous release: the run lock of a dead worker and the enqueue lock
    # of a message gone from the broker are reaped; a live worker's and a queued message's stay.
    client, backend = env.backend.client, env.backend
    now = server_now(client)
    client.zadd(registry_key("dramatiq-unique"), {"dead-host:1:0": now - 600_000, "live-host:2:0": now + 600_000})
    token = (now - 120_000) * 1000  # two minutes old: past the reaper's grace for enqueue locks
    queued_id = uuid.uuid4()
    env.broker.client.hset("dramatiq:default.msgs", str(queued_id), "{}")
    places = {
        "dramatiq-unique:{dead}:run": ("t1", f"{token}||600000|rw|dead-host:1:0||||gone-1"),
        "dramatiq-unique:{live}:run": ("t2", f"{token}||600000|rw|live-host:2:0||||busy"),
        "dramatiq-unique:{lost}": ("gone-2", f"{token}|||qe||{short_uuid(uuid.uuid4())}|||"),
        "dramatiq-unique:{queued}": ("waits", f"{token}|||qe||{short_uuid(queued_id)}|||"),
    }
    for key, (owner, record) in places.items():
        client.hset(key, mapping={"fence": token, "names": "settle|default", owner: record})
    report = reap_orphans(backend, broker=env.broker, logger=logging.getLogger("test.lock_fields"))
    assert (report.released_dead_workers, report.released_missing_messages) == (1, 1)
    assert sorted((r.key, r.owner, r.holder["actor"]) for r in scan_all(backend)) == [
        ("dramatiq-unique:{live}:run", "t2", "settle"),
        ("dramatiq-unique:{queued}", "waits", "settle"),
    ]
    # The fences of the reaped locks stay.
    assert backend.acquire("dramatiq-unique:{dead}:run", "t3", limit=1, ttl=None, holder=running("x")).token > token


def short_uuid(value: uuid.UUID) -> str:
    """A UUID as the compact record writes a RedisBroker message id: 22 characters of base64url."""
    return base64.urlsafe_b64encode(value.bytes)[:22].decode()


def test_the_record_of_an_owner_named_like_a_field(redis_client):
    # The escape: such an owner's field takes one more "@" in front, and its record names its
    # message, so a process of the previous release that reads the lock names the right one. Every
    # other owner (a UUID, a run lock's hex) is recorded as before.
    backend = RedisBackend(client=redis_client)
    message_id = str(uuid.uuid4())
    token = backend.acquire(KEY, message_id, limit=3, ttl=None, holder=queued(message_id)).token
    escaped = backend.acquire(KEY, "names", limit=3, ttl=None, holder=queued("names")).token
    twice = backend.acquire(KEY, "@fence", limit=3, ttl=None, holder=queued("@fence")).token
    assert redis_client.hgetall(KEY) == {
        b"fence": str(twice).encode(),
        b"names": b"settle|payments",
        message_id.encode(): f"{token}|||qe+|||||".encode(),
        b"@names": f"{escaped}|||qe+|||||names".encode(),
        b"@@fence": f"{twice}|||qe+|||||@fence".encode(),
    }
