"""SCIM as Okta provisions: request bodies in the shapes of Okta's SCIM 2.0 guide
("SCIM 2.0 protocol reference": create, filter, deactivate, push groups)."""

from __future__ import annotations

from typing import Any

from rest_framework.test import APIClient

from tenants import services as tenant_services
from tenants.models import ApiToken, AuditEvent, Membership, User

from .conftest import OKTA_ISSUER, PATCH_OP, Scim

OKTA_USER = {
    "schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"],
    "userName": "test.user@okta.local",
    "name": {"givenName": "Test", "familyName": "User"},
    "emails": [{"primary": True, "value": "test.user@okta.local", "type": "work"}],
    "displayName": "Test User",
    "locale": "en-US",
    "externalId": "00ujl29u0le5T6Aj10h7",
    "groups": [],
    "password": "1mz050nq",
    "active": True,
}


def _create(okta: Scim, **changes: Any) -> dict[str, Any]:
    response = okta.call("POST", "/Users", {**OKTA_USER, **changes})
    assert response.status_code == 201, response.content
    return response.json()


def test_okta_create_then_find_by_username_and_external_id(okta: Scim) -> None:
    # Okta first asks whether the user exists, then creates it.
    found = okta.call("GET", '/Users?filter=userName eq "test.user@okta.local"&startIndex=1&count=100')
    assert found.status_code == 200 and found.json()["totalResults"] == 0
    body = _create(okta)
    assert body["userName"] == "test.user@okta.local" and body["active"] is True
    assert body["externalId"] == "00ujl29u0le5T6Aj10h7"
    assert body["emails"][0]["value"] == "test.user@okta.local"
    assert body["meta"]["location"].endswith(f"/scim/v2/Users/{body['id']}")

    # The account signs in through Okta's OIDC: issuer + the Okta user id as subject.
    user = User.objects.get(username="test.user@okta.local")
    assert (user.auth_source, user.sso_issuer, user.sso_subject) == (
        "oidc", OKTA_ISSUER, "00ujl29u0le5T6Aj10h7")
    assert not user.has_usable_password()  # the password Okta sent is never kept

    for query in ('userName eq "TEST.USER@okta.local"', 'externalId eq "00ujl29u0le5T6Aj10h7"'):
        listed = okta.call("GET", f"/Users?filter={query}").json()
        assert listed["totalResults"] == 1 and listed["Resources"][0]["id"] == body["id"]
    got = okta.call("GET", f"/Users/{body['id']}")
    assert got.status_code == 200 and got.json()["name"]["givenName"] == "Test"
    assert AuditEvent.objects.filter(action="user.created", actor_username="scim:okta",
                                     target_id=str(user.pk)).exists()


def test_a_second_create_of_the_same_person_is_a_conflict(okta: Scim) -> None:
    _create(okta)
    again = okta.call("POST", "/Users", OKTA_USER)
    assert again.status_code == 409 and again.json()["scimType"] == "uniqueness"


def test_a_local_account_with_the_same_name_is_never_merged(okta: Scim, world: Any) -> None:
    response = okta.call("POST", "/Users", {**OKTA_USER, "userName": world.a.owner.username})
    assert response.status_code == 409
    assert "another Camp account" in response.json()["detail"]
    world.a.owner.refresh_from_db()
    assert world.a.owner.auth_source == "local" and world.a.owner.has_usable_password()


def test_an_account_that_already_signs_in_with_that_identity_is_adopted(okta: Scim) -> None:
    existing = User.objects.create(username="test.user@okta.local", auth_source="oidc",
                                   sso_issuer=OKTA_ISSUER, sso_subject="00ujl29u0le5T6Aj10h7")
    body = _create(okta)
    assert User.objects.filter(username="test.user@okta.local").count() == 1
    assert existing.scim_link.scim_id.hex == body["id"].replace("-", "")


def test_pagination(okta: Scim) -> None:
    for i in range(5):
        _create(okta, userName=f"u{i}@okta.local", externalId=f"00u{i}")
    page = okta.call("GET", "/Users?startIndex=2&count=2").json()
    assert page["totalResults"] == 5 and page["itemsPerPage"] == 2 and page["startIndex"] == 2
    whole = okta.call("GET", "/Users?count=10").json()["Resources"]
    assert [r["id"] for r in page["Resources"]] == [r["id"] for r in whole[1:3]]


