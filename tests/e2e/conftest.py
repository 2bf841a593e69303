"""Real Chromium (Debian package) driven by Playwright against a live Django server."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PASSWORD

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-results" / "screenshots"


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Iterator[None]:
    """Playwright's sync API keeps an event loop in this thread; Django's ORM refuses
    to run inside one unless told it is safe (it is: one thread, no coroutines).
    Set for the e2e modules only (including database teardown), never beyond."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture
def asgi_server(transactional_db: Any) -> Iterator[str]:
    """Camp under uvicorn (production's ASGI server) in a thread, against the test database:
    WebSockets work, and a log pane's stream ends when its page goes away (the disconnect
    reaches the app), so its log-follow threads end with the test. pytest-django's
    ``live_server`` is Django's WSGI server, which must read a streaming response to its end
    (up to its timeout) before sending it, and never learns that the page has gone."""
    import uvicorn

    from camp.asgi import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from django.db import connection

    def backends() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {row[0] for row in cursor.fetchall()}

    before = backends()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        # Every request has ended with the server, so has every log stream, and each stream
        # joins the follower threads it started (workspaces/logstream.py).
        followers = [t.name for t in threading.enumerate() if t.name.startswith("logs-")]
        assert not followers, f"log-follow threads outlived the server: {followers}"
        # Connections the server's worker threads opened outlive them; end exactly those,
        # so the test database can be dropped (other fixtures' connections are untouched).
        opened = backends() - before
        if opened:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE pid = ANY(%s)", [list(opened)])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.fail("Chromium is missing: apt-get install chromium (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--no-first-run", "--disable-component-update", "--disable-sync"],
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(15000)
    try:
        yield page
    finally:
        context.close()


def login(page: Any, base: str, username: str) -> None:
    """Sign in through the login form as one of the ``world`` users (tests/conftest.py) and
    wait for the home page."""
    page.goto(f"{base}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def shot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
