"""Options: their names, their defaults (this module is their one home) and their validation.

The lock options are actor options too, and most are message options; the
others are options of the middleware only.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from dramatiq import Actor, Broker, Message

from .digest import encodes_as_utf8
from .errors import InvalidLockOptions
from .forks import reset_in_child
from .links import EXTRAS
from .locks import LOCK_TYPES, LockType
from .outcome import AnyMessage
from .strategies import CLIENT, SERVER, STRATEGIES, ConflictStrategy

#: ``on_backend_error`` values: fail closed, or fail open.
RAISE = "raise"
ALLOW = "allow"

# The defaults of the lock options (the middleware's, which actors and messages override).
DEFAULT_LOCK: str | None = None
DEFAULT_ON_CONFLICT = "log"
DEFAULT_LOCK_LIMIT = 1
DEFAULT_LOCK_TTL: int | None = None
DEFAULT_LOCK_ARGS_METHOD: Callable[..., Any] | None = None
#: The default prefix of every key.
DEFAULT_LOCK_PREFIX = "dramatiq-unique"
DEFAULT_UNIQUE_ACROSS_QUEUES = False
DEFAULT_UNIQUE_ACROSS_ACTORS = False
#: The default delay before a rescheduled duplicate tries again, in milliseconds.
DEFAULT_RESCHEDULE_DELAY = 5000
DEFAULT_MAX_RESCHEDULES: int | None = None
#: The default number of messages that may wait in a lock's line (``wait``).
DEFAULT_LINE_LIMIT = 1000
DEFAULT_DEBOUNCE: int | None = None
DEFAULT_DEBOUNCE_CAP: int | None = None
DEFAULT_LOCK_INFO: bool | int = False
#: How many characters of its call a holder keeps with ``lock_info=True``; an integer chooses
#: from SHORTEST_LOCK_INFO to LONGEST_LOCK_INFO. A longer call is cut, and ends with an ellipsis.
LOCK_INFO_LENGTH = 120
SHORTEST_LOCK_INFO = 20
#: Each holder pays its call's bytes in the lock store, and each step on its lock reads them.
LONGEST_LOCK_INFO = 1000

# The defaults of the middleware's own options.
#: The default lease of a run lock, in milliseconds: a dead worker's run locks are free again within it.
DEFAULT_LEASE_PERIOD = 30_000
#: The default interval between two heartbeats of a worker process, in milliseconds.
DEFAULT_HEARTBEAT_INTERVAL = 5_000
DEFAULT_ON_BACKEND_ERROR = RAISE
DEFAULT_REAPER = False
#: The default interval between two reaper runs, in milliseconds.
DEFAULT_REAPER_INTERVAL: int | None = 600_000
DEFAULT_REAPER_QUEUE = "default"
DEFAULT_BACKGROUND_RELEASES = True
DEFAULT_METRICS = False
DEFAULT_ACTIVITY = True

#: The options an actor accepts, with the middleware's defaults.
DEFAULTS: dict[str, Any] = {
    "lock": DEFAULT_LOCK,
    "on_conflict": DEFAULT_ON_CONFLICT,
    "lock_limit": DEFAULT_LOCK_LIMIT,
    "lock_ttl": DEFAULT_LOCK_TTL,
    "lock_args_method": DEFAULT_LOCK_ARGS_METHOD,
    "lock_prefix": DEFAULT_LOCK_PREFIX,
    "unique_across_queues": DEFAULT_UNIQUE_ACROSS_QUEUES,
    "unique_across_actors": DEFAULT_UNIQUE_ACROSS_ACTORS,
    "reschedule_delay": DEFAULT_RESCHEDULE_DELAY,
    "max_reschedules": DEFAULT_MAX_RESCHEDULES,
    "line_limit": DEFAULT_LINE_LIMIT,
    "debounce": DEFAULT_DEBOUNCE,
    "debounce_cap": DEFAULT_DEBOUNCE_CAP,
    "lock_info": DEFAULT_LOCK_INFO,
}

#: A lock_ttl below this many milliseconds is most likely seconds written where milliseconds
#: belong (``lock_ttl=60`` for a minute, as in Sidekiq): it is logged at WARNING, once per actor.
#: A warning, not an error: a lock that is meant to last less than a second is valid.
SHORT_LOCK_TTL = 1000

#: For each of the middleware's durations, the value below which it is most likely seconds
#: written where milliseconds belong (``reaper_interval=600`` for ten minutes), logged at
#: WARNING when the middleware is built, and what such a value does. A heartbeat of a few
#: hundred milliseconds is a deliberate choice (under gevent, say); one below 100 is not.
SECONDS_LIKE_MIDDLEWARE_DURATIONS = {
    "lease_period": (1000, "a run lock is held {} ms without a renewal"),
    "heartbeat_interval": (100, "a worker sends a heartbeat every {} ms"),
    "reaper_interval": (1000, "the reaper runs every {} ms"),
}

#: The longest lock_ttl, reschedule_delay, debounce and debounce_cap, in milliseconds (over
#: 31,000 years). The lock store adds a lock_ttl and a delay (a caller's, cut to this bound, or a
#: debounce or reschedule_delay) to its clock in milliseconds (about 1.8e12 in 2026) in Lua,
#: whose numbers are doubles: the sum stays an exact integer below 2**53 (about 9.0e15), and
#: Redis takes it as an integer only below 1e17, written without an exponent.
LONGEST_LOCK_DURATION = 10**15

#: The longest lease_period, heartbeat_interval and reaper_interval, in milliseconds (over 31
#: years). The middleware's threads wait a heartbeat interval, and up to a lease period when a
#: worker stops; Python refuses a wait longer than threading.TIMEOUT_MAX (about 292 years on
#: Linux) with an OverflowError.
LONGEST_MIDDLEWARE_DURATION = 10**12

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
    line_limit: int
    debounce: int | None
    debounce_cap: int | None
    #: How many characters of its call each holder keeps in the lock (``lock_info``), or
    #: ``None`` for none.
    lock_info: int | None = None


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
    check.duration("lock_ttl", minimum=1, optional=True)
    check.duration("reschedule_delay", minimum=0)
    check.integer("max_reschedules", minimum=0, optional=True)
    check.integer("line_limit", minimum=1)
    check.duration("debounce", minimum=1, optional=True)
    check.duration("debounce_cap", minimum=1, optional=True)
    check.debounce_cap("debounce_cap", "debounce")
    check.boolean("unique_across_queues")
    check.boolean("unique_across_actors")
    check.prefix("lock_prefix")
    lock_info = check.lock_info("lock_info")
    lock_args_method = options["lock_args_method"]
    if lock_args_method is not None and not callable(lock_args_method):
        check.fail("lock_args_method", "must be a callable that takes the actor's arguments, or None")
    client_strategy, server_strategy = check.strategies("on_conflict")

    lock_name = options["lock"]
    if lock_name is None:
        if options["debounce"] is not None:
            _check_debounced(subject, options, None, client_strategy)
        return None
    lock = LOCK_TYPES.get(lock_name) if isinstance(lock_name, str) else None
    if lock is None:
        check.fail("lock", f"is not a lock type. Valid choices are: {_choices(LOCK_TYPES)}")
    if client_strategy.cancels_running_holders or server_strategy.cancels_running_holders:
        _check_cancelling(subject, options["on_conflict"], lock, server_strategy)
    if lock.requires_ttl:
        _check_strategies_for_ttl_only(subject, options["on_conflict"], lock, (client_strategy, server_strategy))
    if lock.requires_ttl and options["lock_ttl"] is None:
        raise InvalidLockOptions(
            f"{subject} uses lock={lock.name!r}, which is only released when its TTL runs out, but has no lock_ttl. "
            "Set lock_ttl to a positive number of milliseconds."
        )
    if options["debounce"] is not None:
        _check_debounced(subject, options, lock, client_strategy)

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
        line_limit=options["line_limit"],
        debounce=options["debounce"],
        debounce_cap=options["debounce_cap"],
        lock_info=lock_info,
    )


def _check_debounced(
    subject: str, options: Mapping[str, Any], lock: LockType | None, client_strategy: ConflictStrategy
) -> None:
    """A debounced send waits in the enqueue lock until a newer send takes its place: there must
    be a lock, taken at enqueue and given up by its message, and the client strategy must replace."""
    debounce = options["debounce"]
    if lock is None or not lock.locks_at_enqueue or lock.requires_ttl:
        usable = (name for name, t in LOCK_TYPES.items() if t.locks_at_enqueue and not t.requires_ttl)
        raise InvalidLockOptions(
            f"{subject} uses debounce={debounce!r} with lock={lock and lock.name!r}: a debounced message waits in the "
            "enqueue lock for a newer one to take its place, so the lock must be taken at enqueue and given up "
            f"by its message. Valid choices of lock there are: {_choices(usable)}."
        )
    if not client_strategy.replaces_queued_holders:
        replacing = (name for name, s in STRATEGIES.items() if CLIENT in s.sides and s.replaces_queued_holders)
        raise InvalidLockOptions(
            f"{subject} uses debounce={debounce!r} with on_conflict={options['on_conflict']!r}: a newer send takes "
            "the waiting message's place only under a client strategy that replaces queued holders. Valid choices "
            f"on the client side there are: {_choices(replacing)}."
        )


def _check_cancelling(subject: str, on_conflict: Any, lock: LockType, server_strategy: ConflictStrategy) -> None:
    """A strategy that stops the running holder does it where a duplicate meets it, in the run
    lock, whose lease renewals carry the request to the holder's worker."""
    if not lock.takes_run_lock:
        usable = (name for name, t in LOCK_TYPES.items() if t.takes_run_lock)
        raise InvalidLockOptions(
            f"{subject} uses on_conflict={on_conflict!r} with lock={lock.name!r}: a running holder is asked to stop "
            "through its run lock, whose lease its worker renews, and this lock type takes none. "
            f"Valid choices of lock there are: {_choices(usable)}."
        )
    if not server_strategy.cancels_running_holders:
        cancelling = (name for name, s in STRATEGIES.items() if SERVER in s.sides and s.cancels_running_holders)
        raise InvalidLockOptions(
            f"{subject} uses on_conflict={on_conflict!r}: a running holder is asked to stop on the server side, "
            "where a duplicate meets it in the run lock, so the strategy must be chosen there. "
            f"Valid choices on the server side there are: {_choices(cancelling)}."
        )


