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


def _secrets(directory: Path) -> subprocess.CompletedProcess[str]:
    """The documented first step: ``python3 deploy/compose/make-secrets.py`` (here into ``directory``)."""
    return subprocess.run([sys.executable, str(ROOT / "deploy" / "compose" / "make-secrets.py"),
                           str(directory)], capture_output=True, text=True, timeout=60)


def _compose_env(service: str, tmp_path: Path, database: str, app_database: str = "") -> dict[str, str]:
    """A service's compose environment as its container sees it: the secrets the script wrote,
    at the paths compose mounts them (/run/secrets/<name> → the script's directory); only the
    database URLs (the owner's, the app role's) point at this machine's PostgreSQL (no compose
    network here)."""
    secret_dir = tmp_path / "secrets"
    if not secret_dir.exists():
        assert _secrets(secret_dir).returncode == 0
        (secret_dir / "database_url").write_text(database + "\n")
        (secret_dir / "app_database_url").write_text((app_database or database) + "\n")
    spec = _compose()
    mounted = set(spec["services"][service].get("secrets", []))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECRET_KEY", "DATABASE_URL",
                                                                      "CAMP_ENCRYPTION_KEY"))}
    for key, value in spec["services"][service]["environment"].items():
        value = str(value)
        if value.startswith("${"):
            continue
        if value.startswith("/run/secrets/"):
            name = value.removeprefix("/run/secrets/")
            assert name in mounted and name in spec["secrets"], f"{key} names an unmounted secret"
            value = str(secret_dir / name)
        env[key] = value
    return env


