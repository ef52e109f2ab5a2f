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
import sys
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
from .held import RUNNING, LockInfo
from .keys import RUN, digest_of
from .middleware import UniqueJobs
from .operations import Locks, unique_jobs_of
from .options import DEFAULT_LOCK_PREFIX, prefix_problem
from .presentation import count, describe_lock, lock_table, places, prefixes_phrase, table
from .reaper import DEFAULT_BATCH, reap_orphans
from .version import __version__

#: The exit codes.
RET_OK = 0  # Done.
RET_USAGE = 2  # Invalid command line (argparse's own code), or invalid arguments for an actor.
RET_IMPORT = 3  # The module does not import, or holds no such actor, broker or UniqueJobs.
RET_CONNECT = 4  # The lock backend cannot be reached, or failed.
RET_URL = 5  # No Redis URL, or one that cannot be used.
RET_NOT_FOUND = 6  # No lock of that digest, or no place of that message, is held.
RET_ABORTED = 7  # The confirmation was not given.
RET_CHANGED = 8  # Some places changed after they were read and were left held.
RET_LINE = 9  # Messages wait in a lock's line: only the command with --app frees a place there.

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

  # One lock, then free it; free every lock of one actor.
  $ dramatiq-unique show A3QW7mGGvwLB5oZHvzHpkA
  $ dramatiq-unique unlock A3QW7mGGvwLB5oZHvzHpkA
  $ dramatiq-unique unlock --actor settle_payment --all --dry-run

  # Run the orphan reaper once (with --app it also asks the broker about enqueue locks).
  $ dramatiq-unique --app myapp.tasks reap --json

  # What the locks did in the last 15 minutes, per actor.
  $ dramatiq-unique stats --minutes 15

  # The web page of held locks on http://127.0.0.1:8000/, read-only.
  $ dramatiq-unique --app myapp.tasks web

exit codes:
  0 done, 2 invalid command line or actor arguments, 3 module import failed,
  4 lock backend unreachable, 5 no or bad Redis URL, 6 no such lock or holder,
  7 not confirmed, 8 some places changed after they were read and were left held
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
    parser.set_defaults(run=run_list)


def run_list(context: Context, args: argparse.Namespace) -> int:
    locks = list(context.locks.list(actor=args.actor, state=args.state, limit=args.limit))
    if args.json:
        context.print_json([lock.as_dict() for lock in locks])
        return RET_OK
    if not locks:
        context.print(f"No locks are held under {prefixes_phrase(context.prefixes)}" + _filters(args) + ".")
        return RET_OK
    for line in lock_table(locks):
        context.print(line)
    context.print()
    context.print(f"{places(locks)} under {prefixes_phrase(context.prefixes)}" + _filters(args) + ".")
    return RET_OK


