"""The web page's "Cancel this run" button in a real headless browser (issue 35, point 4): Debian's
chromium and chromedriver, driven by selenium, against `dramatiq-unique web --allow-unlock`, with a
real `dramatiq` worker process running the holder and a real redis-server.

What the holder did is recorded by the actor itself in a Redis list, apart from the locks
(tests/test_cancel_workers.py). Skipped as tests/test_browser.py is, when the browser is missing."""

from __future__ import annotations

import socket

import pytest

from dramatiq_unique import enqueue_outcome

from .support import wait_for
from .test_browser import browser, serve_page  # noqa: F401 (fixture)
from .test_cancel_workers import deploy, events, worker  # noqa: F401 (fixtures)
from .test_concurrency import processes  # noqa: F401 (fixture)


@pytest.fixture
def server(redis_url):
    """The command's page of the locks of ``redis_url``, with its buttons."""
    yield from serve_page(["--url", redis_url, "web", "--allow-unlock"])


@pytest.mark.slow
def test_cancel_this_run_in_a_browser_interrupts_the_running_holder_and_the_page_says_so(
    worker,  # noqa: F811
    deploy,  # noqa: F811
    redis_client,
    server,
    browser,  # noqa: F811
):
    from selenium.webdriver.common.by import By

    worker()
    message = deploy.send("shop", 0)  # a run of 60 s
    wait_for(lambda: "start 0" in events(redis_client), timeout=30)
    digest = enqueue_outcome(message).digest
    operator = f"operator 127.0.0.1 on the web page of {socket.gethostname()}"

    browser.get(f"{server}/locks/{digest}")
    (form,) = [
        f
        for f in browser.find_elements(By.CSS_SELECTOR, "table.holders form")
        if f.find_elements(By.NAME, "cancel-holder")
    ]
    assert form.find_element(By.NAME, "message_id").get_attribute("value") == message.message_id
    # The box is required: unticked, the browser does not send the form.
    form.find_element(By.NAME, "cancel-holder").click()
    assert browser.current_url.endswith(f"/locks/{digest}")
    form.find_element(By.NAME, "confirm").click()
    form.find_element(By.NAME, "cancel-holder").click()
    wait_for(lambda: browser.current_url.endswith("/cancel"))
    assert "Asked 1 running message(s) to stop" in browser.find_element(By.CLASS_NAME, "freed").text
    (state,) = browser.find_elements(By.CSS_SELECTOR, "table.locks span.state")
    assert (state.text, state.get_attribute("title")) == ("stopping", f"asked to stop by {operator}")

    # The worker interrupts it: its `finally` ran, it never finished, and nothing ran again.
    wait_for(lambda: "end 0" in events(redis_client), timeout=10)
    assert events(redis_client) == ["start 0", "end 0"]

    # The lock's page says so once the worker wrote the trail (once per heartbeat interval).
    def cancelled_row() -> list[str] | None:
        browser.get(f"{server}/locks/{digest}")
        for row in browser.find_elements(By.CSS_SELECTOR, "table.conflicts tbody tr"):
            cells = [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            if cells[1] == "cancelled":
                return cells
        return None

    wait_for(lambda: cancelled_row() is not None, timeout=10)
    row = cancelled_row()
    assert row is not None
    assert row[3:6] == ["deploy('shop', 0)", message.message_id, f"asked to stop by {operator}"]
    assert "No lock of this digest is held now: it is free." in browser.page_source
    assert events(redis_client) == ["start 0", "end 0"]
