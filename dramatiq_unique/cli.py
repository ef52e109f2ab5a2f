"""The ``dramatiq-unique`` command: see, explain and free held locks, and run the orphan reaper.

Each subcommand is a ``declare_*`` function that adds its parser and sets
the function that runs it; :data:`SUBCOMMANDS` lists them in the order of
``--help``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import logging
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TextIO
from urllib.parse import unquote

import dramatiq
from dramatiq import Actor, Broker

from .activity import read_activity
from .backends import LockBackend, RedisBackend
from .default_backend import URL_VARIABLE
from .digest import DIGEST_LENGTH
from .errors import InvalidBackendOptions, LineNeedsBroker, LockArgumentsError, LockBackendError
from .held import RUNNING, ConflictInfo, HolderInfo, LockInfo
from .keys import RUN, digest_of
from .links import EXTRAS
from .middleware import UniqueJobs
from .operations import Locks, unique_jobs_of
from .options import DEFAULT_LOCK_PREFIX, prefix_problem
from .presentation import (
    DEFAULT_WIDTH,
    TRAIL_WIDTH,
    conflicts_summary,
    count,
    describe_lock,
    format_duration,
    holder_calls,
    holder_count,
    holder_stops,
    holders,
    lock_table,
    prefixes_phrase,
    table,
    trail_lines,
)
from .reaper import DEFAULT_BATCH, reap_orphans
from .version import __version__

#: The exit codes.
RET_OK = 0  # Done.
RET_USAGE = 2  # Invalid command line (argparse's own code), or invalid arguments for an actor.
RET_IMPORT = 3  # The module does not import, or holds no such actor, broker or UniqueJobs.
RET_CONNECT = 4  # The lock backend cannot be reached, or failed.
RET_URL = 5  # No Redis URL, or one that cannot be used.
RET_NOT_FOUND = 6  # No lock of that digest (or digest prefix) is held, or that message holds none of them.
RET_ABORTED = 7  # The confirmation was not given.
RET_CHANGED = 8  # Some holders changed after they were read and were left held.
RET_LINE = 9  # Messages wait in a lock's line: only the command with --app unlocks a holder there.

#: The environment variables the Redis URL of the locks is read from, in this order.
URL_VARIABLES = (URL_VARIABLE, "REDIS_URL")

HELP_EPILOG = """\
The Redis URL of the locks is --url, else $DRAMATIQ_UNIQUE_URL; else, when a
module is imported (--app, or explain's MODULE:ACTOR), the backend of its
UniqueJobs; else $REDIS_URL. A Redis Cluster is found by itself.

examples:
  # The held locks, as a table; as JSON.
  $ dramatiq-unique --url redis://localhost:6379/1 list
  $ dramatiq-unique list --actor settle_payment --state queued --json

  # Every lock prefix of an application (actors with their own lock_prefix).
  $ dramatiq-unique --app myapp.tasks list

  # Why would settle_payment("evt_123", {"amount": 100}) not run?
  $ dramatiq-unique explain myapp.tasks:settle_payment '["evt_123", {"amount": 100}]'

  # One lock (by its digest, or the first characters of it), then unlock it;
  # unlock every lock of one actor.
  $ dramatiq-unique show A3QW7mGG
  $ dramatiq-unique unlock A3QW7mGGvwLB5oZHvzHpkA
  $ dramatiq-unique unlock --actor settle_payment --all --dry-run

  # Run the orphan reaper once (with --app it also asks the broker about enqueue locks).
  $ dramatiq-unique --app myapp.tasks reap --json

  # What the locks did in the last 15 minutes, per actor.
  $ dramatiq-unique stats --minutes 15

  # The web page of held locks on http://127.0.0.1:8000/, read-only.
  $ dramatiq-unique --app myapp.tasks web

exit codes:
  0 done, 2 invalid command line, actor arguments or digest prefix (too short,
  or ambiguous), 3 module import failed, 4 lock backend unreachable, 5 no or bad
  Redis URL, 6 no such lock or holder, 7 not confirmed, 8 some holders changed
  after they were read and were left held, 9 messages wait in the lock's line
  and the command has no --app to enqueue the one it hands the lock
"""


class CommandError(Exception):
    """An error the command reports in one line, with its exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class App:
    """What an imported module brings: its broker and the broker's ``UniqueJobs``."""

    broker: Broker
    unique: UniqueJobs


class Context:
    """What every subcommand works with, built on first use: the imported
    application, the lock backend, and the locks under the prefixes in use.

    Parameters:
      args(Namespace): The parsed command line.
      out(TextIO): Where results go.
      err(TextIO): Where prompts and notes go.
      stdin(TextIO): Where confirmations come from; ``None`` when it is closed.
    """

    def __init__(self, args: argparse.Namespace, *, out: TextIO, err: TextIO, stdin: TextIO | None):
        self.args = args
        self.out = out
        self.err = err
        self.stdin = stdin
        self.app: App | None = import_app(args.app) if args.app else None

    @functools.cached_property
    def backend(self) -> LockBackend:
        url = self.args.url or os.environ.get(URL_VARIABLES[0])
        if url:
            return connect(url)
        if self.app is not None:
            try:
                return self.app.unique.resolve_backend(self.app.broker)
            except InvalidBackendOptions as e:
                raise CommandError(str(e), RET_URL) from None
        url = os.environ.get(URL_VARIABLES[1])
        if url:
            return connect(url)
        raise CommandError(
            "There is no Redis URL for the locks: pass --url, set DRAMATIQ_UNIQUE_URL or REDIS_URL, "
            "or import your application with --app.",
            RET_URL,
        )

    @functools.cached_property
    def locks(self) -> Locks:
        return self.make_locks()

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The lock prefixes in use, the middleware's first."""
        return self.locks.prefixes

    def make_locks(self, *, batch: int = DEFAULT_BATCH) -> Locks:
        """The locks in the backend under ``--prefix``, else under every prefix of the application."""
        if self.args.prefix:
            lock_prefix, *actor_prefixes = self.args.prefix
            return Locks(self.backend, lock_prefix=lock_prefix, actor_prefixes=actor_prefixes, batch=batch)
        if self.app is not None:
            return Locks.from_middleware(self.app.unique, backend=self.backend, batch=batch)
        return Locks(self.backend, lock_prefix=DEFAULT_LOCK_PREFIX, batch=batch)

    @property
    def width(self) -> int | None:
        """The width tables fit: the terminal's when the output is one, else $COLUMNS, else
        100 (as ``ls`` does); ``None`` with ``--wide``: every column and value whole."""
        if getattr(self.args, "wide", False):
            return None
        return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns

    @functools.cached_property
    def server(self) -> str:
        """Where the locks are read, for a person: never a password."""
        return server_of(self.backend)

    def where(self) -> str:
        """``Redis host:6379/1 under prefix 'dramatiq-unique'``: what the command reads."""
        return f"{self.server} under {prefixes_phrase(self.prefixes)}"

    def print(self, text: str = "") -> None:
        print(text, file=self.out)

    def print_json(self, document: Any) -> None:
        print(json.dumps(document, indent=2), file=self.out)

    def confirm(self, question: str) -> bool:
        """Ask on the terminal (stderr) and read the answer from stdin; no answer is a no."""
        print(f"{question} [y/N] ", end="", file=self.err, flush=True)
        # With stdin closed (``<&-``), Python's sys.stdin is None: nobody can answer.
        if self.stdin is None or self.stdin.closed:
            print(file=self.err)
            return False
        answer = self.stdin.readline()
        if not self.stdin.isatty():
            print(file=self.err)  # nobody typed the answer, and so ended the line
        return answer.strip().lower() in ("y", "yes")


# Connecting and importing ----------------------------------------------------


def connect(url: str) -> RedisBackend:
    """A backend on the Redis at ``url``, or on its Redis Cluster when it is a node of one.

    Raises:
      CommandError: If the URL cannot be used; its message quotes no part of it.
      LockBackendError: If the Redis cannot be reached.
    """
    try:
        return RedisBackend.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    except InvalidBackendOptions as e:
        raise CommandError(str(e), RET_URL) from None


def server_of(backend: LockBackend) -> str:
    """The server of ``backend``, as a person names it: ``Redis localhost:6379/1``, ``Redis
    Cluster of 3 masters (localhost:7000, ...)``; host, port and database, never a user or password."""
    client = getattr(backend, "client", None)
    if not isinstance(backend, RedisBackend) or client is None:
        return type(backend).__name__
    if hasattr(client, "get_primaries"):
        nodes = sorted(node.name for node in client.get_primaries())
        return f"Redis Cluster of {count(len(nodes), 'master')} ({', '.join(nodes)})"
    pool = client.connection_pool
    kwargs = getattr(pool, "connection_kwargs", {})
    database = kwargs.get("db", 0)
    if hasattr(pool, "service_name"):
        return f"Redis Sentinel service {pool.service_name!r}, database {database}"
    if "path" in kwargs:
        return f"Redis unix:{kwargs['path']}, database {database}"
    return f"Redis {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{database}"


def import_object(value: str) -> tuple[ModuleType, Any]:
    """Import ``module`` or ``module:attribute`` (dotted) the way the ``dramatiq`` command does.

    Raises:
      CommandError: If the module does not import or has no such attribute.
    """
    module_name, _, attribute = value.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        # What the module raises may quote a URL of its own, or what urllib took for its port.
        problem = redact(f"{type(e).__name__}: {e}", [os.environ.get(name) for name in URL_VARIABLES])
        raise CommandError(f"Cannot import module {module_name!r}: {problem}", RET_IMPORT) from None
    if not attribute:
        return module, None
    try:
        return module, functools.reduce(getattr, attribute.split("."), module)
    except AttributeError:
        raise CommandError(f"Module {module_name!r} does not define {attribute!r}.", RET_IMPORT) from None


def import_app(value: str) -> App:
    """The broker of ``module`` (Dramatiq's global broker once it is imported), or of ``module:broker``."""
    _, found = import_object(value)
    if callable(found) and not isinstance(found, Broker):
        try:
            found()
        except Exception as e:
            problem = redact(f"{type(e).__name__}: {e}", [os.environ.get(name) for name in URL_VARIABLES])
            raise CommandError(f"{value!r} failed: {problem}", RET_IMPORT) from None
        found = None
    broker = found if found is not None else dramatiq.get_broker()
    if not isinstance(broker, Broker):
        raise CommandError(f"{value!r} is not a Dramatiq broker.", RET_IMPORT)
    return App(broker=broker, unique=_unique_jobs(broker))


def import_actor(value: str) -> Actor[Any, Any]:
    """The actor named by ``module:actor``: an attribute of the module, or an actor of that name."""
    module_name, _, name = value.partition(":")
    if not module_name or not name:
        raise CommandError(f"{value!r} names no actor: write MODULE:ACTOR, e.g. myapp.tasks:settle_payment.", RET_USAGE)
    try:
        _, actor = import_object(value)
    except CommandError:
        # Not an attribute: perhaps the actor's name, on the broker the module set up.
        broker = dramatiq.broker.global_broker
        if module_name not in sys.modules or broker is None or name not in broker.actors:
            raise
        actor = broker.actors[name]
    if not isinstance(actor, Actor):
        raise CommandError(f"{value!r} is not a Dramatiq actor.", RET_IMPORT)
    return actor


def _unique_jobs(broker: Broker) -> UniqueJobs:
    try:
        return unique_jobs_of(broker)
    except ValueError as e:
        raise CommandError(str(e), RET_IMPORT) from None


# Output ----------------------------------------------------------------------


def _digest_argument(value: str) -> str:
    # A lock key, as the reaper's log lines name it, is accepted too.
    return digest_of(value) or value


# Subcommands -----------------------------------------------------------------

Subparsers = Any  # argparse's _SubParsersAction, which is private
Run = Callable[[Context, argparse.Namespace], int]


def declare_list(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("list", help="list the held locks")
    parser.add_argument("--actor", help="only the holders of messages of this actor")
    parser.add_argument("--state", choices=("queued", "running"), help="only the holders in this state")
    parser.add_argument("--limit", type=_positive, metavar="N", help="at most N locks")
    parser.add_argument("--json", action="store_true", help="print one JSON array")
    _add_wide(parser)
    parser.set_defaults(run=run_list)


def _add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide",
        action="store_true",
        help="print every column and value whole (digests, message ids, lock types, worker ids, calls) instead "
        "of fitting the terminal's width (else $COLUMNS, else 100)",
    )


def run_list(context: Context, args: argparse.Namespace) -> int:
    locks = list(context.locks.list(actor=args.actor, state=args.state, limit=args.limit))
    if context.app is not None:
        locks = list(context.locks.with_calls(locks, context.app.broker))
    if args.json:
        context.print_json([lock.as_dict() for lock in locks])
        return RET_OK
    if not locks:
        context.print(f"No locks are held on {context.where()}" + _filters(args) + ".")
        return RET_OK
    context.print(f"Locks on {context.where()}:")
    for line in lock_table(locks, width=context.width):
        context.print(line)
    context.print()
    context.print(holders(locks) + _filters(args) + ".")
    return RET_OK


def declare_show(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("show", help="show the enqueue and run locks of one digest")
    parser.add_argument("digest", type=_digest_argument, metavar="DIGEST", help=DIGEST_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON array of its locks")
    _add_wide(parser)
    parser.set_defaults(run=run_show)


#: What a DIGEST argument may be.
DIGEST_HELP = (
    "the digest, its first characters (at least 4, as long as no other held lock's digest starts with them), "
    "or the key of a lock"
)


def run_show(context: Context, args: argparse.Namespace) -> int:
    digest = _resolve(context, args.digest)
    locks = _held(context, digest, or_unreadable=True)
    if context.app is not None:
        locks = list(context.locks.with_calls(locks, context.app.broker))
    if args.json:
        context.print_json([lock.as_dict() for lock in locks])
        return RET_OK
    for lock in locks:
        for line in describe_lock(lock, width=context.width):
            context.print(line)
        for line in holder_calls(lock) + holder_stops(lock):
            context.print(line)
    for key, reasons in _unreadable(context, digest).items():
        context.print(f"Lock {key!r} holds {count(len(reasons), 'record')} this version cannot read:")
        for reason in reasons.values():
            context.print(f"  {reason}")
    return RET_OK


def declare_explain(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="compute the digest of an actor and its arguments, and say who holds its lock",
        description="Import the module as the dramatiq command does, so that the actor's own lock options apply, "
        "compute the digest of the arguments as the middleware would, and say who holds its locks and what a new "
        "message with these arguments would meet now.",
    )
    parser.add_argument("actor", metavar="MODULE:ACTOR", help="e.g. myapp.tasks:settle_payment")
    parser.add_argument(
        "args", nargs="?", default="[]", metavar="ARGS_JSON", help="the positional arguments, as a JSON array"
    )
    parser.add_argument("--kwargs", default="{}", metavar="KWARGS_JSON", help="the keyword arguments, as a JSON object")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    _add_wide(parser)
    parser.set_defaults(run=run_explain)


def run_explain(context: Context, args: argparse.Namespace) -> int:
    positional = _json_argument(args.args, list, "ARGS_JSON must be a JSON array of the positional arguments")
    keywords = _json_argument(args.kwargs, dict, "--kwargs must be a JSON object of the keyword arguments")
    actor = import_actor(args.actor)
    unique = _unique_jobs(actor.broker)
    if context.app is None:
        context.app = App(broker=actor.broker, unique=unique)
    try:
        explanation = context.locks.explain(actor, *positional, **keywords)
    except LockArgumentsError as e:
        raise CommandError(str(e), RET_USAGE) from None
    if args.json:
        context.print_json(explanation.as_dict())
        return RET_OK
    read = "" if explanation.prefix is None else f" under prefix {explanation.prefix!r}"
    context.print(f"locks on   {context.server}{read}")
    context.print(f"actor      {explanation.actor} (queue {explanation.queue})")
    if explanation.lock is None:
        context.print(explanation.on_send)
        return RET_OK
    context.print(f"lock       {explanation.lock} (lock_limit {explanation.lock_limit})")
    context.print(f"lock args  {json.dumps(explanation.lock_args)}")
    context.print(f"digest     {explanation.digest}")
    context.print()
    for lock in explanation.locks:
        for line in describe_lock(lock, width=context.width):
            context.print(line)
    if not explanation.locks:
        context.print("No lock of this digest is held.")
    context.print()
    context.print(explanation.on_send)
    if explanation.on_start is not None:
        context.print(explanation.on_start)
    _print_last_conflicts(context, explanation.conflicts)
    return RET_OK


def _print_last_conflicts(context: Context, conflicts: Sequence[ConflictInfo]) -> None:
    """The end of ``explain``: what the conflict trail says of the job in the last hour."""
    context.print()
    if not conflicts:
        context.print("The conflict trail has no message of this job in the last hour.")
        return
    for sentence in conflicts_summary(conflicts):
        context.print(sentence)  # one line, as explain's sentences above


def declare_history(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "history",
        help="show the messages that met a held lock: why a job did not run",
        description="Show the conflict trail, newest first: each message that met a held lock or a failing lock "
        "store, what became of it, and who held the lock. Workers and senders write it once per heartbeat interval, "
        "so the last seconds may be missing.",
    )
    parser.add_argument(
        "actor", nargs="?", metavar="ACTOR", help="only the messages of this actor (a name, or MODULE:ACTOR)"
    )
    parser.add_argument(
        "--args",
        metavar="ARGS_JSON",
        help="only the messages of ACTOR with these positional arguments, as a JSON array: their digest is computed "
        "as explain computes it",
    )
    parser.add_argument("--kwargs", metavar="KWARGS_JSON", help="the keyword arguments that go with --args")
    parser.add_argument(
        "--since", type=_duration_argument, metavar="DURATION", help="only the last DURATION, e.g. 30s, 15m, 2h, 1d"
    )
    parser.add_argument("--digest", type=_digest_argument, help="only the messages of this digest (or lock key)")
    parser.add_argument("--limit", type=_positive, default=50, metavar="N", help="at most N entries (default: 50)")
    parser.add_argument("--json", action="store_true", help="print one JSON array of every field")
    parser.set_defaults(run=run_history)


def run_history(context: Context, args: argparse.Namespace) -> int:
    actor: str | Actor[Any, Any] | None = args.actor
    if args.actor and ":" in args.actor:
        actor = import_actor(args.actor)
        if context.app is None:
            context.app = App(broker=actor.broker, unique=_unique_jobs(actor.broker))
    elif args.actor and context.app is not None and args.actor in context.app.broker.actors:
        actor = context.app.broker.actors[args.actor]  # its own lock_args_method makes the digest
    positional = None if args.args is None else _json_argument(args.args, list, "--args must be a JSON array")
    keywords = None if args.kwargs is None else _json_argument(args.kwargs, dict, "--kwargs must be a JSON object")
    if (positional is not None or keywords is not None) and actor is None:
        raise CommandError("--args and --kwargs need an ACTOR: the digest of arguments depends on it.", RET_USAGE)
    try:
        entries = context.locks.history(
            actor, args=positional, kwargs=keywords, digest=args.digest, within_ms=args.since, limit=args.limit
        )
    except (ValueError, LockArgumentsError) as e:
        raise CommandError(str(e), RET_USAGE) from None
    if args.json:
        context.print_json([entry.as_dict() for entry in entries])
        return RET_OK
    name = actor if actor is None or isinstance(actor, str) else actor.actor_name
    subject = "".join(
        (
            f" of actor {name!r}" if name else "",
            f" with arguments {args.args}" if positional is not None else "",
            f" of digest {args.digest!r}" if args.digest else "",
            f" in the last {format_duration(args.since)}" if args.since else "",
        )
    )
    where = f"on {context.where()}"
    if not entries:
        context.print(f"No conflicts{subject} {where}.")
        return RET_OK
    # The trail's two lines an entry read best within 100 columns, also on a wider terminal.
    width = max(40, min(TRAIL_WIDTH, context.width or TRAIL_WIDTH))
    for line in textwrap.wrap(f"Conflicts{subject} {where}, newest first (times in UTC):", width):
        context.print(line)
    context.print()
    for line in trail_lines(entries, width=width):
        context.print(line)
    context.print()
    more = " (--limit for more)" if len(entries) == args.limit else ""
    context.print(f"{count(len(entries), 'conflict')} shown{more}; --json prints every field.")
    return RET_OK


def declare_unlock(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "unlock",
        help="unlock the holders of a digest, or of an actor",
        description="Unlock the holders of a digest's locks, or of an actor's. A holder is unlocked only if it is "
        "still as it was read (it did not renew its lease, re-enter or leave meanwhile). Its message is neither "
        "stopped nor removed from its queue, and a duplicate of it can be sent, and run, meanwhile. The command "
        "asks first when it would unlock every holder of an actor (--all), or a holder that is running.",
    )
    parser.add_argument("digest", nargs="?", type=_digest_argument, metavar="DIGEST", help=DIGEST_HELP)
    parser.add_argument(
        "--message-id", metavar="ID", help="unlock only the holder of this message (or of its first characters)"
    )
    parser.add_argument("--actor", help="with --all: unlock every holder that is a message of this actor")
    parser.add_argument("--all", action="store_true", help="with --actor: unlock every lock of the actor")
    parser.add_argument(
        "--yes",
        "--force",
        action="store_true",
        help="do not ask before unlocking every holder of an actor (--all) or a running holder, whose message "
        "goes on running while a duplicate can start",
    )
    parser.add_argument("--dry-run", action="store_true", help="only list what would be unlocked")
    _add_wide(parser)
    parser.set_defaults(run=run_unlock, parser=parser)


def run_unlock(context: Context, args: argparse.Namespace) -> int:
    by_digest = args.digest is not None
    if by_digest == bool(args.actor or args.all) or (not by_digest and not (args.actor and args.all)):
        args.parser.error("give either DIGEST [--message-id ID] or --actor ACTOR --all")
    if args.message_id and not by_digest:
        args.parser.error("--message-id goes with DIGEST")
    if by_digest:
        digest = _resolve(context, args.digest)
        found = _held(context, digest, message_id=args.message_id)
        what = f"of digest {digest!r}"
    else:
        found = list(context.locks.list(actor=args.actor))
        what = f"of actor {args.actor!r}"
        if not found:
            context.print(f"No locks of actor {args.actor!r} are held on {context.where()}.")
            return RET_OK
    if args.dry_run:
        context.print(f"Would unlock {holders(found)} {what}:")
        for line in lock_table(found, indent="  ", width=context.width):
            context.print(line)
        return RET_OK
    running = [h for lock in found for h in lock.holders if h.state == RUNNING]
    if not args.yes and (not by_digest or running):
        question = f"Unlock {holders(found)} {what}? " + (
            _running_note(running)
            if by_digest
            else "Their messages are not stopped, and duplicates of them can be sent then."
        )
        if not context.confirm(question):
            context.print("Nothing was unlocked.")
            return RET_ABORTED
    freed = context.locks.release(found)
    context.print(f"Unlocked {holders(freed)} {what}" + (":" if freed else "."))
    for line in lock_table(freed, indent="  ", width=context.width) if freed else ():
        context.print(line)
    left = holder_count(found) - holder_count(freed)
    if left:
        print(
            f"{count(left, 'holder')} changed after {'it was' if left == 1 else 'they were'} read (renewed "
            "a lease, re-entered or left) and stayed held; run the command again to see them.",
            file=context.err,
        )
        return RET_CHANGED
    return RET_OK


def _running_note(running: Sequence[HolderInfo]) -> str:
    """What unlocking running holders does to them: ``Message '…' is running on worker '…': ...``."""
    described = [f"{h.message_id!r}" + (f" on worker {h.worker_id!r}" if h.worker_id else "") for h in running]
    if len(running) == 1:
        return (
            f"Message {described[0]} is running: it is not stopped, and a duplicate of it can be sent and start "
            "beside it."
        )
    return (
        f"Messages {', '.join(described)} are running: they are not stopped, and duplicates of them can be sent "
        "and start beside them."
    )


def declare_cancel(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "cancel",
        help="stop the running holder of a digest's run lock",
        description="Ask the running holders of a digest's run lock to stop: each worker interrupts its message at "
        "its next lease renewal. It keeps the lock until it has stopped, so no duplicate starts "
        "meanwhile. A holder whose worker died is not interrupted: its lease lapses.",
    )
    parser.add_argument("digest", type=_digest_argument, metavar="DIGEST", help="the digest whose holder to stop")
    parser.add_argument("--message-id", metavar="ID", help="stop only this message")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run_cancel, parser=parser)


def run_cancel(context: Context, args: argparse.Namespace) -> int:
    digest = _resolve(context, args.digest)
    found = [
        running
        for running in (
            lock.only(message_id=args.message_id, state=RUNNING) if lock.kind == RUN else None
            for lock in _held(context, digest)
        )
        if running is not None
    ]
    what = f"of digest {digest!r}"
    if not found:
        context.print(f"No message {what} runs holding a run lock: nothing to cancel.")
        return RET_NOT_FOUND
    if not args.yes:
        question = f"Stop {count(holder_count(found), 'running message')} {what}?"
        if not context.confirm(question):
            context.print("Nothing was cancelled.")
            return RET_ABORTED
    asked = context.locks.cancel(digest, args.message_id)
    context.print(
        f"Asked {count(holder_count(asked), 'running message')} {what} to stop"
        + (": each stops at its worker's next lease renewal, and keeps the lock until then." if asked else ".")
    )
    for line in lock_table(asked, indent="  ", width=context.width) if asked else ():
        context.print(line)
    return RET_OK


def declare_reap(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "reap",
        help="run the orphan reaper once",
        description="Release the run locks of dead workers and, with --app, the enqueue locks whose message no "
        "longer exists in the broker (RedisBroker, RabbitmqBroker, StubBroker). One reaper runs at a time across "
        "the deployment.",
    )
    parser.add_argument("--max-passes", type=_positive, metavar="N", help="at most N bounded batches")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(run=run_reap)


def run_reap(context: Context, args: argparse.Namespace) -> int:
    lock_prefix, *actor_prefixes = context.prefixes
    report = reap_orphans(
        context.backend,
        broker=context.app.broker if context.app is not None else None,
        prefix=lock_prefix,
        actor_prefixes=actor_prefixes,
        max_passes=args.max_passes,
        logger=logging.getLogger("dramatiq_unique.reaper"),
    )
    if args.json:
        context.print_json(report.as_dict())
        return RET_OK
    if report.skipped:
        context.print("Another orphan reaper is running; this run did nothing.")
        return RET_OK
    passes = count(report.passes, "pass", "passes")
    context.print(
        f"The orphan reaper inspected {count(report.inspected, 'holder')} of locks in {passes} "
        f"({'a full cycle' if report.complete else 'stopped at --max-passes'}) in {report.seconds:.2f}s and released "
        f"{report.released}: {report.released_dead_workers} of dead workers, {report.released_missing_messages} of "
        "messages that no longer exist."
        + (
            f" It enqueued again {count(report.enqueued_again, 'message')} that a line handed a slot."
            if report.enqueued_again
            else ""
        )
        + (
            f" It left {count(report.left_for_broker, 'holder')} held whose lock has messages waiting in its line:"
            " pass --app to let the reaper enqueue the one handed the slot."
            if report.left_for_broker
            else ""
        )
    )
    if context.app is None:
        context.print("Enqueue locks were left alone: pass --app to let the reaper ask your broker about them.")
    return RET_OK


#: The event kinds in the order of the stats table's columns.
STATS_COLUMNS = (
    "acquired",
    "released",
    "conflict",
    "rescheduled",
    "rejected",
    "replaced",
    "lapsed",
    "lease_lost",
    "reaped",
    "backend_error",
)


def declare_stats(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "stats",
        help="count the lock events of the last minutes",
        description="Count, per actor, the lock events every worker and sender reported in the last minutes "
        "(acquisitions, conflicts, releases, ...). Workers report them once per heartbeat interval, so the last "
        "seconds may be missing.",
    )
    parser.add_argument(
        "--minutes", type=_positive, default=60, metavar="N", help="the last N minutes, at most 360 (default: 60)"
    )
    parser.add_argument("--json", action="store_true", help="print per-minute rows and totals as one JSON object")
    parser.set_defaults(run=run_stats)


def run_stats(context: Context, args: argparse.Namespace) -> int:
    try:
        report = read_activity(context.backend, prefix=context.prefixes[0], minutes=args.minutes)
    except ValueError as e:
        raise CommandError(str(e), RET_USAGE) from None
    if args.json:
        context.print_json(report.as_dict())
        return RET_OK
    totals = report.totals()
    window = f"the last {count(args.minutes, 'minute')} under prefix {context.prefixes[0]!r}"
    if not totals:
        context.print(f"No lock events in {window}.")
        return RET_OK
    columns = [kind for kind in STATS_COLUMNS if any(kind in counts for counts in totals.values())]
    rows = [
        [actor or "(no actor)", *(str(counts.get(kind, 0)) for kind in columns)]
        for actor, counts in sorted(totals.items())
    ]
    context.print(f"Lock events of {window}:")
    for line in table(["ACTOR", *(kind.upper().replace("_", " ") for kind in columns)], rows):
        context.print(line)
    return RET_OK


def declare_web(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "web",
        help="serve the web page of held locks",
        description="Serve the web page of held locks, workers and lock activity with Python's wsgiref server, "
        "read-only unless --allow-unlock. With --app it also says what a new send would meet and whether a queued "
        f"message is still in the broker. Needs Jinja2, which the package's web extra brings: see {EXTRAS}",
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="the port to listen on (default: 8000)")
    parser.add_argument(
        "--allow-unlock", action="store_true", help="show unlock buttons and accept unlocking (POST, CSRF token)"
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the page is reached by, besides the listening address, localhost and 127.0.0.1 "
        "(repeatable); other Host headers are refused",
    )
    parser.set_defaults(run=run_web)


def run_web(context: Context, args: argparse.Namespace) -> int:
    from wsgiref.simple_server import make_server

    try:
        from .web.app import SCAN_BATCH, LocksWebApp
    except ImportError as e:
        raise CommandError(str(e), RET_IMPORT) from None
    app = context.app
    wsgi_app = LocksWebApp(
        context.make_locks(batch=SCAN_BATCH),
        allow_unlock=args.allow_unlock,
        broker=app.broker if app is not None else None,
        middleware=app.unique if app is not None else None,
    )
    with make_server(args.host, args.port, wsgi_app) as server:
        # Only the names it is served under: another site's name pointed at this address (DNS
        # rebinding) would be same-origin with the page for the browser.
        names = {args.host, "localhost", "127.0.0.1", "[::1]", *args.allowed_host}
        wsgi_app.allowed_hosts = frozenset(f"{name}:{server.server_port}".lower() for name in names)
        mode = "unlocking allowed" if args.allow_unlock else "read-only"
        print(f"Serving the locks page on http://{args.host}:{server.server_port}/ ({mode}).", file=context.err)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return RET_OK


#: The subcommands, in the order of ``--help``.
SUBCOMMANDS: list[Callable[[Subparsers], None]] = [
    declare_list,
    declare_show,
    declare_explain,
    declare_history,
    declare_unlock,
    declare_cancel,
    declare_reap,
    declare_stats,
    declare_web,
]


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 1")
    return number


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_argument(value: str) -> int:
    """``30s``, ``15m``, ``2h``, ``1d``, or several, ``1h30m``: in milliseconds."""
    parts = _DURATION.findall(value.strip().lower())
    if not parts or "".join(number + unit for number, unit in parts) != value.strip().lower():
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration such as 30s, 15m, 2h or 1d")
    total = sum(int(number) * _UNITS[unit] for number, unit in parts)
    if total < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is no time at all")
    return total


def _prefix_argument(value: str) -> str:
    # A prefix that no actor may declare holds no lock: refused as the declaration refuses it.
    problem = prefix_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{value!r} is no lock prefix: it {problem}")
    return value


def _json_argument(value: str, kind: type, problem: str) -> Any:
    try:
        parsed = json.loads(value)
    except RecursionError:  # nested deeper than the parser goes
        raise CommandError(f"{problem}: it is nested too deeply.", RET_USAGE) from None
    except ValueError as e:
        raise CommandError(f"{problem}: {e}.", RET_USAGE) from None
    if not isinstance(parsed, kind):
        raise CommandError(f"{problem}, not {type(parsed).__name__}.", RET_USAGE)
    return parsed


def _unreadable(context: Context, digest: str) -> dict[str, dict[str, str]]:
    """The records of the locks of ``digest`` that this version cannot read, by key, as last read."""
    return {key: records for key, records in context.locks.unreadable.items() if digest_of(key) == digest}


#: How many candidates an ambiguous digest prefix names.
CANDIDATES_SHOWN = 10


def _resolve(context: Context, value: str) -> str:
    """The digest that ``value`` is, or is the unique prefix of among the held locks.

    Raises:
      CommandError: If ``value`` is too short, starts no held lock's digest, or starts several.
    """
    if len(value) >= DIGEST_LENGTH:
        return value
    try:
        found = context.locks.resolve(value)
    except ValueError as e:
        raise CommandError(str(e), RET_USAGE) from None
    if len(found) == 1:
        return found[0]
    if not found:
        raise CommandError(
            f"No lock whose digest starts with {value!r} is held on {context.where()} (a digest has "
            f"{DIGEST_LENGTH} characters).",
            RET_NOT_FOUND,
        )
    candidates = []
    for digest in found[:CANDIDATES_SHOWN]:
        locks = context.locks.get(digest)
        holder = locks[0].holders[0] if locks else None
        described = (
            ""
            if holder is None
            else f" (actor {holder.actor}" + (f", {holder.call})" if holder.call is not None else ")")
        )
        candidates.append(digest + described)
    more = f", and {len(found) - CANDIDATES_SHOWN} more" if len(found) > CANDIDATES_SHOWN else ""
    raise CommandError(
        f"The digest prefix {value!r} is ambiguous: {len(found)} held locks on {context.where()} start with it: "
        f"{'; '.join(candidates)}{more}. Give more characters.",
        RET_USAGE,
    )


def _held(
    context: Context, digest: str, *, message_id: str | None = None, or_unreadable: bool = False
) -> list[LockInfo]:
    """The locks of ``digest``, with only the holder of ``message_id`` (or of the only message id that
    starts with it) when given; with ``or_unreadable``, none when it holds only records this version
    cannot read."""
    try:
        locks = list(context.locks.get(digest))
    except ValueError as e:
        raise CommandError(str(e), RET_USAGE) from None
    unreadable = _unreadable(context, digest)
    if not locks and unreadable:
        if or_unreadable:
            return locks
        reasons = "; ".join(
            f"in {key!r}, {reason}" for key, records in unreadable.items() for reason in records.values()
        )
        raise CommandError(
            f"The locks of digest {digest!r} hold only records this version cannot read: {reasons}. Remove them by "
            "hand (see Errors in the docs).",
            RET_NOT_FOUND,
        )
    if not locks:
        hint = "" if len(digest) == DIGEST_LENGTH else f" (a digest has {DIGEST_LENGTH} characters)"
        raise CommandError(f"No lock of digest {digest!r} is held on {context.where()}{hint}.", RET_NOT_FOUND)
    if message_id is None:
        return locks
    ids = {h.message_id for lock in locks for h in lock.holders if h.message_id.startswith(message_id)}
    if message_id not in ids and len(ids) > 1:
        raise CommandError(
            f"Message id {message_id!r} is ambiguous: it starts {', '.join(map(repr, sorted(ids)))} among the holders "
            f"of digest {digest!r}. Give more characters.",
            RET_USAGE,
        )
    wanted = message_id if message_id in ids or not ids else ids.pop()
    mine = [lock for lock in (lock.only(message_id=wanted) for lock in locks) if lock is not None]
    if not mine:
        raise CommandError(f"Message {message_id!r} holds none of the locks of digest {digest!r}.", RET_NOT_FOUND)
    return mine


def _filters(args: argparse.Namespace) -> str:
    filters = [f"{name} {getattr(args, name)!r}" for name in ("actor", "state") if getattr(args, name, None)]
    return (" for " + " and ".join(filters)) if filters else ""


# Entry point -----------------------------------------------------------------


def make_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dramatiq-unique",
        description="See, explain and free the job-uniqueness locks of Dramatiq actors.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=HELP_EPILOG,
    )
    parser.add_argument(
        "--url", help="the Redis URL of the locks (default: $DRAMATIQ_UNIQUE_URL, else --app's, else $REDIS_URL)"
    )
    parser.add_argument(
        "--prefix",
        action="append",
        type=_prefix_argument,
        help=f"a lock prefix, repeated for actors with their own (default: {DEFAULT_LOCK_PREFIX}, or --app's)",
    )
    parser.add_argument(
        "--app",
        metavar="MODULE",
        help="import MODULE or MODULE:BROKER as the dramatiq command does, and use its UniqueJobs: its backend, "
        "every lock prefix its actors use, and its broker for reap",
    )
    # One path per option: nargs="*" would take the subcommand's name for a path too.
    parser.add_argument(
        "--path", "-P", action="append", metavar="PATH", help="a module import path, repeated for several (default: .)"
    )
    parser.add_argument("--version", action="version", version=__version__)
    subparsers = parser.add_subparsers(metavar="COMMAND", required=True)
    for declare in SUBCOMMANDS:
        declare(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit code."""
    args = make_argument_parser().parse_args(argv)
    for path in args.path or ["."]:
        sys.path.insert(0, path)
    run: Run = args.run
    try:
        context = Context(args, out=sys.stdout, err=sys.stderr, stdin=sys.stdin)
        # After the application is imported: its own logging setup wins.
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return run(context, args)
    except CommandError as e:
        return _fail(str(e), e.code)
    except LineNeedsBroker as e:
        return _fail(str(e), RET_LINE)
    except LockBackendError as e:
        return _fail(str(e), RET_CONNECT)
    except KeyboardInterrupt:
        return _fail("Interrupted.", RET_ABORTED)


def _fail(message: str, code: int) -> int:
    # One line: no error quotes a URL (RedisBackend's and redis-py's name a host and port at most).
    print("dramatiq-unique: error: " + " ".join(message.split()), file=sys.stderr)
    return code


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def redact(text: str, urls: Iterable[str | None]) -> str:
    """``text`` without URLs, nor the passwords of ``urls`` or pieces of them:
    an error raised while a module imports may quote what urllib took for a port."""
    for url in urls:
        if not url:
            continue
        password = url.partition("://")[2].rpartition("@")[0].partition(":")[2]
        pieces = {password, *re.split("[:/?#@]", password)}
        for piece in sorted(pieces | {unquote(p) for p in pieces}, key=len, reverse=True):
            if len(piece) >= 3:
                text = text.replace(piece, "***")
    return _URL.sub("<url>", text)
