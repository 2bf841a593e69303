"""``manage.py restore``: put a ``manage.py backup`` archive back, migrate, verify."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from camp.backup import BackupError, check_archive, read_manifest, restore


class Command(BaseCommand):
    help = ("Replace this database with a backup archive's (stop web, worker, beat and watchers "
            "first), apply this release's migrations, then verify the audit chain and that the "
            "stored cluster credentials decrypt. Refuses an archive made with another encryption key.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("archive")
        parser.add_argument("--yes", action="store_true",
                            help="Do not ask: this replaces everything in the database.")
        parser.add_argument("--check", action="store_true",
                            help="Only read the archive's manifest and say whether it can be restored here.")

    def handle(self, *args: Any, archive: str, yes: bool, check: bool, **options: Any) -> None:
        path = Path(archive)
        try:
            info = read_manifest(path)
            check_archive(info)
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Backup of Camp {info['camp_version']} made {info['created_at']} "
                          f"({info['database']['vendor']}; key {info['encryption_key']['fingerprint']}).")
        if check:
            self.stdout.write(self.style.SUCCESS("It can be restored here."))
            return
        if not yes:
            answer = input("This replaces everything in the database. Type 'restore' to go on: ")
            if answer.strip() != "restore":
                raise CommandError("Not restored.")
        try:
            report = restore(path)
        except BackupError as exc:
            raise CommandError(str(exc)) from exc
        for note in report.notes:
            self.stdout.write(f"note     {note}")
        for problem in report.problems:
            self.stdout.write(f"PROBLEM  {problem}")
        if report.problems:
            raise CommandError(f"Restored, but {len(report.problems)} check(s) failed.", returncode=1)
        self.stdout.write(self.style.SUCCESS(
            "Restored and migrated; audit chain intact; stored cluster credentials decrypt."))
