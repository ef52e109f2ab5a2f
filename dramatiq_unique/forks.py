"""What a child forked from this process starts afresh.

A child forked while another thread of the parent holds a mutex inherits the mutex held, by a
thread the child does not have: the child's first use of it would wait for ever. Nor are the
parent's threads, or the work queued for them, the child's. Each object that keeps such state
asks for a method of its own to be called in every child forked from then on
(:func:`reset_in_child`); one hook of the process calls them all, first thing in the child.
"""

from __future__ import annotations

import inspect
import itertools
import os
import weakref
from collections.abc import Callable

#: What to call in a child, by registration: a bound method is held weakly, so that an object
#: that is gone is forgotten (a test suite builds thousands of middlewares).
_RESETS: dict[int, Callable[[], Callable[[], None] | None]] = {}
_NUMBERS = itertools.count()


def reset_in_child(reset: Callable[[], None]) -> None:
    """Call ``reset`` in every child forked from now on, before anything else runs there:
    a bound method for as long as its object lives, a function for ever."""
    number = next(_NUMBERS)
    if inspect.ismethod(reset):
        _RESETS[number] = weakref.WeakMethod(reset, lambda _: _RESETS.pop(number, None))
    else:
        _RESETS[number] = lambda: reset


def _reset_all() -> None:
    for find in list(_RESETS.values()):
        reset = find()
        if reset is not None:
            reset()


os.register_at_fork(after_in_child=_reset_all)
