"""The newcomer (issue 32): the living demo as ``make demo`` runs it — its own web server,
Celery worker (two processes, beat, the load generator), SQLite, the filesystem broker,
DEBUG off — walked in real Chromium as a member, a project admin, a tenant owner and a
platform admin.

Each role launches a notebook, a training job and a model service from the forms' defaults
(nothing picked, just the submit button; for the service, the model to serve typed in), opens
the notebook, and follows every nav link and every link on its home, again and again until the
time is up. Every page must answer below 500, never be Django's debug page, and never show "—"
(or nothing) where a reason, a place in line or an estimate belongs; the platform admin's home
must say how far the scheduler lags (the oldest queued tick; in the full run, under
``SCHEDULER_LAG_SECONDS``, 10 s).

The issue asks for ten minutes under the demo's load: ``CAMP_NEWCOMER_MINUTES=10``. The suite
walks for ``DEFAULT_MINUTES``. Page times are written to test-results/newcomer.json (a figure
for the notes; never asserted: the suite runs on a shared machine).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from portal.management.commands.seed_demo import DEMO_PASSWORD

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "test-results"
DEFAULT_MINUTES = 1.5
MINUTES = float(os.environ.get("CAMP_NEWCOMER_MINUTES", DEFAULT_MINUTES))
LAG_ASSERTED = "CAMP_NEWCOMER_MINUTES" in os.environ
# The demo's logins (seed_demo): one of each role.
ROLES = (("vince", "member"), ("victor", "project admin"), ("vera", "tenant owner"),
         ("admin", "platform admin"))
LAUNCHES = (("/workspaces/environments/new/", r"/workspaces/environments/(\d+)/$"),
            ("/workspaces/training/new/", r"/workspaces/training/(\d+)/$"),
            ("/workspaces/services/new/", r"/workspaces/services/(\d+)/$"))
# Never followed: they end the session or change something.
SKIP = re.compile(r"/logout/|/delete/|/stop/|/api-key/|[?&]format=csv|\.csv$")
OPEN_WITHIN_S = 180  # a notebook from the defaults runs within this (the worker keeping up)
STARTUP_S = 300  # migrate and seed a fresh SQLite file on a busy machine

# Where a reason, a place in line or an estimate belongs: visible and neither empty nor "—".
DEAD_ENDS_JS = """() => {
  const bad = [];
  const shown = el => !el.closest('[hidden]') && el.getClientRects().length > 0;
  const sel = '[data-live-field=reason], [data-live-field=queue], [data-live-field=estimate], p.estimate';
  for (const el of document.querySelectorAll(sel)) {
    if (!shown(el)) continue;
    // In a list, a row owes a reason and a place in line only while it waits.
    const row = el.closest('tr');
    const state = row && row.querySelector('[data-live-field=state]');
    if (state && state.textContent.trim() !== 'Queued') continue;
    const t = el.textContent.trim();
    // a list's place in line may be blank (not in a project queue: the global one); a reason may not
    const blankOk = row && el.matches('[data-live-field=queue]');
    if ((t === '' && !blankOk) || t === '—' || /:\\s*—$/.test(t)) {
      const where = row ? row.textContent.replace(/\\s+/g, ' ').trim().slice(0, 120) + ' → ' : '';
      bad.push(where + el.outerHTML.slice(0, 160));
    }
  }
  for (const table of document.querySelectorAll('table')) {
    const heads = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    heads.forEach((h, i) => {
      if (!/^(Why|Reason|Place in line|Queue position|Estimated start)$/i.test(h)) return;
      for (const row of table.querySelectorAll('tbody tr')) {
        const cell = row.children[i];
        if (cell && shown(cell) && cell.textContent.trim() === '—') {
          bad.push(h + ': ' + row.textContent.trim().slice(0, 160));
        }
      }
    });
  }
  const text = document.body.innerText;
  const label = /(Why it is waiting|Why|Estimated start|Place in line|Queue position):[ \\t]*(—|\\n|$)/g;
  for (const m of text.matchAll(label)) bad.push(m[0]);
  if (/Place in line:\\s*among/.test(text)) bad.push('Place in line without a number');
  return bad;
}"""


@dataclass
class Walk:
    """What the walk saw: failures (asserted at the end, all at once) and page times."""

    failures: list[str] = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)
    pages: int = 0
    lag: list[str] = field(default_factory=list)
    by_url: list[tuple[float, str]] = field(default_factory=list)

    def fail(self, who: str, what: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(f"{who}: {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``manage.py rundemo`` as ``make demo`` starts it (DEBUG off, no Redis, no PostgreSQL),
    its files in a fresh VAR_DIR so it runs beside a developer's own demo; stopped with
    SIGTERM as a terminal's Ctrl-C would, and its worker must end with it."""
    var = tmp_path_factory.mktemp("demo-var")
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_", "DEMO_"))}
    env.update({"VAR_DIR": str(var), "DEBUG": "false", "DJANGO_SETTINGS_MODULE": "camp.settings"})
    log = (var / "demo.log").open("w")
    proc = subprocess.Popen(  # noqa: S603 (this interpreter running manage.py)
        [sys.executable, "manage.py", "rundemo", "--port", str(port)], cwd=ROOT, env=env,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            assert proc.poll() is None, f"rundemo exited: {(var / 'demo.log').read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the demo did not serve within 5 minutes"
            try:
                with urllib.request.urlopen(f"{base}/login/", timeout=5) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)  # the worker's warm shutdown finishes its task first (load)
        log.close()
        said = (var / "demo.log").read_text()
        # The demo restarts a worker that died; the walk must never have needed it.
        assert "The Celery worker exited" not in said, said[-3000:]
        started = re.search(r"Celery worker started \(pid (\d+)\)", said)
        if started:  # the worker ends with the demo (issue 32, finding 2)
            worker = int(started.group(1))
            end = time.monotonic() + 30
            while _alive(worker) and time.monotonic() < end:
                time.sleep(0.5)
            if _alive(worker):
                os.killpg(worker, signal.SIGKILL)
                pytest.fail(f"the demo's worker (pid {worker}) outlived the demo")