def _check_strategies_for_ttl_only(
    subject: str, on_conflict: Any, lock: LockType, strategies: tuple[ConflictStrategy, ConflictStrategy]
) -> None:
    """A lock that only its TTL releases has no queued holder to replace, and hands no place to
    a message waiting in line."""
    for side, strategy in zip((CLIENT, SERVER), strategies, strict=True):
        if strategy.replaces_queued_holders or strategy.waits_in_line:
            valid = (
                name
                for name, s in STRATEGIES.items()
                if side in s.sides and not (s.replaces_queued_holders or s.waits_in_line)
            )
            raise InvalidLockOptions(
                f"{subject} uses on_conflict={on_conflict!r} with lock={lock.name!r}: a lock that is only released "
                f"by its TTL has no queued holder to replace, and hands no place to a message waiting in line. "
                f"Valid choices on the {side} side there are: {_choices(valid)}."
            )


def lock_defaults(**options: Any) -> dict[str, Any]:
    """The lock options given to the middleware, which its actors start from.

    Parameters:
      options: A value for every name in :data:`DEFAULTS`, and nothing else.
    """
    if options.keys() != DEFAULTS.keys():
        raise TypeError(f"lock_defaults() takes exactly the lock options {_choices(DEFAULTS)}.")
    return options


def check_middleware_options(
    *,
    lease_period: Any,
    heartbeat_interval: Any,
    on_backend_error: Any,
    reaper_interval: Any,
    metrics: Any,
    background_releases: Any,
    reaper: Any,
    reaper_queue: Any,
    activity: Any,
) -> None:
    """Validate the options of the middleware only.

    Raises:
      InvalidLockOptions: Naming the option, the bad value and what it must be.
    """

    def integer(name: str, value: Any, minimum: int, optional: bool = False) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise InvalidLockOptions(
                f"UniqueJobs has an invalid {name}={value!r}: it must be an integer >= {minimum} (milliseconds)"
                + (" or None." if optional else ".")
            )
        if value > LONGEST_MIDDLEWARE_DURATION:
            raise InvalidLockOptions(
                f"UniqueJobs has an invalid {name}={value!r}: it must be at most "
                f"{_longest(LONGEST_MIDDLEWARE_DURATION)}" + (", or None." if optional else ".")
            )

    integer("lease_period", lease_period, 3)
    integer("heartbeat_interval", heartbeat_interval, 1)
    integer("reaper_interval", reaper_interval, 1, optional=True)
    if heartbeat_interval * 3 > lease_period:
        raise InvalidLockOptions(
            f"UniqueJobs has heartbeat_interval={heartbeat_interval!r} and lease_period={lease_period!r}: "
            "the heartbeat interval must be at most a third of the lease period, so that a live worker "
            "renews its run locks before they lapse."
        )
    if on_backend_error not in (RAISE, ALLOW):
        raise InvalidLockOptions(
            f"UniqueJobs has an invalid on_backend_error={on_backend_error!r}: "
            f"valid choices are {RAISE!r} and {ALLOW!r}."
        )
    _check_metrics(metrics)
    # A truthy string such as "no" would silently mean True.
    for name, value in (("background_releases", background_releases), ("reaper", reaper), ("activity", activity)):
        if not isinstance(value, bool):
            raise InvalidLockOptions(f"UniqueJobs has an invalid {name}={value!r}: it must be True or False.")
    if not isinstance(reaper_queue, str) or not reaper_queue:
        raise InvalidLockOptions(
            f"UniqueJobs has an invalid reaper_queue={reaper_queue!r}: "
            "it must be the name of a queue, a non-empty string."
        )


