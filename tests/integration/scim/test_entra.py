"""SCIM as Microsoft Entra ID provisions: request bodies in the shapes of Microsoft's
"Develop and plan provisioning for a SCIM endpoint" (user and group operations), with
Entra's habits: ``op`` capitalised, booleans as the strings "True"/"False", attributes
Camp does not keep (enterprise extension, title, addresses)."""

from __future__ import annotations

from typing import Any

from tenants.models import AuditEvent, Membership, User

from .conftest import ENTRA_ISSUER, PATCH_OP, Scim

ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
ENTRA_USER = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User", ENTERPRISE],
    "externalId": "0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef",
    "userName": "Test_User_ab6490ee-1e48-479e-a20b-2d77186b5dd1",
    "active": True,
    "emails": [{"primary": True, "type": "work",
                "value": "Test_User_fd0ea19b-0777-472c-9f96-4f70d2226f2e@testuser.com"}],
    "meta": {"resourceType": "User"},
    "name": {"formatted": "givenName familyName", "familyName": "familyName",
             "givenName": "givenName"},
    "roles": [],
    ENTERPRISE: {"department": "ML", "employeeNumber": "1701"},
}


def _create(entra: Scim, **changes: Any) -> dict[str, Any]:
    response = entra.call("POST", "/Users", {**ENTRA_USER, **changes})
    assert response.status_code == 201, response.content
    return response.json()


def test_entra_create_query_and_update(entra: Scim) -> None:
    absent = entra.call("GET", '/Users?filter=userName eq "Test_User_dfeef4c5-5681-4387-b016-bdf221e82081"')
    assert absent.status_code == 200 and absent.json()["Resources"] == []
    body = _create(entra)
    user = User.objects.get(username__iexact=ENTRA_USER["userName"])
    # Entra's SAML NameID user.objectid is the externalId mapped from objectId.
    assert (user.auth_source, user.sso_issuer, user.sso_subject) == (
        "saml", ENTRA_ISSUER, "0a21f0f2-8d2a-4f8e-bf98-7363c4aed4ef")

    updated = entra.call("PATCH", f"/Users/{body['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "Replace", "path": 'emails[type eq "work"].value', "value": "updatedEmail@microsoft.com"},
        {"op": "Replace", "path": "name.familyName", "value": "updatedFamilyName"},
        {"op": "Add", "path": "title", "value": "Researcher"},
        {"op": "Replace", "path": f"{ENTERPRISE}:department", "value": "Vision"},
    ]})
    assert updated.status_code == 200, updated.content
    user.refresh_from_db()
    assert (user.email, user.last_name) == ("updatedEmail@microsoft.com", "updatedFamilyName")


def test_entra_disables_with_a_string_boolean(entra: Scim) -> None:
    body = _create(entra)
    response = entra.call("PATCH", f"/Users/{body['id']}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "Replace", "path": "active", "value": "False"}]})
    assert response.status_code == 200 and response.json()["active"] is False
    user = User.objects.get(username__iexact=ENTRA_USER["userName"])
    assert not user.is_active
    assert AuditEvent.objects.filter(action="user.deactivated", actor_username="scim:entra",
                                     target_id=str(user.pk)).exists()


def test_entra_groups_and_members(entra: Scim, world: Any) -> None:
    body = _create(entra)
    group = entra.call("POST", "/Groups", {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group",
                    "http://schemas.microsoft.com/2006/11/ResourceManagement/ADSCIM/Group"],
        "externalId": "8aa1a0c0-c4c3-4bc0-b4a5-2ef676900159",
        "displayName": "camp-acme-ml", "meta": {"resourceType": "Group"}})
    assert group.status_code == 201
    gid = group.json()["id"]
    found = entra.call("GET", '/Groups?excludedAttributes=members&filter=displayName eq "camp-acme-ml"')
    assert [g["id"] for g in found.json()["Resources"]] == [gid]

    user = User.objects.get(username__iexact=ENTRA_USER["userName"])
    entra.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "Add", "path": "members", "value": [{"$ref": None, "value": body["id"]}]}]})
    assert Membership.objects.get(user=user, project=world.a.project).role == "project_member"
    entra.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "Remove", "path": "members", "value": [{"$ref": None, "value": body["id"]}]}]})
    assert not Membership.objects.filter(user=user).exists()

    renamed = entra.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "Replace", "path": "displayName", "value": "camp-acme-leads"}]})
    assert renamed.json()["displayName"] == "camp-acme-leads"
    assert entra.call("DELETE", f"/Users/{body['id']}").status_code == 204


def test_bad_input_is_a_400_naming_the_attribute(entra: Scim) -> None:
    body = _create(entra)
    cases = [
        ({"op": "Replace", "path": "active", "value": "maybe"}, "active"),
        ({"op": "Replace", "path": "favouriteColour", "value": "blue"}, "favouriteColour"),
        ({"op": "Replace", "path": 'emails[type eq "work"].value', "value": "not-mail"}, "emails"),
        ({"op": "Frobnicate", "path": "active", "value": True}, "op"),
    ]
    for operation, field in cases:
        response = entra.call("PATCH", f"/Users/{body['id']}",
                              {"schemas": [PATCH_OP], "Operations": [operation]})
        assert response.status_code == 400, (operation, response.content)
        assert field in response.json()["detail"]
    missing = entra.call("POST", "/Users", {**ENTRA_USER, "userName": "", "externalId": "x"})
    assert missing.status_code == 400 and "userName" in missing.json()["detail"]
    unknown = entra.call("POST", "/Groups", {"displayName": "g", "members": [{"value": "nobody"}]})
    assert unknown.status_code == 400 and "members" in unknown.json()["detail"]
    assert entra.call("GET", "/Users/not-a-uuid").status_code == 404


def test_entra_group_query_without_members(entra: Scim) -> None:
    body = _create(entra)
    entra.call("POST", "/Groups", {"displayName": "camp-acme-ml", "members": [{"value": body["id"]}]})
    found = entra.call("GET", '/Groups?excludedAttributes=members&filter=displayName eq "camp-acme-ml"')
    group = found.json()["Resources"][0]
    assert "members" not in group and group["displayName"] == "camp-acme-ml"
    only = entra.call("GET", f"/Users/{body['id']}?attributes=userName").json()
    assert set(only) == {"id", "schemas", "meta", "userName"}
