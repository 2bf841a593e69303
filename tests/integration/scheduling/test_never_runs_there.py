"""Submit refuses work that can never run where it is sent (review rv of issue 16, finding 8), on
real PostgreSQL with the two simulated clusters of test_multicluster ("east": x86 with A100s in
eu-east, "west": ARM with GH200s in us-west).

Before, a job pinned to the ARM cluster with an amd64-only catalog image, or sent by labels with a
GPU model none of the matching clusters has, was accepted (API 201, portal 302) and rejected
later by the cycle or the placement step; now the submit says so, naming the field, for raw jobs
(REST, bulk), training jobs (REST, portal form), environments and model services. A cluster
with no node synced yet refuses nothing: its nodes are not known.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from registry import services as registry_services
from scheduling import services
from scheduling.models import Cluster, Job
from tests.conftest import client_for
from tests.integration.scheduling.test_multicluster import two, x86_image
from workspaces.models import DevEnvironment, ModelService, TrainingJob
from workspaces.services import serving

from .conftest import gpu_group

pytestmark = pytest.mark.django_db
__all__ = ["two"]  # the fixture, imported for pytest

X86 = "registry.example/x86-only:1"


def _job(world: Any, name: str, **kw: Any) -> dict[str, Any]:
    groups = [gpu_group(**kw.pop("group", {}))]
    return {"project": world.a.project.pk, "name": name, "groups": groups, **kw}


def test_the_jobs_api_refuses_a_pinned_job_its_cluster_can_never_run(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    x86_image(world)
    api = client_for(world.a.member)
    arm = api.post("/api/v1/jobs/", _job(world, "x86-on-arm", cluster="west", group={"image": X86}),
                   format="json")
    assert arm.status_code == 400, arm.content
    msg = " ".join(arm.json()["groups[0].image"])
    assert "linux/amd64" in msg and "cluster west has linux/arm64 nodes only" in msg
    h100 = api.post("/api/v1/jobs/", _job(world, "h100-on-west", cluster="west",
                                          group={"gpu_models": ["H100-80G"]}), format="json")
    assert h100.status_code == 400, h100.content
    assert "No node of cluster west has a GPU of model H100-80G (it has GH200-96G)" in " ".join(
        h100.json()["groups[0].gpu_models"])
    assert not Job.objects.filter(name__in=["x86-on-arm", "h100-on-west"]).exists()
    # What can run there still goes there.
    ok = api.post("/api/v1/jobs/", _job(world, "gh200-on-west", cluster="west",
                                        group={"gpu_models": ["GH200-96G"]}), format="json")
    assert ok.status_code == 201, ok.content
    assert api.post("/api/v1/jobs/", _job(world, "x86-on-east", cluster="east", group={"image": X86}),
                    format="json").status_code == 201
    # A sweep names the item.
    bulk = api.post("/api/v1/jobs/bulk/", {"jobs": [
        _job(world, "fine", cluster="east"), _job(world, "bad", cluster="west", group={"image": X86})]},
        format="json")
    assert bulk.status_code == 400, bulk.content
    assert "jobs[1].groups[0].image" in bulk.json() and not Job.objects.filter(name="fine").exists()


def test_a_label_or_set_choice_without_the_gpu_model_is_refused(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    api = client_for(world.a.member)
    us_west = {"labels": {"region": "us-west"}}
    west = api.post("/api/v1/jobs/", _job(world, "h100-west", cluster_choice=us_west,
                                          group={"gpu_models": ["H100-80G"]}), format="json")
    assert west.status_code == 400, west.content
    assert "None of the clusters this job may use has a GPU of model H100-80G (they have GH200-96G)" \
        in " ".join(west.json()["groups[0].gpu_models"])
    anywhere = api.post("/api/v1/jobs/", _job(world, "h100-any", group={"gpu_models": ["H100-80G"]}),
                        format="json")
    assert anywhere.status_code == 400 and "groups[0].gpu_models" in anywhere.json()
    both = {"clusters": ["east", "west"]}
    a100_set = api.post("/api/v1/jobs/", _job(world, "a100-set", cluster_choice=both,
                                              group={"gpu_models": ["A100-80G"]}), format="json")
    assert a100_set.status_code == 201, a100_set.content
    # A pod group without GPUs is not held to the models it lists.
    cpu = api.post("/api/v1/jobs/", _job(world, "cpu-west", cluster="west",
                                         group={"gpu_count": 0, "gpu_models": ["H100-80G"]}), format="json")
    assert cpu.status_code == 201, cpu.content


def test_a_cluster_with_no_node_synced_yet_refuses_nothing(world: Any, two: tuple[Cluster, Cluster]) -> None:
    x86_image(world)
    services.cluster_create(actor=world.admin, name="fresh", backend="simulated",
                            labels={"region": "us-west", "arch": "arm64"},
                            inventory="nodes:\n  - name: fresh-{i}\n    count: 1\n    labels: "
                                      "{kubernetes.io/arch: arm64}\n")  # not synced: no Node rows
    api = client_for(world.a.member)
    pinned = api.post("/api/v1/jobs/", _job(world, "pinned-fresh", cluster="fresh",
                                            group={"image": X86, "gpu_models": ["H100-80G"]}), format="json")
    assert pinned.status_code == 201, pinned.content
    us_west = {"labels": {"region": "us-west"}}
    by_label = api.post("/api/v1/jobs/", _job(world, "label-fresh", cluster_choice=us_west,
                                              group={"gpu_models": ["H100-80G"]}), format="json")
    assert by_label.status_code == 201, by_label.content


TRAINING_FORM = {"framework": "pytorch", "image_reference": X86, "workers": 1, "gpu_count": 1,
                 "gpu_memory_mib": 0, "gpu_cores_percent": 0, "cpu_millicores": 1000, "ram_mib": 2048,
                 "checkpoint_dir": "/ckpt", "checkpoint_volume_gib": 0, "retry_limit": 0,
                 "priority_class": "normal", "preemptible": "on", "command": "torchrun train.py",
                 "duration_seconds": 3600}


def test_the_training_form_and_api_refuse_a_pinned_image_without_the_clusters_arch(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    x86_image(world)
    c = Client()
    c.force_login(world.a.member)
    form = c.post("/workspaces/training/new/", {**TRAINING_FORM, "project": world.a.project.pk,
                                                "cluster": "west", "name": "x86-on-arm"})
    assert form.status_code == 200  # the form again, not a redirect to a job the cycle rejects
    page = form.content.decode()
    assert "cluster west has linux/arm64 nodes only" in page
    assert form.context["form"].errors["image_reference"]
    assert not TrainingJob.objects.filter(name="x86-on-arm").exists()
    ok = c.post("/workspaces/training/new/", {**TRAINING_FORM, "project": world.a.project.pk,
                                              "cluster": "east", "name": "x86-on-east"})
    assert ok.status_code == 302
    api = client_for(world.a.member)
    body = {"project": world.a.project.pk, "framework": "pytorch", "image_reference": "pytorch/pytorch:2.4",
            "workers": 2, "gpu_count": 1, "cpu_millicores": 1000, "ram_mib": 2048, "duration_seconds": 3600}
    h100 = api.post("/api/v1/training-jobs/", {**body, "name": "h100", "cluster": "west",
                                               "gpu_models": ["H100-80G"]}, format="json")
    assert h100.status_code == 400 and "cluster west" in " ".join(h100.json()["gpu_models"]), h100.content
    floating = api.post("/api/v1/training-jobs/", {**body, "name": "h100-labels", "gpu_models": ["H100-80G"],
                                                   "cluster_choice": {"labels": {"region": "us-west"}}},
                        format="json")
    assert floating.status_code == 400 and "gpu_models" in floating.json(), floating.content
    assert not TrainingJob.objects.filter(name__in=["h100", "h100-labels"]).exists()


def test_environments_and_services_are_refused_at_create_but_later_replicas_are_not(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    x86_image(world)
    api = client_for(world.a.member)
    env = api.post("/api/v1/environments/", {
        "project": world.a.project.pk, "cluster": "west", "name": "nb", "kind": "jupyter",
        "image_reference": X86, "cpu_millicores": 1000, "ram_mib": 1024}, format="json")
    assert env.status_code == 400 and "linux/arm64" in " ".join(env.json()["image_reference"]), env.content
    assert not DevEnvironment.objects.filter(name="nb").exists()
    svc_body = {"project": world.a.project.pk, "cluster": "west", "name": "chat",
                "image_reference": "docker.io/vllm/vllm-openai:v0.6.3", "model_source": "hf://Qwen/Qwen2.5-7B",
                "gpu_count": 1, "cpu_millicores": 2000, "ram_mib": 8192, "gpu_models": ["H100-80G"]}
    svc = api.post("/api/v1/services/", svc_body, format="json")
    assert svc.status_code == 400 and "cluster west" in " ".join(svc.json()["gpu_models"]), svc.content
    assert not ModelService.objects.filter(name="chat").exists()
    made = api.post("/api/v1/services/", {**svc_body, "gpu_models": ["GH200-96G"]}, format="json")
    assert made.status_code == 201, made.content
    # The catalog changes under a running service: its autoscaled replicas are still added (the
    # cycle then says why they cannot run), never an error in the autoscaler.
    registry_services.image_create(actor=world.admin, name="vllm-x86", variant="inference",
                                   reference=str(svc_body["image_reference"]), architectures=["linux/amd64"])
    service = ModelService.objects.get(name="chat")
    serving.model_service_scale(actor=world.a.member, service=service, replicas=2)
    assert service.replicas.filter(removed_reason="").count() == 2
