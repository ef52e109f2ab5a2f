"""Frozen dataclasses built for every message, in a worker's hooks or in ``send()``."""

from __future__ import annotations

from typing import Any, TypeVar

_T = TypeVar("_T")


def frozen_instance(cls: type[_T], values: dict[str, Any]) -> _T:
    """An instance of ``cls``, a frozen dataclass without slots or ``__post_init__``, with
    ``values``, one for every field: the same object its ``__init__`` builds, without setting
    each field apart through ``object.__setattr__``, which costs a microsecond for a few fields."""
    instance = object.__new__(cls)
    instance.__dict__.update(values)
    return instance
