"""Production settings pass Django's deployment checks; secrets come from files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("x" * 20 + "a-long-random-production-secret-key-0123456789")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production",
           "SECRET_KEY_FILE": str(secret_file), "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": "postgres://camp:secret@db.example.com:5432/camp"}
    env.pop("SECRET_KEY", None)
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_the_demo_secret() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production"}
    env.pop("SECRET_KEY", None)
    env.pop("SECRET_KEY_FILE", None)
    result = _manage("check", env=env)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr


def _production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    secret_file = tmp_path / "secret"
    secret_file.write_text("x" * 20 + "a-long-random-production-secret-key-0123456789")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production",
           "SECRET_KEY_FILE": str(secret_file), "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": "postgres://camp:hunter2-db-password@db.example.com:5432/camp"}
    for name in ("SECRET_KEY", "DATABASE_URL_FILE"):
        env.pop(name, None)
    env.update(extra)
    return env


def _refused_in_one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_production_refuses_to_start_without_a_database_url(tmp_path: Path) -> None:
    env = _production_env(tmp_path)
    env.pop("DATABASE_URL")
    _refused_in_one_line(_manage("check", env=env), "DATABASE_URL", "must be set")


def test_an_empty_or_foreign_database_url_is_named_without_echoing_its_password(tmp_path: Path) -> None:
    _refused_in_one_line(_manage("check", env=_production_env(tmp_path, DATABASE_URL="")),
                         "DATABASE_URL", "empty")
    line = _refused_in_one_line(
        _manage("check", env=_production_env(tmp_path, DATABASE_URL="mssql://sa:hunter2@db/camp")),
        "DATABASE_URL", "mssql")
    assert "hunter2" not in line


def test_a_secret_file_that_is_not_there_is_named(tmp_path: Path) -> None:
    env = _production_env(tmp_path, SECRET_KEY_FILE=str(tmp_path / "not-mounted"))
    _refused_in_one_line(_manage("check", env=env), "SECRET_KEY_FILE", "not-mounted",
                         "No such file")


def test_production_refuses_a_short_secret_key_in_one_line(tmp_path: Path) -> None:
    for short in ("x", "a" * 49):
        env = _production_env(tmp_path, SECRET_KEY=short)
        env.pop("SECRET_KEY_FILE")
        line = _refused_in_one_line(_manage("check", env=env), "SECRET_KEY", "at least 50")
        assert "a" * 49 not in line  # the refusal names the variable, never echoes the secret
    env = _production_env(tmp_path, SECRET_KEY="k" * 50)
    env.pop("SECRET_KEY_FILE")
    assert _manage("check", env=env).returncode == 0


def test_production_refuses_empty_allowed_hosts_in_one_line(tmp_path: Path) -> None:
    for value in ("", " , "):
        _refused_in_one_line(_manage("check", env=_production_env(tmp_path, ALLOWED_HOSTS=value)),
                             "ALLOWED_HOSTS")
    env = _production_env(tmp_path)
    env.pop("ALLOWED_HOSTS")
    _refused_in_one_line(_manage("check", env=env), "ALLOWED_HOSTS")


def test_production_says_loudly_at_start_up_when_the_https_redirect_is_off(tmp_path: Path) -> None:
    off = _manage("check", env=_production_env(tmp_path, SECURE_SSL_REDIRECT="false"))
    assert off.returncode == 0, off.stderr
    assert "WARNING: SECURE_SSL_REDIRECT=false" in off.stderr
    on = _manage("check", env=_production_env(tmp_path))
    assert "SECURE_SSL_REDIRECT" not in on.stderr
