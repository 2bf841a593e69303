"""One job's pods never mix GPU models unless the job allows it (issue 11), through the API and
the real cycle on the simulated backend: 2 A100 + 2 L4, a 4-worker job can never run on one
model, so it is rejected at once with a reason naming ``mixed_gpu_models`` (it neither waits
forever nor holds nodes); with ``mixed_gpu_models`` it runs on both; a 2-worker job lands on one
model."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import GpuSlice, Job, JobState
from tests.conftest import client_for

from .conftest import gpu_group

pytestmark = pytest.mark.django_db(transaction=True)

INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: a100-0
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 2, memory_mib: 81920}
  - name: l4-0
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: L4, count: 2, memory_mib: 23034}
"""


def _submit(world: Any, name: str, replicas: int, **extra: Any) -> dict[str, Any]:
    r = client_for(world.a.member).post("/api/v1/jobs/", {
        "name": name, "project": world.a.project.pk, "cluster": "sim", "kind": "pytorch",
        "groups": [gpu_group(replicas=replicas)], **extra}, format="json")
    assert r.status_code == 201, r.content
    return dict(r.json())


def _models(job_id: int) -> set[str]:
    return set(GpuSlice.objects.filter(allocation__job_id=job_id).values_list("gpu__model", flat=True))


def test_a_jobs_pods_stay_on_one_gpu_model_unless_it_allows_mixing(world: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=INVENTORY)
    services.inventory_sync(cluster=cluster)

    four = _submit(world, "four", 4)
    assert four["mixed_gpu_models"] is False
    services.cycle_run(cluster=cluster)
    job = Job.objects.get(pk=four["id"])
    assert job.state == JobState.REJECTED and not job.allocations.exists(), job.reason
    assert "No single GPU model can ever hold the job" in job.reason, job.reason
    assert "mixed_gpu_models" in job.reason, job.reason

    r = client_for(world.a.member).post("/api/v1/jobs/", {
        "name": "bad", "project": world.a.project.pk, "cluster": "sim",
        "groups": [gpu_group()], "mixed_gpu_models": "sometimes"}, format="json")
    assert r.status_code == 400 and "mixed_gpu_models" in r.json(), r.content

    mixed = _submit(world, "mixed", 4, mixed_gpu_models=True)
    assert mixed["mixed_gpu_models"] is True
    services.cycle_run(cluster=cluster)
    assert Job.objects.get(pk=mixed["id"]).state == JobState.STARTING
    assert _models(mixed["id"]) == {"A100-80G", "L4"}
    services.job_cancel(actor=world.a.member, job=Job.objects.get(pk=mixed["id"]))
    services.cluster_reconcile(cluster=cluster)
    services.cluster_reconcile(cluster=cluster)
    assert not GpuSlice.objects.exists()

    two = _submit(world, "two", 2)
    services.cycle_run(cluster=cluster)
    assert Job.objects.get(pk=two["id"]).state == JobState.STARTING
    assert len(_models(two["id"])) == 1
