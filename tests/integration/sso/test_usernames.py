"""One person, one account: look-alike usernames (issue 31, item 1).

Usernames are normalised (NFKC + case folding) at every entrance; directory accounts
are keyed by the entry's DN, OIDC by issuer + subject, SAML by IdP + NameID; a new name
mixing scripts is refused; a platform admin can deactivate a look-alike made before.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tenants import services
from tenants.models import AuditEvent, User
from tenants.sso.oidc import CampOIDCBackend

from .conftest import Acme, configure, ldap_config
from .servers import Slapd
from .test_login_security import DUMMY_OIDC

pytestmark = pytest.mark.django_db

ALICE_DN = "uid=alice,ou=people,dc=camp,dc=test"


def login(username: str, password: str) -> int:
    return Client().post("/login/", {"username": username, "password": password}).status_code


def admin_api(acme: Acme) -> APIClient:
    _, plaintext = services.token_create(actor=acme.admin, name="admin")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def test_every_spelling_of_a_directory_name_is_one_account(
        settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    for spelling in ("ａｌｉｃｅ", "ALICE", "Alice", "alice", "ａlice"):
        assert login(spelling, "alice-ldap-pw") == 302, spelling
    accounts = User.objects.filter(auth_source="ldap")
    assert [(u.username, u.sso_issuer, u.sso_subject) for u in accounts] == [
        ("alice", "ldap", ALICE_DN)]
    # Deactivating that one account stops the person, whatever they type.
    services.user_update(actor=acme.admin, user=accounts[0], is_active=False)
    for spelling in ("ａｌｉｃｅ", "ALICE", "alice"):
        assert login(spelling, "alice-ldap-pw") == 200, spelling
    assert User.objects.filter(auth_source="ldap").count() == 1


def test_an_ldap_account_from_before_is_adopted_by_its_entry(
        settings: Any, slapd: Slapd, acme: Acme) -> None:
    old = User.objects.create(username="bob", auth_source="ldap")
    configure(settings, ldap=ldap_config(slapd))
    assert login("BOB", "bob-ldap-pw") == 302
    old.refresh_from_db()
    assert old.sso_subject == "uid=bob,ou=people,dc=camp,dc=test"
    assert User.objects.filter(auth_source="ldap").count() == 1


def test_a_look_alike_made_before_can_be_deactivated_from_api_and_console(acme: Acme) -> None:
    User.objects.create(username="lee", auth_source="ldap")
    fullwidth = User.objects.create(username="ｌｅｅ", auth_source="ldap")
    script = User.objects.create(username="ℓee", auth_source="ldap")

    response = admin_api(acme).patch(f"/api/v1/users/{fullwidth.pk}/", {"is_active": False},
                                     format="json")
    assert response.status_code == 200, response.content
    fullwidth.refresh_from_db()
    assert not fullwidth.is_active and fullwidth.username == "ｌｅｅ"

    console = Client()
    console.force_login(acme.admin)
    page = console.post(f"/admin/users/{script.pk}/toggle/", {"field": "is_active"}, follow=True)
    assert page.status_code == 200
    script.refresh_from_db()
    assert not script.is_active
    assert "already exists" not in page.content.decode()
    assert AuditEvent.objects.filter(action="user.updated", target_id=str(script.pk),
                                     after__is_active=False).exists()


def test_api_user_create_normalises_and_refuses_look_alikes(acme: Acme) -> None:
    api = admin_api(acme)
    created = api.post("/api/v1/users/", {"username": "Victim"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["username"] == "victim"
    for name in ("ＶＩＣＴＩＭ", "VICTIM"):  # the same name in other clothes
        response = api.post("/api/v1/users/", {"username": name}, format="json")
        assert response.status_code == 400 and "username" in response.json(), name
    mixed = api.post("/api/v1/users/", {"username": "vіctim2"}, format="json")  # Cyrillic і
    assert mixed.status_code == 400
    assert "several scripts" in str(mixed.json()["username"])
    # One script, non-Latin, is a name like any other.
    assert api.post("/api/v1/users/", {"username": "дмитрий"}, format="json").status_code == 201
    assert User.objects.filter(username__in=["victim", "дмитрий"]).count() == 2


def test_local_login_is_by_the_normalised_name(settings: Any, acme: Acme) -> None:
    configure(settings)
    victim = services.user_create(actor=acme.admin, username="Victim", password="Victim-pw-123456")
    assert victim.username == "victim"
    assert login("ＶＩＣＴＩＭ", "Victim-pw-123456") == 302
    assert login("victim", "Victim-pw-123456") == 302


def _oidc_login(claims: dict[str, Any]) -> tuple[Any, Any]:
    return CampOIDCBackend()._find_or_create(DUMMY_OIDC["OIDC_ISSUER"], claims["sub"], claims)


def test_oidc_look_alike_names_do_not_become_new_accounts(settings: Any, acme: Acme) -> None:
    configure(settings, oidc=DUMMY_OIDC)
    User.objects.create(username="victim", is_platform_admin=True)
    user, refusal = _oidc_login({"sub": "s-1", "preferred_username": "ｖｉｃｔｉｍ"})
    assert user is None and refusal[0] == "victim" and "clash" in refusal[1]
    user, refusal = _oidc_login({"sub": "s-2", "preferred_username": "vіctim"})  # Cyrillic і
    assert user is None and refusal[1] == "confusable username"
    user, refusal = _oidc_login({"sub": "s-3", "preferred_username": "Ｍａｌｌｏｒｙ"})
    assert refusal is None and user.username == "mallory"
    # The same subject is the same account, whatever name it shows next time.
    again, _ = _oidc_login({"sub": "s-3", "preferred_username": "someone-else"})
    assert again.pk == user.pk
    assert User.objects.filter(auth_source="oidc").count() == 1
