"""Options, validation and the digest (SPEC D1-D6)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import InvalidLockOptions, LockArgumentsError, StubBackend, UniqueJobs, enqueue_outcome
from dramatiq_unique.digest import DIGEST_LENGTH, canonical_json, compute_digest
from dramatiq_unique.keys import enqueue_key
from dramatiq_unique.options import LONGEST_LOCK_DURATION

from .support import unique_warnings


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"lock": "until_done"}, ["'until_done'", "lock", "'until_executed'", "'while_executing'"]),
        ({"lock": "until_executed", "on_conflict": "shrug"}, ["on_conflict", "'shrug'", "'log'"]),
        ({"lock": "until_executed", "on_conflict": {"clent": "log"}}, ["on_conflict", "'clent'", "'client'"]),
        ({"lock": "until_executed", "on_conflict": {"server": "nope"}}, ["on_conflict", "server", "'log'"]),
        ({"lock": "until_expired"}, ["until_expired", "lock_ttl"]),
        ({"lock": "until_executed", "lock_limit": 0}, ["lock_limit=0", ">= 1"]),
        ({"lock": "until_executed", "lock_limit": "2"}, ["lock_limit='2'"]),
        ({"lock": "until_executed", "lock_limit": True}, ["lock_limit=True"]),
        ({"lock": "until_executed", "lock_ttl": -5}, ["lock_ttl=-5", "milliseconds"]),
        ({"lock": "until_executed", "lock_ttl": 1.5}, ["lock_ttl=1.5"]),
        ({"lock": "until_executed", "lock_args_method": "first"}, ["lock_args_method='first'", "callable"]),
        ({"lock": "until_executed", "lock_prefix": "app:{x}"}, ["lock_prefix", "'{'"]),
        # Issue 32 (4): accepted, then every send raised UnicodeEncodeError, logged, and enqueued unlocked.
        (
            {"lock": "until_executed", "lock_prefix": "app:\udcff"},
            ["lock_prefix='app:\\udcff'", "it holds a lone surrogate, which UTF-8 cannot encode"],
        ),
        # Issue 32 (5): accepted, then every send raised LockBackendError naming no option, or
        # (2**63) wrote a negative lifetime and took no lock.
        (
            {"lock": "until_executed", "lock_ttl": 10**18},
            [
                "lock_ttl=1000000000000000000: it must be at most 1_000_000_000_000_000 (milliseconds, over 31,688 "
                "years), or None."
            ],
        ),
        ({"lock": "until_executed", "lock_ttl": 2**63}, ["lock_ttl=9223372036854775808: it must be at most"]),
        (
            {"lock": "until_executed", "on_conflict": {"client": "replace"}, "debounce": 300, "debounce_cap": 10**30},
            [f"debounce_cap={10**30}: it must be at most 1_000_000_000_000_000 (milliseconds"],
        ),
        (
            {"lock": "until_executed", "on_conflict": {"client": "replace"}, "debounce": 10**16},
            ["debounce=10000000000000000: it must be at most 1_000_000_000_000_000 (milliseconds"],
        ),
        (
            {"lock": "until_executed", "reschedule_delay": 10**16},
            [
                "reschedule_delay=10000000000000000: it must be at most 1_000_000_000_000_000 (milliseconds, over "
                "31,688 years)."
            ],
        ),
        ({"lock": "until_executed", "unique_across_queues": "yes"}, ["unique_across_queues='yes'"]),
        ({"lock": "until_executed", "reschedule_delay": -1}, ["reschedule_delay=-1"]),
        ({"lock": "until_executed", "max_reschedules": -1}, ["max_reschedules=-1"]),
        ({"lock": "until_executed", "debounce": 0}, ["debounce=0", ">= 1 (milliseconds) or None"]),
        ({"lock": "until_executed", "debounce": 1.5}, ["debounce=1.5"]),
        ({"lock": "until_executed", "debounce": True}, ["debounce=True"]),
        ({"lock": "until_executed", "debounce_cap": "800"}, ["debounce_cap='800'", "milliseconds"]),
        ({"lock": "until_executed", "debounce_cap": 800}, ["debounce_cap=800", "needs debounce"]),
        (
            {"lock": "until_executed", "on_conflict": {"client": "replace"}, "debounce": 300, "debounce_cap": 200},
            ["debounce_cap=200", ">= debounce=300"],
        ),
        (
            {"lock": "while_executing", "on_conflict": {"client": "replace"}, "debounce": 300},
            [
                "debounce=300",
                "lock='while_executing'",
                "'until_and_while_executing', 'until_executed', 'until_executing'",
            ],
        ),
        (
            {"debounce": 500},
            ["debounce=500", "lock=None", "'until_and_while_executing', 'until_executed', 'until_executing'"],
        ),
        (
            {"lock": "until_expired", "lock_ttl": 5000, "debounce": 300},
            ["debounce=300", "lock='until_expired'", "'until_executing'"],
        ),
        (
            {"lock": "until_executed", "debounce": 300},
            [
                "debounce=300",
                "on_conflict='log'",
                "replaces queued holders",
                "Valid choices on the client side there are: 'cancel_in_progress', 'replace'",
            ],
        ),
    ],
)
def test_invalid_options_fail_when_the_actor_is_declared(stub_env, options, expected):
    # D5: a ValueError that names the actor, the option, the bad value and the valid choices.
    with pytest.raises(ValueError) as excinfo:

        @dramatiq.actor(**options)
        def sync_account_balance(account_id):
            pass

    assert isinstance(excinfo.value, InvalidLockOptions)
    text = str(excinfo.value)
    assert "'sync_account_balance'" in text
    for fragment in expected:
        assert fragment in text
    assert "sync_account_balance" not in stub_env.broker.actors


def test_misspelled_options_are_rejected_by_dramatiq(stub_env):
    with pytest.raises(ValueError, match="lock_tll"):

        @dramatiq.actor(lock="until_executed", lock_tll=1000)
        def job():
            pass


def test_invalid_middleware_defaults_fail_in_the_constructor():
    with pytest.raises(InvalidLockOptions, match="UniqueJobs has an invalid lock_limit=0"):
        UniqueJobs(backend=StubBackend(), lock_limit=0)


def test_middleware_defaults_apply_to_every_actor():
    broker = StubBroker()
    broker.add_middleware(UniqueJobs(backend=StubBackend(), lock="until_executed"), before=TimeLimit)

    @dramatiq.actor(broker=broker)
    def job(x):
        pass

    @dramatiq.actor(broker=broker, lock=None)
    def free(x):
        pass

    assert enqueue_outcome(job.send(1)).enqueued
    assert not enqueue_outcome(job.send(1)).enqueued
    assert enqueue_outcome(free.send(1)).enqueued and enqueue_outcome(free.send(1)).enqueued


def test_a_message_can_override_its_actors_options(env):
    @env.actor(lock="until_executed")
    def job(x):
        pass

    assert enqueue_outcome(job.send_with_options(args=(1,), lock_limit=2)).enqueued
    assert enqueue_outcome(job.send_with_options(args=(1,), lock_limit=2)).enqueued
    assert not enqueue_outcome(job.send(1)).enqueued
    assert enqueue_outcome(job.send_with_options(args=(1,), lock=None)).enqueued


def test_an_invalid_message_override_fails_at_send_and_enqueues_nothing(env):
    runs = []

    @env.actor(lock="until_executed")
    def job(x):
        runs.append(x)

    with pytest.raises(InvalidLockOptions, match="'job'.*lock_limit=-1"):
        job.send_with_options(args=(1,), lock_limit=-1)
    env.worker()
    env.join(job)
    assert runs == []
    assert enqueue_outcome(job.send(1)).enqueued  # and nothing was locked


def test_a_debounce_without_a_lock_fails_at_send_and_enqueues_nothing(env):
    # Issue 31 (8): an actor without a lock sent with debounce ran every message at once, undelayed.
    runs = []

    @env.actor
    def push_profile(user_id):
        runs.append(user_id)

    with pytest.raises(InvalidLockOptions, match="'push_profile' .*uses debounce=500 with lock=None"):
        push_profile.send_with_options(args=(7,), debounce=500)
    env.worker()
    env.join(push_profile)
    assert runs == []
    assert env.seen.enqueues == []


def test_a_failing_lock_args_method_fails_the_send_and_locks_nothing(env):
    # D6: send() raises an error naming the actor and the cause; nothing enqueued, nothing locked.
    runs = []

    def account_only(account_id, requested_at):
        return [account_id["id"]]

    @env.actor(lock="until_executed", lock_args_method=account_only)
    def sync(account_id, requested_at):
        runs.append(account_id)

    with pytest.raises(LockArgumentsError) as excinfo:
        sync.send(42, "2026-11-29")
    assert "'sync'" in str(excinfo.value) and "TypeError" in str(excinfo.value)
    env.worker()
    env.join(sync)
    assert runs == []
    assert enqueue_outcome(sync.send({"id": 42}, "2026-11-29")).enqueued


def test_lock_args_that_are_not_json_fail_the_send(env):
    # D6
    @env.actor(lock="until_executed", lock_args_method=lambda x: {x})
    def job(x):
        pass

    with pytest.raises(LockArgumentsError, match="'job'.*not JSON-serialisable"):
        job.send(1)


def test_the_digest_is_sha256_of_actor_queue_and_arguments():
    # D1
    def digest(actor="a", queue="q", args=(1,), **flags):
        return compute_digest(
            actor_name=actor,
            queue_name=queue,
            lock_args=args,
            unique_across_actors=flags.get("across_actors", False),
            unique_across_queues=flags.get("across_queues", False),
        )

    # Issue 33: the first 128 bits of the SHA-256, in base64url without padding.
    assert len(digest()) == DIGEST_LENGTH == 22 and re.fullmatch("[A-Za-z0-9_-]{22}", digest())
    assert base64.urlsafe_b64decode(digest() + "==") == hashlib.sha256(b'["a","q",[1]]').digest()[:16]
    assert digest() == digest(queue="q.DQ") == digest(queue="q.XQ")  # the canonical queue
    assert digest() != digest(actor="b") and digest() != digest(queue="r") and digest() != digest(args=(2,))
    # D3
    assert digest(actor="b", across_actors=True) == digest(across_actors=True)
    assert digest(queue="r", across_queues=True) == digest(across_queues=True)
    # Key order of mappings does not matter; arguments cannot steer the key name.
    assert digest(args={"a": 1, "b": 2}) == digest(args={"b": 2, "a": 1})
    tricky = digest(args=["} :run {x"])
    assert enqueue_key("dramatiq-unique", tricky) == "dramatiq-unique:{" + tricky + "}"


def test_lock_args_method_narrows_the_digest(env):
    # D2: only the account decides uniqueness; the timestamp does not.
    @env.actor(lock="until_executed", lock_args_method=lambda account_id, requested_at=None: [account_id])
    def sync(account_id, requested_at=None):
        pass

    first = sync.send(42, requested_at="09:00")
    second = sync.send(42, requested_at="09:05")
    assert enqueue_outcome(first).enqueued
    assert not enqueue_outcome(second).enqueued
    assert enqueue_outcome(sync.send(43, requested_at="09:05")).enqueued


def test_unique_across_actors_shares_one_lock(env):
    # D3
    @env.actor(lock="until_executed", unique_across_actors=True)
    def charge(order_id):
        pass

    @env.actor(lock="until_executed", unique_across_actors=True)
    def refund(order_id):
        pass

    assert enqueue_outcome(charge.send(7)).enqueued
    assert not enqueue_outcome(refund.send(7)).enqueued


def test_unique_across_queues(env):
    # D3: the same actor sent to two queues shares a lock only with unique_across_queues.
    @env.actor(lock="until_executed", queue_name="a")
    def job(x):
        pass

    @env.actor(lock="until_executed", queue_name="a", unique_across_queues=True)
    def shared(x):
        pass

    env.broker.declare_queue("b")
    assert enqueue_outcome(job.send(1)).enqueued
    assert enqueue_outcome(env.broker.enqueue(job.message(1).copy(queue_name="b"))).enqueued
    assert enqueue_outcome(shared.send(1)).enqueued
    assert not enqueue_outcome(env.broker.enqueue(shared.message(1).copy(queue_name="b"))).enqueued


def test_while_executing_checks_lock_arguments_at_send(env):
    # D6 holds for lock types without an enqueue lock too: the error comes from send(), not the worker.
    @env.actor(lock="while_executing", lock_args_method=lambda account_id: [account_id["id"]])
    def sync(account_id):
        pass

    with pytest.raises(LockArgumentsError, match="'sync'"):
        sync.send(42)
    assert enqueue_outcome(sync.send({"id": 42})).digest is not None


# The digest accepts what Dramatiq's JSON encoder accepts (issue 9, item 1) --------------------


def digest_of(lock_args) -> str:
    flags = {"unique_across_actors": False, "unique_across_queues": False}
    return compute_digest(actor_name="sync", queue_name="default", lock_args=lock_args, **flags)


def test_digests_of_ordinary_arguments_are_unchanged():
    # D1: the canonical JSON of ordinary arguments is the one earlier versions hashed. Issue 33
    # keeps 128 bits of its SHA-256 in base64url: each digest is the first half of the 64-hex
    # digest 0.1 gave the same arguments.
    expected = {
        "YiQHy2A4N1PnfS6ok2MoZA": "622407cb60383753e77d2ea893632864d976b555fa1d79228f1348bfe5091514",
        "tqvEKYUnK-LXV6i-UqRp6w": "b6abc42985272be2d757a8be52a469eb111127a86f4f01ba7f303de1fb571686",
        "2YVGo3f6VxOs2HcBvZtvNw": "d98546a377fa5713acd87701bd9b6f3774a6f7c9792db3340ef37da3020ffd5d",
    }
    for new, old in expected.items():
        assert base64.urlsafe_b64encode(bytes.fromhex(old)[:16]).rstrip(b"=").decode() == new
    assert list(expected) == [
        digest_of([[42, "2026-11-29"], {}]),
        digest_of([[{"b": [1, 2.5, None, True], "a": "é ü 😀"}], {"at": "09:00", "n": -3}]),
        digest_of([(10**30, 1e-7, -0.0, "\u2028"), {"z": {"y": [], "x": {}}}]),
    ]


def test_the_documented_recipe_computes_the_digest():
    # Issue 33: the recipe of "How the Redis backend stores locks", as a reader copies it, gives
    # the digest the middleware computes.
    page = (Path(__file__).parent.parent / "docs" / "backend-internals.md").read_text()
    (recipe,) = re.findall(r"## The digest, byte by byte.*?```python\n(.*?)```", page, re.DOTALL)
    namespace: dict = {}
    exec(compile(recipe, "backend-internals.md", "exec"), namespace)
    assert namespace["digest"] == compute_digest(
        actor_name="settle_payment",
        queue_name="payments",
        lock_args=["evt_123"],
        unique_across_actors=False,
        unique_across_queues=False,
    )


def test_the_digest_is_that_of_the_arguments_a_worker_receives():
    # D1: values that Dramatiq encodes to the same JSON arrive at the worker identical: one job.
    assert digest_of({1: "a", "b": 2}) == digest_of({"1": "a", "b": 2}) == digest_of({"b": 2, 1: "a"})
    assert digest_of({10: "a", 2: "b"}) == digest_of({"10": "a", "2": "b"})
    assert digest_of({True: 1, None: 2, 1.5: 3}) == digest_of({"true": 1, "null": 2, "1.5": 3})
    assert digest_of("\ud83d\ude00") == digest_of("😀")  # a surrogate pair is decoded as one character
    # Distinct values stay distinct, lone surrogates included.
    distinct = ["\udcff", "\udcfe", "\\udcff", "\ufffd", "", float("nan"), float("inf"), -float("inf"), None]
    assert len({digest_of(value) for value in distinct}) == len(distinct)
    assert digest_of({1: "a"}) != digest_of({1: "b"}) and digest_of([1]) != digest_of(["1"])


@pytest.mark.parametrize(
    "value",
    [
        [[42, "2026-11-29"], {}],
        [(10**30, 1e-7, -0.0, "\u2028", float("nan"), float("inf")), {"z": {"y": [], "x": {}}}],
        ["é ü 😀", {"ключ": ["значение", None, True, False]}],
        ["\ud83d\ude00", "\udcff", {"\udcff": 1}],
        [{1: "a", "b": 2}, {True: 1, None: 2, 1.5: 3}],
        [[[[[]]]], {"a": ({"b": (1, 2)},)}],
    ],
)
def test_the_digest_takes_no_shortcut_that_changes_it(value):
    # P5 (issue 11): values that arrive as sent skip the trip through JSON and back; the
    # canonical JSON must be exactly what that trip gives, for those and for the others.
    through_json = json.loads(json.dumps(value, separators=(",", ":")))
    expected = json.dumps(through_json, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected.encode("utf-8", "surrogatepass")


def test_arguments_with_a_lone_surrogate_are_locked(env):
    # D1 + D6: os.fsdecode() of a non-UTF-8 file name gives a lone surrogate, which Dramatiq
    # encodes (as \udcff): the message is locked like any other, so its duplicate never runs.
    runs = []

    @env.actor(lock="until_executed")
    def index(path):
        runs.append(path)

    path, other = os.fsdecode(b"report-\xff.csv"), os.fsdecode(b"report-\xfe.csv")
    assert enqueue_outcome(index.send(path)).enqueued
    assert not enqueue_outcome(index.send(path)).enqueued
    assert enqueue_outcome(index.send(other)).enqueued
    env.worker()
    env.join(index)
    assert sorted(runs) == sorted([path, other])


def test_dicts_with_mixed_keys_are_locked(env):
    # D1: Dramatiq encodes {1: "a", "b": 2} as {"1": "a", "b": 2}: a worker cannot tell them apart.
    runs = []

    @env.actor(lock="until_executed")
    def job(mapping):
        runs.append(mapping)

    assert enqueue_outcome(job.send({1: "a", "b": 2})).enqueued
    assert not enqueue_outcome(job.send({"b": 2, 1: "a"})).enqueued
    assert not enqueue_outcome(job.send({"1": "a", "b": 2})).enqueued
    assert enqueue_outcome(job.send({1: "z", "b": 2})).enqueued
    env.worker()
    env.join(job)
    assert sorted(run["1"] for run in runs) == ["a", "z"]


def test_an_actor_with_a_lock_and_a_name_utf8_cannot_encode_is_refused_when_declared(stub_env):
    # Issue 32 (4): declared, its every send raised UnicodeEncodeError in before_enqueue, which Dramatiq
    # logged at CRITICAL before it enqueued the message without a lock.
    with pytest.raises(InvalidLockOptions) as raised:

        @stub_env.actor(lock="until_executed", actor_name="index_\udcff")
        def index(path):
            pass

    assert str(raised.value) == (
        "Actor 'index_\\udcff' has a lock, but its name holds a lone surrogate: UTF-8 cannot encode it, and the "
        "lock store records it as UTF-8 text. Give the actor a name of valid Unicode text (actor_name=...)."
    )
    assert "index_\udcff" not in stub_env.broker.actors


def test_a_message_id_with_a_lone_surrogate_fails_the_send_and_enqueues_nothing(env, caplog):
    # Issue 32 (4): a message built by hand with such an id: redis-py's UnicodeEncodeError escaped
    # before_enqueue, Dramatiq logged it at CRITICAL and enqueued the message with no lock, so the
    # same job sent again was enqueued too.
    runs = []

    @env.actor(lock="until_executed")
    def index(path):
        runs.append(path)

    message = index.message("report.csv").copy(message_id="job-\udcff")
    for _ in range(2):
        with pytest.raises(LockArgumentsError) as raised:
            env.broker.enqueue(message)
        assert str(raised.value) == (
            "Message 'job-\\udcff' of actor 'index' has message_id='job-\\udcff', which holds a lone surrogate: "
            "UTF-8 cannot encode it, and the lock store records it as UTF-8 text. The message was not enqueued and "
            "no lock was taken."
        )
    assert env.seen.enqueues == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert enqueue_outcome(index.send("report.csv")).enqueued  # nothing was locked
    env.worker()
    env.join(index)
    assert runs == ["report.csv"]


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        # Issue 32 (4): Dramatiq logged redis-py's UnicodeEncodeError at CRITICAL and enqueued the message unlocked.
        (
            "lock_prefix",
            "billing:\udcff",
            "it holds a lone surrogate, which UTF-8 cannot encode, and the lock store's keys are UTF-8 text.",
        ),
        # Issue 32 (5): LockBackendError "value is not an integer or out of range", naming no option; with
        # 2**63, a negative lifetime and no lock.
        ("lock_ttl", 2**63, "it must be at most 1_000_000_000_000_000 (milliseconds, over 31,688 years), or None."),
        (
            "debounce_cap",
            10**30,
            "it must be at most 1_000_000_000_000_000 (milliseconds, over 31,688 years), or None.",
        ),
        ("reschedule_delay", 10**16, "it must be at most 1_000_000_000_000_000 (milliseconds, over 31,688 years)."),
    ],
)
def test_a_message_option_the_lock_store_cannot_take_fails_the_send_and_enqueues_nothing(env, option, value, problem):
    runs = []

    @env.actor(lock="until_executed", on_conflict={"client": "replace"}, debounce=50)
    def push_profile(user_id):
        runs.append(user_id)

    with pytest.raises(InvalidLockOptions) as raised:
        push_profile.send_with_options(args=(7,), **{option: value})
    text = str(raised.value)
    assert text.startswith("Actor 'push_profile' (options of message '")
    assert text.endswith(f") has an invalid {option}={value!r}: {problem}")
    assert env.seen.enqueues == []
    assert enqueue_outcome(push_profile.send(7)).enqueued  # nothing was locked
    env.worker()
    env.join(push_profile)
    assert runs == [7]


def test_the_longest_lock_ttl_locks_and_a_longer_delay_is_cut_to_it(env):
    # Issue 32 (5): the bound keeps a lock_ttl of centuries working; a caller's delay is Dramatiq's,
    # and added to the lock_ttl past the bound it made the send raise LockBackendError.
    @env.actor(lock="until_executed", lock_ttl=LONGEST_LOCK_DURATION)
    def archive(year):
        pass

    assert enqueue_outcome(archive.send(2026)).enqueued
    assert not enqueue_outcome(archive.send(2026)).enqueued
    assert enqueue_outcome(archive.send_with_options(args=(2027,), delay=2**70)).enqueued
    assert not enqueue_outcome(archive.send(2027)).enqueued


def test_replace_for_one_message_of_an_actor_without_a_lock_fails_the_send(env):
    # Issue 32 (8): refused for an actor whose lock has another strategy, it passed for an actor with none;
    # replace is chosen for a whole actor.
    runs = []

    @env.actor
    def export_report(report_id):
        runs.append(report_id)

    with pytest.raises(InvalidLockOptions) as raised:
        export_report.send_with_options(args=(7,), lock="until_executed", on_conflict={"client": "replace"})
    text = str(raised.value)
    assert text.startswith("Actor 'export_report' (options of message '")
    assert text.endswith(
        ") uses on_conflict={'client': 'replace'}, and its actor has no lock: the client strategy 'replace' can "
        "only be "
        "chosen for a whole actor, in its options or the middleware's."
    )
    assert env.seen.enqueues == []
    assert enqueue_outcome(export_report.send_with_options(args=(7,), lock="until_executed")).enqueued
    env.worker()
    env.join(export_report)
    assert runs == [7]


class _Exploding(dict):
    def items(self):
        raise RuntimeError("boom")


@pytest.mark.parametrize(
    ("argument", "cause"),
    [({1, 2}, "not JSON-serialisable"), (_Exploding(a=1), "RuntimeError: boom")],
)
def test_arguments_dramatiq_cannot_encode_fail_the_send_and_enqueue_nothing(env, argument, cause):
    # D6: a clear LockArgumentsError naming the actor and the cause, not a raw error from the encoder.
    @env.actor(lock="until_executed")
    def job(value):
        pass

    with pytest.raises(LockArgumentsError, match=f"'job'.*{cause}"):
        job.send(argument)
    assert env.waiting(job) == 0


# Message options (issue 9, item 6) -------------------------------------------------------------


def test_lock_args_method_cannot_be_sent_with_a_message(env):
    # D5 + D6: a clear error naming the actor and the option, not the encoder's raw TypeError.
    runs = []

    @env.actor(lock="until_executed")
    def job(x):
        runs.append(x)

    with pytest.raises(InvalidLockOptions) as excinfo:
        job.send_with_options(args=(1,), lock_args_method=lambda x: [x])
    text = str(excinfo.value)
    assert "'job'" in text and "lock_args_method" in text and "on the actor" in text
    assert env.waiting(job) == 0
    assert enqueue_outcome(job.send(1)).enqueued  # and nothing was locked
    env.worker()
    env.join(job)
    assert runs == [1]


def test_a_misspelt_message_option_is_logged_once_with_the_right_name(env, caplog):
    # D5: Dramatiq stores message options unchecked, so a misspelt lock option would be ignored silently.
    class Concurrency(dramatiq.Middleware):
        actor_options = {"locks"}

    env.broker.add_middleware(Concurrency())

    @env.actor(lock="until_executed")
    def job(x):
        pass

    @env.actor(lock="until_executed")
    def other(x):
        pass

    for x in range(3):
        assert enqueue_outcome(job.send_with_options(args=(x,), lock_tll=5000)).enqueued
    other.send_with_options(args=(1,), lock_tll=5000)
    # Options of other middleware, declared or not, and options not close to ours are not ours to judge.
    job.send_with_options(args=(9,), max_retries=0, time_limit=1000, locks=2, tenant="acme", clock="utc", delay=10)
    job.send_with_options(args=(10,), on_conflcit="raise")

    warnings = unique_warnings(caplog)
    assert len(warnings) == 3, warnings
    assert "'job'" in warnings[0] and "'lock_tll'" in warnings[0] and "'lock_ttl'" in warnings[0]
    assert "'other'" in warnings[1] and "'lock_tll'" in warnings[1]
    assert "'on_conflcit'" in warnings[2] and "'on_conflict'" in warnings[2]


def test_deeply_nested_arguments_are_locked_as_before(stub_env):
    # P5 (issue 11): the shortcut walks the value in Python, which runs out of stack long
    # before Dramatiq's JSON encoder does: such a value still gets the digest of the round trip.
    env = stub_env
    value: list = []
    for _ in range(600):
        value = [value]

    @env.actor(lock="until_executed")
    def job(tree):
        pass

    through_json = json.loads(json.dumps(value, separators=(",", ":")))
    expected = json.dumps(through_json, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected.encode("utf-8", "surrogatepass")
    assert enqueue_outcome(job.send(value)).enqueued
    assert not enqueue_outcome(job.send(value)).enqueued


def test_a_lock_ttl_that_looks_like_seconds_is_logged_once_per_actor(env, caplog):
    # Issue 19, point 4: lock_ttl=60 written in seconds, as Sidekiq users do, is 60 ms; it was silent.
    @env.actor(lock="until_executed", lock_ttl=60)
    def settle(event_id):
        pass

    @env.actor(lock="until_executed", lock_ttl=60_000)
    def refund(event_id):
        pass

    settle.send("evt_1")
    settle.send("evt_2")
    message = refund.send_with_options(args=("evt_3",), lock_ttl=30)
    refund.send_with_options(args=("evt_4",), lock_ttl=30)
    assert unique_warnings(caplog) == [
        "Actor 'settle' has lock_ttl=60: lock_ttl is in milliseconds, so its lock lapses 60 ms after it is taken. "
        "For 60 seconds, write lock_ttl=60_000. This is logged once per actor.",
        f"Actor 'refund' (options of message {message.message_id!r}) has lock_ttl=30: lock_ttl is in milliseconds, "
        "so its lock lapses 30 ms after it is taken. For 30 seconds, write lock_ttl=30_000. "
        "This is logged once per actor.",
    ]


def test_a_middleware_lock_ttl_that_looks_like_seconds_is_logged(caplog):
    UniqueJobs(backend=StubBackend(), lock="until_executed", lock_ttl=999)
    UniqueJobs(backend=StubBackend(), lock="until_executed", lock_ttl=1000)
    UniqueJobs(backend=StubBackend(), lock_ttl=5)  # no lock by default: an actor with one is told
    assert unique_warnings(caplog) == [
        "UniqueJobs has lock_ttl=999: lock_ttl is in milliseconds, so its lock lapses 999 ms after it is taken. "
        "For 999 seconds, write lock_ttl=999_000. This is logged once per actor."
    ]


def test_middleware_durations_that_look_like_seconds_are_logged(caplog):
    # Issue 32 (8): reaper_interval=600, meant as ten minutes, ran the reaper every 0.6 s, and said nothing.
    UniqueJobs(backend=StubBackend(), reaper=True, reaper_interval=600)
    UniqueJobs(backend=StubBackend(), lease_period=60, heartbeat_interval=20)
    # A deliberate short heartbeat, and a reaper interval that no reaper uses, are not seconds.
    UniqueJobs(backend=StubBackend(), lease_period=1500, heartbeat_interval=500, reaper_interval=600)
    assert unique_warnings(caplog) == [
        "UniqueJobs has reaper_interval=600: reaper_interval is in milliseconds, so the reaper runs every 600 ms. "
        "For 600 seconds, write reaper_interval=600_000.",
        "UniqueJobs has lease_period=60: lease_period is in milliseconds, so a run lock is held 60 ms without a "
        "renewal. For 60 seconds, write lease_period=60_000.",
        "UniqueJobs has heartbeat_interval=20: heartbeat_interval is in milliseconds, so a worker sends a heartbeat "
        "every 20 ms. For 20 seconds, write heartbeat_interval=20_000.",
    ]


@pytest.mark.parametrize(
    ("option", "value", "problem"),
    [
        # Issue 32 (5): lease_period=10**13 was taken, and a worker's stop raised OverflowError (a wait
        # longer than Python takes).
        ("lease_period", 10**13, "it must be at most 1_000_000_000_000 (milliseconds, over 31 years)."),
        ("heartbeat_interval", 10**13, "it must be at most 1_000_000_000_000 (milliseconds, over 31 years)."),
        ("reaper_interval", 10**13, "it must be at most 1_000_000_000_000 (milliseconds, over 31 years), or None."),
        ("reaper", "no", "it must be True or False."),
        ("activity", "no", "it must be True or False."),
        ("activity", 0, "it must be True or False."),
        ("reaper_queue", "", "it must be the name of a queue, a non-empty string."),
        ("reaper_queue", None, "it must be the name of a queue, a non-empty string."),
    ],
)
def test_the_middlewares_own_switches_and_queue_are_checked(option, value, problem):
    # Issue 18 review: these were not checked, so activity="no" silently meant True.
    with pytest.raises(InvalidLockOptions) as raised:
        UniqueJobs(backend=StubBackend(), **{option: value})
    assert str(raised.value) == f"UniqueJobs has an invalid {option}={value!r}: {problem}"
