from __future__ import annotations

from .reject import Reject


class Wait(Reject):
    """Wait in line: the duplicate waits in the lock's line, in the order the
    duplicates came, and is enqueued the moment a place frees up, by the step
    that frees it. On the client ``send()`` returns normally with status
    ``"waiting"``; in the worker the message leaves its queue for the line.

    At most ``line_limit`` messages wait; a duplicate that finds the line full
    goes to the dead-letter queue, as with ``reject``.
    """

    name = "wait"
    waits_in_line = True
    # A duplicate that cannot wait (the line is full) is dealt with as reject deals with one.

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        return "wait in line, to be enqueued when a slot frees up (the dead-letter queue when the line is full)"


class KeepLatest(Wait):
    """Keep the latest: one duplicate waits as the successor of the holders,
    and a newer one takes its place, so the successor always has the latest
    arguments. It is enqueued when a place frees up; the one it replaced is
    dropped (its ``send()`` returned ``"waiting"``).
    """

    name = "keep_latest"
    keeps_latest = True

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        return "wait as the one successor, to be enqueued when a slot frees up (a newer one replaces it)"