def test_okta_deactivation_ends_sessions_and_tokens_at_once(okta: Scim, world: Any) -> None:
    body = _create(okta)
    user = User.objects.get(pk=User.objects.get(username="test.user@okta.local").pk)
    tenant_services.membership_create(actor=world.a.owner, user=user, tenant=world.a.tenant,
                                      project=world.a.project, role="project_member")
    _, plaintext = tenant_services.token_create(actor=user, name="ci")
    browser = APIClient()
    browser.force_login(user)
    bearer = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert browser.get("/api/v1/projects/").status_code == 200
    assert bearer.get("/api/v1/projects/").status_code == 200

    response = okta.call("PATCH", f"/Users/{body['id']}", {
        "schemas": [PATCH_OP], "Operations": [{"op": "replace", "value": {"active": False}}]})
    assert response.status_code == 200 and response.json()["active"] is False

    # The very next request of the open session and of the API token is refused.
    assert browser.get("/api/v1/projects/").status_code in (401, 403)
    assert bearer.get("/api/v1/projects/").status_code == 401
    assert ApiToken.objects.get(user=user).revoked_at is not None
    event = AuditEvent.objects.get(action="user.deactivated", target_id=str(user.pk))
    assert event.actor_username == "scim:okta"
    assert event.after["sessions_ended"] is True and event.after["api_tokens_revoked"] == 1
    assert AuditEvent.objects.filter(action="token.revoked", actor_username="scim:okta").exists()

    # Reactivation lets the person sign in again; the revoked token stays revoked.
    okta.call("PATCH", f"/Users/{body['id']}", {
        "schemas": [PATCH_OP], "Operations": [{"op": "replace", "value": {"active": True}}]})
    user.refresh_from_db()
    assert user.is_active
    assert bearer.get("/api/v1/projects/").status_code == 401


def test_okta_put_replaces_the_profile(okta: Scim) -> None:
    body = _create(okta)
    replaced = okta.call("PUT", f"/Users/{body['id']}", {
        **OKTA_USER, "id": body["id"], "name": {"givenName": "Tess", "familyName": "Userova"},
        "emails": [{"primary": True, "value": "tess@okta.local", "type": "work"}]})
    assert replaced.status_code == 200
    user = User.objects.get(username="test.user@okta.local")
    assert (user.first_name, user.last_name, user.email) == ("Tess", "Userova", "tess@okta.local")


def test_okta_group_push_grants_and_revokes_roles(okta: Scim, world: Any) -> None:
    ada = _create(okta)
    bob = _create(okta, userName="bob@okta.local", externalId="00ubob")
    group = okta.call("POST", "/Groups", {
        "schemas": ["urn:ietf:params:scim:schemas:core:2.0:Group"],
        "displayName": "camp-acme-ml", "members": []})
    assert group.status_code == 201
    gid = group.json()["id"]
    added = okta.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "add", "path": "members", "value": [
            {"value": ada["id"], "display": "test.user@okta.local"},
            {"value": bob["id"], "display": "bob@okta.local"}]}]})
    assert added.status_code == 200 and len(added.json()["members"]) == 2

    ada_user = User.objects.get(username="test.user@okta.local")
    assert Membership.objects.get(user=ada_user, project=world.a.project).role == "project_member"
    listed = okta.call("GET", f"/Users/{ada['id']}").json()
    assert [g["display"] for g in listed["groups"]] == ["camp-acme-ml"]

    # Okta removes one member with a filter path.
    okta.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "remove", "path": f'members[value eq "{ada["id"]}"]'}]})
    assert not Membership.objects.filter(user=ada_user).exists()

    # Okta renames with a path-less replace (the id repeated): the new name maps to a
    # higher role, which bob now gets.
    renamed = okta.call("PATCH", f"/Groups/{gid}", {"schemas": [PATCH_OP], "Operations": [
        {"op": "replace", "value": {"id": gid, "displayName": "camp-acme-leads"}}]})
    assert renamed.status_code == 200 and renamed.json()["displayName"] == "camp-acme-leads"
    bob_user = User.objects.get(username="bob@okta.local")
    assert Membership.objects.get(user=bob_user, project=world.a.project).role == "project_admin"

    assert okta.call("DELETE", f"/Groups/{gid}").status_code == 204
    assert not Membership.objects.filter(user=bob_user).exists()
    assert AuditEvent.objects.filter(action="membership.deleted", actor_username="sso:scim",
                                     target_id__isnull=False).count() == 2


def test_a_role_given_by_hand_survives_the_group_sync(okta: Scim, world: Any) -> None:
    ada = _create(okta)
    user = User.objects.get(username="test.user@okta.local")
    tenant_services.membership_create(actor=world.b.owner, user=user, tenant=world.b.tenant,
                                      project=world.b.project, role="project_member")
    gid = okta.call("POST", "/Groups", {"displayName": "camp-acme-ml",
                                        "members": [{"value": ada["id"]}]}).json()["id"]
    okta.call("DELETE", f"/Groups/{gid}")
    assert list(Membership.objects.filter(user=user).values_list("project", flat=True)) == [
        world.b.project.pk]


def test_delete_deprovisions(okta: Scim, world: Any) -> None:
    body = _create(okta)
    user = User.objects.get(username="test.user@okta.local")
    _, plaintext = tenant_services.token_create(actor=user, name="ci")
    assert okta.call("DELETE", f"/Users/{body['id']}").status_code == 204
    assert okta.call("GET", f"/Users/{body['id']}").status_code == 404
    user.refresh_from_db()
    assert user.is_active is False
    assert APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}").get(
        "/api/v1/projects/").status_code == 401
    assert AuditEvent.objects.filter(action="user.deprovisioned", actor_username="scim:okta",
                                     target_id=str(user.pk)).exists()
    # Provisioning the same person again brings back the same account.
    again = _create(okta)
    assert again["id"] != body["id"]
    user.refresh_from_db()
    assert user.is_active and User.objects.filter(sso_subject="00ujl29u0le5T6Aj10h7").count() == 1
