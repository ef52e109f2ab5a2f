"""A message's call as a person reads it, cut to a bound: what a holder keeps in its lock
(``lock_info``) and what the views show of a message read from the broker."""

from __future__ import annotations

import functools
import reprlib
from typing import Any

from .digest import encodes_as_utf8

#: What ends a call cut to its bound.
ELLIPSIS = "…"
#: At most how many characters of a message's call a log line and the conflict trail show.
CALL_SHOWN = 200


def message_call(message: Any, bound: int = CALL_SHOWN) -> str:
    """:func:`short_call` of a Dramatiq message; ``actor(…)`` when an argument cannot be written."""
    call = short_call(message.actor_name, message.args, message.kwargs, bound)
    return call if call is not None else f"{message.actor_name}({ELLIPSIS})"


def short_call(actor_name: str, args: Any, kwargs: Any, bound: int) -> str | None:
    """A message's call as Dramatiq's ``str(message)`` writes it, ``reindex('acme', 200)``, of at
    most ``bound`` characters: a longer one is cut, and ends with an ellipsis. ``None`` when an
    argument cannot be written (its ``repr`` raised)."""
    try:
        text, length = [f"{actor_name}("], len(actor_name) + 1
        params = [*args, *kwargs.items()] if kwargs else args
        for i, param in enumerate(params):
            if length > bound:
                break
            if i >= len(args):
                name, value = param
                shown = f"{name}={_short_repr(value, bound)}"
            else:
                shown = _short_repr(param, bound)
            shown = shown if i == 0 else ", " + shown
            text.append(shown)
            length += len(shown)
        text.append(")")
        call = "".join(text)
    except Exception:
        return None
    if len(call) > bound:
        call = call[: bound - 1] + ELLIPSIS
    # The lock store keeps UTF-8 text: a lone surrogate of an object's repr is written escaped.
    return call if encodes_as_utf8(call) else call.encode("utf-8", "backslashreplace").decode()


#: The types whose repr is short whatever their value.
_SHORT = frozenset({int, float, bool, type(None)})


def _short_repr(value: Any, bound: int) -> str:
    """``repr(value)``, of a long string or a large container only as much as a call of
    ``bound`` characters shows: a large argument costs no more to write than a small one."""
    kind = type(value)
    if kind in _SHORT:
        return repr(value)
    if kind is str:
        return repr(value if len(value) <= bound else value[:bound])
    return _shortener(bound).repr(value)


@functools.lru_cache(maxsize=8)
def _shortener(bound: int) -> reprlib.Repr:
    shortener = reprlib.Repr()
    shortener.maxlevel = 4
    shortener.maxstring = shortener.maxother = shortener.maxlong = bound
    shortener.maxlist = shortener.maxtuple = shortener.maxset = shortener.maxfrozenset = bound // 2
    shortener.maxdeque = shortener.maxarray = bound // 2
    shortener.maxdict = bound // 4
    return shortener
