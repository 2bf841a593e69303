"""Logs an SRE can use and metrics for HTTP and Celery (issue 33, finding 4): one JSON object
a line from web and worker alike, each with the ids of its request or task; a bad ``Host:`` is
one line, not a traceback; /metrics has HTTP rate/latency/status and Celery task outcomes,
runtime and queue length, recorded by a real worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from .tools import ROOT

REQUESTS = """
import django
django.setup()
from django.test import Client
c = Client()
c.get("/metrics", HTTP_HOST="camp.example.com", HTTP_X_REQUEST_ID="req-0451", secure=True)
c.get("/metrics", HTTP_HOST="evil.example.net", secure=True)
"""


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not one JSON object a line: {line!r}")
    return parsed


@pytest.mark.django_db(transaction=True)
def test_production_logs_are_json_with_the_request_id_and_a_bad_host_is_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret_key"
    secret.write_text("logs-test-" + "s3cr3t-" * 10)
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production",
           "SECRET_KEY_FILE": str(secret), "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
                           f"/{db['NAME']}",
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")}
    env.pop("SECRET_KEY", None)
    env.pop("LOG_FORMAT", None)
    result = subprocess.run([sys.executable, "-c", REQUESTS], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    records = _json_lines(result.stderr)
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    access = [r for r in records if r["logger"] == "camp.request"]
    assert [(r["path"], r["status"], r["request_id"]) for r in access][0] == ("/metrics", 401, "req-0451")
    assert all(r["request_id"] for r in access)
    bad_host = [r for r in records if r["logger"] == "django.security.DisallowedHost"]
    assert len(bad_host) == 1 and bad_host[0]["level"] == "WARNING"
    assert "evil.example.net" in bad_host[0]["message"] and "exc_info" not in bad_host[0]


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_logs_task_ids_and_its_tasks_reach_metrics(tmp_path: Path) -> None:
    from camp.celery import app

    db = settings.DATABASES["default"]
    name = f"obs-{os.getpid()}@localhost"
    log = tmp_path / "worker.log"  # stderr: the log lines (Celery prints its banner on stdout)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test", "LOG_FORMAT": "json",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "CAMP_TEST_RUN_ID": settings.TEST_RUN_ID}
    app.control.purge()
    with log.open("w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "camp", "worker", "--pool=solo",
                                   "--loglevel=INFO", "--without-gossip", "--without-mingle", "-n", name],
                                  cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=out,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[name], timeout=0.5):
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
        app.send_task("scheduling.tasks.job_stop", args=[987654])  # no such job: it returns
        client = Client()
        metric = 'camp_celery_tasks_total{state="SUCCESS",task="scheduling.tasks.job_stop"}'
        deadline = time.monotonic() + 60
        while True:
            body = client.get("/metrics").content.decode()
            if metric in body:
                break
            assert time.monotonic() < deadline, body[-2000:]
            time.sleep(0.5)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    assert 'camp_celery_task_runtime_seconds_total{task="scheduling.tasks.job_stop"}' in body
    assert f'camp_celery_queue_length{{queue="{settings.CELERY_TASK_DEFAULT_QUEUE}"}}' in body
    # HTTP series of this process (django-prometheus): the earlier scrapes, counted as each ended.
    body = client.get("/metrics").content.decode()
    assert 'django_http_responses_total_by_status_total{status="200"}' in body
    assert "django_http_requests_latency_seconds_by_view_method_bucket" in body
    records = _json_lines(log.read_text())
    task_lines = [r for r in records if r.get("job_id") == "987654"]
    assert task_lines, log.read_text()[-3000:]
    assert all(r["task"] == "scheduling.tasks.job_stop" and r["task_id"] for r in task_lines)


@pytest.mark.django_db
def test_the_grafana_dashboard_queries_only_metrics_camp_exposes() -> None:
    """deploy/grafana/camp.json: every series a panel asks for is on /metrics (a renamed
    metric would leave a panel silently empty)."""
    import re

    from scheduling.models import Cluster

    Cluster.objects.create(name="dash", backend="simulated")
    client = Client()
    client.get("/metrics")  # one request, so the HTTP histograms have samples
    body = client.get("/metrics").content.decode()
    exposed = set(re.findall(r"^# TYPE (\S+) (\w+)", body, re.M))
    names: set[str] = set()
    for family, kind in exposed:
        names.add(family)
        names.update({f"{family}_total", f"{family}_bucket", f"{family}_sum", f"{family}_count"}
                     if kind in ("counter", "histogram") else set())
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "camp.json").read_text())
    queried = {m for panel in dashboard["panels"] for target in panel["targets"]
               for m in re.findall(r"\b((?:camp|django)_[a-z_]+)\b", target["expr"])}
    assert queried and queried <= names, queried - names
