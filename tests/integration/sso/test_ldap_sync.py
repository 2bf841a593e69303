"""LDAP re-sync against the real slapd (issue 31, item 5): a person removed, locked or taken out
of a group in the directory loses access without signing in again; an outage changes nobody."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from tenants import services
from tenants.models import ApiToken, AuditEvent, Membership, User

from .conftest import Acme, configure, ldap_config
from .servers import Slapd, free_port

pytestmark = pytest.mark.django_db

DAVE_DN = "uid=dave,ou=people,dc=camp,dc=test"
DAVE = f"""dn: {DAVE_DN}
objectClass: inetOrgPerson
uid: dave
cn: Dave Temp
sn: Temp
mail: dave@example.test
userPassword: dave-ldap-pw
"""


def modify(slapd: Slapd, dn: str, change: str) -> None:
    slapd.ldif(f"dn: {dn}\nchangetype: modify\n{change}\n", modify=True)


def group_member(slapd: Slapd, group: str, dn: str, op: str) -> None:
    modify(slapd, f"cn={group},ou=groups,dc=camp,dc=test", f"{op}: member\nmember: {dn}")


@pytest.fixture
def dave(slapd: Slapd) -> Iterator[str]:
    """A directory entry of this test's own (the test may delete it)."""
    slapd.ldif(DAVE)
    group_member(slapd, "acme-ml", DAVE_DN, "add")
    try:
        yield DAVE_DN
    finally:
        try:
            slapd.ldif(f"dn: {DAVE_DN}\nchangetype: delete\n", modify=True)
        except RuntimeError:
            pass  # the test deleted it (memberOf-refint removed it from its groups)


def signed_in(username: str, password: str) -> Client:
    client = Client()
    response = client.post("/login/", {"username": username, "password": password})
    assert response.status_code == 302, response.content[:300]
    return client


def roles_of(user: User) -> set[str]:
    return {f"{m.role}:{m.project or m.tenant.name}" for m in Membership.objects.filter(user=user)}


def api_token(user: User, acme: Acme) -> str:
    _, plaintext = services.token_create(actor=user, name="laptop", project=acme.ml)
    return plaintext


def api_status(plaintext: str) -> int:
    return Client().get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code


def test_resync_revokes_a_role_whose_group_is_gone(settings: Any, slapd: Slapd,
                                                    acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    client = signed_in("bob", "bob-ldap-pw")
    bob = User.objects.get(username="bob")
    assert roles_of(bob) == {"tenant_owner:acme", "project_member:acme/ml"}
    group_member(slapd, "acme-owners", "uid=bob,ou=people,dc=camp,dc=test", "delete")
    try:
        call_command("ldap_sync")
    finally:
        group_member(slapd, "acme-owners", "uid=bob,ou=people,dc=camp,dc=test", "add")
    bob.refresh_from_db()
    assert roles_of(bob) == {"project_member:acme/ml"}  # without signing in again
    assert bob.is_active
    removed = AuditEvent.objects.get(action="membership.deleted", actor_username="sso:ldap")
    assert (removed.before or {}).get("role") == "tenant_owner"
    # Still a member of ml: the session goes on.
    assert client.get("/").status_code == 200


def test_removed_and_locked_accounts_are_deactivated_with_their_sessions_and_tokens(
        settings: Any, slapd: Slapd, acme: Acme, dave: str) -> None:
    configure(settings, ldap=ldap_config(slapd))
    dave_browser = signed_in("dave", "dave-ldap-pw")
    bob_browser = signed_in("bob", "bob-ldap-pw")
    alice_browser = signed_in("alice", "alice-ldap-pw")
    dave_user, bob = User.objects.get(username="dave"), User.objects.get(username="bob")
    dave_token, bob_token = api_token(dave_user, acme), api_token(bob, acme)
    alice_token = api_token(User.objects.get(username="alice"), acme)
    assert api_status(dave_token) == 200 and dave_browser.get("/").status_code == 200

    slapd.ldif(f"dn: {dave}\nchangetype: delete\n", modify=True)
    modify(slapd, "uid=bob,ou=people,dc=camp,dc=test",
           "replace: pwdAccountLockedTime\npwdAccountLockedTime: 000001010000Z")
    try:
        from tenants.tasks import ldap_sync

        report = ldap_sync()  # what the beat runs
    finally:
        modify(slapd, "uid=bob,ou=people,dc=camp,dc=test", "delete: pwdAccountLockedTime")
    assert sorted(map(tuple, report["deactivated"])) == [  # type: ignore[call-overload]
        ("bob", "locked in the directory"), ("dave", "removed from the directory")]
    assert report["error"] == "" and report["checked"] == 3

    for user in (dave_user, bob):
        user.refresh_from_db()
        assert not user.is_active
        assert roles_of(user) == set() and not user.sso_grants
    # Their open sessions and API tokens stop at once; alice's go on.
    assert dave_browser.get("/").status_code == 302
    assert bob_browser.get("/").status_code == 302
    assert api_status(dave_token) == 401 and api_status(bob_token) == 401
    assert alice_browser.get("/").status_code == 200 and api_status(alice_token) == 200
    assert not ApiToken.objects.filter(user__in=[dave_user, bob], revoked_at__isnull=True).exists()
    event = AuditEvent.objects.get(action="user.deactivated", target_id=str(dave_user.pk))
    assert event.actor_username == "sso:ldap" and event.actor_id is None
    after = event.after or {}
    assert after.get("reason") == "removed from the directory"
    assert after.get("api_tokens_revoked") == 1
    assert AuditEvent.objects.filter(action="token.revoked", actor_username="sso:ldap").count() == 2
    # A second run finds nothing more to do (inactive accounts are not read again).
    out = []
    call_command("ldap_sync", stdout=type("W", (), {"write": lambda self, s: out.append(s),
                                                    "flush": lambda self: None})())
    assert "1 directory accounts read, 0 deactivated" in "".join(out)


@pytest.mark.parametrize("what", ["server down", "service bind refused"])
def test_a_directory_outage_deactivates_nobody(settings: Any, slapd: Slapd, acme: Acme,
                                               what: str) -> None:
    configure(settings, ldap=ldap_config(slapd))
    client = signed_in("bob", "bob-ldap-pw")
    bob = User.objects.get(username="bob")
    token = api_token(bob, acme)
    if what == "server down":
        settings.AUTH_LDAP_SERVER_URI = f"ldap://127.0.0.1:{free_port()}"
    else:  # e.g. the service account's password rotated in the directory only
        settings.AUTH_LDAP_BIND_PASSWORD = "rotated-elsewhere"
    with pytest.raises(CommandError, match="the directory is unavailable"):
        call_command("ldap_sync")
    bob.refresh_from_db()
    assert bob.is_active and roles_of(bob) == {"tenant_owner:acme", "project_member:acme/ml"}
    assert client.get("/").status_code == 200 and api_status(token) == 200
    assert not AuditEvent.objects.filter(action__in=["user.deactivated",
                                                     "membership.deleted"]).exists()


def test_the_beat_runs_the_resync_every_few_minutes(settings: Any) -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["ldap-sync"]
    assert entry["task"] == "tenants.tasks.ldap_sync"
    assert 60 <= entry["schedule"] <= 900
