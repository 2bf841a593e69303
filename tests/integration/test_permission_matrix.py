"""Every API endpoint × role × own/foreign tenant (DESIGN.md §5).

Roles: platform admin, tenant owner, project admin, project member (all of
tenant "acme"), an outsider with no membership, and anonymous. "own" targets an
object of acme, "foreign" the same kind of object of tenant "globex".
A user never reads or writes across tenants: foreign objects answer 404 (or
400 for a reference to them in a body), never 200/201/204.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import World, client_for

ROLES = ["platform_admin", "owner", "project_admin", "member", "outsider", "anonymous"]
OPS = ["list", "retrieve", "create", "update", "delete"]
RESOURCES = ["tenants", "projects", "memberships", "quotas", "users", "tokens", "audit-events"]

V = "visible"  # list: the target appears
H = "hidden"   # list: the target does not appear

# EXPECT[resource][op][role] for an object of the user's own tenant (acme).
EXPECT: dict[str, dict[str, dict[str, Any]]] = {
    "tenants": {
        "list": dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404),
        "create": dict(platform_admin=201, owner=403, project_admin=403, member=403, outsider=403),
        "update": dict(platform_admin=200, owner=403, project_admin=403, member=403, outsider=404),
        "delete": dict(platform_admin=204, owner=403, project_admin=403, member=403, outsider=404),
    },
    "projects": {
        "list": dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404),
        "create": dict(platform_admin=201, owner=201, project_admin=403, member=403, outsider=400),
        "update": dict(platform_admin=200, owner=200, project_admin=200, member=403, outsider=404),
        "delete": dict(platform_admin=204, owner=204, project_admin=403, member=403, outsider=404),
    },
    "memberships": {
        "list": dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404),
        "create": dict(platform_admin=201, owner=201, project_admin=201, member=403, outsider=400),
        "update": dict(platform_admin=200, owner=200, project_admin=200, member=403, outsider=404),
        "delete": dict(platform_admin=204, owner=204, project_admin=204, member=403, outsider=404),
    },
    "quotas": {
        "list": dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404),
        # the new quota is for acme's second project, which only owners and admins see
        "create": dict(platform_admin=201, owner=201, project_admin=400, member=400, outsider=400),
        "update": dict(platform_admin=200, owner=200, project_admin=403, member=403, outsider=404),
        "delete": dict(platform_admin=204, owner=204, project_admin=403, member=403, outsider=404),
    },
    "users": {
        "list": dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404),
        "create": dict(platform_admin=201, owner=403, project_admin=403, member=403, outsider=403),
        "update": dict(platform_admin=200, owner=403, project_admin=403, member=403, outsider=404),
        "delete": dict(platform_admin=405, owner=405, project_admin=405, member=405, outsider=405),
    },
    "tokens": {  # the target token belongs to acme's member
        "list": dict(platform_admin=V, owner=H, project_admin=H, member=V, outsider=H),
        "retrieve": dict(platform_admin=200, owner=404, project_admin=404, member=200, outsider=404),
        "create": dict(platform_admin=201, owner=201, project_admin=201, member=201, outsider=201),
        "update": dict(platform_admin=405, owner=405, project_admin=405, member=405, outsider=405),
        "delete": dict(platform_admin=204, owner=404, project_admin=404, member=204, outsider=404),
    },
    "audit-events": {
        "list": dict(platform_admin=V, owner=V, project_admin=H, member=H, outsider=H),
        "retrieve": dict(platform_admin=200, owner=200, project_admin=404, member=404, outsider=404),
        "create": dict(platform_admin=405, owner=405, project_admin=405, member=405, outsider=405),
        "update": dict(platform_admin=405, owner=405, project_admin=405, member=405, outsider=405),
        "delete": dict(platform_admin=405, owner=405, project_admin=405, member=405, outsider=405),
    },
}


def expected(resource: str, op: str, role: str, side: str) -> Any:
    if role == "anonymous":
        return H if op == "list" else 401
    own = EXPECT[resource][op][role]
    if side == "own" or role in ("platform_admin", "outsider"):
        return own
    # A foreign tenant's object, for a role held only in acme.
    if op == "list":
        return H
    if op == "create":
        if resource in ("tenants", "users"):
            return own  # not tenant-scoped: same answer as for acme
        if resource == "tokens":
            return 201  # a token of one's own; the body names no foreign object
        if resource == "audit-events":
            return 405
        return 400  # the body references a globex object the user cannot see
    if own == 405:
        return 405
    return 404


def _setup(world: World) -> dict[str, Any]:
    from tenants import services
    from tenants.models import AuditEvent, Membership

    targets: dict[str, dict[str, Any]] = {}
    for side, tw in (("own", world.a), ("foreign", world.b)):
        services.quota_set(actor=world.admin, scope="tenant", tenant=tw.tenant, values={
            "gpus_guaranteed": Decimal(8), "gpus_limit": Decimal(16)})
        quota = services.quota_set(actor=tw.owner, scope="project", project=tw.project,
                                   values={"gpus_guaranteed": Decimal(2)})
        token, _ = services.token_create(actor=tw.member, name=f"{side}-token")
        targets[side] = {
            "tenants": tw.tenant,
            "projects": tw.project,
            "memberships": Membership.objects.get(user=tw.member, project=tw.project),
            "quotas": quota,
            "users": tw.member,
            "tokens": token,
            "audit-events": AuditEvent.objects.filter(tenant=tw.tenant).first(),
            "tw": tw,
        }
    return targets


def _create_body(resource: str, tw: Any, world: World) -> dict[str, Any]:
    return {
        "tenants": {"name": "initech"},
        "projects": {"tenant": tw.tenant.pk, "name": "new-project"},
        "memberships": {"user": world.outsider.username, "tenant": tw.tenant.pk,
                        "project": tw.project.pk, "role": "project_member"},
        "quotas": {"scope": "project", "project": tw.other_project.pk, "gpus_guaranteed": "1",
                   "gpu_memory_mib_guaranteed": 0, "cpu_cores_guaranteed": "0",
                   "ram_mib_guaranteed": 0},
        "users": {"username": "newcomer", "password": "a-long-enough-passphrase"},
        "tokens": {"name": "ci"},
        "audit-events": {"action": "forged"},
    }[resource]


UPDATE_BODY = {
    "tenants": {"display_name": "Renamed"},
    "projects": {"display_name": "Renamed"},
    "memberships": {"role": "project_admin"},
    "quotas": {"gpus_guaranteed": "3"},
    "users": {"first_name": "Renamed"},
    "tokens": {"name": "renamed"},
    "audit-events": {"action": "rewritten"},
}


@pytest.mark.django_db
@pytest.mark.parametrize("side", ["own", "foreign"])
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("resource", RESOURCES)
def test_permission_matrix(world: World, resource: str, op: str, role: str, side: str) -> None:
    targets = _setup(world)
    target = targets[side][resource]
    user = None if role == "anonymous" else world.user(role, "a")
    client = client_for(user)
    want = expected(resource, op, role, side)
    base = f"/api/v1/{resource}/"
    if op == "list":
        response = client.get(base, {"page_size": 500})
        if role == "anonymous":
            assert response.status_code == 401
            return
        assert response.status_code == 200, response.content
        ids = {row["id"] for row in response.json()["results"]}
        assert (target.pk in ids) == (want == V), f"{role} listing {resource}: {ids}"
        return
    detail = f"{base}{target.pk}/"
    if op == "retrieve":
        response = client.get(detail)
    elif op == "create":
        response = client.post(base, _create_body(resource, targets[side]["tw"], world), format="json")
    elif op == "update":
        response = client.patch(detail, UPDATE_BODY[resource], format="json")
    else:
        response = client.delete(detail)
    assert response.status_code == want, (
        f"{role} {op} {side} {resource}: got {response.status_code} {response.content[:300]!r}"
    )
    if response.status_code >= 400 and op in ("update", "delete"):
        # Nothing changed: the object is still there, as it was.
        model = type(target)
        fresh = model.objects.get(pk=target.pk)
        if resource == "tokens":
            assert fresh.revoked_at is None
        elif resource != "audit-events":
            for field, value in UPDATE_BODY[resource].items():
                assert str(getattr(fresh, field)) != str(value)
