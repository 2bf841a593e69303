"""`manage.py doctor` names what a deployment lacks and exits non-zero; silent when all is set."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.db import connection

from .tools import ROOT


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", "doctor", "--timeout", "3"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def _production_env(tmp_path: Path) -> dict[str, str]:
    """What docs/DEPLOY.md asks a deployment to set, pointed at this run's test database."""
    secret = tmp_path / "secret_key"
    secret.write_text("doctor-test-" + "s3cr3t-" * 10)
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production",
           "SECRET_KEY_FILE": str(secret), "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
                           f"/{db['NAME']}",
           "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15"),
           "CAMP_ENCRYPTION_KEY": Fernet.generate_key().decode()}
    env.pop("SECRET_KEY", None)
    return env


@pytest.mark.django_db(transaction=True)
def test_a_complete_production_configuration_has_nothing_missing(tmp_path: Path) -> None:
    result = _doctor(_production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PROBLEM" not in result.stdout
    assert "ok       database" in result.stdout and "Nothing missing." in result.stdout


@pytest.mark.django_db(transaction=True)
def test_doctor_names_each_missing_piece(tmp_path: Path) -> None:
    from scheduling.models import Cluster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    Cluster.objects.create(name="far-away", backend="kubernetes",
                           api_server=f"https://127.0.0.1:{closed}")
    env = _production_env(tmp_path)
    env.update({"SECURE_SSL_REDIRECT": "false", "SECURE_HSTS_SECONDS": "0",
                "ALLOWED_HOSTS": "*", "REDIS_URL": f"redis://127.0.0.1:{closed}/0"})
    env.pop("CAMP_ENCRYPTION_KEY")
    result = _doctor(env)
    assert result.returncode == 1
    out = result.stdout
    assert "PROBLEM  security.W008" in out  # no HTTPS redirect
    assert "PROBLEM  tls: SECURE_SSL_REDIRECT=false" in out  # and a host that is not loopback
    assert "PROBLEM  security.W004" in out  # no HSTS
    assert "PROBLEM  hosts: ALLOWED_HOSTS contains '*'" in out
    assert "PROBLEM  encryption: CAMP_ENCRYPTION_KEY is not set" in out
    assert "PROBLEM  redis: REDIS_URL unreachable" in out
    assert "PROBLEM  cluster far-away: API server unreachable" in out
    assert "ok       database" in out and "ok       migrations" in out
    assert "problem(s) found" in result.stderr


def test_doctor_on_the_demo_settings_names_the_insecure_defaults(tmp_path: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings",
           "DATABASE_URL": f"sqlite:///{tmp_path / 'none' / 'db.sqlite3'}"}
    for name in ("SECRET_KEY", "SECRET_KEY_FILE", "REDIS_URL", "DEBUG"):
        env.pop(name, None)
    result = _doctor(env)
    assert result.returncode == 1
    assert "PROBLEM  security.W009" in result.stdout  # the demo's insecure secret key
    assert "PROBLEM  security.W018" in result.stdout  # DEBUG
    assert "PROBLEM  database: unreachable" in result.stdout
    assert "PROBLEM  redis: REDIS_URL is not set" in result.stdout



@pytest.mark.django_db(transaction=True)
def test_doctor_lets_loopback_go_without_the_https_redirect_but_no_other_host(tmp_path: Path) -> None:
    env = _production_env(tmp_path)
    env.update({"SECURE_SSL_REDIRECT": "false", "ALLOWED_HOSTS": "localhost,127.0.0.1"})
    local = _doctor(env)
    assert "tls" not in local.stdout and "security.W008" not in local.stdout, local.stdout
    env["ALLOWED_HOSTS"] = "localhost,camp.example.com"
    public = _doctor(env)
    assert public.returncode == 1
    assert "PROBLEM  tls: SECURE_SSL_REDIRECT=false" in public.stdout


@pytest.mark.django_db(transaction=True)
def test_doctor_says_evaluation_mode_is_not_for_production(tmp_path: Path) -> None:
    """Issue 33, item 7: the chart's evaluation.enabled sets CAMP_EVALUATION=true."""
    env = {**_production_env(tmp_path), "CAMP_EVALUATION": "true"}
    result = _doctor(env)
    assert result.returncode == 1
    assert "PROBLEM  evaluation: evaluation mode" in result.stdout