def _check(page: Any, walk: Walk, who: str, url: str, status: int | None) -> None:
    if status is None or status >= 500:
        walk.fail(who, f"{url} answered {status}")
    body = page.content()
    if "You're seeing this error because you have" in body or 'id="traceback"' in body:
        walk.fail(who, f"{url} is Django's debug page")
    for bad in page.evaluate(DEAD_ENDS_JS):
        walk.fail(who, f"{url} has a dead end: {bad}")


def _visit(page: Any, walk: Walk, who: str, url: str) -> None:
    started = time.monotonic()
    response = page.goto(url, wait_until="load")
    walk.times.setdefault(who, []).append(time.monotonic() - started)
    walk.by_url.append((round(time.monotonic() - started, 3), url))
    walk.pages += 1
    status = response.status if response else None
    _check(page, walk, who, url, status)
    if status is not None and status >= 400:
        walk.fail(who, f"followed a link to {url}: {status}")


def _launch(page: Any, walk: Walk, who: str, base: str) -> list[str]:
    """Submit each launch form with its defaults; the pages it lands on."""
    landed = []
    for path, pattern in LAUNCHES:
        _visit(page, walk, who, base + path)
        model = page.locator("main input[name=model_source]")
        if model.count() and not model.input_value():
            # The one thing a model service cannot default: which model to serve (its help
            # text's example, typed as a newcomer would).
            model.fill("hf://Qwen/Qwen2.5-0.5B-Instruct")
        with page.expect_navigation():
            page.locator("main button.primary-launch").click()
        if not re.search(pattern, page.url):
            errors = page.locator("main .error, main .errors, main .errorlist").all_inner_texts()
            walk.fail(who, f"the defaults of {path} did not launch: {errors or page.url}")
            continue
        _check(page, walk, who, page.url, 200)
        landed.append(page.url)
    return landed