def _check_metrics(metrics: Any) -> None:
    if metrics is False:
        return
    if metrics is not True and not callable(getattr(metrics, "register", None)):
        raise InvalidLockOptions(
            f"UniqueJobs has an invalid metrics={metrics!r}: valid choices are True (prometheus_client's "
            "default registry), False, or a prometheus_client CollectorRegistry."
        )
    # Looked up, not imported: importing it now would decide its multiprocess mode too early.
    if importlib.util.find_spec("prometheus_client") is None:
        raise InvalidLockOptions(
            "UniqueJobs has metrics=True, but prometheus_client is not installed: "
            f"install it, or the package's 'prometheus' extra (see {EXTRAS}), or leave metrics out."
        )


def warn_if_seconds_like(logger: logging.Logger, **durations: int | None) -> None:
    """Log at WARNING each of the middleware's durations that looks like seconds (see
    :data:`SECONDS_LIKE_MIDDLEWARE_DURATIONS`); ``None`` for one that does nothing."""
    for name, value in durations.items():
        shortest, effect = SECONDS_LIKE_MIDDLEWARE_DURATIONS[name]
        if value is not None and value < shortest:
            logger.warning(
                "UniqueJobs has %s=%d: %s is in milliseconds, so %s. For %d seconds, write %s=%s.",
                name,
                value,
                name,
                effect.format(value),
                value,
                name,
                f"{value * 1000:_}",
            )


