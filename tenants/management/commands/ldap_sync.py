"""Re-read every directory account now (what the beat's ldap-sync does every few minutes)."""

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = ("Re-read every LDAP account through the service bind: revoke roles whose groups are "
            "gone, deactivate accounts removed or locked in the directory (sessions, API tokens "
            "and live pages end). A directory that does not answer changes nobody; exits "
            "non-zero then.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.LDAP_ENABLED:
            raise CommandError("LDAP sign-in is not enabled (LDAP_ENABLED).")
        from tenants.sso.ldap_sync import ldap_sync

        report = ldap_sync()
        for line in report.roles_changed:
            self.stdout.write(f"roles  {line}")
        for username, reason in report.deactivated:
            self.stdout.write(f"deactivated  {username}: {reason}")
        for username, why in report.skipped:
            self.stdout.write(f"skipped  {username}: {why}")
        summary = (f"{report.checked} directory accounts read, {len(report.deactivated)} "
                   f"deactivated, {len(report.roles_changed)} with role changes, "
                   f"{len(report.skipped)} skipped.")
        if report.error:
            raise CommandError(f"LDAP re-sync incomplete: {report.error}. {summary}")
        self.stdout.write(self.style.SUCCESS(summary))
