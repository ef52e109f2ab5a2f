"""A real Django project: django_dramatiq builds ``"dramatiq_unique.UniqueJobs"`` from its dotted
path with no arguments, and ``manage.py rundramatiq`` runs the example shop of docs/integrations/django.md
(examples/django_shop) against a real redis-server and a real RabbitMQ (issue 19, point 2).

Each test copies the shop into its own directory and runs ``manage.py`` as the user would, as
subprocesses: sends from ``manage.py send_receipt``, a worker from ``manage.py rundramatiq``, stopped with
SIGTERM. The receipts the actor writes to a file are the independent record of what ran.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pika
import pytest

from dramatiq_unique import Locks, RedisBackend

from .support import wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "django_shop"

#: The shop on RabbitMQ with no lock store named: a mistake the user must be told about at start-up.
NO_LOCKS_SETTINGS = """
from .rabbitmq_settings import *  # noqa: F403

del DRAMATIQ_UNIQUE  # noqa: F821
"""

NO_LOCK_STORE = (
    "dramatiq_unique.errors.InvalidBackendOptions: UniqueJobs was given no lock backend, and its broker, "
    "a RabbitmqBroker, is no RedisBroker whose Redis could hold the locks. To name the Redis of the locks, "
    "set the DRAMATIQ_UNIQUE_URL environment variable to a Redis URL; or, in a Django project, set "
    'DRAMATIQ_UNIQUE = {"BACKEND_OPTIONS": {"url": "redis://..."}} in its settings; or pass '
    "UniqueJobs(backend=RedisBackend(url=...))."
)

RECEIPT = "receipt for order 42"


class Shop:
    """The example shop, copied to ``path``, run with ``settings`` and ``variables`` in its environment."""

    def __init__(self, path: Path, settings: str, variables: dict[str, str]):
        self.path = path
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DRAMATIQ_UNIQUE_URL", "DJANGO_SETTINGS_MODULE", "REDIS_URL")
        }
        # dramatiq_unique from this checkout, as in the rest of the tests.
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
        self.env["DJANGO_SETTINGS_MODULE"] = settings
        self.env.update(variables)
        self.log = path / "rundramatiq.log"

    def manage(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("manage.py", *args)

    def listed_locks(self) -> list[tuple[str, str]]:
        """The actor and state of each holder that ``dramatiq-unique list`` shows in the project."""
        result = self.run("-m", "dramatiq_unique", "--path", ".", "--app", "django_dramatiq.setup", "list", "--json")
        assert result.returncode == 0, result.stderr
        return [(lock["actor"], holder["state"]) for lock in json.loads(result.stdout) for holder in lock["holders"]]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=self.path,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def send(self, *order_ids: int) -> list[str]:
        """What each send() did, as ``manage.py send_receipt`` prints it."""
        result = self.manage("send_receipt", *map(str, order_ids))
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()

    def rundramatiq(self) -> subprocess.Popen[bytes]:
        with self.log.open("wb") as log:
            # rundramatiq execs dramatiq in its own process: the pid is Dramatiq's main process.
            return subprocess.Popen(
                [sys.executable, "manage.py", "rundramatiq", "--processes", "1", "--threads", "2"],
                cwd=self.path,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def receipts(self) -> list[str]:
        receipts = self.path / "receipts.log"
        return receipts.read_text().splitlines() if receipts.exists() else []


@pytest.fixture
def copy_shop(tmp_path):
    def copy(settings: str, **variables: str) -> Shop:
        path = tmp_path / "shop"
        shutil.copytree(EXAMPLE, path, ignore=shutil.ignore_patterns("__pycache__", "*.log", "*.sqlite3"))
        (path / "shop" / "no_locks_settings.py").write_text(NO_LOCKS_SETTINGS)
        return Shop(path, settings, variables)

    return copy


@pytest.fixture
def receipts_queue(rabbitmq_url):
    """The shop's queue on RabbitMQ, empty before and after the test."""

    def delete() -> None:
        connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
        try:
            channel = connection.channel()
            for name in ("receipts", "receipts.DQ", "receipts.XQ"):
                channel.queue_delete(name)
        finally:
            connection.close()

    delete()
    yield rabbitmq_url
    delete()


def with_db(redis_url: str, db: int) -> str:
    return redis_url.rpartition("/")[0] + f"/{db}"


