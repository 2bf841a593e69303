"""Who may use which priority class (issue 30, item 4): role × priority class × kind, through
the API (plain jobs, the bulk endpoint, training jobs, model services), with sessions and
with a project-scoped token.

Default policy: ``inference`` only for model services; ``high`` for project admins and
above; ``normal`` and ``batch`` for every member who may submit.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from registry.models import Image
from tenants import services as tenant_services
from tests.conftest import World, client_for
from tests.integration.scheduling.conftest import gpu_group
from tests.integration.workspaces.conftest import sim_cluster  # noqa: F401  (fixture)

pytestmark = pytest.mark.django_db

ROLES = ["platform_admin", "owner", "project_admin", "member"]
CLASSES = ["inference", "high", "normal", "batch"]
ADMINS = {"platform_admin", "owner", "project_admin"}


def _allowed(role: str, kind: str, priority_class: str) -> bool:
    if priority_class == "inference":
        return kind == "service" and role in ADMINS | {"member"}
    if priority_class == "high":
        return role in ADMINS
    return True


def _client(world: World, role: str) -> Any:
    return client_for(world.user(role))


def _post(world: World, client: Any, kind: str, pc: str, n: int) -> Any:
    project = world.a.project.pk
    if kind == "plain":
        return client.post("/api/v1/jobs/", {
            "name": f"p{n}", "project": project, "cluster": "sim", "priority_class": pc,
            "groups": [gpu_group(gpu_count=0)]}, format="json")
    if kind == "bulk":
        return client.post("/api/v1/jobs/bulk/", {"jobs": [{
            "name": f"b{n}", "project": project, "cluster": "sim", "priority_class": pc,
            "groups": [gpu_group(gpu_count=0)]}]}, format="json")
    if kind == "plain-claiming-service":
        return client.post("/api/v1/jobs/", {
            "name": f"s{n}", "project": project, "cluster": "sim", "priority_class": pc,
            "kind": "service", "groups": [gpu_group(gpu_count=0)]}, format="json")
    if kind == "training":
        return client.post("/api/v1/training-jobs/", {
            "name": f"t{n}", "project": project, "cluster": "sim", "framework": "pytorch",
            "image_reference": "pytorch/pytorch:2", "gpu_count": 0, "cpu_millicores": 500,
            "ram_mib": 512, "command": ["python", "t.py"], "priority_class": pc}, format="json")
    assert kind == "service"
    return client.post("/api/v1/services/", {
        "name": f"svc{n}", "project": project, "cluster": "sim",
        "image": Image.objects.get(name="vllm").pk, "model_source": "hf://Qwen/Qwen2.5-7B-Instruct",
        "gpu_memory_mib": 2048, "gpu_cores_percent": 10, "ram_mib": 1024, "priority_class": pc,
        "preemptible": pc == "batch"}, format="json")


@pytest.mark.parametrize("kind", ["plain", "bulk", "plain-claiming-service", "training", "service"])
def test_role_by_priority_class(world: World, sim_cluster: Any, kind: str) -> None:  # noqa: F811
    n = 0
    wrong = []
    for role in ROLES:
        client = _client(world, role)
        for pc in CLASSES:
            n += 1
            r = _post(world, client, kind, pc, n)
            want = _allowed(role, "service" if kind == "service" else "job", pc)
            got = r.status_code == 201
            if got != want or (not got and r.status_code != 400):
                wrong.append((role, pc, r.status_code, r.content[:200]))
            if not got and r.status_code == 400:
                assert "priority_class" in str(r.json()), r.content
    assert not wrong, wrong


def test_a_project_scoped_token_of_an_owner_may_use_high_only_where_it_reaches(
        world: World, sim_cluster: Any) -> None:  # noqa: F811
    _, scoped = tenant_services.token_create(actor=world.a.owner, name="ci", project=world.a.project)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {scoped}")
    assert _post(world, client, "plain", "high", 1).status_code == 201
    _, ro = tenant_services.token_create(actor=world.a.owner, name="ro", read_only=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ro}")
    assert _post(world, client, "plain", "high", 2).status_code == 403

