"""The web page in a real headless browser (issue 12): Debian's chromium and chromedriver, driven
by selenium, against `dramatiq-unique web --allow-unlock` serving tests/cli_app.py's locks.

It is skipped when chromium, chromedriver or selenium is missing, except in CI where it fails.
With UPDATE_SCREENSHOTS=1 it saves its screenshots into docs/images/ (else into a temporary directory)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import wait_for
from .test_cli import ROOT, URL_VARIABLES, app, digest  # noqa: F401  (app: tests/cli_app.py with locks)

pytestmark = pytest.mark.version_independent

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_or_skip():
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium")
    if missing:
        problem = f"the browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_page(arguments: list[str], **environ: str) -> Iterator[str]:
    """``dramatiq-unique <arguments> web`` on a free port, without the URL variables of the tests'
    own environment but with ``environ``: yields its address until the fixture ends."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if k not in URL_VARIABLES} | environ
    command = [sys.executable, "-m", "dramatiq_unique", *arguments, "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stderr=subprocess.PIPE)

    def listening() -> bool:
        assert process.poll() is None, process.stderr.read().decode()
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout=20)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(10)


@pytest.fixture
def server(app, redis_url):  # noqa: F811
    yield from serve_page(["--app", "tests.cli_app", "web", "--allow-unlock"], CLI_APP_URL=redis_url)


@pytest.fixture
def browser(monkeypatch):
    browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import selenium_manager

    def no_manager(*args, **kwargs):
        raise AssertionError("selenium-manager must not run: the test uses Debian's chromium and chromedriver")

    monkeypatch.setattr(selenium_manager.SeleniumManager, "binary_paths", no_manager)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


@pytest.fixture
def screenshots(tmp_path) -> Path:
    if not os.environ.get("UPDATE_SCREENSHOTS"):
        return tmp_path
    (ROOT / "docs" / "images").mkdir(exist_ok=True)
    return ROOT / "docs" / "images"


def test_filter_open_a_lock_unlock_it_and_see_it_gone(app, server, browser, screenshots):  # noqa: F811
    from selenium.webdriver.common.by import By

    _, sent = app
    report = digest(sent["report_a"])

    def rows() -> list[list[str]]:
        return [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "table.locks tbody tr")
        ]

    def shot(name: str) -> None:
        # The whole page: a viewport as tall as its content.
        height = browser.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": 1400, "height": min(height, 2000), "deviceScaleFactor": 1, "mobile": False}
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        assert browser.save_screenshot(str(screenshots / f"web-{name}.png"))
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    browser.get(server + "/")
    assert browser.title == "Locks · dramatiq-unique"
    assert {row[2] for row in rows()} == {"settle_payment", "build_report", "sync_account_balance", "send_invoice"}
    shot("locks")

    # Filter by actor: the browser sends the form.
    browser.find_element(By.NAME, "actor").send_keys("build_report")
    browser.find_element(By.NAME, "filter").click()
    wait_for(lambda: "actor=build_report" in browser.current_url)
    assert {(row[2], row[5]) for row in rows()} == {
        ("build_report", sent["report_a"].message_id),
        ("build_report", sent["report_b"].message_id),
    }
    shot("locks-filtered")

    # Open the lock.
    browser.find_element(By.CSS_SELECTOR, "td.digest a").click()
    wait_for(lambda: "/locks/" in browser.current_url)
    assert browser.current_url.endswith("/locks/" + report)
    holders = browser.find_elements(By.CSS_SELECTOR, "table.holders tbody tr")
    assert len(holders) == 2
    assert "A new send would be dropped as a duplicate of messages" in browser.page_source
    shot("lock")

    # Unlock it: the CSRF token travels in the form, its cookie with the request.
    browser.find_element(By.NAME, "unlock-lock").click()
    wait_for(lambda: browser.current_url.endswith("/unlock"))
    assert "Unlocked 2 holders in 1 lock:" in browser.find_element(By.CLASS_NAME, "freed").text
    shot("unlocked")

    # And it is gone.
    browser.get(server + "/?actor=build_report")
    assert rows() == []
    assert "No held lock matches these filters" in browser.page_source
    browser.get(server + "/locks/" + report)
    assert "it is free" in browser.page_source

    browser.get(server + "/workers")
    assert browser.find_elements(By.CSS_SELECTOR, "table.workers tbody tr")
    shot("workers")


def test_the_conflict_trail_of_an_actor_and_of_its_lock(app, server, browser, screenshots):  # noqa: F811
    # Issue 34, the conflict trail: the send that met a full lock is on the actor's list and on
    # its lock's page, read through Locks.history by the page's own process.
    from selenium.webdriver.common.by import By

    module, sent = app
    dropped = module.build_report.send("2024-06-30")  # its lock_limit of 2 is full
    module.unique.activity.flush()  # a worker's heartbeat thread does this once per interval

    def trail() -> list[list[str]]:
        return [
            [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "table.conflicts tbody tr")
        ]

    browser.get(server + "/?actor=build_report")
    assert browser.find_element(By.CSS_SELECTOR, "section.history h2").text == "Conflict trail of actor build_report"
    (row,) = trail()
    assert row[1:5] == ["dropped", "at send (log)", "build_report('2024-06-30')", dropped.message_id]
    holders = {f"held by message '{sent[name].message_id}' and 1 other (queued)" for name in ("report_a", "report_b")}
    assert row[5] in holders
    height = browser.execute_script("return document.documentElement.scrollHeight")
    metrics = {"width": 1400, "height": min(height, 2000), "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    assert browser.save_screenshot(str(screenshots / "web-history.png"))
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})

    # The holder links to the lock's page, which has the same trail.
    browser.find_element(By.CSS_SELECTOR, "table.conflicts td a").click()
    wait_for(lambda: browser.current_url.endswith("/locks/" + digest(sent["report_a"])))
    assert browser.find_element(By.CSS_SELECTOR, "section.history h2").text == "Conflict trail of this lock"
    assert [r[4] for r in trail()] == [dropped.message_id]
