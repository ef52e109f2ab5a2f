"""What a child forked from this process starts afresh.

A child forked while another thread of the parent holds a mutex inherits the mutex held, by a
thread the child does not have: the child's first use of it would wait for ever. Nor are the
parent's threads, or the work queued for them, the child's. Each object that keeps such state
asks for a method of its own to be called in every child forked from then on
(:func:`reset_in_child`); one hook of the process calls them all, first thing in the child.
"""

from __future__ import annotations

import inspect
import os
import weakref
from collections.abc import Callable

#: What to call in a child, in the order asked: the object of a bound method is held weakly (and
#: ``None`` stands for a plain function), so that an object that is gone is skipped, and
#: forgotten as the list grows (a test suite builds thousands of middlewares). No weak reference
#: here has a callback: one called while the interpreter exits would fail on half-gone modules.
_RESETS: list[tuple[weakref.ref[object] | None, Callable[..., None]]] = []
#: How long the list may grow before the resets of objects that are gone are forgotten.
_prune_at = 64


def reset_in_child(reset: Callable[[], None]) -> None:
    """Call ``reset`` in every child forked from now on, before anything else runs there:
    a bound method for as long as its object lives, a function for ever."""
    global _prune_at
    if inspect.ismethod(reset):
        _RESETS.append((weakref.ref(reset.__self__), reset.__func__))
    else:
        _RESETS.append((None, reset))
    if len(_RESETS) >= _prune_at:
        _RESETS[:] = [entry for entry in _RESETS if entry[0] is None or entry[0]() is not None]
        _prune_at = max(64, 2 * len(_RESETS))


def _reset_all() -> None:
    for owner, function in list(_RESETS):
        if owner is None:
            function()
            continue
        target = owner()
        if target is not None:
            function(target)


os.register_at_fork(after_in_child=_reset_all)
