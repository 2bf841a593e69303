"""Verify the audit log's hash chain and name the first broken row."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenants.audit import verify_chain
from tenants.models import AuditEvent


class Command(BaseCommand):
    help = "Verify the audit log hash chain; exits non-zero at the first broken row."

    def handle(self, *args: Any, **options: Any) -> None:
        total = AuditEvent.objects.count()
        for broken in verify_chain():
            raise CommandError(f"Audit chain broken at event #{broken.event_id}: {broken.problem}.")
        self.stdout.write(self.style.SUCCESS(f"Audit chain intact: {total} events verified."))
