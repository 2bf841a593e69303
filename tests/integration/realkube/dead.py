"""API servers that are registered and dead, the ways a real one dies (issue 27, finding 6):

* ``refusing_api_server``: nothing listens on the port (connection refused at once);
* ``hung_api_server``: accepts TCP and never answers (a hung server, or a half-dead load
  balancer in front of one: the worst kind, every read waits for its timeout);
* ``HalfDeadApiServer``: answers ``GET /version`` (the probe passes) and then either never
  answers anything else (an API server whose etcd hangs) or answers each request after
  turning a clock forward (a slow server, measured on a clock the test controls).

Each counts what reached it, so tests assert on calls, not on wall-clock time.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.integration.scheduling.test_worker_faults import _hung_api_server

hung_api_server = _hung_api_server
"""``with hung_api_server() as (url, connections)``: ``connections[0]`` counts accepts."""


@contextmanager
def refusing_api_server() -> Iterator[str]:
    """A URL whose port is held (bound, not listening) for the test: every connect is refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


class FakeClock:
    """A monotonic clock that moves only when told (``services.clusters._clock`` in tests)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class HalfDeadApiServer:
    """Answers ``/version``; every other request either hangs (``hang=True``) or is answered
    with an empty list after ``clock.advance(cost)`` (each answer "took" ``cost`` seconds)."""

    def __init__(self, *, hang: bool, clock: FakeClock | None = None, cost: float = 0.0) -> None:
        self.hang, self.clock, self.cost = hang, clock, cost
        self.requests: list[str] = []
        self._stop = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                outer.requests.append(self.path)
                if self.path.startswith("/version"):
                    self._json({"major": "1", "minor": "24", "gitVersion": "v1.24.0"})
                    return
                if outer.hang:
                    outer._stop.wait()  # never answers while the test runs
                    return
                if outer.clock is not None:
                    outer.clock.advance(outer.cost)
                self._json({"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []})

            def _json(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def calls(self, keep: Callable[[str], bool] = lambda p: not p.startswith("/version")) -> list[str]:
        return [p for p in self.requests if keep(p)]

    def __enter__(self) -> HalfDeadApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
