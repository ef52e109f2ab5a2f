from __future__ import annotations

from .base import CLIENT, Conflict
from .log import Log
from .wait import KeepLatest


class CancelInProgress(KeepLatest):
    """The newest message stops the one that runs. A duplicate that meets a
    running holder in the run lock asks it to stop, and waits as the one
    successor (as with ``keep_latest``: a newer one takes its place); the
    holder is interrupted with :class:`~dramatiq_unique.Cancelled` within about
    one heartbeat interval, and when it has stopped its release hands the place
    to the successor, so the two never run side by side. A message sent while a
    queued holder waits in the enqueue lock takes its place, as with
    ``replace``.

    It needs a run lock (``while_executing``, ``until_and_while_executing``),
    whose lease renewals carry the request to the holder's worker.
    """

    name = "cancel_in_progress"
    replaces_queued_holders = True
    cancels_running_holders = True

    def on_client_conflict(self, conflict: Conflict) -> None:
        # Every holder of the enqueue lock runs, or may not be replaced (a group waits for it).
        Log().on_client_conflict(conflict)

    def explain(self, side: str, *, reschedule_delay: int, max_reschedules: int | None) -> str:
        if side == CLIENT:
            return "replace a queued holder, or be dropped when every holder runs"
        return "ask the running holder to stop, and wait as the one successor to run once it has stopped"
