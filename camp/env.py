"""Small typed helpers that read settings from the environment.

Every secret may also come from a file: ``FOO_FILE=/run/secrets/foo`` wins over
``FOO`` (the Docker/Kubernetes secrets convention), so secrets need not sit in
the process environment.
"""

from __future__ import annotations

import os
from pathlib import Path


class ImproperlyConfiguredEnv(RuntimeError):
    """A variable is present but cannot be parsed; names the variable."""


def _raw(name: str) -> str | None:
    file_path = os.environ.get(f"{name}_FILE")
    if file_path:
        try:
            return Path(file_path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:  # a missing mount: one line, not a traceback
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ImproperlyConfiguredEnv(f"{name}_FILE={file_path}: cannot be read ({reason})") from exc
    return os.environ.get(name)


def env_is_set(name: str) -> bool:
    """Whether ``name`` (or ``name_FILE``) is given at all, even empty."""
    return f"{name}_FILE" in os.environ or name in os.environ


def env_str(name: str, default: str = "") -> str:
    value = _raw(name)
    return default if value is None else value


def env_bool(name: str, default: bool = False) -> bool:
    value = _raw(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={value!r} is not a boolean (use true/false)")


def env_int(name: str, default: int) -> int:
    value = _raw(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise ImproperlyConfiguredEnv(f"{name}={value!r} is not an integer") from exc


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    value = _raw(name)
    if value is None or value.strip() == "":
        return list(default or [])
    return [item.strip() for item in value.split(",") if item.strip()]
