"""Create, list and revoke SCIM bearer tokens (one identity provider each)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from tenants.models import User
from tenants.scim.models import SSO_SOURCES, ScimToken
from tenants.scim.services import scim_provider_for, scim_token_create, scim_token_revoke


class Command(BaseCommand):
    help = ("SCIM provisioning credentials. `create PROVIDER --sso-source oidc|saml --sso-issuer "
            "ISSUER` prints a new token once; `list`; `revoke PREFIX`. docs/AUTH.md.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="a new token for a provider (created on first use)")
        create.add_argument("provider", help="a short name: okta, entra, onelogin")
        create.add_argument("--sso-source", choices=[s for s, _ in SSO_SOURCES],
                            help="how the provisioned people sign in (needed for a new provider)")
        create.add_argument("--sso-issuer",
                            help="the OIDC issuer or SAML IdP entity id they sign in with")
        create.add_argument("--admin", required=True,
                            help="username of the platform admin creating it (audited)")
        sub.add_parser("list", help="tokens and their providers (never the secrets)")
        revoke = sub.add_parser("revoke", help="revoke a token by its prefix")
        revoke.add_argument("prefix")
        revoke.add_argument("--admin", required=True)

    def _admin(self, username: str) -> User:
        from tenants.permissions import CHANGE, acts_as_platform_admin

        admin = User.objects.filter(username=username).first()
        if admin is None or not admin.is_active or not acts_as_platform_admin(admin, CHANGE):
            raise CommandError(f"--admin: {username!r} is not an active platform admin.")
        return admin

    @transaction.atomic
    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "list":
            for token in ScimToken.objects.select_related("provider"):
                state = "revoked" if token.revoked_at else "live"
                self.stdout.write(f"{token.prefix}  {token.provider.name}  "
                                  f"{token.provider.sso_source} {token.provider.sso_issuer}  "
                                  f"{state}  last used {token.last_used_at or 'never'}")
            return
        admin = self._admin(options["admin"])
        if action == "revoke":
            found = ScimToken.objects.select_related("provider").filter(
                prefix=options["prefix"]).first()
            if found is None:
                raise CommandError(f"prefix: no SCIM token {options['prefix']!r}.")
            scim_token_revoke(actor=admin, token=found)
            self.stdout.write(f"Revoked {found.prefix}.")
            return
        try:
            provider = scim_provider_for(options["provider"], options["sso_source"],
                                         options["sso_issuer"])
        except ValidationError as exc:
            field, errors = next(iter(exc.message_dict.items()))
            name = {"sso_source": "--sso-source"}.get(field, field)
            raise CommandError(f"{name}: {errors[0]}") from exc
        _, plaintext = scim_token_create(actor=admin, provider=provider)
        self.stdout.write(plaintext)
