"""A message's call as a person reads it, cut to a bound: what a holder keeps in its lock
(``lock_info``) and what the views show of a message read from the broker."""

from __future__ import annotations

from typing import Any

from .digest import encodes_as_utf8

#: What ends a call cut to its bound.
ELLIPSIS = "…"


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


def _short_repr(value: Any, bound: int) -> str:
    """``repr(value)``, of a long string only as much as a call of ``bound`` characters shows."""
    if isinstance(value, str) and len(value) > bound:
        return repr(value[:bound])
    return repr(value)
