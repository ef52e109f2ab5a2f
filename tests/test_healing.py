"""The healing of a lock store that lost its data, round by round (issue 20, second review): a loss
found while a round runs, a second loss while it heals, a failure after the hold, a hand-over
during a round, and the marks of the sending threads under gevent."""

from __future__ import annotations

import json
import time

import pytest

from dramatiq_unique import RedisBackend, UniqueJobs
from dramatiq_unique.backends import Holder
from dramatiq_unique.errors import LockBackendError, LockStoreHealing

from .test_data_loss import store  # noqa: F401  (fixture)

PREFIX = "dramatiq-unique"
REFUSING = f"{PREFIX}:refusing"


def _healing(client, interval=100):
    return UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=interval).healing


def test_a_second_loss_while_healing_is_recorded_as_healed(store):  # noqa: F811
    # The healer finds a second loss while it heals the first: it begins again with the marks of
    # the second loss, and records those as healed, so a worker that found the second loss and
    # watched heals nothing again (new places are not refused a second time).
    client = store.client()
    healer, other = _healing(client), _healing(client)
    assert healer(True)  # loss 1
    client.flushall()  # loss 2, during the healing
    marks2 = json.dumps(healer.backend.epochs(PREFIX), sort_keys=True)  # the healer's heartbeat finds it
    assert healer(True)
    assert healer(False)  # its next round: it holds the healing lock again
    assert other(True)  # found loss 2 too: watches
    time.sleep(0.25)
    assert not healer(False)  # healed
    healed = client.get(f"{PREFIX}:healed").decode()
    assert not other(False), f"the watcher heals loss 2 a second time (healed {healed}, loss 2 {marks2})"
    assert not client.exists(REFUSING)


def test_a_second_loss_while_healing_makes_two_healers(store):  # noqa: F811
    # The healing lock went with the data: the healer takes it back before it begins again, and if a
    # worker that found the second loss took it first, the healer only watches: one heals.
    client = store.client()
    healer, other = _healing(client), _healing(client)
    assert healer(True)
    assert other(True)  # watches loss 1
    client.flushall()
    healer.backend.epochs(PREFIX)
    assert healer(True)  # begins again, as the owner
    assert other(True)
    assert not (healer._owner and other._owner), "two workers heal at once"


def test_a_failure_after_the_hold_records_an_empty_healed_mark(store):  # noqa: F811
    # A failure between taking the healing lock and beginning (here get_value; also epochs, or a
    # refusal that fails as a cluster master is unreachable) gives the lock up: the next round
    # starts over, with the "healed already" check, the marks and the time it began.
    client = store.client()
    healer, late = _healing(client), _healing(client)
    real = healer.backend.get_value
    failed = []

    def flaky(key):
        if not failed:
            failed.append(key)
            raise LockBackendError("blip")
        return real(key)

    healer.backend.get_value = flaky
    assert healer(True)  # the blip: tries again
    while healer(False):
        time.sleep(0.1)
    assert client.get(f"{PREFIX}:healed") not in (None, b""), "no marks recorded as healed"
    # A worker that finds the same loss late does not refuse new places again.
    assert not late(True)
    assert not client.exists(REFUSING)


def test_a_loss_found_while_the_last_round_runs_is_never_healed(store):  # noqa: F811
    # Under gevent each round runs in a hub greenlet: a loss found while the previous round is still
    # at work (a network wait) is kept for the next round, which heals it; the runtime is asked to
    # call again until then.
    client = store.client()
    healer = _healing(client)
    assert healer(True)
    time.sleep(0.25)
    real_accept = healer.backend.accept_new_places
    answers = []

    def accept_while_another_round_comes(prefix):
        real_accept(prefix)
        client.flushall()  # loss 2
        healer.backend.epochs(PREFIX)  # the native thread's heartbeat finds it ...
        answers.append(healer(True))  # ... and its round enters the hub while this one waits

    healer.backend.accept_new_places = accept_while_another_round_comes
    done = healer(False)
    assert answers == [True]
    assert done, "the round that ends answers False although a new loss was found meanwhile"


def test_hand_over_during_a_round_leaves_a_30s_refusal(store):  # noqa: F811
    # Under gevent, hand_over runs in the native periodic thread as the last Worker stops, while a
    # round may still run in the hub: that round hands the healing over as it ends, and the
    # refusal ends within three heartbeat intervals, not UNHEALED_REFUSAL.
    client = store.client()
    healer = _healing(client, interval=1000)
    real = healer.backend.get_value

    def get_value_while_the_worker_stops(key):
        healer.hand_over()  # the native thread, concurrently
        return real(key)

    healer.backend.get_value = get_value_while_the_worker_stops
    healer(True)
    assert 0 < client.pttl(REFUSING) <= 3000, client.pttl(REFUSING)


def test_gevent_main_backend_forgets_the_mark_forever(store, monkeypatch):  # noqa: F811
    # Under gevent the heartbeat reads the marks on the native backend; the last Worker's stop makes
    # the sending threads' backend forget them too, and a Worker that boots again has it read them:
    # a loss is refused in the same step again.
    import dramatiq_unique.runtime as runtime_module

    monkeypatch.setattr(runtime_module, "gevent_patched", lambda: True)
    client = store.client()
    middleware = UniqueJobs(backend=RedisBackend(client=client), heartbeat_interval=100)
    runtime = middleware.runtime
    assert runtime._native_backend is not None
    first, second = object(), object()
    runtime.worker_booted(first)
    runtime.worker_stopped(first)  # the last Worker stops: the process forgets the marks
    runtime.worker_booted(second)  # another Worker boots in the process
    try:
        client.flushall()
        holder = Holder("m1", "settle", "default", "until_executed", "queued")
        with pytest.raises(LockStoreHealing):
            middleware.backend.acquire(f"{PREFIX}:{{d1}}", "m1", limit=1, ttl=None, holder=holder)
    finally:
        runtime.worker_stopped(second)