def run_the_shop(shop: Shop, locks: Locks) -> None:
    """A receipt asked for twice is sent once; the worker starts, and stops on SIGTERM leaving
    no lock and no worker behind."""
    assert shop.send(42, 42) == ["order 42: enqueued", "order 42: duplicate"]
    held = [(h.actor, h.queue, h.state) for lock in locks.list() for h in lock.holders]
    assert held == [("send_receipt", "receipts", "queued")]
    assert shop.listed_locks() == [("send_receipt", "queued")]

    worker = shop.rundramatiq()
    try:
        wait_for(lambda: shop.receipts() == [RECEIPT], timeout=30)
        assert shop.send(42) == ["order 42: enqueued"]  # the lock went with the run
        wait_for(lambda: len(shop.receipts()) == 2, timeout=30)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, shop.log.read_text()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    log = shop.log.read_text()
    assert "Worker has been shut down." in log
    assert "Traceback" not in log and "ERROR" not in log and "CRITICAL" not in log, log
    assert shop.receipts() == [RECEIPT, RECEIPT]
    assert list(locks.list()) == []
    assert locks.workers()[1] == ()


@pytest.mark.slow
def test_redis_broker_keeps_the_locks_on_its_own_redis(copy_shop, redis_url):
    shop = copy_shop("shop.settings", REDIS_URL=redis_url)
    run_the_shop(shop, Locks(RedisBackend(url=redis_url)))


@pytest.mark.slow
def test_rabbitmq_with_the_lock_store_in_the_django_setting(copy_shop, redis_url, receipts_queue):
    locks_url = with_db(redis_url, 2)
    shop = copy_shop("shop.rabbitmq_settings", RABBITMQ_URL=receipts_queue, LOCKS_REDIS_URL=locks_url)
    run_the_shop(shop, Locks(RedisBackend(url=locks_url)))


@pytest.mark.slow
def test_rabbitmq_with_the_lock_store_in_the_environment(copy_shop, redis_url, receipts_queue):
    locks_url = with_db(redis_url, 3)
    shop = copy_shop("shop.no_locks_settings", RABBITMQ_URL=receipts_queue, DRAMATIQ_UNIQUE_URL=locks_url)
    run_the_shop(shop, Locks(RedisBackend(url=locks_url)))


def test_no_lock_store_stops_the_start_up_and_says_what_to_set(copy_shop):
    # Before any connection to RabbitMQ: the broker's URL is never used.
    shop = copy_shop("shop.no_locks_settings", RABBITMQ_URL="amqp://guest:guest@127.0.0.1:1/%2F")

    worker = shop.manage("rundramatiq", "--processes", "1", "--threads", "2")
    assert worker.returncode != 0
    assert worker.stderr.splitlines()[-1] == NO_LOCK_STORE
    # The web process, or anything that sends, stops where it imports the actors: no send is dropped.
    sender = shop.manage("send_receipt", "42")
    assert sender.returncode != 0
    assert sender.stderr.splitlines()[-1] == NO_LOCK_STORE
    assert shop.receipts() == []


STUB_SETTINGS = """
from .settings import *  # noqa: F403
from .settings import DRAMATIQ_BROKER

DRAMATIQ_BROKER = {**DRAMATIQ_BROKER, "BROKER": "dramatiq.brokers.stub.StubBroker", "OPTIONS": {}}
DRAMATIQ_UNIQUE = %s
"""


def test_the_setting_names_any_lock_backend_class(copy_shop):
    # The test settings of a project: StubBroker, and the locks in memory.
    shop = copy_shop("shop.stub_settings")
    (shop.path / "shop" / "stub_settings.py").write_text(STUB_SETTINGS % '{"BACKEND": "dramatiq_unique.StubBackend"}')

    assert shop.send(42, 42) == ["order 42: enqueued", "order 42: duplicate"]


@pytest.mark.parametrize(
    "setting, error",
    [
        (
            '{"URL": "redis://localhost:6379/1"}',
            'The Django setting DRAMATIQ_UNIQUE must be a dict with the keys "BACKEND" (a dotted path to a lock '
            "backend class, 'dramatiq_unique.RedisBackend' when left out) and \"BACKEND_OPTIONS\" (its keyword "
            'arguments), e.g. {"BACKEND_OPTIONS": {"url": "redis://..."}}.',
        ),
        (
            '{"BACKEND": "dramatiq.results.backends.RedisBackend"}',
            "DRAMATIQ_UNIQUE['BACKEND'] is 'dramatiq.results.backends.RedisBackend', which is no LockBackend "
            "class, e.g. 'dramatiq_unique.RedisBackend' or 'dramatiq_unique.StubBackend'.",
        ),
        (
            '{"BACKEND_OPTIONS": {"urll": "redis://localhost:6379/1"}}',
            "DRAMATIQ_UNIQUE['BACKEND_OPTIONS'] has arguments that RedisBackend does not take (urll): ",
        ),
    ],
)
def test_a_setting_that_cannot_be_used_stops_the_start_up(copy_shop, setting, error):
    shop = copy_shop("shop.stub_settings")
    (shop.path / "shop" / "stub_settings.py").write_text(STUB_SETTINGS % setting)

    result = shop.manage("send_receipt", "42")
    assert result.returncode != 0
    last_line = result.stderr.splitlines()[-1]
    assert last_line.startswith("dramatiq_unique.errors.InvalidBackendOptions: " + error), last_line


