"""The records a worker's hooks and send() build for every message without their dataclass's
__init__ (dramatiq_unique.frozen): each must be the object __init__ builds, field for field, so
that a field added to one of them, or a __post_init__, fails here rather than in a user's code."""

from __future__ import annotations

import dataclasses

import dramatiq
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker

from dramatiq_unique import StubBackend, UniqueJobs, current_lock, enqueue_outcome
from dramatiq_unique.backends import Holder


class RecordingBackend(StubBackend):
    """A StubBackend that keeps the holders it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: list[Holder] = []

    def acquire(self, key, owner, *, holder, **options):
        self.holders.append(holder)
        return super().acquire(key, owner, holder=holder, **options)


def rebuilt(record):
    """``record`` built again by its class's __init__, from every field: an AttributeError if one
    was never set."""
    cls = type(record)
    assert "__post_init__" not in vars(cls) and "__slots__" not in vars(cls)
    return cls(**{field.name: getattr(record, field.name) for field in dataclasses.fields(cls)})


def test_records_built_for_every_message_are_those_their_init_builds():
    broker = StubBroker()
    backend = RecordingBackend()
    middleware = UniqueJobs(backend=backend)
    broker.add_middleware(middleware)
    held = []

    @dramatiq.actor(broker=broker, lock="until_executed", actor_name="settle")
    def settle(event_id: str) -> None:
        held.append(current_lock())

    message = settle.send("e1")
    outcome = enqueue_outcome(message)
    unrecorded = enqueue_outcome(settle.message("e2"))
    proxy = MessageProxy(message)
    middleware.before_process_message(broker, proxy)
    settle(*message.args)
    middleware.after_process_message(broker, proxy, result=None)
    broker.close()

    [holder] = backend.holders
    for record in (holder, outcome, unrecorded, held[0]):
        assert record is not None
        assert rebuilt(record) == record and vars(rebuilt(record)) == vars(record)
