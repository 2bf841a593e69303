"""Admission control for a web process (issue 35): no more requests at once than it has
database connections, a bounded queue, and 503 at once beyond it.

Under ASGI every request runs in a thread of its own, and uvicorn accepts every connection.
Offered more than two cores serve, a process took them all: each waited for one of its pool's
connections until ``DB_POOL_TIMEOUT`` and most then failed — at 100 requests a second against
a capacity of ~37, 9 a second were answered with data and the rest waited ~30 s for a 503
(docs/BENCHMARKS.md §15). Here a request runs only while it holds one of ``WEB_MAX_IN_FLIGHT``
slots (default: the pool's size, so it never waits for a connection); up to
``WEB_MAX_WAITING`` more wait for a slot (default: 4 × that), at most ``DB_POOL_TIMEOUT``;
anyone beyond is answered 503 with ``Retry-After`` at once, so the ones admitted are served
at the process's own pace. Off without a pool (the demo's SQLite, the test suite's process).

Probes (``/healthz``, ``/readyz``: ``camp.health``, earlier in the chain) and static files
(WhiteNoise, earlier too) are never held here; WebSockets do not pass through Django's
middleware. Written by hand: uvicorn's ``--limit-concurrency`` counts open connections,
WebSockets included, so a portal with many live pages open would shut the API out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import Counter

from tenants.api.exceptions import busy_response

SHED = Counter("camp_http_requests_shed_total",
               "Requests answered 503 at once by a web process's admission control (camp/admission.py): "
               "every slot taken and its queue full, or a wait for a slot outlasted WEB_WAIT_SECONDS.",
               ["why"])


class AdmissionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.in_flight = int(getattr(settings, "WEB_MAX_IN_FLIGHT", 0) or 0)
        self.max_waiting = int(getattr(settings, "WEB_MAX_WAITING", 0) or 0)
        self.wait_s = float(getattr(settings, "WEB_WAIT_SECONDS", 10))
        self.slots = threading.BoundedSemaphore(max(1, self.in_flight))
        self.lock = threading.Lock()
        self.waiting = 0

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if self.in_flight <= 0:
            return self.get_response(request)
        # A newcomer queues behind anyone already waiting (no barging past them for a freed
        # slot; a waiter woken by a release then takes it), else takes a free slot at once.
        if self.waiting or not self.slots.acquire(blocking=False):
            with self.lock:
                if self.waiting >= self.max_waiting:
                    SHED.labels("queue full").inc()
                    return busy_response(request)
                self.waiting += 1
            try:
                got = self.slots.acquire(timeout=self.wait_s)
            finally:
                with self.lock:
                    self.waiting -= 1
            if not got:
                SHED.labels("waited too long").inc()
                return busy_response(request)
        try:
            return self.get_response(request)
        finally:
            self.slots.release()
