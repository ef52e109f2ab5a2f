"""What every conflict strategy has in common."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from dramatiq import Broker

from ..outcome import AnyMessage

#: A conflict found in ``before_enqueue``, in the process that sends.
CLIENT = "client"
#: A conflict found in ``before_process_message``, in the worker.
SERVER = "server"


@dataclass(frozen=True, kw_only=True)
class Conflict:
    """A message that could not take its lock because other messages hold it.

    Parameters:
      broker(dramatiq.Broker): The broker the message goes through.
      message(dramatiq.Message): The duplicate.
      digest(str): The lock's digest.
      holders(tuple[str]): The message_ids holding the lock.
      side(str): ``"client"`` or ``"server"``.
      logger(logging.Logger): The middleware's logger.
      delay(int): The delay the duplicate was sent with, in milliseconds, if any.
      reschedule_delay(int): The duplicate's ``reschedule_delay``, in milliseconds.
      max_reschedules(int): The duplicate's ``max_reschedules``; ``None`` for no limit.
      emit(collections.abc.Callable): Called with an event kind and its fields
        (``holders``, ``delay``, ``reason``) to tell the lock's event subscribers.
      release_enqueue_lock(collections.abc.Callable): Gives up the enqueue lock the
        duplicate holds, if any: in the worker, before it leaves for good.
    """

    broker: Broker
    message: AnyMessage
    digest: str
    holders: tuple[str, ...]
    side: str
    logger: logging.Logger
    delay: int | None = None
    reschedule_delay: int
    max_reschedules: int | None
    emit: Callable[..., None]
    release_enqueue_lock: Callable[[], None]

    def log(self, level: int, outcome: str, strategy: str) -> None:
        """Log the one line that says what became of the duplicate, and why."""
        message_id = self.message.message_id
        if message_id in self.holders:
            # A redelivery met the run lock of its own earlier attempt: it waits for that attempt.
            others = "".join(f" and by message {holder!r}" for holder in self.holders if holder != message_id)
            self.logger.log(
                level,
                "Message %r of actor %r %s: lock %r is held by its own earlier attempt%s, "
                "until that attempt finishes or its lease runs out (strategy %r).",
                message_id,
                self.message.actor_name,
                outcome,
                self.digest,
                others,
                strategy,
            )
            return
        self.logger.log(
            level,
            "Message %r of actor %r %s: lock %r is held by message %s (strategy %r).",
            message_id,
            self.message.actor_name,
            outcome,
            self.digest,
            ", ".join(map(repr, self.holders)),
            strategy,
        )


class ConflictStrategy:
    """What becomes of a duplicate.

    The client method runs in ``before_enqueue``: it raises
    :class:`~dramatiq_unique.errors.EnqueueCancelled` to drop the duplicate
    with ``send()`` returning normally, raises another
    :class:`~dramatiq.middleware.MiddlewareError` to make ``send()`` raise, or
    returns to let the duplicate be enqueued as it now is (``reject`` marks it
    for the dead-letter queue). The server method runs in
    ``before_process_message`` and must stop the message from running, e.g.
    by raising :class:`dramatiq.middleware.SkipMessage`.

    Register your own with :func:`~dramatiq_unique.register_strategy`.
    """

    #: The name used in ``@dramatiq.actor(on_conflict=...)``.
    name: ClassVar[str]
    #: Where the strategy can be used, a subset of ``{"client", "server"}``.
    sides: ClassVar[frozenset[str]] = frozenset({CLIENT, SERVER})
    #: Whether a new message takes the place of a queued holder at enqueue
    #: instead of meeting a conflict (``replace``).
    replaces_queued_holders: ClassVar[bool] = False
    #: Whether the duplicate is dropped. A message that a group or a pipeline
    #: waits for is rescheduled instead, so the group completes and the
    #: pipeline goes on.
    drops_duplicates: ClassVar[bool] = False
    #: Whether ``send()`` raises on a client conflict. Where Dramatiq itself
    #: enqueues (a due delayed message, a pipeline's next step) nobody would
    #: see the error, so the duplicate is rescheduled instead.
    fails_send: ClassVar[bool] = False
    #: Whether the duplicate waits in the lock's line, to be enqueued when a place frees up.
    #: The strategy's conflict methods then deal with a duplicate that cannot wait.
    waits_in_line: ClassVar[bool] = False
    #: Whether the line holds one message, whose place the newest takes (``keep_latest``).
    keeps_latest: ClassVar[bool] = False
    #: Whether a duplicate that meets running holders in the run lock asks them to stop
    #: (``cancel_in_progress``); it needs a lock type that takes a run lock.
    cancels_running_holders: ClassVar[bool] = False

    def on_client_conflict(self, conflict: Conflict) -> None:
        """Resolve a conflict found when the duplicate was sent."""
        raise TypeError(f"The {self.name!r} strategy cannot be used on the client side.")

    def on_server_conflict(self, conflict: Conflict) -> None:
        """Resolve a conflict found when the duplicate was about to run."""
        raise TypeError(f"The {self.name!r} strategy cannot be used on the server side.")

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        """What becomes of a duplicate, worded to follow "would" in what
        :meth:`~dramatiq_unique.Locks.explain` says, e.g. ``"be dropped"``.

        A strategy of your own without this method is described by its name.

        Parameters:
          side(str): ``"client"`` for a duplicate sent, ``"server"`` for one about to run.
          reschedule_delay(int): The actor's ``reschedule_delay``, in milliseconds.
          max_reschedules(int): The actor's ``max_reschedules``; ``None`` for no limit.
        """
        return f"be left to strategy {self.name!r}"
