"""manage.py scim_token: a platform admin creates, lists and revokes SCIM credentials."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from tenants.models import AuditEvent
from tenants.scim.models import ScimProvider, ScimToken


def _run(*args: str) -> str:
    out = StringIO()
    call_command("scim_token", *args, stdout=out)
    return out.getvalue().strip()


def test_create_list_revoke(world: Any) -> None:
    plaintext = _run("create", "okta", "--sso-source", "oidc", "--sso-issuer",
                     "https://example.okta.com", "--admin", world.admin.username)
    assert plaintext.startswith("campscim_")
    token = ScimToken.objects.get()
    assert token.key_hash != plaintext and plaintext not in token.prefix
    assert Client().get("/scim/v2/Users", HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code == 200
    listing = _run("list")
    assert token.prefix in listing and plaintext not in listing
    event = AuditEvent.objects.get(action="scim_token.created")
    assert event.actor_username == world.admin.username and plaintext not in str(event.after)

    _run("revoke", token.prefix, "--admin", world.admin.username)
    assert Client().get("/scim/v2/Users", HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code == 401


def test_only_a_platform_admin_and_a_bound_provider(world: Any) -> None:
    with pytest.raises(CommandError, match="--admin"):
        _run("create", "okta", "--sso-source", "oidc", "--sso-issuer", "https://x",
             "--admin", world.a.owner.username)
    with pytest.raises(CommandError, match="--sso-source"):
        _run("create", "okta", "--admin", world.admin.username)
    _run("create", "okta", "--sso-source", "oidc", "--sso-issuer", "https://x",
         "--admin", world.admin.username)
    with pytest.raises(CommandError, match="bound to"):
        _run("create", "okta", "--sso-source", "saml", "--admin", world.admin.username)
    assert ScimProvider.objects.get().sso_source == "oidc"
