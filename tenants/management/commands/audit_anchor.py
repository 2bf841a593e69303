"""Append the audit chain's head to its anchor outside the database, now."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from tenants.anchor import anchor_write
from tenants.audit import seal


class Command(BaseCommand):
    help = ("Seal, then append the audit chain's head (position, hash, count) to AUDIT_ANCHOR_PATH, "
            "signed with AUDIT_ANCHOR_KEY. The worker's beat does this every AUDIT_ANCHOR_SECONDS.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.AUDIT_ANCHOR_PATH:
            raise CommandError("AUDIT_ANCHOR_PATH is not set.")
        seal(wait=True)
        head = anchor_write()
        if head is None:
            self.stdout.write("Nothing sealed yet: no anchor written.")
            return
        self.stdout.write(self.style.SUCCESS(
            f"Anchored chain position {head.seq} ({head.count} events) to {settings.AUDIT_ANCHOR_PATH}."))
