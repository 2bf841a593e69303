"""``manage.py backup``: the database and what restoring it needs, in one archive."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from camp.backup import BackupError, backup


class Command(BaseCommand):
    help = ("Write one archive (mode 0600) with the database dump (pg_dump custom format, or an "
            "SQLite copy) and a manifest: Camp version, migrations, the encryption key's "
            "fingerprint (never the key), the settings check and the audit chain's head and anchor.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--output", "-o", default="",
                            help="The archive's path (default: camp-backup-<UTC time>.tar here).")

    def handle(self, *args: Any, output: str, **options: Any) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        target = Path(output or f"camp-backup-{stamp}.tar")
        try:
            info = backup(target)
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        head = info["audit"]["head"]
        chain = "empty" if head is None else f"at position {head['seq']} ({head['count']} events)"
        self.stdout.write(self.style.SUCCESS(
            f"Backed up Camp {info['camp_version']} ({info['database']['vendor']}) to {target}: "
            f"{sum(len(v) for v in info['migrations'].values())} migrations, audit chain "
            f"{chain}, "
            f"encryption key {info['encryption_key']['fingerprint']}."))
        self.stdout.write("Keep SECRET_KEY and CAMP_ENCRYPTION_KEY in your secret store: the "
                          "archive names the key's fingerprint only.")
