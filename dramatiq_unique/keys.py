"""Key names: every key the library writes.

Every key starts with the lock prefix, and the keys of one digest share the
hash tag ``{<digest>}``, so one Lua script can touch both of them on Redis
Cluster. The keys of the lock activity share the hash tag ``{activity}``, so
one call writes the counts of several minutes; the conflict trail of each
prefix shares it too.
"""

from __future__ import annotations

#: The two kinds of lock a digest has.
ENQUEUE = "enqueue"
RUN = "run"


def enqueue_key(prefix: str, digest: str) -> str:
    """The key of the lock taken when a message is enqueued."""
    return f"{prefix}:{{{digest}}}"


def run_key(prefix: str, digest: str) -> str:
    """The key of the lock taken while a message runs."""
    return f"{prefix}:{{{digest}}}:run"


def replaced_key(prefix: str, digest: str) -> str:
    """The key of the set of queued messages whose place a newer message took (``replace``)."""
    return f"{prefix}:{{{digest}}}:replaced"


def line_key(lock_key: str) -> str:
    """The key of the line of the lock at ``lock_key``: the ids of the messages that wait for one
    of its places (``on_conflict="wait"`` or ``"keep_latest"``), in the order they came."""
    return f"{lock_key}:line"


def waiters_key(lock_key: str) -> str:
    """The key of the messages that wait in the lines of the locks of the digest of ``lock_key``,
    and of those handed a place that have not started yet."""
    return f"{lock_key.removesuffix(':run')}:waiting"


def served_key(lock_key: str) -> str:
    """The key of the copies of messages that started after they waited in a line of the locks of
    the digest of ``lock_key``: a second copy of one of them never runs."""
    return f"{lock_key.removesuffix(':run')}:served"


def debounce_key(lock_key: str) -> str:
    """The key of the deadline of a series of debounced sends (``debounce_cap``) of the digest
    whose enqueue lock is at ``lock_key``: ``<prefix>:{<digest>}:debounce``, in the lock's hash slot."""
    return f"{lock_key}:debounce"


def registry_key(prefix: str) -> str:
    """The key of the worker registry: worker id -> the time until which it counts as alive."""
    return f"{prefix}:workers"


def in_hand_key(registry: str) -> str:
    """The key of what each worker of the registry at ``registry`` last published of the
    messages in its hands. Its hash tag is the registry's own key, so that both are in one
    slot of a Redis Cluster, as a key without braces is placed by its whole name."""
    return f"{{{registry}}}:in-hand"


def epoch_key(prefix: str, shard: str | None = None) -> str:
    """The key of the mark of the lock store's data: a random value written once, which
    changes only when the data is lost. On a Redis Cluster there is one per master, each
    under a ``shard`` hash tag that places it there."""
    return f"{prefix}:epoch" if shard is None else f"{prefix}:epoch:{{{shard}}}"


def refusal_key(prefix: str, tag: str | None = None) -> str:
    """The key that exists while the lock store heals after a loss of its data: new places in
    the locks under ``prefix`` are refused meanwhile. On a Redis Cluster there is one per hash
    slot, each under a ``tag`` that places it there, beside the locks it refuses."""
    return f"{prefix}:refusing" if tag is None else f"{prefix}:refusing:{{{tag}}}"


def format_key(prefix: str, tag: str | None = None) -> str:
    """The key of the format of the lock records under ``prefix`` and of the last fencing token
    issued to them: a process that finds another format there takes no place. On a Redis
    Cluster there is one per hash slot, in the slot that ``tag`` places it in, beside the locks
    it serves."""
    return f"{prefix}:format" if tag is None else f"{prefix}:format:{{{tag}}}"


def activity_key(prefix: str, minute: int) -> str:
    """The key of the lock activity counts of ``minute`` (minutes since the epoch)."""
    return f"{prefix}:activity:{{activity}}:{minute}"


def history_key(prefix: str) -> str:
    """The key of the conflict trail of the locks under ``prefix``: a stream of the messages that
    met a held lock or a failing store. It shares the hash tag of the activity counts."""
    return f"{prefix}:history:{{activity}}"


def healing_key(prefix: str) -> str:
    """The key of the lock the worker holds that rebuilds the enqueue locks after a loss of the store's data."""
    return f"{prefix}:healing"


def healed_key(prefix: str) -> str:
    """The key of the marks of the store's data that the last healing healed: a worker that
    finds that loss late heals nothing."""
    return f"{prefix}:healed"


def rebuilding_key(prefix: str, broker: str) -> str:
    """The key of the lock a worker holds while it takes again the enqueue locks of the messages
    of one broker (``broker``: its fingerprint) after a loss of the store's data."""
    return f"{prefix}:rebuilding:{broker}"


def rebuilt_key(prefix: str, broker: str) -> str:
    """The key of the marks of the store's data after whose loss the enqueue locks of the
    messages of one broker were taken again: no other worker of that broker does it again."""
    return f"{prefix}:rebuilt:{broker}"


def reaper_leader_key(prefix: str) -> str:
    """The key of the lock a reaper run holds while it works: one run at a time."""
    return f"{prefix}:reaper"


def reaper_schedule_key(prefix: str) -> str:
    """The key of the lock that the worker sending the reaper actor holds for one reaper interval."""
    return f"{prefix}:reaper:schedule"


def reaper_cursor_key(prefix: str) -> str:
    """The key of where the previous reaper run stopped."""
    return f"{prefix}:reaper:cursor"


def lock_kind(key: str) -> str | None:
    """:data:`ENQUEUE` or :data:`RUN` for the key of a lock, ``None`` for the other keys of a digest."""
    if key.endswith("}"):
        return ENQUEUE
    if key.endswith("}:run"):
        return RUN
    return None


def digest_of(key: str) -> str | None:
    """The digest in the key of a lock, ``None`` for the other keys."""
    start, end = key.find(":{"), key.find("}")
    if lock_kind(key) is None or start < 0 or end < start:
        return None
    return key[start + 2 : end]


def prefix_of(key: str) -> str | None:
    """The lock prefix of the key of a lock, ``None`` for the other keys."""
    return key[: key.index(":{")] if digest_of(key) is not None else None


def digest_keys_start(prefix: str) -> str:
    """What the key of each digest's locks, replaced set and debounce deadline under ``prefix`` starts with."""
    return f"{prefix}:{{"
