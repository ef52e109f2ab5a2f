"""A message whose actor this worker does not declare (renamed or removed in a deploy).

Dramatiq sends it to the dead-letter queue as it takes it off the queue, before any hook that
starts a message: only ``after_nack`` sees it. The place it holds in its lock never frees itself
when a line handed it (such a place never lapses, so that the message it waits for is never
lost), and the orphan reaper, which finds the message gone from its queue but still in line, only
enqueues it again: without this step, every later message of that lock would wait for ever.
"""

from __future__ import annotations

import logging

from dramatiq.broker import MessageProxy

from .backends import LockBackend
from .errors import LockBackendError
from .held import QUEUED
from .keys import RUN, enqueue_key, run_key
from .locks import outlives_message
from .outcome import ENQUEUED, enqueue_outcome, plain_message


def give_up_places(
    backend: LockBackend, prefixes: tuple[str, ...], message: MessageProxy, logger: logging.Logger
) -> None:
    """Give up the place that ``message``, dead-lettered for want of its actor, holds in its lock,
    so that the next message in that lock's line is handed it; one WARNING names the actor and
    the lock.

    Only this copy's place goes: the one its line handed it, or the one it took when it was sent
    (told by their tokens), while it is still queued. Another copy of the message, which a worker
    that declares the actor may run, keeps its own. The lock is looked for under each lock prefix
    this process knows.

    Parameters:
      backend(LockBackend): The lock store.
      prefixes(tuple): The lock prefixes in use in this process.
      message(MessageProxy): The message Dramatiq dead-lettered.
      logger(logging.Logger): Where the WARNING goes.
    """
    sent = plain_message(message)
    outcome = enqueue_outcome(sent)
    digest = outcome.digest
    if not digest:
        return
    if outcome.handoff is not None:
        key_of, token = run_key if outcome.line == RUN else enqueue_key, outcome.handoff
    elif outcome.status == ENQUEUED and outcome.holder == sent.message_id and outcome.token is not None:
        key_of, token = enqueue_key, outcome.token
    else:
        return
    try:
        _, places = backend.read([key_of(prefix, digest) for prefix in prefixes])
        freed = [
            place.key
            for place in places
            if place.owner == sent.message_id
            and place.token == token
            and place.holder.get("state") == QUEUED
            and not outlives_message(place.holder.get("lock"))
            and backend.release_record(place.key, place.owner, place.record)
        ]
    except LockBackendError as e:
        logger.warning(
            "Message %r of actor %r, which this worker does not declare, went to the dead-letter queue, and its "
            "place in lock %r could not be given up: %s. The messages waiting in that lock's line wait until its "
            "lock_ttl or the orphan reaper frees it.",
            sent.message_id,
            sent.actor_name,
            digest,
            e,
        )
        return
    for key in freed:
        logger.warning(
            "Message %r of actor %r, which this worker does not declare, went to the dead-letter queue: it gave up "
            "its place in lock %r (key %r), which goes to the next message in the lock's line, if one waits.",
            sent.message_id,
            sent.actor_name,
            digest,
            key,
        )
