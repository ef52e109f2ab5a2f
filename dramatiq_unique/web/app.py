"""The WSGI application of the web page: held locks, one lock, workers, and unlocking.

Every page reads the locks through :class:`~dramatiq_unique.operations.Locks`,
so it sees what ``dramatiq-unique list`` sees, on a single Redis and on a
Redis Cluster. Links and form actions start with ``SCRIPT_NAME``, so the
application can be mounted under any path.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlencode

import dramatiq

from ..activity import read_activity
from ..backends import LockBackend
from ..digest import DIGEST_LENGTH
from ..errors import LineNeedsBroker, LockBackendError, UniqueError
from ..events import EVENT_KINDS
from ..held import STATES, LockInfo
from ..links import EXTRAS
from ..operations import Locks, unique_jobs_of
from ..options import DEFAULT_LOCK_PREFIX
from ..presentation import (
    age,
    expires,
    format_duration,
    format_time,
    holder_phrase,
    holder_state,
    lease,
    record_fields,
    where_phrase,
)
from .security import SECURITY_HEADERS, Csrf, mount_path

try:
    import jinja2
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(f"dramatiq_unique.web needs Jinja2, which the package's 'web' extra brings: see {EXTRAS}") from e

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIEnvironment
    from dramatiq import Broker

    from ..middleware import UniqueJobs

_logger = logging.getLogger(__name__)

#: Decides whether a request may unlock: called with the WSGI environ.
Authorize = Callable[["WSGIEnvironment"], bool]

#: How many locks a page of the list shows.
PAGE_SIZE = 50
#: The most entries of the conflict trail a page shows.
TRAIL_ROWS = 20
#: About how many keys one scan step of a page reads, and at most how many steps a page takes.
SCAN_BATCH = 100
MAX_STEPS = 5
#: The largest form body read, in bytes.
MAX_BODY = 16 * 1024

_STATUS = {200: "200 OK", 400: "400 Bad Request", 403: "403 Forbidden", 404: "404 Not Found"}
_STATUS.update({405: "405 Method Not Allowed", 503: "503 Service Unavailable"})


@dataclass
class Response:
    status: int
    body: str
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


class HTTPError(Exception):
    """An answer other than the page asked for, with a sentence for the person who asked."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