PREFIXES_IN_USE = """
import dramatiq
from dramatiq_unique import UniqueJobs
for middleware in dramatiq.get_broker().middleware:
    if isinstance(middleware, UniqueJobs):
        print(*middleware.lock_prefixes)
"""


def test_an_instance_in_the_middleware_list_takes_options_and_chooses_its_backend(copy_shop):
    # django_dramatiq takes instances as they are: the way to give UniqueJobs options in Django.
    shop = copy_shop("shop.stub_settings")
    settings = STUB_SETTINGS % '{"BACKEND": "dramatiq_unique.StubBackend"}'
    settings += (
        "from dramatiq_unique import UniqueJobs\n"
        "DRAMATIQ_BROKER['MIDDLEWARE'] = [\n"
        "    UniqueJobs(lock_prefix='shop') if path == 'dramatiq_unique.UniqueJobs' else path\n"
        "    for path in DRAMATIQ_BROKER['MIDDLEWARE']\n"
        "]\n"
    )
    (shop.path / "shop" / "stub_settings.py").write_text(settings)

    assert shop.send(42, 42) == ["order 42: enqueued", "order 42: duplicate"]
    # The broker holds that instance, with its option.
    shown = shop.manage("shell", "--verbosity", "0", "--command", PREFIXES_IN_USE)
    assert shown.stdout.split() == ["shop"], shown.stderr


#: Serves the shop's wsgi.py (Django, and the locks page under /ops/locks) on a free port.
SERVE = """
from wsgiref.simple_server import WSGIRequestHandler, make_server
from shop.wsgi import application
server = make_server("127.0.0.1", 0, application, handler_class=WSGIRequestHandler)
print(server.server_port, flush=True)
server.serve_forever()
"""


@pytest.mark.slow
def test_the_locks_page_mounts_in_the_django_project_from_its_broker(copy_shop, redis_url):
    # Issue 34 (7): in a django_dramatiq project there is no broker or middleware to import, and
    # the middleware taken from dramatiq.get_broker() had no lock backend yet. The shop's wsgi.py
    # builds the page with from_broker(), served here as a WSGI server would serve it.
    shop = copy_shop("shop.settings", REDIS_URL=redis_url)
    assert shop.send(42) == ["order 42: enqueued"]
    (digest,) = [lock.digest for lock in Locks(RedisBackend(url=redis_url)).list()]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE],
        cwd=shop.path,
        env=shop.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        line = server.stdout.readline()
        assert line.strip(), server.stderr.read()
        port = int(line)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ops/locks/") as answer:
            page = answer.read().decode()
        # The lock of order 42, a link to it under the mount path, and what a new send would meet.
        assert "send_receipt" in page
        assert f'href="/ops/locks/locks/{digest}"' in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ops/locks/locks/{digest}") as answer:
            lock_page = answer.read().decode()
        assert "receipts" in lock_page and "queued" in lock_page
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def test_the_page_shows_django_dramatiqs_default_middleware_with_one_line_added():
    # Issue 34 (10): the page's list left out django_dramatiq's defaults (AdminMiddleware,
    # Prometheus): a user who copied it lost the admin's task table without a word.
    from django_dramatiq.apps import DEFAULT_BROKER_SETTINGS

    page = (ROOT / "docs" / "integrations" / "django.md").read_text()
    block = page.partition("```{code-block} python\n")[2].partition("```")[0]
    settings: dict[str, object] = {}
    exec(block.split("\n\n", 1)[1], settings)  # after the directive's options
    defaults = list(DEFAULT_BROKER_SETTINGS["MIDDLEWARE"])
    defaults.insert(defaults.index("dramatiq.middleware.TimeLimit"), "dramatiq_unique.UniqueJobs")
    assert settings["DRAMATIQ_BROKER"]["MIDDLEWARE"] == defaults
    emphasized = int(block.partition(":emphasize-lines: ")[2].split()[0])
    assert "dramatiq_unique.UniqueJobs" in block.split("\n\n", 1)[1].splitlines()[emphasized - 1]
