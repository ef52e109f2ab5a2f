"""The digest: what makes two messages "the same job" (SPEC D1-D3)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from dramatiq.common import q_name

from .errors import LockArgumentsError


def lock_arguments(
    actor_name: str,
    lock_args_method: Callable[..., Any] | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """Return the value that decides uniqueness: ``lock_args_method(*args, **kwargs)``,
    or all the arguments when the actor has no such method.

    Raises:
      LockArgumentsError: If ``lock_args_method`` raises.
    """
    if lock_args_method is None:
        return [list(args), kwargs]
    try:
        return lock_args_method(*args, **kwargs)
    except Exception as e:
        raise LockArgumentsError(
            f"The lock_args_method of actor {actor_name!r} raised {type(e).__name__}: {e}. "
            "The message was not enqueued and no lock was taken."
        ) from e


def compute_digest(
    *,
    actor_name: str,
    queue_name: str,
    lock_args: Any,
    unique_across_actors: bool,
    unique_across_queues: bool,
) -> str:
    """Hash the actor, the canonical queue and the lock arguments with SHA-256.

    The hex digest is the only part of a lock key derived from the
    arguments, so argument values can never steer key names.

    Raises:
      LockArgumentsError: If the lock arguments are not JSON-serialisable.
    """
    identity = [
        None if unique_across_actors else actor_name,
        None if unique_across_queues else q_name(queue_name),
        lock_args,
    ]
    try:
        canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise LockArgumentsError(
            f"The lock arguments of actor {actor_name!r} are not JSON-serialisable ({e}). "
            "Return plain JSON values from lock_args_method. The message was not enqueued and no lock was taken."
        ) from e
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
