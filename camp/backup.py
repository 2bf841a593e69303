"""``manage.py backup`` / ``manage.py restore`` (issue 33, item 8): one archive with what a
restore needs, checked before and after.

The archive is a tar file (mode 0600: it holds password hashes and encrypted credentials):

- ``database.dump``: ``pg_dump --format=custom`` of Camp's database (PostgreSQL), or
  ``database.sqlite3``: a copy made with SQLite's online backup API (the demo);
- ``manifest.json``: Camp's version, the applied migrations, the encryption key's
  *fingerprint* (never the key), the deployment checks' findings, and the audit chain's head
  and last anchor at the time of the backup.

``restore`` refuses an archive whose encryption key fingerprint none of the configured keys
has (the stored cluster credentials would not decrypt), replaces the database with the dump,
applies this release's migrations, then verifies: the audit chain (``audit_verify``'s
checks), the manifest's chain head present with its hash, and every stored cluster
credential decrypting with the configured key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

FORMAT = 1
MANIFEST = "manifest.json"
PG_DUMP = "database.dump"
SQLITE_COPY = "database.sqlite3"
RESTORE_ACTOR = "manage.py restore"


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says why and what to do."""


def camp_version() -> str:
    """The version in pyproject.toml (the image ships it at /app/pyproject.toml)."""
    try:
        with open(Path(settings.BASE_DIR) / "pyproject.toml", "rb") as f:
            return str(tomllib.load(f)["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"


def key_fingerprints() -> list[str]:
    from scheduling.backends.credentials import key_fingerprints as fingerprints

    return fingerprints()


def _migrations() -> dict[str, list[str]]:
    from django.db.migrations.recorder import MigrationRecorder

    applied: dict[str, list[str]] = {}
    for app, name in sorted(MigrationRecorder(connection).applied_migrations()):
        applied.setdefault(app, []).append(name)
    return applied


def _settings_check() -> list[str]:
    from django.core.checks import WARNING, run_checks

    return sorted({f"{m.id}" for m in run_checks(include_deployment_checks=True)
                   if m.level >= WARNING and m.id})


def _audit_state() -> dict[str, Any]:
    from tenants.anchor import chain_head, last_anchor
    from tenants.audit import seal

    seal(wait=True)  # what is committed is chained before the head is read
    head = chain_head()
    state: dict[str, Any] = {"head": None, "anchor": None}
    if head is not None:
        state["head"] = {"seq": head.seq, "hash": head.hash, "count": head.count}
    if settings.AUDIT_ANCHOR_PATH:
        anchor, _ = last_anchor(settings.AUDIT_ANCHOR_PATH)
        if anchor is not None:
            state["anchor"] = {"seq": anchor.seq, "hash": anchor.hash, "count": anchor.count,
                               "at": anchor.at}
    return state


def manifest() -> dict[str, Any]:
    db = settings.DATABASES["default"]
    return {
        "format": FORMAT,
        "camp_version": camp_version(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(),
        "database": {"vendor": connection.vendor, "name": Path(str(db["NAME"])).name
                     if connection.vendor == "sqlite" else str(db["NAME"])},
        "migrations": _migrations(),
        "encryption_key": {
            "fingerprint": key_fingerprints()[0],
            "source": "CAMP_ENCRYPTION_KEY" if any(getattr(settings, "CAMP_ENCRYPTION_KEYS", []))
            else "derived from SECRET_KEY",
        },
        "settings_check": _settings_check(),
        "audit": _audit_state(),
    }


# --- PostgreSQL through its client tools -----------------------------------------------------

def _pg_env() -> dict[str, str]:
    """libpq's variables for the default database: the password travels in the environment
    of the child process, never on its command line."""
    db = settings.DATABASES["default"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update({"PGHOST": str(db.get("HOST") or ""), "PGPORT": str(db.get("PORT") or ""),
                "PGUSER": str(db.get("USER") or ""), "PGDATABASE": str(db["NAME"])})
    if db.get("PASSWORD"):
        env["PGPASSWORD"] = str(db["PASSWORD"])
    sslmode = (db.get("OPTIONS") or {}).get("sslmode")
    if sslmode:
        env["PGSSLMODE"] = str(sslmode)
    return {k: v for k, v in env.items() if v != ""}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise BackupError(f"{name} is not installed: install PostgreSQL's client tools "
                          "(Debian: postgresql-client; the image has them).")
    return path


def _run_pg(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=_pg_env(), capture_output=True, text=True)  # noqa: S603 - our own argv
    if done.returncode != 0:
        raise BackupError(f"{Path(cmd[0]).name} failed: {done.stderr.strip()[-1500:]}")


# --- backup ----------------------------------------------------------------------------------

def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = int(dt.datetime.now(dt.UTC).timestamp())
    tar.addfile(info, io.BytesIO(data))


def backup(target: Path) -> dict[str, Any]:
    """Write the archive to ``target`` (created 0600; replaced only when complete)."""
    if connection.vendor not in ("postgresql", "sqlite"):
        raise BackupError(f"No backup for the {connection.vendor} database.")
    info = manifest()
    with tempfile.TemporaryDirectory(prefix="camp-backup-") as tmp:
        if connection.vendor == "postgresql":
            dump = Path(tmp) / PG_DUMP
            _run_pg([_tool("pg_dump"), "--format=custom", "--no-owner", "--no-privileges",
                     "--file", str(dump)])
        else:
            dump = Path(tmp) / SQLITE_COPY
            connection.ensure_connection()
            destination = sqlite3.connect(dump)
            try:
                connection.connection.backup(destination)  # consistent even while others write
            finally:
                destination.close()
        info["database"]["file"] = dump.name
        info["database"]["sha256"] = _sha256(dump)
        part = target.with_name(target.name + ".part")
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
            _add_bytes(tar, MANIFEST, json.dumps(info, indent=2, sort_keys=True).encode())
            tar.add(dump, arcname=dump.name, filter=_private)
        os.replace(part, target)
    return info


def _private(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mode, info.uid, info.gid, info.uname, info.gname = 0o600, 0, 0, "", ""
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- restore ---------------------------------------------------------------------------------

@dataclass
class RestoreReport:
    manifest: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def read_manifest(archive: Path) -> dict[str, Any]:
    try:
        with tarfile.open(archive, mode="r") as tar:
            member = tar.extractfile(MANIFEST)
            if member is None:
                raise KeyError(MANIFEST)
            return dict(json.loads(member.read()))
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise BackupError(f"{archive} is not a Camp backup ({exc.__class__.__name__}).") from exc


def check_archive(info: dict[str, Any]) -> None:
    """Refuse what this deployment cannot restore, before anything is touched."""
    if info.get("format") != FORMAT:
        raise BackupError(f"Backup format {info.get('format')!r}; this release reads format {FORMAT}.")
    vendor = info["database"]["vendor"]
    if vendor != connection.vendor:
        raise BackupError(f"The backup is of a {vendor} database; DATABASE_URL names a "
                          f"{connection.vendor} one.")
    wanted = info["encryption_key"]["fingerprint"]
    if wanted not in key_fingerprints():
        raise BackupError(
            f"The backup's cluster credentials were encrypted with the key {wanted} "
            f"({info['encryption_key']['source']}); none of the configured keys matches "
            f"({', '.join(key_fingerprints())}). Configure the CAMP_ENCRYPTION_KEY (and SECRET_KEY) "
            "of the installation that made the backup (add it after the current one: NEW,OLD).")


def _extract(archive: Path, name: str, into: Path, sha256: str) -> Path:
    with tarfile.open(archive, mode="r") as tar:
        member = tar.extractfile(name)
        if member is None:
            raise BackupError(f"{archive} holds no {name}.")
        path = into / name
        with open(path, "wb") as out:
            shutil.copyfileobj(member, out)
    if _sha256(path) != sha256:
        raise BackupError(f"{name} in {archive} does not match the manifest's checksum (damaged).")
    return path


def _replace_postgres(dump: Path) -> None:
    from django.db import DatabaseError

    # Everything Camp has lives in the public schema: empty it, then load the dump into it.
    try:
        with connection.cursor() as cursor:
            cursor.execute("DROP SCHEMA public CASCADE")
            cursor.execute("CREATE SCHEMA public")
    except DatabaseError as exc:
        raise BackupError("Cannot empty the database (restore needs the owner's DATABASE_URL, as "
                          f"migrate does, and no other process connected): {exc}".strip()) from exc
    connection.close()
    _run_pg([_tool("pg_restore"), "--no-owner", "--no-privileges", "--exit-on-error",
             "--single-transaction", "--dbname", _pg_env()["PGDATABASE"], str(dump)])


def _replace_sqlite(copy: Path) -> None:
    connection.ensure_connection()
    source = sqlite3.connect(copy)
    try:
        source.backup(connection.connection)  # page by page, the whole file replaced
    finally:
        source.close()
    connection.close()


def restore(archive: Path) -> RestoreReport:
    """Replace the database with the archive's, migrate, verify. Raises BackupError before
    touching anything when the archive does not fit this deployment."""
    from django.core.management import call_command

    info = read_manifest(archive)
    check_archive(info)
    report = RestoreReport(manifest=info)
    with tempfile.TemporaryDirectory(prefix="camp-restore-") as tmp:
        dump = _extract(archive, info["database"]["file"], Path(tmp), info["database"]["sha256"])
        if connection.vendor == "postgresql":
            _replace_postgres(dump)
        else:
            _replace_sqlite(dump)
    call_command("migrate", "--noinput", verbosity=0)
    report.problems.extend(verify(info, report.notes))
    _record(info, report)
    return report


def _record(info: dict[str, Any], report: RestoreReport) -> None:
    """The restore itself, as the restored chain's next event (after the checks)."""
    from django.db import transaction

    from tenants.audit import audit_record, seal

    with transaction.atomic():
        audit_record(actor=None, actor_username=RESTORE_ACTOR, action="backup.restored",
                     target_repr=f"backup of {info['created_at']}",
                     after={"camp_version": info["camp_version"], "backup_created_at": info["created_at"],
                            "key_fingerprint": info["encryption_key"]["fingerprint"],
                            "problems": len(report.problems)})
    seal(wait=True)


def verify(info: dict[str, Any], notes: list[str]) -> list[str]:
    """What a restored database lacks against its manifest (empty: nothing)."""
    from scheduling.backends.credentials import decrypt_credentials
    from scheduling.models import Cluster
    from tenants.anchor import verify_anchor
    from tenants.audit import seal, verify_chain
    from tenants.models import AuditEvent

    problems: list[str] = []
    seal(wait=True)
    for broken in verify_chain(seal_first=False):
        problems.append(f"audit chain broken at event #{broken.event_id}: {broken.problem}")
        break
    head = info["audit"]["head"]
    if head is not None:
        stored = AuditEvent.objects.filter(chain_seq=head["seq"]).values_list("hash", flat=True).first()
        if stored != head["hash"]:
            problems.append(f"the audit chain's head at backup time (position {head['seq']}) "
                            "is missing or has another hash")
    if settings.AUDIT_ANCHOR_PATH:
        anchor_problems = verify_anchor()
        anchored = info["audit"].get("anchor") or {}
        from tenants.anchor import last_anchor

        current, _ = last_anchor(settings.AUDIT_ANCHOR_PATH)
        if anchor_problems and current is not None and head is not None and current.seq > head["seq"]:
            # An older backup than the last checkpoint: the events anchored after it are
            # what restoring it loses. Say so; write a new checkpoint once that is accepted.
            notes.append(f"the anchor file records {current.count - head['count']} audit events "
                         f"after this backup (last checkpoint {current.at}); they are not in it. "
                         "Run `manage.py audit_anchor` once you accept that.")
        elif anchor_problems:
            problems.extend(f"audit anchor: {p}" for p in anchor_problems)
        elif anchored:
            notes.append(f"audit anchor at position {anchored['seq']} holds")
    undecryptable = []
    for cluster in Cluster.objects.exclude(credentials_encrypted=""):
        try:
            decrypt_credentials(cluster.credentials_encrypted)
        except ValueError:
            undecryptable.append(cluster.name)
    if undecryptable:
        problems.append("stored credentials do not decrypt with the configured key: "
                        + ", ".join(undecryptable))
    return problems
