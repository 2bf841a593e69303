"""A web process admits at most WEB_MAX_IN_FLIGHT requests at once and WEB_MAX_WAITING more in
its queue; anyone beyond gets 503 with Retry-After at once (camp/admission.py, issue 35). The
requests here block on an event the test controls, so who holds a slot and who waits is
decided by the test, not by timing."""

from __future__ import annotations

import threading
import time
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from camp.admission import SHED, AdmissionMiddleware
from tenants.api.exceptions import BUSY_RETRY_AFTER_S


def _wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_two_run_two_wait_and_the_fifth_is_told_to_retry_at_once() -> None:
    release = threading.Event()
    running: list[str] = []

    def view(request: HttpRequest) -> HttpResponse:
        running.append(request.path)
        release.wait(30)
        return HttpResponse("ok")

    with override_settings(WEB_MAX_IN_FLIGHT=2, WEB_MAX_WAITING=2, WEB_WAIT_SECONDS=30):
        admit = AdmissionMiddleware(view)
    rf = RequestFactory()
    answers: dict[int, HttpResponse] = {}

    def call(i: int) -> None:
        answers[i] = admit(rf.get(f"/api/v1/jobs/{i}/"))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    _wait_for(lambda: len(running) == 2 and admit.waiting == 2, "two running, two waiting")

    shed = SHED.labels("queue full")._value.get()
    started = time.monotonic()
    fifth = admit(rf.get("/api/v1/jobs/"))  # answered at once, not after the 30-s wait
    assert time.monotonic() - started < 15
    assert fifth.status_code == 503 and fifth["Retry-After"] == str(BUSY_RETRY_AFTER_S)
    assert SHED.labels("queue full")._value.get() == shed + 1  # counted for /metrics
    page = admit(rf.get("/dashboard/"))
    assert page.status_code == 503 and b"Camp is busy" in page.content
    assert len(running) == 2  # neither reached the view

    release.set()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers.values()) == [200, 200, 200, 200]
    assert len(running) == 4 and admit.waiting == 0
    assert admit(rf.get("/api/v1/jobs/")).status_code == 200  # every slot was given back


def test_a_wait_that_outlasts_its_limit_is_a_503_and_no_pool_means_no_limit() -> None:
    release = threading.Event()

    def view(request: HttpRequest) -> HttpResponse:
        release.wait(30)
        return HttpResponse("ok")

    with override_settings(WEB_MAX_IN_FLIGHT=1, WEB_MAX_WAITING=5, WEB_WAIT_SECONDS=0.05):
        admit = AdmissionMiddleware(view)
    rf = RequestFactory()
    holder = threading.Thread(target=admit, args=(rf.get("/api/v1/jobs/"),))
    holder.start()
    _wait_for(lambda: admit.slots._value == 0, "the one slot taken")  # type: ignore[attr-defined]
    late = admit(rf.get("/api/v1/jobs/"))
    assert late.status_code == 503 and admit.waiting == 0
    release.set()
    holder.join(30)

    with override_settings(WEB_MAX_IN_FLIGHT=0):  # no pool (SQLite, the suite's own process)
        free = AdmissionMiddleware(lambda request: HttpResponse("ok"))
    assert [free(rf.get("/")).status_code for _ in range(50)] == [200] * 50


def test_the_defaults_follow_the_pool(monkeypatch: Any) -> None:
    from camp.settings.database import admission, parse_database_url, pool_options

    for name in ("WEB_MAX_IN_FLIGHT", "WEB_MAX_WAITING"):
        monkeypatch.delenv(name, raising=False)
    pg = parse_database_url("postgres://camp:pw@db:5432/camp")
    assert admission(pool_options(pg, 8, timeout=7)) == (8, 32, 7.0)
    assert admission(pg)[0] == 0  # no pool: off
    monkeypatch.setenv("WEB_MAX_WAITING", "3")
    assert admission(pool_options(pg, 2)) == (2, 3, 10.0)