class Request:
    """What a handler needs from the WSGI environ."""

    def __init__(self, environ: WSGIEnvironment):
        self.environ = environ
        self.method = environ.get("REQUEST_METHOD", "GET").upper()
        self.path: str = str(environ.get("PATH_INFO", "")) or "/"
        self.root: str = mount_path(environ).rstrip("/")
        self.query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        self._form: dict[str, str] | None = None

    @property
    def form(self) -> dict[str, str]:
        if self._form is None:
            content_type = self.environ.get("CONTENT_TYPE", "").partition(";")[0].strip()
            if content_type != "application/x-www-form-urlencoded":
                raise HTTPError(400, "A form must be sent as application/x-www-form-urlencoded.")
            try:
                length = int(self.environ.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                raise HTTPError(400, "The form is too large, or its length is not given.")
            body = self.environ["wsgi.input"].read(length).decode("utf-8", "replace")
            # A blank value is a value: the unlock form of a holder whose message_id is empty sends one.
            self._form = {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
        return self._form

    def url(self, path: str, **query: Any) -> str:
        """A link to ``path`` of this application, with the query parameters that are not empty."""
        params = {k: v for k, v in query.items() if v not in (None, "")}
        return self.root + path + ("?" + urlencode(params) if params else "")


class LocksWebApp:
    """The web page of the held locks, as a WSGI application.

    Parameters:
      locks(Locks): The locks it shows.
      allow_unlock(bool): Whether unlock buttons are shown and unlocking is accepted.
      authorize(collections.abc.Callable): Called with the WSGI environ of each request; only
        when it returns True may the request unlock. ``None`` lets every
        request unlock when ``allow_unlock`` is set.
      broker(dramatiq.Broker): The broker, to tell whether a queued holder's message
        is still in it (RedisBroker, RabbitmqBroker, StubBroker), and its call where the lock
        does not keep it (RedisBroker, StubBroker).
      middleware(UniqueJobs): The middleware of the application, to say what
        a new send would meet and how old a worker's heartbeat is.
      secret(bytes|str): The key of the CSRF tokens (a ``str`` is taken as its UTF-8 bytes);
        random per application when ``None``. Give every process serving the page the same one.
      allowed_hosts(Iterable[str]): The ``Host`` headers (``name:port``) the
        page answers; ``None`` for any, when the web application it is mounted
        in checks them. A page that answers any host can be read, and with
        ``allow_unlock`` used, by a site whose name is made to point at it.
    """

    def __init__(
        self,
        locks: Locks,
        *,
        allow_unlock: bool = False,
        authorize: Authorize | None = None,
        broker: Broker | None = None,
        middleware: UniqueJobs | None = None,
        secret: bytes | str | None = None,
        allowed_hosts: Iterable[str] | None = None,
    ):
        self.locks = locks
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        self.allow_unlock = allow_unlock
        self.authorize = authorize
        self.broker = broker
        self.middleware = middleware
        self.csrf = Csrf(secret=secret)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("dramatiq_unique.web", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.stylesheet = (resources.files(__package__) / "static" / "style.css").read_bytes()

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        try:
            if self.allowed_hosts is not None and str(environ.get("HTTP_HOST", "")).lower() not in self.allowed_hosts:
                raise HTTPError(400, "This page is not served under that host name.")
            response = self._dispatch(request)
        except HTTPError as e:
            response = self._render(request, "error.html", status=e.status, message=e.message)
            response.headers += e.headers
        except LineNeedsBroker as e:
            # Served with a bare backend (--url): a message waits in the line of a lock to free.
            response = self._render(request, "error.html", status=409, message=str(e))
        except LockBackendError as e:
            # The backend's errors name a host and port at most, never a password.
            response = self._render(request, "error.html", status=503, message=str(e))
        except Exception:
            # E.g. an authorize callable or the broker's Redis failing: the answer still
            # carries the security headers, and says nothing of the cause.
            _logger.exception("The locks page failed to answer %s %s.", request.method, request.path)
            response = self._render(request, "error.html", status=500, message="The page failed; see the server's log.")
        body = response.body.encode()
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(body))),
            *SECURITY_HEADERS,
            *response.headers,
        ]
        start_response(_STATUS.get(response.status, f"{response.status} Error"), headers)
        return [b"" if request.method == "HEAD" else body]

    # Routing -----------------------------------------------------------------

    def _dispatch(self, request: Request) -> Response:
        path = request.path
        if path == "/static/style.css":
            self._only(request, "GET")
            return Response(200, self.stylesheet.decode(), content_type="text/css; charset=utf-8")
        if path in ("/", ""):
            self._only(request, "GET")
            return self.locks_page(request)
        if path.startswith("/locks/") and path.count("/") == 2:
            self._only(request, "GET")
            return self.lock_page(request, path.removeprefix("/locks/"))
        if path == "/workers":
            self._only(request, "GET")
            return self.workers_page(request)
        if path in ("/unlock", "/unlock-actor"):
            self._only(request, "POST")
            self._check_unlock(request)
            return self.unlock(request) if path == "/unlock" else self.unlock_actor(request)
        if path == "/cancel":
            self._only(request, "POST")
            self._check_unlock(request)
            return self.cancel(request)
        raise HTTPError(404, "There is no such page.")

    def _only(self, request: Request, method: str) -> None:
        allowed = (method, "HEAD") if method == "GET" else (method,)
        if request.method not in allowed:
            raise HTTPError(405, f"This page only answers {method}.", [("Allow", ", ".join(allowed))])

    # Pages -------------------------------------------------------------------

    def locks_page(self, request: Request) -> Response:
        query = request.query
        actor, state, digest = query.get("actor") or None, query.get("state") or None, query.get("digest") or None
        if state is not None and state not in STATES:
            raise HTTPError(400, "The state filter must be 'queued' or 'running'.")
        try:
            found, next_cursor = self.locks.page(
                cursor=query.get("cursor") or None,
                limit=PAGE_SIZE,
                actor=actor,
                state=state,
                digest_prefix=digest,
                max_steps=MAX_STEPS,
            )
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        conflicts = self.locks.history(actor, limit=TRAIL_ROWS) if actor is not None else ()
        found = self.locks.with_calls(found, self.broker)
        report = read_activity(self.locks.backend, prefix=self.locks.prefixes[0], minutes=60)
        totals = report.totals()
        kinds = [kind for kind in EVENT_KINDS if any(kind in counts for counts in totals.values())]
        filters = {"actor": actor, "state": state, "digest": digest}
        return self._render(
            request,
            "locks.html",
            locks=found,
            filters=filters,
            filtered=any(filters.values()),
            first_page=query.get("cursor") is None,
            next_url=request.url("/", **filters, cursor=next_cursor) if next_cursor else None,
            first_url=request.url("/", **filters),
            activity=sorted(totals.items()),
            activity_kinds=kinds,
            unreadable=dict(self.locks.unreadable),
            conflicts=conflicts,
            trail_of=f"of actor {actor}",
            trail_digest=None,
        )

    def lock_page(self, request: Request, digest: str) -> Response:
        try:
            found = self.locks.get(digest)
        except ValueError as e:
            raise HTTPError(404, str(e)) from None
        unreadable = dict(self.locks.unreadable)
        # A free lock still has the page of its conflict trail: why its job did not run.
        conflicts = self.locks.history(digest=digest, limit=TRAIL_ROWS) if len(digest) == DIGEST_LENGTH else ()
        if not found and not unreadable and not conflicts:
            raise HTTPError(404, f"No lock of digest {digest!r} is held: it is free.")
        found = self.locks.with_calls(found, self.broker)
        explanations = []
        if self.middleware is not None:
            for actor in dict.fromkeys(h.actor for lock in found for h in lock.holders):
                config = self.middleware.lock_config(actor)
                if config is not None:
                    explanations.append(self.locks.explain_digest(digest, actor=actor, config=config))
        return self._render(
            request,
            "lock.html",
            digest=digest,
            locks=found,
            in_broker=self.locks.in_broker(found, self.broker),
            explanations=explanations,
            calls_of=_calls_of(found),
            explained=self.middleware is not None,
            unreadable=unreadable,
            conflicts=conflicts,
            trail_of="of this lock",
            trail_digest=digest,
        )

    def workers_page(self, request: Request) -> Response:
        # The heartbeat a worker sent last is only known when it has this application's lease period.
        lease = self.middleware.liveness.lease_period if self.middleware is not None else None
        now, workers = self.locks.workers()
        rows = [
            {
                "worker": w.worker_id,
                "prefixes": ", ".join(w.prefixes),
                "alive": w.alive,
                "alive_until": format_time(w.alive_until),
                "left": format_duration(w.alive_until - now) if w.alive else None,
                "since": format_duration(now - w.alive_until) if not w.alive else None,
                "heartbeat": format_duration(now - (w.alive_until - lease)) if lease is not None else None,
            }
            for w in workers
        ]
        return self._render(request, "workers.html", workers=rows, now=format_time(now), lease_known=lease is not None)

    # Unlocking ---------------------------------------------------------------

    def _check_unlock(self, request: Request) -> None:
        if not self.allow_unlock:
            raise HTTPError(403, "Unlocking is turned off: this page is read-only.")
        if not self._authorized(request):
            raise HTTPError(403, "You may not unlock here.")
        if not self.csrf.check(request.environ, request.form.get("csrf")):
            raise HTTPError(403, "The form's CSRF token is missing or does not match its cookie: reload the page.")

    def unlock(self, request: Request) -> Response:
        form = request.form
        # Without a message_id (the form of the whole lock), every holder of the digest is freed.
        digest, message_id = form.get("digest", ""), form.get("message_id")
        try:
            freed = self.locks.unlock(digest, message_id)
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        what = f"digest {digest}" + ("" if message_id is None else f", message {message_id!r}")
        return self._render(request, "freed.html", freed=freed, what=what)

    def unlock_actor(self, request: Request) -> Response:
        actor = request.form.get("actor", "")
        if not actor:
            raise HTTPError(400, "Name the actor whose locks to free.")
        freed = self.locks.unlock_all(actor=actor)
        return self._render(request, "freed.html", freed=freed, what=f"actor {actor}")

    def cancel(self, request: Request) -> Response:
        # Stops a running holder as `dramatiq-unique cancel` does: behind the safeguards of
        # unlocking, and confirmed by the form's box.
        form = request.form
        if form.get("confirm") != "yes":
            raise HTTPError(400, "Tick the box to confirm that the running message is to be stopped.")
        digest, message_id = form.get("digest", ""), form.get("message_id")
        try:
            asked = self.locks.cancel(digest, message_id, by=_operator(request.environ))
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
        what = f"digest {digest}" + ("" if message_id is None else f", message {message_id!r}")
        return self._render(request, "cancelled.html", asked=asked, what=what)

    # Helpers -----------------------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        if not self.allow_unlock:
            return False
        if self.authorize is None:
            return True
        try:
            return self.authorize(request.environ) is True
        except Exception:
            # A failing authorize denies: the page stays read-only for this request.
            _logger.exception("The authorize callable of the locks page failed; the request may not unlock.")
            return False

    def _render(self, request: Request, template: str, *, status: int = 200, **context: Any) -> Response:
        headers = []
        can_unlock = self._authorized(request)
        token = None
        if can_unlock:
            nonce = self.csrf.nonce(request.environ)
            if nonce is None:
                nonce = self.csrf.new_nonce()
                headers.append(self.csrf.cookie(nonce, request.environ))
            token = self.csrf.token(nonce)
        body = self.templates.get_template(template).render(
            url=request.url,
            lock_url=lambda digest: request.url("/locks/" + quote(digest, safe="")),
            can_unlock=can_unlock,
            csrf_token=token,
            prefixes=self.locks.prefixes,
            age=age,
            lease_left=functools.partial(lease, none="–"),
            expires_in=functools.partial(expires, never="never", none="–"),
            when=format_time,
            trail_where=where_phrase,
            trail_holder=functools.partial(holder_phrase, full=True),
            record_fields=record_fields,
            holder_state=holder_state,
            status=status,
            **context,
        )
        return Response(status, body, headers=headers)


