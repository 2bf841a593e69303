"""SCIM fixtures: providers bound to an OIDC issuer, their tokens, and a small client."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client

OKTA_ISSUER = "https://example.okta.com"
ENTRA_ISSUER = "https://sts.windows.net/8eaef023-2b34-4da1-9baa-8bc8c9d6a490/"
PATCH_OP = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
GROUP_ROLES = json.dumps({
    "camp-acme-ml": "project_member:acme/acme-p1",
    "camp-acme-leads": "project_admin:acme/acme-p1",
    "camp-admins": "platform_admin",
})


@dataclass
class Scim:
    """Requests to /scim/v2 with one provider's bearer token."""

    token: str
    client: Client

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        kwargs: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {token or self.token}"}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            kwargs["content_type"] = "application/scim+json"
        return getattr(self.client, method.lower())(f"/scim/v2{path}", **kwargs)


def _provider(name: str, source: str, issuer: str, admin: Any) -> Scim:
    from tenants.scim.models import ScimProvider
    from tenants.scim.services import scim_token_create

    provider = ScimProvider.objects.create(name=name, sso_source=source, sso_issuer=issuer)
    _, plaintext = scim_token_create(actor=admin, provider=provider)
    return Scim(plaintext, Client())


@pytest.fixture
def group_roles(settings: Any) -> None:
    from tenants.sso.mapping import parse_group_roles

    settings.SSO_GROUP_ROLES = parse_group_roles(GROUP_ROLES)


@pytest.fixture
def okta(world: Any, group_roles: None) -> Scim:
    return _provider("okta", "oidc", OKTA_ISSUER, world.admin)


@pytest.fixture
def entra(world: Any, group_roles: None) -> Scim:
    return _provider("entra", "saml", ENTRA_ISSUER, world.admin)
