"""Schedulers driving the orphan reaper (issue 19, point 4): the reaper actor takes the options of
the broker's other middleware, such as periodiq's ``periodic``, and periodiq schedules it."""

from __future__ import annotations

import logging
import signal

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from periodiq import PeriodiqMiddleware, Scheduler, cron

from dramatiq_unique import InvalidLockOptions, RedisBackend, StubBackend, UniqueJobs

from .support import plant_dead_workers_run_lock, scan_all, wait_for

DIGEST = "d" * 64
RUN_KEY = f"dramatiq-unique:{{{DIGEST}}}:run"


def held(backend) -> bool:
    return any(record.key == RUN_KEY for record in scan_all(backend))


@pytest.fixture
def periodiq_broker(redis_client):
    broker = RedisBroker(client=redis_client)
    backend = RedisBackend(client=redis_client)
    unique = UniqueJobs(backend=backend)
    broker.add_middleware(unique, before=TimeLimit)
    broker.add_middleware(PeriodiqMiddleware(skip_delay=30))
    dramatiq.set_broker(broker)
    yield broker, backend, unique
    broker.flush_all()
    broker.close()


def test_periodiq_schedules_the_reaper_declared_with_its_periodic_option(periodiq_broker, caplog):
    broker, backend, unique = periodiq_broker
    caplog.set_level(logging.INFO)
    reaper = unique.declare_reaper(broker, periodic=cron("* * * * *"))
    plant_dead_workers_run_lock(backend, DIGEST)
    assert held(backend)

    # What the periodiq command does once it imported the application: it schedules the actors
    # that have a periodic option, and sends those that are due now (every minute is, here).
    periodic_actors = [actor for actor in broker.actors.values() if "periodic" in actor.options]
    assert periodic_actors == [reaper]
    # It sets an alarm for its next minute; pytest-timeout's alarm and handler are put back.
    handler, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    try:
        Scheduler(actors=periodic_actors).schedule()
    finally:
        signal.setitimer(signal.ITIMER_REAL, *timer)
        signal.signal(signal.SIGALRM, handler)

    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        wait_for(lambda: not held(backend))
        broker.join(reaper.queue_name)
        worker.join()
    finally:
        worker.stop()
    lines = [record.getMessage() for record in caplog.records]
    # Periodiq's middleware saw a scheduled message, and the reaper released the dead worker's lock.
    assert any(line.startswith("Processing ") and "scheduled at" in line for line in lines), lines
    assert (
        "The orphan reaper inspected 1 holder of locks in 1 pass and released 1: 1 of dead workers, "
        "0 of messages that no longer exist." in lines
    )


def test_the_reaper_refuses_options_no_middleware_declares():
    broker = StubBroker()
    unique = UniqueJobs(backend=StubBackend())
    broker.add_middleware(unique, before=TimeLimit)
    with pytest.raises(InvalidLockOptions) as error:
        unique.declare_reaper(broker, periodic="*/10 * * * *")
    text, _, choices = str(error.value).partition(" Valid choices on this broker are: ")
    assert text == (
        "The reaper actor 'dramatiq_unique_reaper' has an invalid option periodic='*/10 * * * *': no middleware on "
        "this broker declares it. Add the middleware that does before the reaper is declared."
    )
    assert "'max_retries'" in choices and "'time_limit'" in choices and "'lock'" not in choices
    assert unique.reaper_actor is None and "dramatiq_unique_reaper" not in broker.actors


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("queue_name", "it is the middleware's reaper_queue: set UniqueJobs(reaper_queue=...) instead."),
        ("actor_name", "the reaper actor sets actor_name itself."),
        ("lock", "the reaper actor sets lock itself."),
    ],
)
def test_the_reaper_refuses_options_of_its_own(option, problem):
    broker = StubBroker()
    unique = UniqueJobs(backend=StubBackend())
    broker.add_middleware(unique, before=TimeLimit)
    with pytest.raises(InvalidLockOptions, match=problem.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        unique.declare_reaper(broker, **{option: "x"})


def test_the_reaper_keeps_the_options_it_was_declared_with():
    broker = StubBroker()
    unique = UniqueJobs(backend=StubBackend(), reaper=True)
    broker.add_middleware(unique, before=TimeLimit)
    broker.add_middleware(PeriodiqMiddleware())
    spec = cron("*/10 * * * *")
    reaper = unique.declare_reaper(broker, periodic=spec, max_retries=2)
    assert reaper.options["periodic"] is spec and reaper.options["max_retries"] == 2
    assert reaper.options["lock"] is None
    # The worker's own declaration, at boot, finds it declared.
    assert unique.declare_reaper(broker) is reaper
    assert unique.declare_reaper(broker, periodic=spec) is reaper
    with pytest.raises(InvalidLockOptions, match="already declared"):
        unique.declare_reaper(broker, periodic=cron("0 * * * *"))