class _Once:
    """The keys seen so far, for what is logged once per key, from any thread."""

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()
        self._mutex = threading.Lock()
        reset_in_child(self._reset_in_child)

    def first(self, key: Hashable) -> bool:
        """Whether ``key`` is seen for the first time."""
        with self._mutex:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True

    def _reset_in_child(self) -> None:
        # A thread of the parent may have held the mutex at the fork; what it logged, the child did.
        self._mutex = threading.Lock()


class ActorConfigs:
    """The lock options of each declared actor, resolved once, and of each message.

    Parameters:
      defaults(Mapping): The middleware's lock options (see :func:`lock_defaults`).
      logger(logging.Logger): Where a lock_ttl that looks like seconds is reported.
    """

    def __init__(self, defaults: Mapping[str, Any], *, logger: logging.Logger) -> None:
        self.logger = logger
        self._short_ttls_warned = _Once()
        self.defaults = dict(defaults)
        self._default = (self.defaults, resolve("UniqueJobs", self.defaults))
        self._warn_if_short_ttl("UniqueJobs", "UniqueJobs", self._default[1])
        #: The merged options and the resolved config of each declared actor.
        self._actors: dict[str, tuple[dict[str, Any], LockConfig | None]] = {}

    def declare(self, actor: Actor[Any, Any]) -> dict[str, Any]:
        """Resolve and remember the options of ``actor``, and return them merged with the defaults.

        Raises:
          InvalidLockOptions: If they are not valid.
        """
        options = {**self.defaults, **{k: v for k, v in actor.options.items() if k in DEFAULTS}}
        subject = f"Actor {actor.actor_name!r}"
        config = resolve(subject, options)
        if config is not None and not encodes_as_utf8(actor.actor_name):
            raise InvalidLockOptions(
                f"{subject} has a lock, but its name holds a lone surrogate: UTF-8 cannot encode it, and the "
                "lock store records it as UTF-8 text. Give the actor a name of valid Unicode text (actor_name=...)."
            )
        self._warn_if_short_ttl(actor.actor_name, subject, config)
        self._actors[actor.actor_name] = (options, config)
        return options

    def lines(self) -> list[str]:
        """The declared actors that wait in a lock's line on either side (``wait``, ``keep_latest``)."""
        return sorted(
            name
            for name, (_, config) in self._actors.items()
            if config is not None and (config.client_strategy.waits_in_line or config.server_strategy.waits_in_line)
        )

    def for_actor(self, actor_name: str) -> LockConfig | None:
        """The resolved lock options of an actor; ``None`` when it has no lock."""
        return self._actors.get(actor_name, self._default)[1]

    def for_message(self, message: AnyMessage) -> LockConfig | None:
        """The lock options of ``message``: its actor's, overridden by its own.

        Raises:
          InvalidLockOptions: If the message's own options are not valid.
        """
        options, config = self._actors.get(message.actor_name, self._default)
        message_options = message.options
        if MESSAGE_OPTIONS.isdisjoint(message_options):  # nearly always: no per-message lock options
            return config
        overrides = {name: message_options[name] for name in MESSAGE_OPTIONS if name in message_options}
        subject = f"Actor {message.actor_name!r} (options of message {message.message_id!r})"
        overridden_options = {**options, **overrides}
        overridden = resolve(subject, overridden_options)
        # Every message of a replacing actor records when it starts, so that a running holder is
        # never replaced: replace is all or nothing per actor, and an actor without a lock has none.
        ours = overridden.client_strategy if overridden is not None else None
        actors = config.client_strategy if config is not None else None
        if (
            ours is not None
            and ours is not actors
            and (ours.replaces_queued_holders or (actors is not None and actors.replaces_queued_holders))
        ):
            theirs = "has no lock" if config is None else f"has on_conflict={options['on_conflict']!r}"
            raise InvalidLockOptions(
                f"{subject} uses on_conflict={overridden_options['on_conflict']!r}, and its actor {theirs}: the "
                "client strategy 'replace' can only be chosen for a whole actor, in its options or the middleware's."
            )
        self._warn_if_short_ttl(message.actor_name, subject, overridden)
        return overridden

    def _warn_if_short_ttl(self, actor_name: str, subject: str, config: LockConfig | None) -> None:
        ttl = config.lock_ttl if config is not None else None
        if ttl is None or ttl >= SHORT_LOCK_TTL:
            return
        if not self._short_ttls_warned.first(actor_name):
            return
        self.logger.warning(
            "%s has lock_ttl=%d: lock_ttl is in milliseconds, so its lock lapses %d ms after it is taken. "
            "For %d seconds, write lock_ttl=%s. This is logged once per actor.",
            subject,
            ttl,
            ttl,
            ttl,
            f"{ttl * 1000:_}",
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
        self._warned = _Once()

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
        actor_options = broker.actor_options
        for name in message.options:  # no set built: every send passes here
            if name not in actor_options and isinstance(name, str):
                suggestion = _misspelt(name)
                if suggestion is not None:
                    self._warn(message.actor_name, name, suggestion)

    def _warn(self, actor_name: str, name: str, suggestion: str) -> None:
        if not self._warned.first((actor_name, name)):
            return
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


#: Milliseconds in a year of 365.25 days.
_YEAR = 31_557_600_000


def _longest(maximum: int) -> str:
    return f"{maximum:_} (milliseconds, over {maximum // _YEAR:,} years)"


def prefix_problem(prefix: Any) -> str | None:
    """What makes ``prefix`` no lock prefix, as the end of a sentence that starts with "it";
    ``None`` for a valid one."""
    # Braces would move the hash tag from the digest to the prefix.
    if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
        return "must be a non-empty string without '{' or '}'"
    if not encodes_as_utf8(prefix):
        return "holds a lone surrogate, which UTF-8 cannot encode, and the lock store's keys are UTF-8 text"
    return None


def _choices(names: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in sorted(names))


class _Checker:
    def __init__(self, subject: str, options: Mapping[str, Any]):
        self.subject = subject
        self.options = options

    def fail(self, option: str, problem: str) -> NoReturn:
        raise InvalidLockOptions(f"{self.subject} has an invalid {option}={self.options[option]!r}: it {problem}.")

    def integer(self, option: str, *, minimum: int, optional: bool = False, unit: str = "") -> None:
        value = self.options[option]
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(option, f"must be an integer >= {minimum}{unit}" + (" or None" if optional else ""))

    def duration(self, option: str, *, minimum: int, optional: bool = False) -> None:
        self.integer(option, minimum=minimum, optional=optional, unit=" (milliseconds)")
        value = self.options[option]
        if value is not None and value > LONGEST_LOCK_DURATION:
            self.fail(option, f"must be at most {_longest(LONGEST_LOCK_DURATION)}" + (", or None" if optional else ""))

    def debounce_cap(self, option: str, debounce: str) -> None:
        """A cap bounds a debounce's postponements: it needs one, and is no shorter."""
        cap, quiet = self.options[option], self.options[debounce]
        if cap is None:
            return
        if quiet is None:
            self.fail(option, f"bounds the postponements of a debounce, so it needs {debounce} too")
        if cap < quiet:
            self.fail(option, f"must be >= {debounce}={quiet!r}, or None")

    def lock_info(self, option: str) -> int | None:
        """How many characters of its call a holder keeps: ``None`` for none (False)."""
        value = self.options[option]
        if value is True:
            return LOCK_INFO_LENGTH
        if value is False:
            return None
        if isinstance(value, int) and SHORTEST_LOCK_INFO <= value <= LONGEST_LOCK_INFO:
            return value
        self.fail(
            option,
            f"must be True (the holder's call, up to {LOCK_INFO_LENGTH} characters), False (none), or an integer "
            f"from {SHORTEST_LOCK_INFO} to {LONGEST_LOCK_INFO} (characters)",
        )

    def boolean(self, option: str) -> None:
        if not isinstance(self.options[option], bool):
            self.fail(option, "must be True or False")

    def prefix(self, option: str) -> None:
        problem = prefix_problem(self.options[option])
        if problem is not None:
            self.fail(option, problem)

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
