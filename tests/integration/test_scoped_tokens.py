"""A token narrowed to one project carries only that project's rights (issue 30, item 5).

The user behind the token may be a platform admin: the token is still not one. Platform-wide
presets, the demo switch and tokens of other scopes stay out of its reach.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient

from tenants import services
from tenants.models import ApiToken, AuditEvent
from tests.conftest import World, client_for
from workspaces.models import Profile

pytestmark = pytest.mark.django_db

PRESET = {"name": "everyone-small", "cpu_millicores": 1000, "ram_mib": 1024, "home_gib": 5}


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


def _admin_in_project(world: World) -> None:
    """The platform admin is also project admin of acme-p1, so a token narrowed there is valid."""
    from tenants.models import Role

    services.membership_create(actor=world.admin, user=world.admin, tenant=world.a.tenant,
                               project=world.a.project, role=Role.PROJECT_ADMIN)


def test_platform_admins_project_token_cannot_create_a_platform_preset(world: World) -> None:
    _admin_in_project(world)
    _, scoped = services.token_create(actor=world.admin, name="p1", project=world.a.project)
    response = bearer(scoped).post("/api/v1/profiles/", PRESET, format="json")
    assert response.status_code == 403, response.content
    assert not Profile.objects.filter(name=PRESET["name"]).exists()
    # a read-only unscoped token of the same admin cannot either
    _, read_only = services.token_create(actor=world.admin, name="ro", read_only=True)
    assert bearer(read_only).post("/api/v1/profiles/", PRESET, format="json").status_code == 403
    # the admin's full token (and session) still can
    _, full = services.token_create(actor=world.admin, name="full")
    assert bearer(full).post("/api/v1/profiles/", PRESET, format="json").status_code == 201


def test_platform_admins_project_token_cannot_use_the_preset_pages(world: World) -> None:
    from tenants.services import token_authenticate

    _admin_in_project(world)
    _, scoped = services.token_create(actor=world.admin, name="p1", project=world.a.project)
    token = token_authenticate(scoped)
    assert token is not None
    user = token.user
    user.camp_token = token
    from workspaces.services import profile_create

    with pytest.raises(PermissionDenied):
        profile_create(actor=user, name="via-service", cpu_millicores=1000, ram_mib=1024, home_gib=5)
    assert not Profile.objects.filter(name="via-service").exists()


def test_demo_switch_is_not_a_project_tokens_to_pull(world: World) -> None:
    from portal import demo
    from portal.models import DemoLoad
    from tenants.services import token_authenticate

    DemoLoad.objects.create(paused=False)
    _admin_in_project(world)
    _, scoped = services.token_create(actor=world.admin, name="p1", project=world.a.project)
    token = token_authenticate(scoped)
    assert token is not None
    user = token.user
    user.camp_token = token
    with pytest.raises(PermissionDenied):
        demo.set_paused(actor=user, paused=True)
    assert DemoLoad.objects.get().paused is False
    fresh = type(world.admin).objects.get(pk=world.admin.pk)
    assert demo.set_paused(actor=fresh, paused=True).paused is True


def _ids(client: APIClient) -> set[int]:
    return {t["id"] for t in client.get("/api/v1/tokens/").json()["results"]}


def test_project_token_lists_and_revokes_only_tokens_of_its_own_project(world: World) -> None:
    owner = world.a.owner
    scoped, scoped_plain = services.token_create(actor=owner, name="p1", project=world.a.project)
    sibling, _ = services.token_create(actor=owner, name="p1-ci", project=world.a.project,
                                       read_only=True)
    full, _ = services.token_create(actor=owner, name="full")
    other, _ = services.token_create(actor=owner, name="p2", project=world.a.other_project)
    client = bearer(scoped_plain)

    assert _ids(client) == {scoped.pk, sibling.pk}
    for token in (full, other):
        assert client.get(f"/api/v1/tokens/{token.pk}/").status_code == 404
        assert client.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
        token.refresh_from_db()
        assert token.revoked_at is None
    assert not AuditEvent.objects.filter(action="token.revoked").exists()
    # its own scope it may manage
    assert client.delete(f"/api/v1/tokens/{sibling.pk}/").status_code == 204
    sibling.refresh_from_db()
    assert sibling.revoked_at is not None
    # the owner's session still sees and revokes every token of theirs
    assert _ids(client_for(owner)) >= {scoped.pk, sibling.pk, full.pk, other.pk}


def test_platform_admins_project_token_sees_only_its_own_scoped_tokens(world: World) -> None:
    _admin_in_project(world)
    scoped, plain = services.token_create(actor=world.admin, name="p1", project=world.a.project)
    member_token, _ = services.token_create(actor=world.a.member, name="m")
    own_full, _ = services.token_create(actor=world.admin, name="full")
    client = bearer(plain)
    assert _ids(client) == {scoped.pk}
    assert client.delete(f"/api/v1/tokens/{member_token.pk}/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{own_full.pk}/").status_code == 404
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 0
