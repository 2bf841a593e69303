"""/api/v1/scim-tokens/: a platform admin lists, creates and revokes SCIM credentials over the
API (issue 31); nobody else sees or makes one. The secret is shown once and stored hashed."""

from __future__ import annotations

from typing import Any

from django.test import Client

from tenants.models import AuditEvent
from tenants.scim.models import ScimProvider, ScimToken
from tenants.services import hash_token, token_create
from tests.conftest import client_for

URL = "/api/v1/scim-tokens/"
OKTA = {"provider": "okta", "sso_source": "oidc", "sso_issuer": "https://example.okta.com"}


def scim_status(plaintext: str) -> int:
    return Client().get("/scim/v2/Users", HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code


def test_a_platform_admin_creates_lists_and_revokes(world: Any) -> None:
    admin = client_for(world.admin)
    created = admin.post(URL, OKTA, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    plaintext = body["token"]
    assert plaintext.startswith("campscim_") and body["provider"] == "okta" and body["active"]
    assert scim_status(plaintext) == 200
    stored = ScimToken.objects.get(pk=body["id"])
    assert stored.key_hash == hash_token(plaintext) and plaintext not in stored.prefix
    provider = ScimProvider.objects.get(name="okta")
    assert (provider.sso_source, provider.sso_issuer) == ("oidc", "https://example.okta.com")

    # A second token for the same provider (rotation) needs no binding again.
    second = admin.post(URL, {"provider": "okta"}, format="json")
    assert second.status_code == 201
    listing = admin.get(URL).json()
    rows = listing["results"] if isinstance(listing, dict) else listing
    assert {r["id"] for r in rows} == {body["id"], second.json()["id"]}
    assert all("token" not in r for r in rows) and plaintext not in str(listing)

    assert admin.delete(f"{URL}{body['id']}/").status_code == 204
    assert scim_status(plaintext) == 401 and scim_status(second.json()["token"]) == 200
    assert admin.get(f"{URL}{body['id']}/").json()["active"] is False
    revoked = AuditEvent.objects.get(action="scim_token.revoked")
    assert revoked.actor_username == world.admin.username
    created_event = AuditEvent.objects.filter(action="scim_token.created").first()
    assert created_event is not None and plaintext not in str(created_event.after)


def test_rebinding_a_provider_is_refused(world: Any) -> None:
    admin = client_for(world.admin)
    assert admin.post(URL, OKTA, format="json").status_code == 201
    response = admin.post(URL, {**OKTA, "sso_source": "saml"}, format="json")
    assert response.status_code == 400 and "bound to" in str(response.json())
    assert admin.post(URL, {"provider": "entra"}, format="json").status_code == 400
    assert ScimToken.objects.count() == 1


def test_nobody_else_sees_or_creates_scim_tokens(world: Any) -> None:
    admin = client_for(world.admin)
    existing = admin.post(URL, OKTA, format="json").json()
    owner = world.a.owner
    for user in (owner, world.outsider):
        client = client_for(user)
        assert client.post(URL, OKTA, format="json").status_code == 403
        # A body that would not validate gets the same answer (no oracle before the check).
        assert client.post(URL, {"provider": ""}, format="json").status_code == 403
        listing = client.get(URL).json()
        assert (listing["results"] if isinstance(listing, dict) else listing) == []
        assert client.get(f"{URL}{existing['id']}/").status_code == 404
        assert client.delete(f"{URL}{existing['id']}/").status_code == 404
    # A platform admin's read-only API token reads but does not create or revoke.
    _, plaintext = token_create(actor=world.admin, name="ro", read_only=True)
    ro = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert ro.get(URL).status_code == 200
    assert ro.post(URL, OKTA, content_type="application/json").status_code == 403
    assert ro.delete(f"{URL}{existing['id']}/").status_code == 403
    assert scim_status(existing["token"]) == 200
    assert ScimToken.objects.count() == 1


def test_camp_cli_creates_lists_and_revokes(world: Any, live_server: Any, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    _, api_token = token_create(actor=world.admin, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": api_token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", "scim-token", *args], env=env,
                              cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)

    created = camp("create", "okta", "--sso-source", "oidc", "--sso-issuer",
                   "https://example.okta.com")
    assert created.returncode == 0, created.stderr
    plaintext = created.stdout.strip()
    assert plaintext.startswith("campscim_") and scim_status(plaintext) == 200
    listing = camp("ls")
    token = ScimToken.objects.get()
    assert token.prefix in listing.stdout and "live" in listing.stdout
    assert plaintext not in listing.stdout
    assert camp("revoke", str(token.pk)).returncode == 0
    assert scim_status(plaintext) == 401
    # A tenant owner's token is refused, with the API's reason.
    _, owner_token = token_create(actor=world.a.owner, name="cli")
    env["CAMP_TOKEN"] = owner_token
    refused = camp("create", "okta")
    assert refused.returncode == 1 and "403" in refused.stdout + refused.stderr
