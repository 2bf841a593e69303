"""Environment values (often secrets) never reach the append-only audit log, nor a job's
reason (issue 30, item 3): names only, for every kind that takes ``env``."""

from __future__ import annotations

from typing import Any

import pytest

from registry.models import Image
from scheduling import services as scheduling_services
from tenants.audit import without_values
from tenants.models import AuditEvent
from tests.conftest import client_for
from workspaces import services

pytestmark = pytest.mark.django_db
SECRET = "hf_TOPSECRET_value_123"


def test_no_env_value_in_any_audit_event_of_any_kind(world: Any, sim_cluster: Any) -> None:
    member = world.a.member
    scheduling_services.job_submit(
        actor=member, project=world.a.project, cluster=sim_cluster, name="plain",
        groups=[{"name": "main", "replicas": 1, "gpu_count": 0, "cpu_millicores": 500,
                 "ram_mib": 512, "image": "busybox", "env": {"API_KEY": SECRET}}])
    scheduling_services.job_submit_many(actor=member, jobs=[{
        "project": world.a.project, "cluster": sim_cluster, "name": "bulk",
        "groups": [{"name": "main", "replicas": 1, "gpu_count": 0, "cpu_millicores": 500,
                    "ram_mib": 512, "image": "busybox", "env": {"API_KEY": SECRET}}]}])
    services.environment_launch(
        actor=member, project=world.a.project, cluster=sim_cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000, ram_mib=1024,
        env={"API_KEY": SECRET})
    services.training_submit(
        actor=member, project=world.a.project, cluster=sim_cluster, name="train",
        framework="pytorch", image_reference="pytorch/pytorch:2", gpu_count=0,
        cpu_millicores=500, ram_mib=512, command=["python", "train.py"], env={"API_KEY": SECRET})
    made = client_for(member).post("/api/v1/services/", {
        "name": "chat", "project": world.a.project.pk, "cluster": "sim",
        "image": Image.objects.get(name="vllm").pk, "model_source": "hf://Qwen/Qwen2.5-7B-Instruct",
        "gpu_memory_mib": 20480, "gpu_cores_percent": 30, "ram_mib": 8192,
        "env": {"API_KEY": SECRET}}, format="json")
    assert made.status_code == 201, made.content

    events = list(AuditEvent.objects.values_list("action", "before", "after"))
    submitted = [after for action, _, after in events if action == "job.submitted"]
    assert len(submitted) >= 5  # plain, bulk, environment, training, service replica
    assert not [e for e in events if SECRET in str(e)]
    # the names stay: what was set is auditable, not what it was set to
    assert all(g["env"] == ["API_KEY"] for a in submitted for g in a["groups"] if g.get("env"))
    # ... nor through the tenant owner's audit API and CSV export
    owner = client_for(world.a.owner)
    listed = owner.get("/api/v1/audit-events/?page_size=200")
    assert listed.status_code == 200 and SECRET not in listed.content.decode()
    exported = owner.get("/api/v1/audit-events/export/")
    assert exported.status_code == 200
    assert SECRET not in b"".join(exported.streaming_content).decode()


def test_a_refusal_that_echoes_a_value_is_redacted() -> None:
    refused = f'Pod "x" is invalid: spec.containers[0].env[0].value: Invalid value: "{SECRET}"'
    assert without_values(refused, [SECRET, "1"]) == (
        'Pod "x" is invalid: spec.containers[0].env[0].value: Invalid value: "[redacted]"')
