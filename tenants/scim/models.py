"""SCIM provisioning state, kept beside Camp's users (tenants.User is not changed).

- ``ScimProvider``: one identity provider that provisions (Okta, Entra ID, OneLogin),
  bound to the single sign-on identity its users sign in with, so that an account it
  provisions is the account that signs in.
- ``ScimToken``: that provider's bearer credential; only a SHA-256 is stored (as API
  tokens, ``tenants.services.hash_token``), shown once.
- ``ScimUser``: the link provider + externalId → Camp user. Accounts are found by this
  link only, never by the typed ``userName``.
- ``ScimGroup``: a provider's group; its ``display_name`` is looked up in
  ``SSO_GROUP_ROLES`` like an OIDC/SAML/LDAP group name.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

SSO_SOURCES = [("oidc", "OpenID Connect"), ("saml", "SAML 2.0")]


class ScimProvider(models.Model):
    name = models.SlugField(max_length=63, unique=True,
                            help_text="Names the provider in audit events (actor scim:<name>).")
    sso_source = models.CharField(max_length=8, choices=SSO_SOURCES,
                                  help_text="How the provisioned people sign in.")
    sso_issuer = models.CharField(
        max_length=255,
        help_text="OIDC issuer or SAML IdP entity id; with the externalId as subject/NameID "
                  "it is the account's single sign-on identity.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ScimToken(models.Model):
    provider = models.ForeignKey(ScimProvider, on_delete=models.CASCADE, related_name="tokens")
    prefix = models.CharField(max_length=24, db_index=True, help_text="Public part, for display")
    key_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.provider.name} ({self.prefix}…)"


class ScimUser(models.Model):
    scim_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    provider = models.ForeignKey(ScimProvider, on_delete=models.CASCADE, related_name="users")
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                related_name="scim_link")
    external_id = models.CharField(max_length=255, blank=True, default="")
    user_name = models.CharField(max_length=255, help_text="userName as the provider sent it")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "external_id"], condition=~Q(external_id=""),
                                    name="scim_user_unique_external_id"),
            models.UniqueConstraint(fields=["provider", "user_name"],
                                    name="scim_user_unique_user_name"),
        ]

    def __str__(self) -> str:
        return f"{self.provider.name}:{self.external_id or self.user_name}"


class ScimGroup(models.Model):
    scim_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    provider = models.ForeignKey(ScimProvider, on_delete=models.CASCADE, related_name="groups")
    external_id = models.CharField(max_length=255, blank=True, default="")
    display_name = models.CharField(max_length=255)
    members = models.ManyToManyField(ScimUser, related_name="groups", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["provider", "display_name"],
                                    name="scim_group_unique_display_name"),
        ]

    def __str__(self) -> str:
        return f"{self.provider.name}:{self.display_name}"
