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
           "SECRET_KEY_FILE": str(secret_file), "ALLOWED_HOSTS": "camp.example.com"}
    env.pop("SECRET_KEY", None)
    result = _manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_production_refuses_the_demo_secret() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production"}
    env.pop("SECRET_KEY", None)
    env.pop("SECRET_KEY_FILE", None)
    result = _manage("check", env=env)
    assert result.returncode != 0 and "SECRET_KEY" in result.stderr
