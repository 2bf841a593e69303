#!/usr/bin/env python3
"""Create docker-compose's secrets once, and never again: ``python3 deploy/compose/make-secrets.py``.

Writes, next to docker-compose.yml, ``secrets/secret_key``, ``secrets/encryption_key`` (a Fernet
key for cluster credentials), ``secrets/db_password``, ``secrets/database_url`` (the owner's, for
migrations), ``secrets/app_database_url`` (the role web and worker use, ``camp_app``) and
``secrets/admin_password`` (the first platform admin's, used by the ``initial-admin`` service;
change it after signing in). A file that exists is kept as it is: re-running this (or
``docker compose up`` again) never rotates a key, so sessions survive a restart and stored
cluster credentials stay readable. Rotation is deliberate and documented (docs/DEPLOY.md, "Day 2").

Compose mounts each file at /run/secrets/<name> and Camp reads it through its ``*_FILE``
settings, so no secret sits in a container's environment or in ``docker inspect``. The
directory is 0700 (nobody else on the host can reach the files); the files themselves are 0644
because compose bind-mounts them unchanged and Camp (uid 10001) and PostgreSQL (uid 999) must
read them inside their containers. Only the Python standard library: it runs on any Docker host.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
from pathlib import Path


def _values() -> dict[str, str]:
    password = secrets.token_urlsafe(32)
    return {
        "secret_key": secrets.token_urlsafe(64),
        # cryptography's Fernet.generate_key(), without needing cryptography on the host
        "encryption_key": base64.urlsafe_b64encode(os.urandom(32)).decode(),
        "db_password": password,
        # The owner's URL: the migrate service only (migrations, then `db_app_role`).
        "database_url": f"postgres://camp:{password}@postgres:5432/camp",
        "admin_password": secrets.token_urlsafe(18),
        # web, worker, beat and watchers: camp_app, a role that owns nothing and cannot
        # truncate the audit log or disable its triggers (created by the migrate service).
        "app_database_url": f"postgres://camp_app:{secrets.token_urlsafe(32)}@postgres:5432/camp",
    }


def ensure(directory: Path) -> dict[str, str]:
    """Create the missing secrets in ``directory``; return each file's fate (created/kept)."""
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)
    fresh = _values()
    kept_password = (directory / "db_password").read_text().strip() \
        if (directory / "db_password").exists() else None
    if kept_password is not None:  # the URL must carry the password PostgreSQL was created with
        fresh["database_url"] = f"postgres://camp:{kept_password}@postgres:5432/camp"
    fates: dict[str, str] = {}
    for name, value in fresh.items():
        path = directory / name
        if path.exists():
            fates[name] = "kept"
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(value + "\n")
        fates[name] = "created"
    return fates


def main(argv: list[str]) -> int:
    directory = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[2] / "secrets"
    for name, fate in ensure(directory).items():
        print(f"{fate:8} {directory / name}")
    print("Back these files up with the database: without encryption_key the stored cluster "
          "credentials cannot be read.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
