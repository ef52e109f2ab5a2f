"""Testing your actors with StubBackend: unit tests of locked actors with no Redis.

    python examples/testing_with_stub_backend.py   # runs the tests below with pytest
    python -m pytest examples/testing_with_stub_backend.py

In your project the broker setup lives in its own module and the tests in tests/; see
docs/testing.md. Here they share one file so that it runs on its own.
"""

import sys
import threading
import time

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit

from dramatiq_unique import StubBackend, UniqueJobs, current_lock, enqueue_outcome

# The application: the broker and the middleware first, then the actors.
broker = StubBroker()
broker.emit_after("process_boot")
lock_backend = StubBackend()
unique = UniqueJobs(backend=lock_backend)
broker.add_middleware(unique, before=TimeLimit)
dramatiq.set_broker(broker)

settled = []  # stands for your payments table
attempts = []  # (event_id, fencing token) of every attempt
syncs = []  # message_id of every sync that ran
sync_started = threading.Event()
sync_may_finish = threading.Event()


@dramatiq.actor(
    queue_name="payments",
    lock="until_executed",
    lock_args_method=lambda event_id, payload=None: [event_id],
)
def settle_payment(event_id, payload=None):
    attempts.append((event_id, current_lock().token))
    if payload == "fail once" and len(attempts) == 1:
        raise ConnectionError("the payment provider timed out")
    settled.append(event_id)


@dramatiq.actor(lock="while_executing")
def sync_account_balance(account_id):
    syncs.append(current_lock().message_id)
    sync_started.set()
    sync_may_finish.wait(5)


# The fixtures -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean():
    broker.flush_all()  # empty the queues
    lock_backend.flush()  # and drop every lock, so that no test sees another's
    settled.clear()
    attempts.clear()
    syncs.clear()
    sync_started.clear()
    sync_may_finish.clear()


@pytest.fixture
def start_worker():
    workers = []

    def start():
        worker = Worker(broker, worker_timeout=100)
        worker.start()
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


def run_until_done(worker, actor):
    broker.join(actor.queue_name)  # every message processed, retries included
    worker.join()  # and the worker idle


# The tests ----------------------------------------------------------------------------


def test_a_second_delivery_is_not_enqueued():
    first = settle_payment.send("evt_123", {"delivery": 1})
    second = settle_payment.send("evt_123", {"delivery": 2})

    assert enqueue_outcome(first).enqueued
    assert enqueue_outcome(second).status == "duplicate"
    assert enqueue_outcome(second).holder == first.message_id
    assert broker.queues["payments"].qsize() == 1


def test_the_event_is_settled_once_then_the_lock_lifts(start_worker):
    settle_payment.send("evt_123")
    settle_payment.send("evt_123")
    # After the sends: else the first might be done before the second is sent.
    worker = start_worker()
    run_until_done(worker, settle_payment)

    assert settled == ["evt_123"]
    assert enqueue_outcome(settle_payment.send("evt_123")).enqueued


def test_a_retry_keeps_the_lock_and_its_token(start_worker):
    # Retries waits 15 s before a first retry by default; a test wants milliseconds.
    first = settle_payment.send_with_options(
        args=("evt_123", "fail once"), min_backoff=10, max_backoff=10
    )
    worker = start_worker()
    run_until_done(worker, settle_payment)

    token = enqueue_outcome(first).token
    assert attempts == [("evt_123", token), ("evt_123", token)]
    assert settled == ["evt_123"]


def test_a_copy_that_starts_while_another_runs_is_dropped(start_worker):
    conflicts = []
    unique.subscribe("conflict", conflicts.append)
    try:
        worker = start_worker()
        first = sync_account_balance.send(42)
        assert sync_started.wait(5)  # the first copy runs and holds the run lock
        # Queued: while_executing takes nothing at send().
        second = sync_account_balance.send(42)
        wait_for(lambda: conflicts)
        sync_may_finish.set()
        run_until_done(worker, sync_account_balance)
    finally:
        unique.unsubscribe("conflict", conflicts.append)

    seen = [(event.message_id, event.side, event.holders) for event in conflicts]
    assert seen == [(second.message_id, "server", (first.message_id,))]
    assert syncs == [first.message_id]


def wait_for(condition, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(
        pytest.main(
            [
                __file__,
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "console_output_style=classic",
            ]
        )
    )
