"""Create the Camp client application, or a user, in the test IdP."""

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand
from oauth2_provider.models import Application


class Command(BaseCommand):
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--client-id")
        parser.add_argument("--client-secret")
        parser.add_argument("--user")
        parser.add_argument("--password")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["client_id"]:
            Application.objects.update_or_create(
                client_id=opts["client_id"],
                defaults={
                    "name": "Camp",
                    "client_secret": opts["client_secret"],
                    "client_type": Application.CLIENT_CONFIDENTIAL,
                    "authorization_grant_type": Application.GRANT_AUTHORIZATION_CODE,
                    # Loopback redirect: any port matches (RFC 8252 §7.3, as DOT implements).
                    "redirect_uris": "http://127.0.0.1/oidc/callback/",
                    "algorithm": Application.RS256_ALGORITHM,
                    "skip_authorization": True,
                },
            )
        if opts["user"]:
            user, _ = User.objects.get_or_create(username=opts["user"])
            user.set_password(opts["password"])
            user.save()
