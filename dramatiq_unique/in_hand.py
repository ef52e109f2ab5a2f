"""The messages in a worker process's hands: received from the broker and
not yet acknowledged.

RabbitMQ cannot be asked whether it still has a message: it counts the
messages waiting in a queue, and a message a worker has received is no
longer among them. So that the orphan reaper can tell a lost message from one
in a worker's hands, each worker process on such a broker publishes with every
heartbeat the ids of the locked messages it holds (see
:meth:`~dramatiq_unique.backends.LockBackend.messages_in_hand`). A message is in
a worker's hands:

* from its delivery to the work queue of a Worker, until a worker thread takes
  it (read from the work queue itself, where no hook sees it);
* from ``before_process_message`` until it is acknowledged or rejected;
* from ``before_delay_message`` (a delayed message held until due) until it
  is acknowledged, once its copy has been enqueued again.

Deliveries are told apart, not message ids: the copy of a retry may be
received, under the same id, before the delivery it comes from is acknowledged.

A worker thread takes a message from the work queue a moment before
``before_process_message``: a publication that may miss such a message says
it is not complete, and the reaper then waits for the next one.
"""

from __future__ import annotations

import threading
from typing import Any

from .backends import MessagesInHand
from .native import gevent_patched
from .outcome import OUTCOME_OPTION, AnyMessage


def _locked(message: AnyMessage) -> bool:
    return OUTCOME_OPTION in message.options


class InHand:
    """Keeps count of the messages in this process's hands, once :meth:`start` was called.

    Parameters:
      interval(int): Milliseconds between two publications (the heartbeat interval).
    """

    def __init__(self, *, interval: int):
        self.interval = interval
        self.active = False
        self._mutex = threading.Lock()
        # Both are keyed by the delivery (the identity of its message proxy), not by the message
        # id: a retry, or a delayed message that is due, is received again under the same id
        # before the delivery it comes from is acknowledged.
        #: Deliveries taken from a work queue: -> (message id, whether it carries a lock).
        self._started: dict[int, tuple[str, bool]] = {}
        #: Locked deliveries a consumer holds until they are due: -> message id.
        self._delayed: dict[int, str] = {}
        #: The work queues of the booted Workers, by the Worker's identity.
        self._work_queues: dict[int, Any] = {}

    def start(self) -> None:
        """Keep count from now on: the broker cannot be asked for a message by its id."""
        self.active = True

    def watch(self, worker: object) -> None:
        """Read the work queue of ``worker``, a booted Worker."""
        work_queue = getattr(worker, "work_queue", None)
        if self.active and work_queue is not None:
            with self._mutex:
                self._work_queues[id(worker)] = work_queue

    def unwatch(self, worker: object) -> None:
        with self._mutex:
            self._work_queues.pop(id(worker), None)

    def delayed(self, message: AnyMessage) -> None:
        if self.active and _locked(message):
            with self._mutex:
                self._delayed[id(message)] = message.message_id

    def started(self, message: AnyMessage) -> None:
        if self.active:
            with self._mutex:
                self._started[id(message)] = (message.message_id, _locked(message))

    def left(self, message: AnyMessage) -> None:
        """This delivery of ``message`` was acknowledged or rejected: it is no longer in this worker's hands."""
        if self.active:
            with self._mutex:
                self._started.pop(id(message), None)
                self._delayed.pop(id(message), None)

    def reset_after_fork(self) -> None:
        self._mutex = threading.Lock()
        self._started, self._delayed, self._work_queues = {}, {}, {}

    def publication(self, taken_at: int) -> MessagesInHand | None:
        """The locked messages in this process's hands now; ``None`` when it keeps no count.

        Parameters:
          taken_at(int): A time of the backend's clock that is not yet past.
        """
        if not self.active:
            return None
        with self._mutex:
            work_queues = list(self._work_queues.values())
        waiting: list[AnyMessage] = []
        taken = 0  # taken from a work queue, and not yet done with
        complete = True
        for work_queue in work_queues:
            items, unfinished, consistent = _read(work_queue)
            # Dramatiq 2.0 queues (priority, message) pairs; later versions an item with a message.
            waiting += [item.message if hasattr(item, "message") else item[-1] for item in items]
            taken += unfinished - len(items)
            complete = complete and consistent
        waiting_deliveries = {id(message) for message in waiting}
        with self._mutex:
            started = dict(self._started)
            ids = {*self._delayed.values(), *(i for i, locked in started.values() if locked)}
        # Every delivery taken from a work queue before it was read must be known as started (or
        # be finished): one that a worker thread has taken but not yet begun is in no list.
        complete = complete and sum(1 for delivery in started if delivery not in waiting_deliveries) >= taken
        ids.update(message.message_id for message in waiting if _locked(message))
        return MessagesInHand(frozenset(ids), complete, taken_at, self.interval)


def held_by_live_workers(alive_until: dict[str, int], published: dict[str, MessagesInHand]) -> set[str]:
    """The ids of the messages in the hands of the workers of a registry, by what each published
    (see :meth:`~dramatiq_unique.backends.LockBackend.messages_in_hand`)."""
    return {message_id for worker in alive_until if worker in published for message_id in published[worker].message_ids}


def _read(work_queue: Any) -> tuple[list[Any], int, bool]:
    """The items waiting in a work queue, how many were put in it and are not yet done
    with, and whether the two were read at one moment."""
    if not gevent_patched():
        with work_queue.mutex:
            return list(work_queue.queue), work_queue.unfinished_tasks, True
    # In a gevent worker this runs in a native thread, which must not wait on the hub's
    # locks: the queue is read twice around the copy, which the GIL makes one step.
    before = work_queue.unfinished_tasks
    items = list(work_queue.queue)
    consistent = work_queue.unfinished_tasks == before and len(work_queue.queue) == len(items)
    return items, before, consistent
