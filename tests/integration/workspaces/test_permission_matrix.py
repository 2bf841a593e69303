"""Workload and registry endpoints × role × own/foreign tenant (DESIGN.md §5).

Roles: platform admin, tenant owner, project admin, project member (of tenant "acme"),
an outsider and anonymous. "Own" objects live in acme's first project (environments and
training jobs belong to its project admin, so a plain member may look but not stop
them), "foreign" ones in globex. Images and registries are tenant-level entries of acme /
globex; profiles are the platform's (own only). Invisible objects answer 404; naming one
in a body answers 400.

One test per endpoint: the world is built once, and every (role, side) call runs in a
savepoint that is rolled back afterwards, so each sees the same untouched state.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from registry import services as registry_services
from registry.models import Image
from scheduling import services as scheduling_services
from tests.conftest import World, client_for
from workspaces import services, serving

from .conftest import SMALL_INVENTORY
from .test_ssh_keys import public_key

pytestmark = pytest.mark.django_db

ROLES = ["platform_admin", "owner", "project_admin", "member", "outsider", "anonymous"]
V, H = "visible", "hidden"
MEMBERS = dict(platform_admin=V, owner=V, project_admin=V, member=V, outsider=H)
READ = dict(platform_admin=200, owner=200, project_admin=200, member=200, outsider=404)
CREATE = dict(platform_admin=201, owner=201, project_admin=201, member=201, outsider=400)
# the object's owner (the project admin) or above; a plain member may not
OWNER_OR_ADMIN = dict(platform_admin=200, owner=200, project_admin=200, member=403, outsider=404)
SELF_ONLY = dict(owner=404, member=404, outsider=404)
TENANT_OWNER = dict(platform_admin=200, owner=200, project_admin=403, member=403, outsider=404)

EXPECT: dict[tuple[str, str], dict[str, Any]] = {
    ("environments", "list"): MEMBERS,
    ("environments", "retrieve"): READ,
    ("environments", "create"): CREATE,
    ("environments", "stop"): OWNER_OR_ADMIN,
    ("environments", "start"): {
        **OWNER_OR_ADMIN,
        "platform_admin": 400,
        "owner": 400,
        "project_admin": 400,
    },  # allowed, but it is already queued
    ("environments", "open"): dict(
        platform_admin=403, owner=403, project_admin=200, member=403, outsider=404
    ),  # only its owner opens it
    ("environments", "logs"): READ,
    ("environments", "why"): READ,
    ("environments", "delete"): {**OWNER_OR_ADMIN, "platform_admin": 204, "owner": 204, "project_admin": 204},
    ("training-jobs", "list"): MEMBERS,
    ("training-jobs", "retrieve"): READ,
    ("training-jobs", "create"): CREATE,
    ("training-jobs", "stop"): OWNER_OR_ADMIN,
    ("training-jobs", "logs"): READ,
    ("training-jobs", "why"): READ,
    ("training-jobs", "checkpoints"): READ,
    ("training-jobs", "delete"): {
        **OWNER_OR_ADMIN,
        "platform_admin": 204,
        "owner": 204,
        "project_admin": 204,
    },
    # Model services (issue 15): the job rule, like the other workload kinds.
    ("services", "list"): MEMBERS,
    ("services", "retrieve"): READ,
    ("services", "create"): CREATE,
    ("services", "update"): OWNER_OR_ADMIN,
    ("services", "scale"): OWNER_OR_ADMIN,
    ("services", "rollout"): OWNER_OR_ADMIN,
    ("services", "delete"): {**OWNER_OR_ADMIN, "platform_admin": 204, "owner": 204, "project_admin": 204},
    ("images", "list"): MEMBERS,
    ("images", "retrieve"): READ,
    ("images", "create"): dict(platform_admin=201, owner=201, project_admin=403, member=403, outsider=400),
    ("images", "update"): TENANT_OWNER,
    ("images", "delete"): {**TENANT_OWNER, "platform_admin": 204, "owner": 204},
    ("registries", "list"): MEMBERS,
    ("registries", "retrieve"): READ,
    ("registries", "create"): dict(
        platform_admin=201, owner=201, project_admin=403, member=403, outsider=400
    ),
    ("registries", "update"): TENANT_OWNER,
    ("registries", "delete"): {**TENANT_OWNER, "platform_admin": 204, "owner": 204},
    ("workspace-policies", "list"): MEMBERS,
    ("workspace-policies", "create"): dict(
        platform_admin=200, owner=200, project_admin=200, member=403, outsider=400
    ),
    ("profiles", "list"): MEMBERS,
    ("profiles", "create"): dict(platform_admin=201, owner=403, project_admin=403, member=403, outsider=403),
    # SSH keys are personal: "own" is a key of acme's project admin, "foreign" one of
    # globex's. Only the key's user (and platform admins) see it; anyone adds their own.
    ("ssh-keys", "list"): dict(platform_admin=V, owner=H, project_admin=V, member=H, outsider=H),
    ("ssh-keys", "retrieve"): {**SELF_ONLY, "platform_admin": 200, "project_admin": 200},
    ("ssh-keys", "create"): dict(platform_admin=201, owner=201, project_admin=201, member=201, outsider=201),
    ("ssh-keys", "delete"): {**SELF_ONLY, "platform_admin": 204, "project_admin": 204},
}
TENANTLESS = {"profiles"}
OWN_SIDE_ONLY = {("ssh-keys", "create")}  # the body names no tenant: nothing is foreign


def expected(resource: str, op: str, role: str, side: str) -> Any:
    if role == "anonymous":
        return 401
    own = EXPECT[(resource, op)][role]
    if side == "own" or role == "platform_admin":
        return own
    if op == "list":
        return H
    if op == "create":
        return 400  # the body names a foreign project or tenant
    return 404


def _setup(world: World) -> dict[str, Any]:
    cluster = scheduling_services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    scheduling_services.inventory_sync(cluster=cluster)
    jupyter = Image.objects.get(name="pytorch-jupyter")
    objs: dict[str, dict[str, Any]] = {
        "environments": {},
        "training-jobs": {},
        "images": {},
        "registries": {},
        "workspace-policies": {},
        "ssh-keys": {},
        "services": {},
    }
    for side, tw in (("own", world.a), ("foreign", world.b)):
        objs["environments"][side], _ = services.environment_launch(
            actor=tw.project_admin,
            project=tw.project,
            cluster=cluster,
            name=f"nb-{side}",
            kind="jupyter",
            image=jupyter,
            cpu_millicores=1000,
            ram_mib=1024,
        )
        objs["training-jobs"][side] = services.training_submit(
            actor=tw.project_admin,
            project=tw.project,
            cluster=cluster,
            name=f"t-{side}",
            framework="pytorch",
            image_reference="pytorch/pytorch:2",
            cpu_millicores=1000,
            ram_mib=1024,
        )
        objs["services"][side] = serving.model_service_create(
            actor=tw.project_admin, project=tw.project, cluster=cluster, name=f"svc-{side}",
            image=Image.objects.get(name="vllm"), model_source="hf://Qwen/Qwen2.5-0.5B",
            cpu_millicores=1000, ram_mib=1024,
        )
        objs["registries"][side] = registry_services.registry_create(
            actor=tw.owner, tenant=tw.tenant, name=f"reg-{side}", server="ghcr.io", username="u", password="p"
        )
        objs["images"][side] = registry_services.image_create(
            actor=tw.owner,
            tenant=tw.tenant,
            name=f"img-{side}",
            reference="ghcr.io/x/y:1",
            variant="training",
        )
        objs["workspace-policies"][side] = services.workspace_policy_set(
            actor=tw.owner, project=tw.project, idle_minutes=60
        )
        objs["ssh-keys"][side] = services.ssh_key_add(
            actor=tw.project_admin, name=f"key-{side}", public_key=public_key()
        )
    objs["profiles"] = {
        "own": services.profile_create(actor=world.admin, name="small", cpu_millicores=1000, ram_mib=2048)
    }
    return {"cluster": cluster, "objs": objs, "world": world}


def _body(resource: str, ctx: dict[str, Any], side: str) -> dict[str, Any]:
    world: World = ctx["world"]
    tw = world.a if side == "own" else world.b
    if resource == "environments":
        return {
            "name": "new-nb",
            "project": tw.project.pk,
            "cluster": "sim",
            "kind": "jupyter",
            "image": Image.objects.get(name="pytorch-jupyter").pk,
            "cpu_millicores": 1000,
            "ram_mib": 1024,
        }
    if resource == "training-jobs":
        return {
            "name": "new-t",
            "project": tw.project.pk,
            "cluster": "sim",
            "framework": "pytorch",
            "image_reference": "pytorch/pytorch:2",
            "cpu_millicores": 1000,
            "ram_mib": 1024,
        }
    if resource == "images":
        return {
            "name": "new-img",
            "tenant": tw.tenant.pk,
            "reference": "ghcr.io/a/b:2",
            "variant": "training",
        }
    if resource == "registries":
        return {"name": "new-reg", "tenant": tw.tenant.pk, "server": "quay.io", "password": "secret"}
    if resource == "workspace-policies":
        return {"project": tw.project.pk, "idle_minutes": 30}
    if resource == "ssh-keys":
        return {"name": "new-key", "public_key": public_key()}
    if resource == "services":
        return {"name": "new-svc", "project": tw.project.pk, "cluster": "sim",
                "image": Image.objects.get(name="vllm").pk, "model_source": "hf://a/b",
                "cpu_millicores": 1000, "ram_mib": 1024}
    return {"name": "new-profile", "cpu_millicores": 1000, "ram_mib": 1024}


def _call(client: Any, ctx: dict[str, Any], resource: str, op: str, side: str) -> tuple[Any, int]:
    obj = ctx["objs"][resource][side]
    base = f"/api/v1/{resource}/"
    if op == "list":
        return client.get(base), obj.pk
    if op == "create":
        return client.post(base, _body(resource, ctx, side), format="json"), obj.pk
    if op == "retrieve":
        return client.get(f"{base}{obj.pk}/"), obj.pk
    if op == "update":
        return client.patch(f"{base}{obj.pk}/", {"name": "renamed"}, format="json"), obj.pk
    if op == "delete":
        return client.delete(f"{base}{obj.pk}/"), obj.pk
    if op in ("logs", "why", "checkpoints"):
        return client.get(f"{base}{obj.pk}/{op}/"), obj.pk
    if op == "scale":
        return client.post(f"{base}{obj.pk}/scale/", {"replicas": 2}, format="json"), obj.pk
    return client.post(f"{base}{obj.pk}/{op}/"), obj.pk  # stop, start, open, rollout


class _Rollback(Exception):  # noqa: N818
    pass


@pytest.mark.parametrize(("resource", "op"), list(EXPECT))
def test_workload_permission_matrix(world: World, resource: str, op: str) -> None:
    ctx = _setup(world)
    sides = ["own"] if resource in TENANTLESS or (resource, op) in OWN_SIDE_ONLY else ["own", "foreign"]
    wrong = []
    for role in ROLES:
        for side in sides:
            want = expected(resource, op, role, side)
            user = None if role == "anonymous" else world.user(role, "a")
            try:
                with transaction.atomic():
                    response, obj_id = _call(client_for(user), ctx, resource, op, side)
                    got: Any = response.status_code
                    if want in (V, H) and got == 200:
                        ids = [row["id"] for row in response.json()["results"]]
                        got = V if obj_id in ids else H
                    raise _Rollback
            except _Rollback:
                pass
            if got != want:
                wrong.append(f"{role}/{side}: expected {want}, got {got} {response.content[:200]!r}")
    assert not wrong, "\n".join(wrong)
