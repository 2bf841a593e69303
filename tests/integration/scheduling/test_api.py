"""The scheduling REST API as a client sees it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, Job
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import gpu_group

pytestmark = pytest.mark.django_db

KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user: {token: s3cr3t-token-value}\n"


def test_cluster_credentials_are_write_only_and_encrypted(world: Any) -> None:
    client = client_for(world.admin)
    response = client.post("/api/v1/clusters/", {
        "name": "prod", "backend": "kubernetes", "api_server": "https://10.0.0.1:6443",
        "kubeconfig": KUBECONFIG, "enabled": False}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["has_credentials"] is True
    assert "kubeconfig" not in body and "token" not in body
    for payload in (client.get(f"/api/v1/clusters/{body['id']}/").content,
                    client.get("/api/v1/clusters/").content):
        assert b"s3cr3t" not in payload
    stored = Cluster.objects.get(pk=body["id"]).credentials_encrypted
    assert stored and "s3cr3t" not in stored
    events = AuditEvent.objects.filter(action__startswith="cluster.")
    assert events.exists()
    assert all("s3cr3t" not in json.dumps([e.before, e.after]) for e in events)
    from scheduling.backends.credentials import decrypt_credentials
    assert decrypt_credentials(stored)["kubeconfig"] == KUBECONFIG


def test_bad_inventory_is_a_400_naming_the_field(world: Any) -> None:
    response = client_for(world.admin).post(
        "/api/v1/clusters/", {"name": "bad", "inventory": "nodes: [{count: 2}]"}, format="json")
    assert response.status_code == 400
    assert "inventory" in response.json()


def _sim(world: Any) -> Cluster:
    from .conftest import SMALL_INVENTORY

    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    return cluster


def test_submit_with_idempotency_key_creates_one_job(world: Any) -> None:
    _sim(world)
    client = client_for(world.a.member)
    body = {"name": "train", "project": world.a.project.pk, "cluster": "sim",
            "priority_class": "batch", "groups": [gpu_group(gpu_memory_mib=20000, gpu_cores_percent=25)]}
    first = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.filter(name="train").count() == 1
    job = first.json()
    assert job["state"] == "queued" and job["preemptible"] is True and job["owner"] == "acme-member"


@pytest.mark.parametrize(("change", "field"), [
    ({"groups": []}, "groups"),
    ({"groups": [gpu_group(gpu_cores_percent=101)]}, "groups"),
    ({"priority_class": "vip"}, "priority_class"),
    ({"cluster": "nope"}, "cluster"),
    ({"name": "Bad Name!"}, "name"),
    ({"priority_class": "inference", "preemptible": True}, "preemptible"),
])
def test_bad_job_input_is_400_naming_the_field(world: Any, change: dict[str, Any], field: str) -> None:
    _sim(world)
    body = {"name": "ok", "project": world.a.project.pk, "cluster": "sim", "groups": [gpu_group()]}
    body.update(change)
    response = client_for(world.a.member).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert any(k == field or k.startswith(field) for k in response.json()), response.json()


def test_job_shows_reason_position_and_decisions(world: Any) -> None:
    cluster = _sim(world)
    for i in range(3):
        services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                            name=f"big-{i}", groups=[gpu_group(gpu_count=4)])
    services.cycle_run(cluster=cluster)
    client = client_for(world.a.member)
    waiting = Job.objects.get(name="big-2")
    data = client.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert data["state"] == "queued" and data["queue_position"] == 1 and data["queue_length"] == 1
    assert "1st of 1" in data["reason"]
    admitted = Job.objects.get(name="big-0")
    data = client.get(f"/api/v1/jobs/{admitted.pk}/").json()
    assert data["state"] == "starting" and len(data["allocations"]) == 1
    assert len(data["allocations"][0]["slices"]) == 4
    kinds = [d["kind"] for d in client.get(f"/api/v1/jobs/{admitted.pk}/decisions/").json()["results"]]
    assert kinds == ["admitted", "submitted"]
    cancelled = client.post(f"/api/v1/jobs/{waiting.pk}/cancel/").json()
    assert cancelled["state"] == "cancelled"
    again = client.post(f"/api/v1/jobs/{waiting.pk}/cancel/")
    assert again.status_code == 400 and "state" in again.json()


def test_nodes_show_gpus_and_quarantine(world: Any) -> None:
    _sim(world)
    admin = client_for(world.admin)
    nodes = client_for(world.a.member).get("/api/v1/nodes/?search=l4").json()["results"]
    assert [n["name"] for n in nodes] == ["l4-0"] and len(nodes[0]["gpus"]) == 2
    response = admin.post(f"/api/v1/nodes/{nodes[0]['id']}/quarantine/",
                          {"quarantined": True, "reason": "ECC errors"}, format="json")
    assert response.status_code == 200
    assert response.json()["quarantined"] is True and response.json()["schedulable"] is False
    assert AuditEvent.objects.filter(action="node.quarantined").exists()
