"""Who may call /scim/v2: a live SCIM token only, each provider its own resources."""

from __future__ import annotations

from typing import Any

from django.test import Client
from rest_framework.test import APIClient

from tenants import services as tenant_services
from tenants.models import AuditEvent
from tenants.scim.models import ScimToken
from tenants.scim.services import scim_token_revoke

from .conftest import Scim


def test_only_a_scim_token_opens_scim(okta: Scim, world: Any) -> None:
    _, api_token = tenant_services.token_create(actor=world.admin, name="admin automation")
    assert okta.call("GET", "/Users").status_code == 200
    # A platform admin's API token, a browser session, garbage, nothing: 401.
    assert okta.call("GET", "/Users", token=api_token).status_code == 401
    browser = Client()
    browser.force_login(world.admin)
    assert browser.get("/scim/v2/Users").status_code == 401
    assert Client().get("/scim/v2/Users").status_code == 401
    refused = okta.call("GET", "/Users", token="campscim_00000000_forged")
    assert refused.status_code == 401 and "WWW-Authenticate" in refused.headers
    # And the SCIM token does not open the REST API.
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {okta.token}").get(
        "/api/v1/projects/").status_code == 401


def test_a_revoked_token_stops_working(okta: Scim, world: Any) -> None:
    token = ScimToken.objects.get()
    scim_token_revoke(actor=world.admin, token=token)
    assert okta.call("GET", "/Users").status_code == 401
    assert AuditEvent.objects.filter(action="scim_token.revoked",
                                     actor_username=world.admin.username).exists()


def test_a_provider_sees_only_its_own_users(okta: Scim, entra: Scim) -> None:
    created = okta.call("POST", "/Users", {"userName": "ada@okta.local", "externalId": "00uada"})
    uid = created.json()["id"]
    assert entra.call("GET", f"/Users/{uid}").status_code == 404
    assert entra.call("GET", "/Users").json()["totalResults"] == 0
    assert entra.call("GET", '/Users?filter=userName eq "ada@okta.local"').json()[
        "totalResults"] == 0
    assert entra.call("DELETE", f"/Users/{uid}").status_code == 404
    assert entra.call("PATCH", f"/Users/{uid}", {"Operations": [
        {"op": "replace", "path": "active", "value": False}]}).status_code == 404
    assert okta.call("GET", f"/Users/{uid}").json()["active"] is True


def test_requests_are_throttled_per_token(okta: Scim, settings: Any) -> None:
    settings.SCIM_THROTTLE_RATE = "3/hour"
    codes = [okta.call("GET", "/ServiceProviderConfig").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


def test_discovery_documents(okta: Scim) -> None:
    config = okta.call("GET", "/ServiceProviderConfig").json()
    assert config["patch"]["supported"] is True and config["filter"]["supported"] is True
    assert config["authenticationSchemes"][0]["type"] == "oauthbearertoken"
    types = okta.call("GET", "/ResourceTypes").json()["Resources"]
    assert {t["endpoint"] for t in types} == {"/Users", "/Groups"}
    schemas = okta.call("GET", "/Schemas").json()["Resources"]
    assert "urn:ietf:params:scim:schemas:core:2.0:User" in {s["id"] for s in schemas}