def test_compose_secrets_are_made_once_and_never_sit_in_the_environment(tmp_path: Path) -> None:
    """Re-running the documented commands keeps every key (issue 33, finding 1): the script
    never rewrites a file, no secret value is in compose's environment, and PostgreSQL's
    password is the one in Camp's database URL."""
    first = _secrets(tmp_path / "s")
    assert first.returncode == 0 and first.stdout.count("created") == 6, first.stdout
    before = {p.name: p.read_text() for p in (tmp_path / "s").iterdir()}
    again = _secrets(tmp_path / "s")
    assert again.returncode == 0 and again.stdout.count("kept") == 6, again.stdout
    assert {p.name: p.read_text() for p in (tmp_path / "s").iterdir()} == before
    assert oct((tmp_path / "s").stat().st_mode & 0o777) == "0o700"
    assert before["db_password"].strip() in before["database_url"]
    spec = _compose()
    for name, service in spec["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert not any(v.strip() in str(value) for v in before.values()), (name, key)
            assert key not in ("SECRET_KEY", "DATABASE_URL", "CAMP_ENCRYPTION_KEY",
                               "POSTGRES_PASSWORD"), f"{name} takes {key} from the environment"
    assert spec["services"]["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/db_password"


def test_a_restart_keeps_sessions_and_cluster_credentials(tmp_path: Path) -> None:
    """What one process signs (sessions) and encrypts (cluster credentials), the next process
    of the same compose deployment reads: the keys come from the kept secret files."""
    env = _compose_env("web", tmp_path, "postgres://postgres@127.0.0.1:5432/postgres")
    env["ALLOWED_HOSTS"] = "localhost"
    write = ("from django.core import signing; from scheduling.backends.credentials import "
             "encrypt_credentials as e; print(signing.dumps({'session': 'alice'})); "
             "print(e({'token': 'cluster-token'}))")
    first = subprocess.run([sys.executable, "manage.py", "shell", "-c", write], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    signed, sealed = first.stdout.split()[-2:]  # the last two lines (start-up may log above)
    read = ("import sys; from django.core import signing; from scheduling.backends.credentials "
            f"import decrypt_credentials as d; print(signing.loads({signed!r})['session'], "
            f"d({sealed!r})['token'])")
    again = _compose_env("worker", tmp_path, "postgres://postgres@127.0.0.1:5432/postgres")
    again["ALLOWED_HOSTS"] = "localhost"
    second = subprocess.run([sys.executable, "manage.py", "shell", "-c", read], cwd=ROOT,
                            env=again, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split()[-2:] == ["alice", "cluster-token"]


@pytest.fixture
def compose_database() -> Iterator[tuple[str, str]]:
    """A database of its own, as compose's postgres service gives (dropped afterwards), and the
    URL of an app role for it that does not exist yet (the migrate service creates it; roles
    are cluster-wide, so the name is unique and the role is dropped afterwards)."""
    tag = uuid.uuid4().hex[:8]
    name, role = f"camp_compose_{tag}", f"camp_app_{tag}"
    admin = "postgres://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield (f"postgres://postgres@127.0.0.1:5432/{name}",
               f"postgres://{role}:app-{tag}@127.0.0.1:5432/{name}")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_compose_initial_admin_is_created_once_with_the_kept_password(
    compose_database: tuple[str, str], tmp_path: Path
) -> None:
    """Issue 33, item 7: compose's initial-admin service (after migrate) creates the platform
    admin with secrets/admin_password; a later `up` leaves a changed password alone."""
    services = _compose()["services"]
    assert services["initial-admin"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"}
    owner_url, app_url = compose_database
    venv_bin = str(Path(sys.executable).parent)
    extra = {"ALLOWED_HOSTS": "localhost", "CAMP_ADMIN_USERNAME": "admin",
             "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}
    env = {**_compose_env("initial-admin", tmp_path, owner_url, app_url), **extra}

    def run(service: str) -> str:
        # Each service with its own environment (migrate as the owner, the rest as camp_app).
        service_env = {**_compose_env(service, tmp_path, owner_url, app_url), **extra}
        done = subprocess.run(services[service]["command"], cwd=ROOT, env=service_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("migrate")
    assert "Created platform admin admin" in run("initial-admin")
    password = (tmp_path / "secrets" / "admin_password").read_text().strip()
    check = ("from tenants.models import User; u = User.objects.get(username='admin'); "
             "print(u.is_platform_admin, u.check_password({!r}))")
    shell = [sys.executable, "manage.py", "shell", "-c"]
    done = subprocess.run([*shell, check.format(password)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stdout + done.stderr
    subprocess.run([*shell, "from tenants.models import User; u = User.objects.get(username='admin'); "
                    "u.set_password('changed-after-sign-in-4410'); u.save()"],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)
    assert "left as it is" in run("initial-admin")
    done = subprocess.run([*shell, check.format("changed-after-sign-in-4410")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stdout + done.stderr


def test_compose_wires_two_database_roles() -> None:
    """Only migrate holds the owner's URL; web, worker, beat and watcher connect with the app
    role's (issue 30, item 2), which migrate creates and grants right after migrating."""
    spec = _compose()
    services = spec["services"]
    for role in ("web", "worker", "beat", "watcher"):
        assert services[role]["environment"]["DATABASE_URL_FILE"] == "/run/secrets/app_database_url"
        assert "database_url" not in services[role]["secrets"], f"{role} can read the owner's URL"
        assert "app_database_url" in services[role]["secrets"]
    migrate = services["migrate"]
    assert migrate["environment"]["DATABASE_URL_FILE"] == "/run/secrets/database_url"
    assert migrate["environment"]["APP_DATABASE_URL_FILE"] == "/run/secrets/app_database_url"
    assert {"database_url", "app_database_url"} <= set(migrate["secrets"])
    steps = migrate["command"][-1].split("&&")
    assert "manage.py migrate" in steps[0] and "db_app_role --from-url-env APP_DATABASE_URL" in steps[1]
    assert {"database_url", "app_database_url"} <= set(spec["secrets"])


def test_compose_migrate_then_web_serves_ready(compose_database: tuple[str, str], tmp_path: Path) -> None:
    """compose's migrate and web commands, with its environment pointed at this machine's
    PostgreSQL and Redis (no Docker engine runs here): web connects as the app role, which
    exists and answers /readyz 200 only after migrate; and that role cannot truncate the
    audit log or disable its triggers."""
    owner_url, app_url = compose_database
    services = _compose()["services"]
    env = _compose_env("web", tmp_path, owner_url, app_url)
    venv_bin = str(Path(sys.executable).parent)
    env.update({"REDIS_URL": "redis://127.0.0.1:6379/15", "ALLOWED_HOSTS": "localhost",
                "SECURE_SSL_REDIRECT": "false", "STATIC_ROOT": str(tmp_path / "static"),
                "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"})
    assert env["DATABASE_URL_FILE"].endswith("app_database_url")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    web_cmd = [str(port) if c == "8000" else ("127.0.0.1" if c == "0.0.0.0" else c)  # noqa: S104
               for c in services["web"]["command"]]
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
        assert status == 503  # the app role does not exist yet, nor do the tables
        migrate_env = _compose_env("migrate", tmp_path, owner_url, app_url)
        migrate_env.update({k: env[k] for k in ("PATH", "REDIS_URL", "ALLOWED_HOSTS", "SECURE_SSL_REDIRECT",
                                                "STATIC_ROOT")})
        done = subprocess.run(services["migrate"]["command"], cwd=ROOT, env=migrate_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        status, body = readyz()
        assert status == 200, body
    finally:
        os.killpg(web.pid, 15)
        web.wait(timeout=30)
    with psycopg.connect(app_url, autocommit=True) as app:
        assert app.execute("SELECT count(*) FROM tenants_auditevent").fetchone() is not None
        for statement in ("TRUNCATE tenants_auditevent",
                          "ALTER TABLE tenants_auditevent DISABLE TRIGGER USER",
                          "DELETE FROM tenants_auditevent"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                app.execute(statement)


def test_compose_commands_are_real() -> None:
    """Each role's program exists in this code base (a renamed command would break compose)."""
    services = _compose()["services"]
    watch = shlex.split(services["watcher"]["command"][-1].replace("exec ", ""))
    assert watch[:3] == ["python", "manage.py", "camp_watch"]
    result = subprocess.run([sys.executable, "manage.py", "help", "camp_watch"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "--cluster" in result.stdout
