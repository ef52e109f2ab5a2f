"""Lock options: their names, defaults and validation."""

from __future__ import annotations

import difflib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from dramatiq import Broker, Message

from .errors import InvalidLockOptions
from .locks import LOCK_TYPES, LockType
from .strategies import CLIENT, SERVER, STRATEGIES, ConflictStrategy

#: The default prefix of every key.
DEFAULT_LOCK_PREFIX = "dramatiq-unique"
#: The default delay before a rescheduled duplicate tries again, in milliseconds.
DEFAULT_RESCHEDULE_DELAY = 5000

#: The options an actor accepts, with the middleware's defaults.
DEFAULTS: dict[str, Any] = {
    "lock": None,
    "on_conflict": "log",
    "lock_limit": 1,
    "lock_ttl": None,
    "lock_args_method": None,
    "lock_prefix": DEFAULT_LOCK_PREFIX,
    "unique_across_queues": False,
    "unique_across_actors": False,
    "reschedule_delay": DEFAULT_RESCHEDULE_DELAY,
    "max_reschedules": None,
}

#: The options a message may override with ``send_with_options``: all but
#: the callable, which cannot travel with a message.
MESSAGE_OPTIONS = frozenset(DEFAULTS) - {"lock_args_method"}

#: How alike a message option's name and a lock option's must be (difflib's ratio) for the
#: first to be taken for a misspelling of the second.
MISSPELLING_CUTOFF = 0.8


@dataclass(frozen=True)
class LockConfig:
    """The lock options of an actor, or of one message, resolved and validated."""

    lock: LockType
    client_strategy: ConflictStrategy
    server_strategy: ConflictStrategy
    lock_limit: int
    lock_ttl: int | None
    lock_args_method: Callable[..., Any] | None
    lock_prefix: str
    unique_across_queues: bool
    unique_across_actors: bool
    reschedule_delay: int
    max_reschedules: int | None


def resolve(subject: str, options: Mapping[str, Any]) -> LockConfig | None:
    """Validate a full set of options and resolve it.

    Parameters:
      subject(str): Who the options belong to, for error messages, e.g. ``"Actor 'sync'"``.
      options(Mapping): A value for every name in :data:`DEFAULTS`.

    Returns:
      LockConfig: ``None`` when ``lock`` is ``None``: no uniqueness.

    Raises:
      InvalidLockOptions: A ``ValueError`` naming the subject, the option, the
        bad value and the valid choices.
    """
    check = _Checker(subject, options)
    check.integer("lock_limit", minimum=1)
    check.integer("lock_ttl", minimum=1, optional=True)
    check.integer("reschedule_delay", minimum=0)
    check.integer("max_reschedules", minimum=0, optional=True)
    check.boolean("unique_across_queues")
    check.boolean("unique_across_actors")
    check.prefix("lock_prefix")
    lock_args_method = options["lock_args_method"]
    if lock_args_method is not None and not callable(lock_args_method):
        check.fail("lock_args_method", "must be a callable that takes the actor's arguments, or None")
    client_strategy, server_strategy = check.strategies("on_conflict")

    lock_name = options["lock"]
    if lock_name is None:
        return None
    lock = LOCK_TYPES.get(lock_name) if isinstance(lock_name, str) else None
    if lock is None:
        check.fail("lock", f"is not a lock type. Valid choices are: {_choices(LOCK_TYPES)}")
    if client_strategy.replaces_queued_holders and lock.requires_ttl:
        raise InvalidLockOptions(
            f"{subject} uses on_conflict={options['on_conflict']!r} with lock={lock.name!r}: a lock that is only "
            "released by its TTL has no queued holder to replace. Valid choices on the client side there are: "
            + _choices(name for name, s in STRATEGIES.items() if CLIENT in s.sides and not s.replaces_queued_holders)
            + "."
        )
    if lock.requires_ttl and options["lock_ttl"] is None:
        raise InvalidLockOptions(
            f"{subject} uses lock={lock.name!r}, which is only released when its TTL runs out, but has no lock_ttl. "
            "Set lock_ttl to a positive number of milliseconds."
        )

    return LockConfig(
        lock=lock,
        client_strategy=client_strategy,
        server_strategy=server_strategy,
        lock_limit=options["lock_limit"],
        lock_ttl=options["lock_ttl"],
        lock_args_method=lock_args_method,
        lock_prefix=options["lock_prefix"],
        unique_across_queues=options["unique_across_queues"],
        unique_across_actors=options["unique_across_actors"],
        reschedule_delay=options["reschedule_delay"],
        max_reschedules=options["max_reschedules"],
    )