def _operator(environ: WSGIEnvironment) -> str:
    """Who cancels from the page, as the holder's worker logs it: the user the server
    authenticated, else the client's address, and the host that serves the page."""
    who = environ.get("REMOTE_USER") or environ.get("REMOTE_ADDR") or "an unknown client"
    return f"{who} on the web page of {socket.gethostname()}"


def _calls_of(locks: Iterable[LockInfo]) -> dict[str, list[str]]:
    """The calls of the holders of each actor, once each: the arguments that a new message of
    their digest has (the lock arguments they share, and perhaps others)."""
    calls: dict[str, list[str]] = {}
    for lock in locks:
        for holder in lock.holders:
            if holder.call is not None and holder.call not in calls.setdefault(holder.actor, []):
                calls[holder.actor].append(holder.call)
    return calls


def make_wsgi_app(
    backend: LockBackend,
    *,
    lock_prefix: str = DEFAULT_LOCK_PREFIX,
    actor_prefixes: Iterable[str] = (),
    allow_unlock: bool = False,
    authorize: Authorize | None = None,
    broker: Broker | None = None,
    secret: bytes | str | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> LocksWebApp:
    """The web page of the locks in ``backend``, as a WSGI application.

    Parameters:
      backend(LockBackend): Where the locks are.
      lock_prefix(str): The middleware's lock prefix.
      actor_prefixes(Iterable[str]): The ``lock_prefix`` of actors that have their own.
      allow_unlock(bool): Show unlock buttons and accept unlocking; read-only by default.
      authorize(collections.abc.Callable): Called with the WSGI environ; only when it returns
        True may the request unlock.
      broker(dramatiq.Broker): The broker, to tell whether a queued message is still in it.
      secret(bytes|str): The key of the CSRF tokens, the same in every process
        serving the page; random when ``None``.
      allowed_hosts(Iterable[str]): The ``Host`` headers it answers; ``None``
        for any (leave the check to the application it is mounted in).

    Raises:
      ImportError: If Jinja2 is not installed (the ``web`` extra).
      TypeError: If ``secret`` is neither bytes nor a str.
      ValueError: If ``secret`` is empty.
    """
    locks = Locks(backend, lock_prefix=lock_prefix, actor_prefixes=actor_prefixes, batch=SCAN_BATCH)
    return LocksWebApp(
        locks,
        allow_unlock=allow_unlock,
        authorize=authorize,
        broker=broker,
        secret=secret,
        allowed_hosts=allowed_hosts,
    )


def from_middleware(
    unique_jobs: UniqueJobs,
    *,
    allow_unlock: bool = False,
    authorize: Authorize | None = None,
    broker: Broker | None = None,
    secret: bytes | str | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> LocksWebApp:
    """The web page of the locks of ``unique_jobs``, under every lock prefix
    its actors use; it also says what a new send would meet, from the actors'
    options. The parameters are those of :func:`make_wsgi_app`."""
    return LocksWebApp(
        Locks.from_middleware(unique_jobs, batch=SCAN_BATCH),
        allow_unlock=allow_unlock,
        authorize=authorize,
        broker=broker,
        middleware=unique_jobs,
        secret=secret,
        allowed_hosts=allowed_hosts,
    )


class BrokerLocksWebApp:
    """The web page of the :class:`~dramatiq_unique.UniqueJobs` middleware of a broker, as a
    WSGI application that finds the broker, the middleware and its lock backend at its first
    request. Build it with :func:`from_broker`.

    Parameters:
      broker(dramatiq.Broker): The broker; ``None`` for ``dramatiq.get_broker()``.
      options: The keyword arguments of :func:`from_middleware` other than ``broker``.
    """

    def __init__(self, broker: Broker | None, **options: Any):
        self._broker = broker
        self._options = options
        self._page: LocksWebApp | None = None
        self._building = threading.Lock()

    def page(self) -> LocksWebApp:
        """The page, built the first time it is asked for; a failed build is tried again next time.

        Raises:
          UniqueError: If the broker has no ``UniqueJobs`` middleware.
          InvalidBackendOptions: If the middleware was given no lock backend and nothing names one.
        """
        if self._page is None:
            with self._building:
                if self._page is None:
                    self._page = self._build()
        return self._page

    def _build(self) -> LocksWebApp:
        broker = self._broker if self._broker is not None else dramatiq.get_broker()
        try:
            unique_jobs = unique_jobs_of(broker)
        except ValueError as e:
            raise UniqueError(
                f"{e} The locks page shows the locks of UniqueJobs: add it to the broker (in Django: "
                '"dramatiq_unique.UniqueJobs" in DRAMATIQ_BROKER["MIDDLEWARE"]), or build the page with '
                "make_wsgi_app(backend)."
            ) from None
        unique_jobs.resolve_backend(broker)
        return from_middleware(unique_jobs, broker=broker, **self._options)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        return self.page()(environ, start_response)


def from_broker(
    broker: Broker | None = None,
    *,
    allow_unlock: bool = False,
    authorize: Authorize | None = None,
    secret: bytes | str | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> BrokerLocksWebApp:
    """The web page of the locks of the ``UniqueJobs`` middleware on ``broker``, as
    :func:`from_middleware` builds it. Call it at any time, before the broker exists too: the
    page takes the broker (``dramatiq.get_broker()`` when ``None``), its middleware and the
    middleware's lock backend at its first request. That suits a Django project, where
    django_dramatiq builds the broker and the middleware from the settings.

    Parameters:
      broker(dramatiq.Broker): The broker; ``None`` for the global broker at the first request.
      allow_unlock(bool): Show unlock buttons and accept unlocking; read-only by default.
      authorize(collections.abc.Callable): Called with the WSGI environ; only when it returns
        True may the request unlock.
      secret(bytes|str): The key of the CSRF tokens, the same in every process
        serving the page; random when ``None``.
      allowed_hosts(Iterable[str]): The ``Host`` headers it answers; ``None``
        for any (leave the check to the application it is mounted in).

    Raises:
      TypeError: If ``secret`` is neither bytes nor a str.
      ValueError: If ``secret`` is empty.
    """
    # A secret that cannot be used fails here, not at the first request.
    Csrf(secret=secret)
    return BrokerLocksWebApp(
        broker,
        allow_unlock=allow_unlock,
        authorize=authorize,
        secret=secret,
        allowed_hosts=allowed_hosts,
    )
