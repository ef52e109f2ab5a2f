"""What keeps the web page's unlock buttons for the people meant to press them.

A POST must carry a CSRF token: the HMAC, under the application's secret, of
a random nonce kept in a ``SameSite=Strict``, ``HttpOnly`` cookie. Another
site can neither read the page's token nor send the cookie with its own
forms, and a token is worthless without the cookie it belongs to.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from http.cookies import SimpleCookie
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

#: The cookie that holds the nonce of the CSRF token.
CSRF_COOKIE = "dramatiq_unique_csrf"

#: Sent with every answer: no script or style from elsewhere, no inline
#: script, no framing, forms only to this page.
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)


class Csrf:
    """Issues and checks CSRF tokens.

    Parameters:
      secret(bytes|str): The key of the HMAC, a ``str`` taken as its UTF-8 bytes; a random one
        per application when ``None``, so every process serving the page needs the same one.

    Raises:
      TypeError: If ``secret`` is neither bytes nor a str.
      ValueError: If ``secret`` is empty.
    """

    def __init__(self, *, secret: bytes | str | None = None):
        self._secret = secrets.token_bytes(32) if secret is None else _key(secret)

    def nonce(self, environ: WSGIEnvironment) -> str | None:
        """The nonce of the request's cookie, ``None`` when it has none that looks right."""
        cookie: SimpleCookie = SimpleCookie()
        try:
            cookie.load(environ.get("HTTP_COOKIE", ""))
        except Exception:  # a malformed Cookie header is no cookie
            return None
        morsel = cookie.get(CSRF_COOKIE)
        if morsel is None or len(morsel.value) != 32 or not morsel.value.isalnum():
            return None
        return morsel.value

    def new_nonce(self) -> str:
        return secrets.token_hex(16)

    def token(self, nonce: str) -> str:
        """The token the forms carry for the cookie's ``nonce``."""
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def cookie(self, nonce: str, environ: WSGIEnvironment) -> tuple[str, str]:
        """The Set-Cookie header that keeps ``nonce`` for the page's path."""
        path = mount_path(environ) or "/"
        value = f"{CSRF_COOKIE}={nonce}; Path={path}; HttpOnly; SameSite=Strict"
        if environ.get("wsgi.url_scheme") == "https":
            value += "; Secure"
        return "Set-Cookie", value

    def check(self, environ: WSGIEnvironment, token: str | None) -> bool:
        """Whether a POST comes from this page: its token matches its cookie, and its Origin, if sent, is ours."""
        origin = environ.get("HTTP_ORIGIN")
        if origin is not None and origin != own_origin(environ):
            return False
        nonce = self.nonce(environ)
        if nonce is None or not token:
            return False
        return hmac.compare_digest(self.token(nonce), token)


def _key(secret: object) -> bytes:
    # The errors name the parameter and the type, never the value: it is a secret.
    if isinstance(secret, str):
        # A lone surrogate (os.environ's for a byte that is not UTF-8) is part of the key too.
        key = secret.encode("utf-8", "surrogatepass")
    elif isinstance(secret, (bytes, bytearray, memoryview)):
        key = bytes(secret)
    else:
        raise TypeError(
            f"The web page's secret must be bytes or a str, the key of its CSRF tokens, not {type(secret).__name__}."
        )
    if not key:
        raise ValueError(
            "The web page's secret is empty: give it the same random value in every process that serves the page "
            "(e.g. secrets.token_hex(32), kept in your settings), or leave it out for a random one per process."
        )
    return key


def mount_path(environ: WSGIEnvironment) -> str:
    """``SCRIPT_NAME`` as a browser sends it: percent-encoded, so it is safe in
    links and in a cookie's ``Path`` (no ``;`` or ``,`` to end the attribute)."""
    # PEP 3333: the path arrives decoded, its UTF-8 bytes read as latin-1.
    raw = str(environ.get("SCRIPT_NAME", "")).encode("latin-1", "replace")
    return quote(raw, safe="/")


def own_origin(environ: WSGIEnvironment) -> str:
    """The origin the request was sent to, as a browser names it in ``Origin``."""
    scheme = environ.get("wsgi.url_scheme", "http")
    host = environ.get("HTTP_HOST")
    if not host:
        host = environ.get("SERVER_NAME", "")
        port = environ.get("SERVER_PORT", "")
        if port and port != {"http": "80", "https": "443"}.get(scheme):
            host += f":{port}"
    return f"{scheme}://{host}"