def declare_show(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser("show", help="show the enqueue and run locks of one digest")
    parser.add_argument("digest", type=_digest_argument, metavar="DIGEST", help="the digest (or the key of a lock)")
    parser.add_argument("--json", action="store_true", help="print one JSON array of its locks")
    parser.set_defaults(run=run_show)


def run_show(context: Context, args: argparse.Namespace) -> int:
    locks = _held(context, args.digest, or_unreadable=True)
    if args.json:
        context.print_json([lock.as_dict() for lock in locks])
        return RET_OK
    for lock in locks:
        for line in describe_lock(lock):
            context.print(line)
    for key, reasons in _unreadable(context, args.digest).items():
        context.print(f"Lock {key!r} holds {count(len(reasons), 'place')} this version cannot read:")
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
    context.print(f"actor      {explanation.actor} (queue {explanation.queue})")
    if explanation.lock is None:
        context.print(explanation.on_send)
        return RET_OK
    context.print(f"lock       {explanation.lock} (lock_limit {explanation.lock_limit}, prefix {explanation.prefix!r})")
    context.print(f"lock args  {json.dumps(explanation.lock_args)}")
    context.print(f"digest     {explanation.digest}")
    context.print()
    for lock in explanation.locks:
        for line in describe_lock(lock):
            context.print(line)
    if not explanation.locks:
        context.print("No lock of this digest is held.")
    context.print()
    context.print(explanation.on_send)
    if explanation.on_start is not None:
        context.print(explanation.on_start)
    return RET_OK


def declare_unlock(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "unlock",
        help="free the locks of a digest, or of an actor",
        description="Free held places, each only while it is still as read. A freed message is neither stopped nor "
        "removed from its queue, and a duplicate of it can be sent meanwhile.",
    )
    parser.add_argument("digest", nargs="?", type=_digest_argument, metavar="DIGEST", help="the digest to free")
    parser.add_argument("--message-id", metavar="ID", help="free only the place of this message")
    parser.add_argument("--actor", help="with --all: free every place held by messages of this actor")
    parser.add_argument("--all", action="store_true", help="with --actor: free every lock of the actor")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument("--dry-run", action="store_true", help="only list what would be freed")
    parser.set_defaults(run=run_unlock, parser=parser)


def run_unlock(context: Context, args: argparse.Namespace) -> int:
    by_digest = args.digest is not None
    if by_digest == bool(args.actor or args.all) or (not by_digest and not (args.actor and args.all)):
        args.parser.error("give either DIGEST [--message-id ID] or --actor ACTOR --all")
    if args.message_id and not by_digest:
        args.parser.error("--message-id goes with DIGEST")
    if by_digest:
        found = _held(context, args.digest, message_id=args.message_id)
        what = f"of digest {args.digest!r}"
    else:
        found = list(context.locks.list(actor=args.actor))
        what = f"of actor {args.actor!r}"
        if not found:
            context.print(f"No locks of actor {args.actor!r} are held under prefix {context.prefixes[0]!r}.")
            return RET_OK
    if args.dry_run:
        context.print(f"Would free {places(found)} {what}:")
        for line in lock_table(found, indent="  "):
            context.print(line)
        return RET_OK
    if not by_digest and not args.yes:
        question = (
            f"Free {places(found)} {what}? Their messages are not stopped, and duplicates of them can be sent then."
        )
        if not context.confirm(question):
            context.print("Nothing was freed.")
            return RET_ABORTED
    freed = context.locks.release(found)
    context.print(f"Freed {places(freed)} {what}" + (":" if freed else "."))
    for line in lock_table(freed, indent="  ") if freed else ():
        context.print(line)
    left = sum(len(lock.holders) for lock in found) - sum(len(lock.holders) for lock in freed)
    if left:
        print(
            f"{count(left, 'place')} changed after {'it was' if left == 1 else 'they were'} read (a holder renewed "
            "its lease, re-entered or left) and stayed held; run the command again to see them.",
            file=context.err,
        )
        return RET_CHANGED
    return RET_OK


def declare_cancel(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "cancel",
        help="stop the running holder of a digest's run lock",
        description="Ask the running holders of a digest's run lock to stop: each worker interrupts its message at "
        "its next lease renewal. The place stays held until the message has stopped, so no duplicate starts "
        "meanwhile. A holder whose worker died is not interrupted: its lease lapses.",
    )
    parser.add_argument("digest", type=_digest_argument, metavar="DIGEST", help="the digest whose holder to stop")
    parser.add_argument("--message-id", metavar="ID", help="stop only this message")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    parser.set_defaults(run=run_cancel, parser=parser)


def run_cancel(context: Context, args: argparse.Namespace) -> int:
    found = [
        running
        for running in (
            lock.only(message_id=args.message_id, state=RUNNING) if lock.kind == RUN else None
            for lock in _held(context, args.digest)
        )
        if running is not None
    ]
    what = f"of digest {args.digest!r}"
    if not found:
        context.print(f"No message {what} runs holding a run lock: nothing to cancel.")
        return RET_NOT_FOUND
    if not args.yes:
        question = f"Stop {count(sum(len(lock.holders) for lock in found), 'running message')} {what}?"
        if not context.confirm(question):
            context.print("Nothing was cancelled.")
            return RET_ABORTED
    asked = context.locks.cancel(args.digest, args.message_id)
    context.print(
        f"Asked {count(sum(len(lock.holders) for lock in asked), 'running message')} {what} to stop"
        + (": each stops at its worker's next lease renewal, and keeps its place until then." if asked else ".")
    )
    for line in lock_table(asked, indent="  ") if asked else ():
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
        f"The orphan reaper inspected {count(report.inspected, 'lock place')} in {passes} "
        f"({'a full cycle' if report.complete else 'stopped at --max-passes'}) in {report.seconds:.2f}s and released "
        f"{report.released}: {report.released_dead_workers} of dead workers, {report.released_missing_messages} of "
        "messages that no longer exist."
        + (
            f" It enqueued again {count(report.enqueued_again, 'message')} that a line handed a place."
            if report.enqueued_again
            else ""
        )
        + (
            f" It left {count(report.left_for_broker, 'place')} held whose lock has messages waiting in its line:"
            " pass --app to let the reaper enqueue the one handed the place."
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
        "message is still in the broker. Needs the web extra: pip install 'dramatiq-unique[web]'.",
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
    """The places of the locks of ``digest`` that this version cannot read, by key, as last read."""
    return {key: places for key, places in context.locks.unreadable.items() if digest_of(key) == digest}


def _held(
    context: Context, digest: str, *, message_id: str | None = None, or_unreadable: bool = False
) -> list[LockInfo]:
    """The locks of ``digest``; with ``or_unreadable``, none when it holds only places this version cannot read."""
    try:
        locks = list(context.locks.get(digest))
    except ValueError as e:
        raise CommandError(str(e), RET_USAGE) from None
    unreadable = _unreadable(context, digest)
    if not locks and unreadable:
        if or_unreadable:
            return locks
        reasons = "; ".join(f"in {key!r}, {reason}" for key, places in unreadable.items() for reason in places.values())
        raise CommandError(
            f"The locks of digest {digest!r} hold only places this version cannot read: {reasons}. Remove them by "
            "hand (see Errors in the docs).",
            RET_NOT_FOUND,
        )
    if not locks:
        hint = "" if len(digest) == DIGEST_LENGTH else f" (a digest has {DIGEST_LENGTH} characters)"
        raise CommandError(
            f"No lock of digest {digest!r} is held under {prefixes_phrase(context.prefixes)}{hint}.", RET_NOT_FOUND
        )
    if message_id is None:
        return locks
    mine = [lock for lock in (lock.only(message_id=message_id) for lock in locks) if lock is not None]
    if not mine:
        raise CommandError(f"Message {message_id!r} holds no place in the locks of digest {digest!r}.", RET_NOT_FOUND)
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
