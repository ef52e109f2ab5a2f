"""The digest: what makes two messages "the same job"."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from dramatiq.common import q_name

from .errors import LockArgumentsError

#: How much of the SHA-256 a digest keeps: with a billion locks held at once, two jobs share a
#: digest of 128 bits with a chance below one in 10^20.
DIGEST_BYTES = 16
#: The length of a digest: 16 bytes in base64url, without padding.
DIGEST_LENGTH = 22


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
        return [args, kwargs]
    try:
        return lock_args_method(*args, **kwargs)
    except Exception as e:
        raise LockArgumentsError(f"The lock_args_method of actor {actor_name!r} raised {type(e).__name__}: {e}.") from e


def compute_digest(
    *,
    actor_name: str,
    queue_name: str,
    lock_args: Any,
    unique_across_actors: bool,
    unique_across_queues: bool,
) -> str:
    """Hash the actor, the canonical queue and the lock arguments with SHA-256: the digest is its
    first 128 bits in base64url, 22 characters.

    The digest is the only part of a lock key derived from the
    arguments, so argument values can never steer key names.

    Raises:
      LockArgumentsError: If the lock arguments cannot be encoded as JSON.
    """
    try:
        identity = [
            None if unique_across_actors else actor_name,
            None if unique_across_queues else q_name(queue_name),
            lock_args,
        ]
        digest = hashlib.sha256(canonical_json(identity)).digest()[:DIGEST_BYTES]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    except (TypeError, ValueError, RecursionError) as e:
        raise _arguments_error(actor_name, "are not JSON-serialisable", e) from e
    except Exception as e:
        # E.g. a mapping whose items() raises: nothing but a MiddlewareError may escape a before_* hook.
        raise _arguments_error(actor_name, "could not be encoded as JSON", e) from e


def _arguments_error(actor_name: str, problem: str, cause: Exception) -> LockArgumentsError:
    return LockArgumentsError(
        f"The lock arguments of actor {actor_name!r} {problem} ({type(cause).__name__}: {cause}): "
        "the message's arguments, or what its lock_args_method returns, must be plain JSON values."
    )


def canonical_json(value: Any) -> bytes:
    """The canonical JSON of ``value`` as a worker receives it, in UTF-8.

    The value goes through Dramatiq's JSON encoding first, so values that
    arrive at a worker identical are one job: ``{1: "a"}`` and ``{"1": "a"}``,
    a tuple and a list, a surrogate pair and the character it stands for.
    Keys are then sorted. Non-ASCII characters stay unescaped and lone
    surrogates (``os.fsdecode`` of a non-UTF-8 file name) are written as
    their code points, which keeps the digests of earlier releases and
    keeps distinct values distinct.

    Raises:
      TypeError, ValueError: If Dramatiq's JSON encoder cannot encode ``value`` either.
    """
    # Nearly every value arrives as it is sent: it needs no trip through JSON and back.
    try:
        unchanged = _arrives_unchanged(value)
    except RecursionError:  # nested deeper than a walk in Python goes, not than json does
        unchanged = False
    received = value if unchanged else json.loads(_AS_SENT.encode(value))
    return _CANONICAL.encode(received).encode("utf-8", "surrogatepass")


# Encoders built once: json.dumps builds one for every call with options.
#: dramatiq.encoder.JSONEncoder: json.dumps with its defaults (ASCII only, NaN allowed).
_AS_SENT = json.JSONEncoder(separators=(",", ":"))
#: It is given values that the walk of _arrives_unchanged went through, or that json.loads
#: returned: none holds a cycle, and there is none to look for.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False)

#: The types of the values that JSON gives back as they were.
_PLAIN = frozenset({int, float, bool, type(None)})


def _arrives_unchanged(value: Any) -> bool:
    """Whether Dramatiq's JSON encoding gives ``value`` back with the same
    canonical JSON: plain values, lists, tuples, and dicts with string keys,
    with no string holding a surrogate."""
    kind = type(value)
    if kind in _PLAIN:
        return True
    if kind is str:
        return encodes_as_utf8(value)
    if kind is list or kind is tuple:
        items = value
    elif kind is dict:
        for key in value:
            if type(key) is not str or not encodes_as_utf8(key):
                return False
        items = value.values()
    else:
        return False
    # Loops rather than all(): the digest of every send walks its arguments.
    for item in items:
        kind = type(item)
        if kind in _PLAIN or (kind is str and item.isascii()):
            continue
        if not _arrives_unchanged(item):
            return False
    return True


def encodes_as_utf8(text: str) -> bool:
    """Whether ``text`` holds no lone surrogate, which UTF-8 (and so Redis' client) cannot encode."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