class MessageOptionsCheck:
    """Checks the option names of a message before anything is locked.

    ``lock_args_method`` is refused. Dramatiq stores message options
    unchecked, so an option that no middleware on the broker declares and
    whose name is close to a lock option's is logged as a likely misspelling,
    once per actor and option.

    Parameters:
      logger(logging.Logger): Where misspellings are reported.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._warned: set[tuple[str, str]] = set()
        self._mutex = threading.Lock()

    def __call__(self, broker: Broker, message: Message[Any]) -> None:
        """Check the options of ``message``, which is being enqueued on ``broker``.

        Raises:
          InvalidLockOptions: If the message sets ``lock_args_method``.
        """
        if "lock_args_method" in message.options:
            raise InvalidLockOptions(
                f"Actor {message.actor_name!r} (options of message {message.message_id!r}) sets lock_args_method: "
                "a callable cannot travel with a message. Set it on the actor, @dramatiq.actor(lock_args_method=...), "
                "or on UniqueJobs. The message was not enqueued and no lock was taken."
            )
        for name in message.options.keys() - broker.actor_options:
            suggestion = _misspelt(name) if isinstance(name, str) else None
            if suggestion is not None:
                self._warn(message.actor_name, name, suggestion)

    def _warn(self, actor_name: str, name: str, suggestion: str) -> None:
        with self._mutex:
            if (actor_name, name) in self._warned:
                return
            self._warned.add((actor_name, name))
        self.logger.warning(
            "Actor %r was sent with the option %r, which no middleware declares, so it is ignored. "
            "Did you mean %r? This is logged once per actor and option.",
            actor_name,
            name,
            suggestion,
        )


@functools.lru_cache(maxsize=256)
def _misspelt(name: str) -> str | None:
    """The message option that ``name`` probably misspells, if any.

    Typos seldom change the first letter: requiring it keeps names that merely
    look alike, such as ``clock`` or ``block`` for ``lock``, from warning.
    """
    matches = difflib.get_close_matches(name, sorted(MESSAGE_OPTIONS), n=3, cutoff=MISSPELLING_CUTOFF)
    return next((match for match in matches if match[0] == name[0]), None)


def _choices(names: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in sorted(names))


class _Checker:
    def __init__(self, subject: str, options: Mapping[str, Any]):
        self.subject = subject
        self.options = options

    def fail(self, option: str, problem: str) -> NoReturn:
        raise InvalidLockOptions(f"{self.subject} has an invalid {option}={self.options[option]!r}: it {problem}.")

    def integer(self, option: str, *, minimum: int, optional: bool = False) -> None:
        value = self.options[option]
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            expected = f"an integer >= {minimum}" + (
                " (milliseconds)" if option in ("lock_ttl", "reschedule_delay") else ""
            )
            self.fail(option, f"must be {expected}" + (" or None" if optional else ""))

    def boolean(self, option: str) -> None:
        if not isinstance(self.options[option], bool):
            self.fail(option, "must be True or False")

    def prefix(self, option: str) -> None:
        value = self.options[option]
        # Braces would move the hash tag from the digest to the prefix.
        if not isinstance(value, str) or not value or "{" in value or "}" in value:
            self.fail(option, "must be a non-empty string without '{' or '}'")

    def strategies(self, option: str) -> tuple[ConflictStrategy, ConflictStrategy]:
        value = self.options[option]
        if isinstance(value, Mapping):
            unknown = set(value) - {CLIENT, SERVER}
            if unknown:
                self.fail(option, f"has unknown keys {_choices(unknown)}; the valid keys are 'client' and 'server'")
            names = {side: value.get(side, DEFAULTS[option]) for side in (CLIENT, SERVER)}
        else:
            names = {CLIENT: value, SERVER: value}
        resolved = []
        for side in (CLIENT, SERVER):
            strategy = STRATEGIES.get(names[side]) if isinstance(names[side], str) else None
            if strategy is None:
                self.fail(
                    option, f"names no conflict strategy for the {side}. Valid choices are: {_choices(STRATEGIES)}"
                )
            if side not in strategy.sides:
                usable = [name for name, s in STRATEGIES.items() if side in s.sides]
                self.fail(
                    option,
                    f"uses {strategy.name!r} on the {side} side, where it makes no sense. "
                    f"Valid choices there are: {_choices(usable)}",
                )
            resolved.append(strategy)
        return resolved[0], resolved[1]
