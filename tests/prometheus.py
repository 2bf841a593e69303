"""A real Prometheus (Debian's ``prometheus``) for integration tests, and exporter stand-ins.

Prometheus runs on a spare 127.0.0.1 port, scrapes every second, and Camp reads it through
its HTTP query API exactly as in production. Its targets are small HTTP servers of the test
(:class:`Exporter`) serving the text format the real exporters (DCGM-exporter, HAMi's vGPU
monitor, vLLM's ``/metrics``) serve: there are no GPUs or inference servers here to run
them. Targets are static (``static_targets``) or discovered from a file
(:meth:`Prometheus.set_targets`, Prometheus' ``file_sd_configs``), which carries target
labels — ``namespace`` and ``pod`` — as Kubernetes service discovery would for a pod.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
requires_prometheus = pytest.mark.skipif(
    not os.path.exists(PROMETHEUS), reason="Debian package prometheus is not installed (.ci/run installs it)")


class Exporter:
    """Serves /metrics in Prometheus' text format; ``text`` (a string, or a function called
    at each scrape) may change between scrapes."""

    def __init__(self) -> None:
        self.text: str | Callable[[], str] = ""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                text = outer.text() if callable(outer.text) else outer.text
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """One running Prometheus; :meth:`stop` ends it early (a Prometheus that went down)."""

    def __init__(self, static_targets: list[int]) -> None:
        self.tmp = tempfile.mkdtemp(prefix="camp-prom-")
        self.targets_file = os.path.join(self.tmp, "targets.json")
        with open(self.targets_file, "w") as fh:
            fh.write("[]")
        static = ", ".join(f"'127.0.0.1:{p}'" for p in static_targets)
        with open(os.path.join(self.tmp, "prometheus.yml"), "w") as fh:
            fh.write(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                     f"scrape_configs:\n  - job_name: static\n    static_configs:\n"
                     f"      - targets: [{static}]\n"
                     f"  - job_name: pods\n    file_sd_configs:\n"
                     f"      - files: ['{self.targets_file}']\n        refresh_interval: 1s\n")
        port = _free_port()
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.tmp}/prometheus.yml", f"--storage.tsdb.path={self.tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("prometheus did not start")
            time.sleep(0.2)

    def set_targets(self, targets: list[tuple[int, Mapping[str, str]]]) -> None:
        """Scrape these exporter ports with these target labels (replacing the previous set)."""
        tmp = self.targets_file + ".new"
        groups = [{"targets": [f"127.0.0.1:{port}"], "labels": dict(labels)} for port, labels in targets]
        with open(tmp, "w") as fh:
            json.dump(groups, fh)
        os.replace(tmp, self.targets_file)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


@contextmanager
def running_prometheus(static_targets: list[int] | None = None) -> Iterator[Prometheus]:
    prom = Prometheus(static_targets or [])
    try:
        yield prom
    finally:
        prom.stop()
        shutil.rmtree(prom.tmp, ignore_errors=True)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy (Prometheus scrapes every second)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"prometheus never showed {what}"
        time.sleep(0.3)
