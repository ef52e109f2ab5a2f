from __future__ import annotations

from .base import CLIENT
from .log import Log


class Replace(Log):
    """The newest message wins: a message sent while the lock is
    full takes the place of the oldest queued holder, which is skipped when
    it reaches a worker. A holder that already runs is never interrupted:
    when every holder runs, the new message is dropped as with ``log``.

    Nothing is searched for in the broker: the replaced message stays in its
    queue until a worker skips it. With ``until_executed`` each message
    records that it runs when it starts, which costs one more round trip.
    """

    name = "replace"
    sides = frozenset({CLIENT})
    replaces_queued_holders = True
