"""tools/test-deps.sh (what `make test` and CI install) and docker-compose.yml's services."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from .tools import ROOT

SCRIPT = ROOT / "tools" / "test-deps.sh"


def test_ci_and_make_test_share_one_install_script() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec make test" in ci and "apt-get" not in ci
    makefile = (ROOT / "Makefile").read_text()
    assert "tools/test-deps.sh" in makefile


def test_without_root_it_prints_exactly_what_to_install() -> None:
    """As a normal user nothing is installed: the missing packages are named in one line."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the script as another user")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHON": "python-that-is-not-here"}
    # The script's text as an argument: user nobody cannot traverse the checkout's parents.
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             "bash", "-c", SCRIPT.read_text(), "test-deps.sh"], env=env, cwd="/",
                            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 1
    assert ("apt-get update && apt-get install -y "
            "python3.11 python3.11-venv python3.11-dev") in result.stderr


def test_check_mode_reports_without_installing() -> None:
    env = {**os.environ, "PYTHON": "python-that-is-not-here"}
    result = subprocess.run(["bash", str(SCRIPT), "--check"], env=env, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 1 and "python3.11-dev" in result.stderr
    ok = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True,
                        timeout=60, stdin=subprocess.DEVNULL)
    assert ok.returncode == 0, ok.stderr  # this machine has everything the suite needs


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def test_compose_runs_every_role_after_migrations() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "migrate", "web", "worker", "beat", "watcher"} <= set(services)
    for role in ("web", "worker", "beat", "watcher"):
        assert services[role]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
        assert services[role]["read_only"] is True
    dockerfile_cmd = json.loads(DockerfileParser(path=str(ROOT / "Dockerfile")).cmd)
    assert services["web"]["command"] == dockerfile_cmd
    assert services["beat"]["command"][:4] == ["celery", "-A", "camp", "beat"]
    assert "camp_watch --cluster" in services["watcher"]["command"][-1]
    assert services["watcher"]["profiles"] == ["kubernetes"]


@pytest.fixture
def compose_database() -> Iterator[str]:
    """A database of its own, as compose's postgres service gives (dropped afterwards)."""
    name = f"camp_compose_{uuid.uuid4().hex[:8]}"
    admin = "postgres://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_compose_migrate_then_web_serves_ready(compose_database: str, tmp_path: Path) -> None:
    """compose's migrate and web commands, with its environment pointed at this machine's
    PostgreSQL and Redis (no Docker engine runs here): /readyz turns 200 only after migrate."""
    services = _compose()["services"]
    env = {**os.environ, **{k: str(v) for k, v in services["web"]["environment"].items()
                            if not str(v).startswith("${")}}
    env.update({"DATABASE_URL": compose_database, "REDIS_URL": "redis://127.0.0.1:6379/15",
                "SECRET_KEY": "compose-test-" + "z" * 60, "ALLOWED_HOSTS": "localhost",
                "SECURE_SSL_REDIRECT": "false", "STATIC_ROOT": str(tmp_path / "static")})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web_cmd = [str(port) if c == "8000" else ("127.0.0.1" if c == "0.0.0.0" else c)  # noqa: S104
               for c in services["web"]["command"]]
    venv_bin = str(Path(sys.executable).parent)
    web_cmd[0] = f"{venv_bin}/{web_cmd[0]}"
    web = subprocess.Popen(web_cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)

    def readyz() -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:  # noqa: S310
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        for _ in range(150):
            try:
                status, body = readyz()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("web never answered")
        assert status == 503 and "not applied" in body["checks"]["migrations"]
        # sh -c "python manage.py migrate … && python manage.py db_app_role camp_app"
        migrate = [c.replace("python manage.py", f"{venv_bin}/python manage.py")
                   for c in services["migrate"]["command"]]
        done = subprocess.run(migrate, cwd=ROOT, env={**env, "APP_DB_PASSWORD": "compose-app-pw"},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        status, body = readyz()
        assert status == 200, body
    finally:
        os.killpg(web.pid, 15)
        web.wait(timeout=30)


def test_compose_commands_are_real() -> None:
    """Each role's program exists in this code base (a renamed command would break compose)."""
    services = _compose()["services"]
    watch = shlex.split(services["watcher"]["command"][-1].replace("exec ", ""))
    assert watch[:3] == ["python", "manage.py", "camp_watch"]
    result = subprocess.run([sys.executable, "manage.py", "help", "camp_watch"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--cluster" in result.stdout
