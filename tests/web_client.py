"""A small WSGI test client for the web page: call the application with environ
dicts, keep its cookies, and read its HTML back with the standard library's parser."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.cookies import SimpleCookie
from urllib.parse import urlencode, urlsplit


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    buttons: list[str] = field(default_factory=list)


class _Parser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.forms: list[Form] = []
        self.rows: list[list[str]] = []  # the cells of each body row of every table
        self.text: list[str] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_tbody = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and "href" in attrs:
            self.links.append(attrs["href"])
        elif tag == "form":
            self.forms.append(Form(attrs.get("action", ""), attrs.get("method", "get").lower()))
        elif tag == "input" and self.forms and attrs.get("name"):
            self.forms[-1].fields[attrs["name"]] = attrs.get("value", "")
        elif tag == "button" and self.forms:
            self.forms[-1].buttons.append(attrs.get("name", ""))
        elif tag == "tbody":
            self._in_tbody = True
        elif tag == "tr" and self._in_tbody:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_tbody = False
        elif tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


@dataclass
class Result:
    status: int
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def parsed(self) -> _Parser:
        parser = _Parser()
        parser.feed(self.body)
        return parser

    @property
    def text(self) -> str:
        return " ".join("".join(self.parsed.text).split())

    @property
    def forms(self) -> list[Form]:
        return self.parsed.forms

    @property
    def post_forms(self) -> list[Form]:
        return [form for form in self.forms if form.method == "post"]

    @property
    def rows(self) -> list[list[str]]:
        return self.parsed.rows


class Client:
    """Calls a WSGI app mounted under ``script_name``, keeping the cookies it sets."""

    def __init__(self, app, *, script_name: str = "/ops/locks", host: str = "ops.example.com"):
        self.app = app
        self.script_name = script_name
        self.host = host
        self.cookies: dict[str, str] = {}

    def request(self, method: str, url: str, *, form: dict[str, str] | None = None, headers=None) -> Result:
        """``url`` is a path of the app, or a link found on a page (which starts with ``script_name``)."""
        parts = urlsplit(url)
        path = parts.path
        if path.startswith(self.script_name):
            path = path[len(self.script_name) :]
        body = urlencode(form or {}).encode()
        environ = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": self.script_name,
            "PATH_INFO": path,
            "QUERY_STRING": parts.query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": "80",
            "HTTP_HOST": self.host,
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "CONTENT_LENGTH": str(len(body)),
        }
        if method == "POST":
            environ["CONTENT_TYPE"] = "application/x-www-form-urlencoded"
        if self.cookies:
            environ["HTTP_COOKIE"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        for name, value in (headers or {}).items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        answer = {}

        def start_response(status, response_headers, exc_info=None):
            answer["status"], answer["headers"] = int(status.split()[0]), response_headers

        chunks = self.app(environ, start_response)
        result = Result(answer["status"], answer["headers"], b"".join(chunks).decode())
        for name, value in result.headers:
            if name.lower() == "set-cookie":
                cookie = SimpleCookie()
                cookie.load(value)
                self.cookies.update({k: m.value for k, m in cookie.items()})
        return result

    def get(self, url: str, **query) -> Result:
        if query:
            url += "?" + urlencode(query)
        return self.request("GET", url)

    def post(self, url: str, form: dict[str, str], **headers) -> Result:
        return self.request("POST", url, form=form, headers=headers)

    def submit(self, form: Form, **headers) -> Result:
        """Submit a form found on a page, as a browser would."""
        return self.post(form.action, form.fields, **headers)