def _open_notebook(page: Any, walk: Walk, who: str, url: str) -> None:
    """Wait for the notebook to run (the live page shows Open), then Open it: Camp's own page
    for a simulated cluster, never a host that does not resolve."""
    button = page.locator("main form[action$='/open/'] button")
    deadline = time.monotonic() + OPEN_WITHIN_S
    while True:  # as a user would: look, and reload now and then
        page.goto(url)
        if button.count() and button.is_visible():
            break
        if time.monotonic() > deadline:
            heading = page.locator("h1").inner_text()
            why = page.locator("main [data-live-field=reason]").all_inner_texts()
            walk.fail(who, f"the notebook at {url} never offered Open (page: {heading!r}, "
                           f"reason: {' '.join(why)!r})")
            return
        page.wait_for_timeout(5000)
    with page.expect_popup() as popup_info:
        button.click()
    popup = popup_info.value
    popup.wait_for_load_state("load")
    if not popup.url.startswith(url.split("/workspaces/")[0]):
        walk.fail(who, f"Open went to {popup.url}, outside Camp")
    elif "simulated" not in popup.url or "not found" in popup.title().lower():
        walk.fail(who, f"Open landed on {popup.url} ({popup.title()!r})")
    popup.close()


def _links(page: Any, base: str) -> list[str]:
    hrefs: list[str] = page.evaluate(
        "() => [...document.querySelectorAll('header nav a[href], main a[href]')].map(a => a.href)")
    seen: dict[str, None] = {}
    for href in hrefs:
        href = href.split("#")[0]
        if href.startswith(base) and not SKIP.search(href):
            seen[href] = None
    return list(seen)


def _lag(page: Any, walk: Walk) -> None:
    """The platform admin's home: the scheduler keeps up (issue 32, finding 2)."""
    lag = page.locator(".scheduler-lag")
    if lag.count() == 0:
        walk.fail("admin", "the admin home says nothing about the scheduler's lag")
        return
    text = lag.first.inner_text()
    walk.lag.append(text)
    # Whether the worker keeps up depends on the machine's load, which this test does not
    # control: the suite's short walk records the figure (test-results/newcomer.json); the
    # issue's full run (CAMP_NEWCOMER_MINUTES set, on a quiet machine) fails on it.
    if "warning" in (lag.first.get_attribute("class") or "") and LAG_ASSERTED:
        walk.fail("admin", f"the scheduler lags: {text}")


def _walk(browser: Any, base: str, username: str, walk: Walk, launch: bool) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("response", lambda r: r.status >= 500 and r.url.startswith(base)
            and walk.fail(username, f"{r.url} answered {r.status}"))
    try:
        page.goto(f"{base}/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", DEMO_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{base}/")
        if launch:
            landed = _launch(page, walk, username, base)
            notebooks = [u for u in landed if "/environments/" in u]
            for url in notebooks:
                _open_notebook(page, walk, username, url)
        _visit(page, walk, username, f"{base}/")
        if username == "admin":
            _lag(page, walk)
        for url in _links(page, base):
            _visit(page, walk, username, url)
    finally:
        context.close()


def test_newcomer_walks_the_living_demo(demo: str, browser: Any) -> None:
    walk = Walk()
    deadline = time.monotonic() + MINUTES * 60
    rounds = 0
    while rounds == 0 or time.monotonic() < deadline:
        for username, _role in ROLES:
            _walk(browser, demo, username, walk, launch=rounds == 0)
        rounds += 1
    every = sorted(t for ts in walk.times.values() for t in ts)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "newcomer.json").write_text(json.dumps({
        "minutes": MINUTES, "rounds": rounds, "pages": walk.pages, "load": os.getloadavg(),
        "median_s": round(statistics.median(every), 3),
        "p95_s": round(every[int(0.95 * (len(every) - 1))], 3), "max_s": round(every[-1], 3),
        "over_1s": sum(t > 1 for t in every), "slowest": sorted(walk.by_url, reverse=True)[:15],
        "lag": walk.lag[-3:], "failures": walk.failures,
    }, indent=2))
    assert not walk.failures, "\n".join(walk.failures)
