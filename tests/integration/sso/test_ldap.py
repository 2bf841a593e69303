"""LDAP sign-in against a real slapd: account creation, role mapping, re-sync, clashes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenants.models import AuditEvent, Membership, User

from .conftest import Acme, configure, ldap_config
from .servers import Slapd

pytestmark = pytest.mark.django_db


def ldap_login(username: str, password: str) -> tuple[Client, Any]:
    client = Client()
    response = client.post("/login/", {"username": username, "password": password})
    return client, response


def roles_of(user: User) -> set[str]:
    return {f"{m.role}:{m.project or m.tenant.name}" for m in Membership.objects.filter(user=user)}


def test_first_ldap_login_creates_the_account_with_mapped_roles(
        settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    client, response = ldap_login("alice", "alice-ldap-pw")
    assert response.status_code == 302
    alice = User.objects.get(username="alice")
    assert alice.auth_source == "ldap"
    assert (alice.email, alice.first_name, alice.last_name) == ("alice@example.test", "Alice", "Liddell")
    assert not alice.has_usable_password()
    assert alice.is_platform_admin  # camp-admins
    assert roles_of(alice) == {"project_member:acme/ml"}  # acme-ml
    assert sorted(alice.sso_grants) == ["platform_admin", "project_member:acme/ml"]
    # The console now shows the admin pages to her.
    home = client.get("/", follow=True)
    assert home.status_code == 200 and b"Audit log" in home.content
    created = AuditEvent.objects.get(action="membership.created", target_id__in=[
        str(m.pk) for m in Membership.objects.filter(user=alice)])
    assert created.actor_username == "sso:ldap" and created.after["via"] == "ldap"
    assert AuditEvent.objects.filter(action="user.created", actor_username="sso:ldap",
                                     target_id=str(alice.pk)).exists()


def test_relogin_resyncs_a_changed_group(settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    _, response = ldap_login("bob", "bob-ldap-pw")
    assert response.status_code == 302
    bob = User.objects.get(username="bob")
    assert roles_of(bob) == {"tenant_owner:acme", "project_member:acme/ml"}
    # A role given by hand survives the re-sync; only SSO-granted ones are managed.
    Membership.objects.create(user=bob, tenant=acme.tenant, project=acme.vision,
                              role="project_admin")

    slapd.ldif("dn: cn=acme-owners,ou=groups,dc=camp,dc=test\nchangetype: modify\n"
               "delete: member\nmember: uid=bob,ou=people,dc=camp,dc=test\n", modify=True)
    slapd.ldif("dn: cn=acme-ml-leads,ou=groups,dc=camp,dc=test\nchangetype: modify\n"
               "add: member\nmember: uid=bob,ou=people,dc=camp,dc=test\n", modify=True)
    try:
        _, response = ldap_login("bob", "bob-ldap-pw")
        assert response.status_code == 302
        assert roles_of(bob) == {"project_admin:acme/ml", "project_admin:acme/vision"}
        removed = AuditEvent.objects.get(action="membership.deleted", actor_username="sso:ldap")
        assert removed.before["role"] == "tenant_owner" and removed.tenant_id == acme.tenant.pk
        promoted = AuditEvent.objects.get(action="membership.updated", actor_username="sso:ldap")
        assert (promoted.before["role"], promoted.after["role"]) == ("project_member", "project_admin")
    finally:
        slapd.ldif("dn: cn=acme-owners,ou=groups,dc=camp,dc=test\nchangetype: modify\n"
                   "add: member\nmember: uid=bob,ou=people,dc=camp,dc=test\n", modify=True)
        slapd.ldif("dn: cn=acme-ml-leads,ou=groups,dc=camp,dc=test\nchangetype: modify\n"
                   "delete: member\nmember: uid=bob,ou=people,dc=camp,dc=test\n", modify=True)


def test_member_of_attribute_maps_roles_too(settings: Any, slapd: Slapd, acme: Acme) -> None:
    # Active Directory style: groups come from the user's memberOf, matched by cn or DN.
    slapd.ldif("dn: cn=acme-vision,ou=groups,dc=camp,dc=test\nobjectClass: groupOfNames\n"
               "cn: acme-vision\nmember: uid=alice,ou=people,dc=camp,dc=test\n")
    try:
        configure(settings, ldap=ldap_config(slapd, group_type="memberOf"))
        _, response = ldap_login("alice", "alice-ldap-pw")
        assert response.status_code == 302
        alice = User.objects.get(username="alice")
        assert alice.is_platform_admin
        assert roles_of(alice) == {"project_member:acme/ml", "project_member:acme/vision"}
    finally:
        slapd.ldif("dn: cn=acme-vision,ou=groups,dc=camp,dc=test\nchangetype: delete\n",
                   modify=True)


def test_wrong_ldap_password_is_refused_and_audited(settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    client, response = ldap_login("alice", "not-her-password")
    assert response.status_code == 200
    assert b"Please enter a correct username and password" in response.content
    assert not User.objects.filter(username="alice").exists()
    assert AuditEvent.objects.filter(action="auth.login_failed", actor_username="alice").exists()
    assert "_auth_user_id" not in client.session


def test_username_clash_with_a_local_account_is_refused(settings: Any, slapd: Slapd, acme: Acme) -> None:
    local = User.objects.create(username="carol", email="carol@example.test")
    local.set_password("carol-local-pw")
    local.save()
    configure(settings, ldap=ldap_config(slapd))
    client, response = ldap_login("carol", "carol-ldap-pw")
    assert response.status_code == 200
    assert "already exists in Camp but does not come from the directory" in response.content.decode()
    assert "_auth_user_id" not in client.session
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.actor_username == "carol" and refused.after["source"] == "ldap"
    local.refresh_from_db()
    assert local.auth_source == "local" and local.first_name == "" and not roles_of(local)
    # The local account itself still signs in with its own password.
    _, response = ldap_login("carol", "carol-local-pw")
    assert response.status_code == 302


def test_local_password_cannot_open_an_ldap_account(settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    ldap_login("alice", "alice-ldap-pw")
    alice = User.objects.get(username="alice")
    alice.set_password("a-local-password")  # e.g. set by mistake in an admin tool
    alice.save()
    _, response = ldap_login("alice", "a-local-password")
    assert response.status_code == 200
