"""Verify the audit log's hash chain and name the first broken row."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.anchor import verify_anchor
from tenants.audit import seal, unsealed_count, verify_chain
from tenants.models import AuditEvent


class Command(BaseCommand):
    help = ("Seal the committed events not chained yet, then verify the audit log hash chain; "
            "exits non-zero at the first broken row.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--no-seal", action="store_true",
                            help="Verify only what is sealed (e.g. on a read-only replica); "
                                 "report how many events wait to be sealed.")

    def handle(self, *args: Any, **options: Any) -> None:
        sealed = 0 if options["no_seal"] else seal(wait=True)
        verified = 0
        for broken in verify_chain(seal_first=False):
            raise CommandError(f"Audit chain broken at event #{broken.event_id}: {broken.problem}.")
        # The chain alone cannot see its newest rows deleted, the table emptied or the whole
        # chain recomputed: the anchor outside the database can (tenants/anchor.py).
        for problem in verify_anchor():
            raise CommandError(f"Audit chain contradicts its anchor: {problem}.")
        verified = AuditEvent.objects.filter(chain_seq__isnull=False).count()
        waiting = unsealed_count()
        message = f"Audit chain intact: {verified} events verified"
        if sealed:
            message += f" ({sealed} sealed just now)"
        if waiting:
            message += f"; {waiting} committed since, not sealed yet (not verified)"
        self.stdout.write(self.style.SUCCESS(message + "."))
