"""/healthz and /readyz answer probes as a kubelet or load balancer sends them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client, override_settings

from camp import health

from .tools import ROOT


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _fresh_migration_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "_migrations_done", False)


def test_healthz_needs_no_database_and_no_login() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_readyz_is_ready_with_database_redis_and_migrations(db: Any) -> None:
    response = Client().get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok",
                               "checks": {"database": "ok", "redis": "ok", "migrations": "ok"}}


def test_readyz_names_an_unreachable_redis_and_stays_in_service(db: Any) -> None:
    """A Redis blip does not take every web pod out of the Service: pages are served from
    PostgreSQL, so readiness stays 200, 'degraded', naming Redis (issue 33, finding 3)."""
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    with override_settings(REDIS_URL=url, CELERY_BROKER_URL=url):
        response = Client().get("/readyz")
        page = Client().get("/login/")
    assert page.status_code == 200  # what the Service routes users to still works
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["redis"] == "REDIS_URL unreachable (ConnectionError)"
    assert body["checks"]["database"] == "ok"
    assert "127.0.0.1" not in response.content.decode()  # no addresses or URLs leak


def test_readyz_names_migrations_not_yet_applied(db: Any) -> None:
    latest = MigrationRecorder.Migration.objects.filter(app="tenants").order_by("-name").first()
    assert latest is not None
    latest.delete()  # as if the new release's migration had not run (rolled back after the test)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"].startswith(f"1 not applied: tenants.{latest.name}")


def test_probe_paths_refuse_writes() -> None:
    response = Client().post("/readyz")
    assert response.status_code == 405 and response["Allow"] == "GET, HEAD"


PROBE_SCRIPT = """
import json, django
django.setup()
from django.test import Client
c = Client()
out = {}
for path in ("/healthz", "/readyz", "/login/"):
    r = c.get(path, HTTP_HOST="10.1.2.3:8000")  # the pod IP, over plain HTTP, as a kubelet probes
    out[path] = [r.status_code, r.content.decode()[:300]]
print(json.dumps(out))
"""


def test_probes_under_production_settings_bypass_host_check_and_https_redirect(tmp_path: Any) -> None:
    """A kubelet probes by pod IP over HTTP: production's ALLOWED_HOSTS and HTTPS redirect
    apply to every other path, never to the probes; a database that is down is a 503."""
    secret = tmp_path / "secret"
    secret.write_text("probe-test-" + "k" * 60)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production",
           "SECRET_KEY_FILE": str(secret), "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": f"postgres://postgres@127.0.0.1:{_closed_port()}/camp",
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")}
    env.pop("SECRET_KEY", None)
    result = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["/healthz"][0] == 200
    status, body = out["/readyz"]
    assert status == 503
    checks = json.loads(body)["checks"]
    assert checks["database"].startswith("unreachable (") and checks["redis"] == "ok"
    assert out["/login/"][0] == 400  # everything else still refuses an unknown Host
