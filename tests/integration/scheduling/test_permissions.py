"""Scheduling endpoints × role × own/foreign tenant (DESIGN.md §5).

Roles: platform admin, tenant owner, project admin, project member (all of tenant
"acme"), an outsider with no membership, and anonymous. Clusters and nodes belong to
the platform (no tenant), so only "own" applies to them: every tenant member reads
them, only platform admins change them. Jobs: "own" is a job of acme's first project
submitted by its project admin, "foreign" the same in globex. Objects outside a user's
reach answer 404; a reference to one in a body answers 400.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from tests.conftest import World, client_for

from .conftest import SMALL_INVENTORY, gpu_group

ROLES = ["platform_admin", "owner", "project_admin", "member", "outsider", "anonymous"]
V, H = "visible", "hidden"
MEMBERS = dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H, anonymous=H)

# EXPECT[(resource, op)][role] for the "own" side.
EXPECT: dict[tuple[str, str], dict[str, Any]] = {
    ("clusters", "list"): MEMBERS,
    ("clusters", "retrieve"): dict(platform_admin=200, owner=200, project_admin=200, member=200,
                                   outsider=404),
    ("clusters", "create"): dict(platform_admin=201, owner=403, project_admin=403, member=403,
                                 outsider=403),
    ("clusters", "update"): dict(platform_admin=200, owner=403, project_admin=403, member=403,
                                 outsider=404),
    ("clusters", "delete"): dict(platform_admin=204, owner=403, project_admin=403, member=403,
                                 outsider=404),
    ("nodes", "list"): MEMBERS,
    ("nodes", "retrieve"): dict(platform_admin=200, owner=200, project_admin=200, member=200,
                                outsider=404),
    ("nodes", "quarantine"): dict(platform_admin=200, owner=403, project_admin=403, member=403,
                                  outsider=404),
    # Pools: "own" is dedicated to acme, "foreign" to globex (only its tenants see it).
    ("pools", "list"): MEMBERS,
    ("pools", "retrieve"): dict(platform_admin=200, owner=200, project_admin=200, member=200,
                                outsider=404),
    ("pools", "create"): dict(platform_admin=201, owner=403, project_admin=403, member=403,
                              outsider=403),
    ("pools", "update"): dict(platform_admin=200, owner=403, project_admin=403, member=403,
                              outsider=404),
    ("pools", "delete"): dict(platform_admin=204, owner=403, project_admin=403, member=403,
                              outsider=404),
    ("jobs", "list"): MEMBERS,
    ("jobs", "retrieve"): dict(platform_admin=200, owner=200, project_admin=200, member=200,
                               outsider=404),
    ("jobs", "create"): dict(platform_admin=201, owner=201, project_admin=201, member=201,
                             outsider=400),
    # the job belongs to the project admin: a plain member may not cancel it
    ("jobs", "cancel"): dict(platform_admin=200, owner=200, project_admin=200, member=403,
                             outsider=404),
    ("jobs", "decisions"): dict(platform_admin=200, owner=200, project_admin=200, member=200,
                                outsider=404),
}
TENANTLESS = {"clusters", "nodes"}
CASES = [(r, op, role, side) for (r, op) in EXPECT for role in ROLES
         for side in (["own"] if r in TENANTLESS or (r, op) == ("pools", "create")
                      else ["own", "foreign"])]


def expected(resource: str, op: str, role: str, side: str) -> Any:
    if role == "anonymous":
        return H if op == "list" else 401
    own = EXPECT[(resource, op)][role]
    if side == "own" or role == "platform_admin":
        return own
    if op == "list":
        return H
    if op == "create":
        return 400  # the body names a foreign project
    return 404


def _setup(world: World) -> dict[str, Any]:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    jobs = {}
    for side, tw in (("own", world.a), ("foreign", world.b)):
        jobs[side] = services.job_submit(actor=tw.project_admin, project=tw.project, cluster=cluster,
                                         name=f"job-{side}", groups=[gpu_group()])
    pools = {side: services.nodepool_create(actor=world.admin, cluster=cluster, name=f"pool-{side}",
                                            selector={"team": side}, dedicated=True,
                                            tenants=[tw.tenant])
             for side, tw in (("own", world.a), ("foreign", world.b))}
    return {"cluster": cluster, "node": cluster.nodes.first(), "jobs": jobs, "pools": pools,
            "world": world}


def _call(client: Any, ctx: dict[str, Any], resource: str, op: str, side: str) -> Any:
    world: World = ctx["world"]
    if resource == "clusters":
        base, obj_id = "/api/v1/clusters/", ctx["cluster"].pk
    elif resource == "nodes":
        base, obj_id = "/api/v1/nodes/", ctx["node"].pk
    elif resource == "pools":
        base, obj_id = "/api/v1/pools/", ctx["pools"][side].pk
    else:
        base, obj_id = "/api/v1/jobs/", ctx["jobs"][side].pk
    if op == "list":
        return client.get(base), obj_id
    if op == "retrieve":
        return client.get(f"{base}{obj_id}/"), obj_id
    if op == "create":
        if resource == "clusters":
            body: dict[str, Any] = {"name": "new-sim", "inventory": SMALL_INVENTORY}
        elif resource == "pools":
            body = {"cluster": "sim", "name": "new-pool", "selector": {"gpu": "l4"}}
        else:
            tw = world.a if side == "own" else world.b
            body = {"name": "new-job", "project": tw.project.pk, "cluster": "sim",
                    "groups": [gpu_group()]}
        return client.post(base, body, format="json"), obj_id
    if op == "update":
        change = {"name": "renamed"} if resource == "pools" else {"display_name": "Renamed"}
        return client.patch(f"{base}{obj_id}/", change, format="json"), obj_id
    if op == "delete":
        services.job_cancel(actor=world.admin, job=ctx["jobs"]["own"])
        services.job_cancel(actor=world.admin, job=ctx["jobs"]["foreign"])
        return client.delete(f"{base}{obj_id}/"), obj_id
    if op == "quarantine":
        return client.post(f"{base}{obj_id}/quarantine/", {"quarantined": True}, format="json"), obj_id
    if op == "cancel":
        return client.post(f"{base}{obj_id}/cancel/"), obj_id
    if op == "decisions":
        return client.get(f"{base}{obj_id}/decisions/"), obj_id
    raise AssertionError(op)


@pytest.mark.django_db
@pytest.mark.parametrize(("resource", "op", "role", "side"), CASES)
def test_scheduling_permission_matrix(world: World, resource: str, op: str, role: str, side: str) -> None:
    ctx = _setup(world)
    user = None if role == "anonymous" else world.user(role, "a")
    response, obj_id = _call(client_for(user), ctx, resource, op, side)
    want = expected(resource, op, role, side)
    if want in (V, H):
        if role == "anonymous":
            assert response.status_code == 401
            return
        assert response.status_code == 200, response.content
        ids = [row["id"] for row in response.json()["results"]]
        assert (obj_id in ids) == (want == V), (ids, obj_id)
    else:
        assert response.status_code == want, response.content
