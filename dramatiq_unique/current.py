"""The lock held by the message an actor is running."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from .errors import NoLockHeld


@dataclass(frozen=True)
class HeldLock:
    """A lock held by a running message.

    Parameters:
      digest(str): The digest that names the lock.
      token(int): The fencing token of this holder: it increases with every
        acquisition of the digest, so a resource that remembers the highest
        token it has seen can refuse writes from a stale holder.
      lock(str): The lock type, e.g. ``"while_executing"``.
      message_id(str): The message that holds it.
    """

    digest: str
    token: int
    lock: str
    message_id: str


_current: contextvars.ContextVar[HeldLock | None] = contextvars.ContextVar("dramatiq_unique_lock", default=None)


def current_lock() -> HeldLock | None:
    """Return the lock held by the message the calling actor is running.

    Examples:
      >>> @dramatiq.actor(lock="while_executing")
      ... def sync_account_balance(account_id):
      ...     lock = current_lock()
      ...     if lock is not None:
      ...         ledger.write(account_id, balance, fencing_token=lock.token)

    Returns:
      HeldLock: ``None`` outside an actor, for an actor without a lock, and
      for ``until_executing``, whose lock is given up before the actor runs.
    """
    return _current.get()


def require_current_lock() -> HeldLock:
    """Return the lock held by the message the calling actor is running,
    for code that must not run without it.

    Examples:
      >>> @dramatiq.actor(lock="while_executing")
      ... def sync_account_balance(account_id):
      ...     ledger.write(account_id, balance, fencing_token=require_current_lock().token)

    Raises:
      NoLockHeld: Where :func:`current_lock` returns ``None``.
    """
    lock = _current.get()
    if lock is None:
        raise NoLockHeld(
            "No lock is held here: require_current_lock() works inside an actor whose message holds its lock "
            "while it runs (every lock type but until_executing)."
        )
    return lock


#: Sets the lock the message of this context holds: the context variable's own setter,
#: without a call of Python around it, as a worker sets it twice for every message.
_set_current_lock = _current.set
