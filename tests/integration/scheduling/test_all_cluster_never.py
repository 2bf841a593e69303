"""Jobs that could never start under a quota across all clusters (issue 16's platform level),
on real PostgreSQL with two simulated clusters ("east": A100-80G, "west": GH200-96G, 8 GPUs
each): refused at submit with a field-named error (REST API, portal form, CLI, every workload
kind, pinned and "any cluster"), and, when the quota was lowered after the job queued,
rejected by the cycle or the placement step with the quota named — rather than waiting for
ever. A job within the limit, or one that may use a class with room, goes through."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from scheduling import services
from scheduling.models import Cluster, DecisionKind, GpuSlice, Job, JobState, SchedulingDecision
from scheduling.services import placement
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.conftest import client_for
from workspaces.models import TrainingJob

from .conftest import gpu_group
from .test_multicluster import EAST, WEST

pytestmark = pytest.mark.django_db

A100 = "A100-80G"
CARD = 81920  # MiB of one A100-80G card
API = {"framework": "pytorch", "image_reference": "pytorch/pytorch:2.4", "cpu_millicores": 1000,
       "ram_mib": 2048, "duration_seconds": 3600}
FORM = {"framework": "pytorch", "image_reference": "pytorch/pytorch:2.4", "gpu_memory_mib": 0,
        "gpu_cores_percent": 0, "cpu_millicores": 1000, "ram_mib": 2048, "checkpoint_dir": "",
        "checkpoint_volume_gib": 0, "retry_limit": 0, "priority_class": "normal", "preemptible": "on",
        "command": "torchrun train.py", "duration_seconds": 3600}


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST)
    for c in (east, west):
        services.inventory_sync(cluster=c)
    return east, west


def _project(world: Any, **values: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project, values=values)


def _tenant(world: Any, **values: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant, values=values)


def _who(world: Any) -> str:
    return f"project {world.a.tenant.name}/{world.a.project.name}"


def _post(world: Any, name: str, workers: int, gpus: int, **extra: Any) -> Any:
    return client_for(world.a.member).post("/api/v1/training-jobs/", {
        **API, "project": world.a.project.pk, "name": name, "workers": workers, "gpu_count": gpus,
        **extra}, format="json")


def _job(world: Any, name: str, cluster: Cluster | None, gpus: int, **kw: Any) -> Job:
    """A queued job straight through the scheduler's submit (no workload pre-check): one that
    queued before its quota was lowered."""
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster, name=name,
                               groups=[gpu_group(gpu_count=gpus, **kw)], preemptible=True)


def _rejected(job: Job) -> Job:
    job.refresh_from_db()
    assert job.state == JobState.REJECTED, (job.state, job.reason)
    assert SchedulingDecision.objects.filter(job=job, kind=DecisionKind.REJECTED).exists()
    event = AuditEvent.objects.get(action="job.rejected", target_id=str(job.pk))
    assert event.after == {"reason": job.reason}
    return job


# --- at submit --------------------------------------------------------------------------------


def test_the_api_refuses_more_gpus_than_the_project_limit_across_all_clusters(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    _project(world, gpus_limit_all_clusters=Decimal(4))
    msg = (f"This asks 6 GPUs in all, more than {_who(world)}'s limit of 4 GPUs on all clusters "
           f"together: it could never start.")
    pinned = _post(world, "pinned", 3, 2, cluster="east")
    assert pinned.status_code == 400 and pinned.json() == {"gpu_count": [msg]}
    anywhere = _post(world, "anywhere", 3, 2)  # floating: no cluster could ever start it
    assert anywhere.status_code == 400 and anywhere.json() == {"gpu_count": [msg]}
    assert not TrainingJob.objects.exists() and not Job.objects.exists()
    # Exactly at the limit: accepted, pinned and floating.
    assert _post(world, "at-limit", 2, 2, cluster="east").status_code == 201
    assert _post(world, "at-limit-any", 2, 2).status_code == 201


def test_the_tenant_limit_across_all_clusters_is_named_when_it_is_the_lower(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    _tenant(world, gpus_limit_all_clusters=Decimal(2))
    refused = _post(world, "four", 2, 2, cluster="west")
    assert refused.status_code == 400
    assert refused.json()["gpu_count"] == [
        f"This asks 4 GPUs in all, more than tenant {world.a.tenant.name}'s limit of 2 GPUs on all "
        f"clusters together: it could never start."]


def test_a_class_memory_limit_refuses_only_when_every_usable_class_is_over(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    _project(world, gpu_memory_mib_limits_all_clusters={A100: CARD})
    # Two whole A100-80G cards hold 160 GiB: more than the class's 80 GiB on east, its only class.
    pinned = _post(world, "a100s", 2, 1, cluster="east")
    assert pinned.status_code == 400, pinned.content
    assert pinned.json() == {"gpu_memory_mib": [
        f"This asks 160 GiB of A100-80G GPU memory in all, more than {_who(world)}'s limit of 80 GiB "
        f"of A100-80G GPU memory on all clusters together: it could never start."]}
    # The same job for any cluster may use west's GH200s (no limit there): accepted, placed west.
    anywhere = _post(world, "anywhere", 2, 1)
    assert anywhere.status_code == 201, anywhere.content
    placement.placement_run()
    job = Job.objects.get(pk=anywhere.json()["run"]["id"])
    assert job.cluster is not None and job.cluster.name == "west"
    # Slices within the class's limit on east: accepted.
    sliced = _post(world, "slices", 2, 1, cluster="east", gpu_memory_mib=20480, gpu_cores_percent=25)
    assert sliced.status_code == 201, sliced.content


def test_a_non_preemptible_job_beyond_what_the_guarantees_can_cover_is_refused(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    # Project (and tenant) guaranteed 4 GPUs across all clusters, nothing per cluster: a
    # non-preemptible job of 6 could never start (the cycle rejects it: over-guarantee).
    _tenant(world, gpus_guaranteed_all_clusters=4)
    _project(world, gpus_guaranteed_all_clusters=4)
    refused = _post(world, "np", 3, 2, cluster="east", preemptible=False)
    assert refused.status_code == 400
    assert refused.json()["gpu_count"][0].startswith(
        f"This non-preemptible job asks 6 GPUs, more than {_who(world)}'s GPU guarantee can ever cover "
        f"(0 per cluster + 4 on all clusters together): it could never start; non-preemptible work "
        f"does not borrow idle GPUs beyond a guarantee")
    assert _post(world, "np-any", 3, 2, preemptible=False).status_code == 400
    # Preemptible, it borrows idle GPUs; non-preemptible within g + G: both accepted.
    assert _post(world, "borrows", 3, 2, cluster="east", preemptible=True).status_code == 201
    assert _post(world, "np-4", 2, 2, cluster="east", preemptible=False).status_code == 201


def test_no_guarantee_across_all_clusters_restricts_no_non_preemptible_job(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    # A limit across all clusters but no guarantee there: only the limit applies.
    _project(world, gpus_limit_all_clusters=Decimal(8))
    assert _post(world, "np", 3, 2, cluster="east", preemptible=False).status_code == 201


def test_the_portal_form_shows_the_refusal(world: Any, two: tuple[Cluster, Cluster]) -> None:
    _project(world, gpus_limit_all_clusters=Decimal(2))
    c = Client()
    c.force_login(world.a.member)
    page = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "east",
                                                "name": "too-big", "workers": 2, "gpu_count": 2})
    assert page.status_code == 200
    text = page.content.decode()
    assert "This asks 4 GPUs in all, more than project" in text
    assert "limit of 2 GPUs on all clusters together: it could never start." in text
    assert not TrainingJob.objects.exists()


def test_environments_and_model_services_are_refused_the_same_way(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from registry.models import Image
    from workspaces.services import serving

    east, _ = two
    _project(world, gpus_limit_all_clusters=Decimal(1))
    env = client_for(world.a.member).post("/api/v1/environments/", {
        "project": world.a.project.pk, "cluster": "east", "name": "nb", "kind": "jupyter",
        "image": Image.objects.get(name="pytorch-jupyter").pk, "gpu_count": 2, "cpu_millicores": 1000,
        "ram_mib": 1024}, format="json")
    assert env.status_code == 400 and "limit of 1 GPU on all clusters together" in env.json()["gpu_count"][0]
    base: dict[str, Any] = {"image_reference": "docker.io/vllm/vllm-openai:v0.6.3",
            "model_source": "hf://Qwen/Qwen2.5-7B-Instruct", "cpu_millicores": 2000, "ram_mib": 8192,
            "gpu_memory_mib": 0, "gpu_cores_percent": 0}  # whole cards: 1 GPU each
    with pytest.raises(ValidationError) as big:
        serving.model_service_create(actor=world.a.member, project=world.a.project, cluster=east,
                                     name="big", gpu_count=2, **base)
    assert "This asks 2 GPUs in all" in big.value.message_dict["gpu_count"][0]
    with pytest.raises(ValidationError) as floor:  # two replicas of one GPU could never run together
        serving.model_service_create(actor=world.a.member, project=world.a.project, cluster=east,
                                     name="floor", gpu_count=1, min_replicas=2, max_replicas=2, **base)
    assert "2 replicas: This asks 2 GPUs in all" in floor.value.message_dict["min_replicas"][0]
    serving.model_service_create(actor=world.a.member, project=world.a.project, cluster=east,
                                 name="one", gpu_count=1, **base)  # at the limit


@pytest.mark.django_db(transaction=True)
def test_the_cli_prints_the_field_error(world: Any, two: tuple[Cluster, Cluster], live_server: Any,
                                        tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    _project(world, gpus_limit_all_clusters=Decimal(1))
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    path = tmp_path / "train.yaml"
    path.write_text(f"kind: TrainingJob\nname: big\nproject: {world.a.tenant.name}/{world.a.project.name}\n"
                    f"cluster: east\nframework: pytorch\nimage_reference: pytorch/pytorch:2.4\nworkers: 2\n"
                    f"gpu_count: 1\ncpu_millicores: 1000\nram_mib: 2048\n")
    done = subprocess.run([sys.executable, "-m", "camp_cli", "submit", "-f", str(path)], env=env,
                          cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "gpu_count: This asks 2 GPUs in all" in out and "limit of 1 GPU on all clusters together" in out
    assert not TrainingJob.objects.exists()


# --- queued before the quota was lowered: rejected, the quota named ---------------------------


def test_a_lowered_limit_rejects_a_pinned_queued_job_and_keeps_one_at_the_limit(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _ = two
    big, at = _job(world, "big", east, 4), _job(world, "at", east, 2)
    _project(world, gpus_limit_all_clusters=Decimal(2))  # lowered by an admin meanwhile
    services.cycle_run(cluster=east)
    big = _rejected(big)
    assert big.reason_kind == "over-limit"
    assert big.reason == (f"The job asks 4 GPUs in all, more than {_who(world)}'s limit of 2 GPUs on "
                          f"all clusters together: it can never start")
    at.refresh_from_db()
    assert at.state == JobState.STARTING


def test_a_lowered_tenant_limit_rejects_a_job_of_any_of_its_projects(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    _, west = two
    job = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=west, name="j",
                              groups=[gpu_group(gpu_count=4)], preemptible=True)
    _tenant(world, gpus_limit_all_clusters=Decimal(3))
    services.cycle_run(cluster=west)
    assert f"more than tenant {world.a.tenant.name}'s limit of 3 GPUs on all clusters together" \
        in _rejected(job).reason


def test_a_lowered_limit_rejects_a_floating_job_in_the_global_queue_and_once_bound(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    bound = _job(world, "bound", None, 4)
    placement.placement_run()
    bound.refresh_from_db()
    assert bound.cluster is not None
    unbound = _job(world, "unbound", None, 4)
    _project(world, gpus_limit_all_clusters=Decimal(2))
    # In the global queue: the placement step finds no cluster could ever run it.
    placement.placement_run()
    unbound = _rejected(unbound)
    assert unbound.reason_kind == "never-fits"
    assert unbound.reason.startswith("No cluster can run it as asked — cluster east: can never run there: "
                                     f"asks 4 GPUs in all, more than {_who(world)}'s limit of 2 GPUs")
    # Bound to a cluster: its cycle sends it back, refused there, and the step rejects it.
    cluster = bound.cluster
    services.cycle_run(cluster=cluster)
    bound.refresh_from_db()
    assert bound.state == JobState.QUEUED and bound.cluster is None
    assert "cannot run it: The job asks 4 GPUs in all" in bound.reason
    placement.placement_run()
    assert "limit of 2 GPUs on all clusters together" in _rejected(bound).reason


def test_a_lowered_class_memory_limit_rejects_only_what_no_usable_class_could_hold(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _ = two
    whole = _job(world, "whole", east, 2)  # two A100-80G cards: 160 GiB
    sliced = _job(world, "sliced", east, 2, gpu_memory_mib=20480, gpu_cores_percent=25)  # 40 GiB
    anywhere = _job(world, "anywhere", None, 2)  # may use west's GH200s
    _project(world, gpu_memory_mib_limits_all_clusters={A100: CARD})
    services.cycle_run(cluster=east)
    whole = _rejected(whole)
    assert whole.reason_kind == "over-limit"
    assert whole.reason == (f"The job asks 160 GiB of A100-80G GPU memory in all, more than {_who(world)}'s "
                            f"limit of 80 GiB of A100-80G GPU memory on all clusters together: it can never "
                            f"start")
    sliced.refresh_from_db()
    assert sliced.state == JobState.STARTING
    placement.placement_run()
    anywhere.refresh_from_db()
    assert anywhere.state == JobState.QUEUED and anywhere.cluster is not None
    assert anywhere.cluster.name == "west"
    why = anywhere.why_across_clusters
    assert "cluster east: can never run there: asks 160 GiB of A100-80G GPU memory" in why


def test_a_lowered_guarantee_rejects_a_bound_non_preemptible_floating_job(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    # Bound while 6 non-preemptible GPUs were within 0 + 8; the guarantee is then lowered to 4:
    # its cluster's cycle refuses it (over-guarantee, the refusal fingerprinted: this path
    # raised a KeyError before) and the placement step rejects it, no cluster being able to.
    _tenant(world, gpus_guaranteed_all_clusters=8)
    _project(world, gpus_guaranteed_all_clusters=8)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=None, name="np",
                              groups=[gpu_group(gpu_count=2, replicas=3)], preemptible=False)
    placement.placement_run()
    job.refresh_from_db()
    assert job.cluster is not None
    _project(world, gpus_guaranteed_all_clusters=4)
    services.cycle_run(cluster=job.cluster)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.cluster is None
    placement.placement_run()
    assert "can never run there: asks 6 GPUs, more than your project's GPU guarantee for " \
        "non-preemptible work (0 per cluster + 4 across all clusters)" in _rejected(job).reason


# --- what a job holds: slices asking only compute, jobs that may mix GPU models -----------------


def test_slices_asking_only_compute_hold_no_memory_so_a_class_memory_limit_passes_them(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    # Review rv2 finding 1: such slices were counted as whole cards (2 × 80 GiB) and refused.
    east, _ = two
    _project(world, gpu_memory_mib_limits_all_clusters={A100: CARD})
    cores = _post(world, "cores", 2, 1, cluster="east", gpu_cores_percent=50)
    assert cores.status_code == 201, cores.content
    services.cycle_run(cluster=east)
    job = Job.objects.get(pk=cores.json()["run"]["id"])
    assert job.state == JobState.STARTING, (job.state, job.reason)
    held = GpuSlice.objects.filter(allocation__job=job).values_list("memory_mib", "cores_percent")
    assert sorted(held) == [(0, 50), (0, 50)]
    # Slices asking memory still count it: 2 × 48 GiB is over the class's 80 GiB.
    mem = _post(world, "mem", 2, 1, cluster="east", gpu_memory_mib=49152, gpu_cores_percent=25)
    assert mem.status_code == 400
    assert mem.json() == {"gpu_memory_mib": [
        f"This asks 96 GiB of A100-80G GPU memory in all, more than {_who(world)}'s limit of 80 GiB "
        f"of A100-80G GPU memory on all clusters together: it could never start."]}


def test_queued_compute_only_slices_are_admitted_after_a_class_memory_limit_is_set(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _ = two
    cores = _job(world, "cores", east, 1, gpu_cores_percent=50, replicas=2)
    mem = _job(world, "mem", east, 1, gpu_memory_mib=49152, gpu_cores_percent=25, replicas=2)
    _project(world, gpu_memory_mib_limits_all_clusters={A100: CARD})
    services.cycle_run(cluster=east)
    cores.refresh_from_db()
    assert cores.state == JobState.STARTING, (cores.state, cores.reason)
    assert _rejected(mem).reason.startswith("The job asks 96 GiB of A100-80G GPU memory in all")


MIX = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: mix-a100-{i}
    count: 1
    cpu_cores: 64
    ram_gib: 512
    labels: {kubernetes.io/arch: amd64}
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
  - name: mix-gh200-{i}
    count: 1
    cpu_cores: 64
    ram_gib: 512
    labels: {kubernetes.io/arch: amd64}
    gpus: {model: GH200-96G, count: 4, memory_mib: 98304}
"""


def test_a_job_that_may_mix_models_is_rejected_only_beyond_the_classes_limits_together(world: Any) -> None:
    # Review rv2 finding 2: 4 whole cards with mixed_gpu_models may go 2 A100 (160 GiB) + 2 GH200
    # (192 GiB): within limits of 160 + 192 GiB though over each alone. It waits (the wait gate
    # counts the whole job on each class), pinned and floating; never rejected as "never".
    mix = services.cluster_create(actor=world.admin, name="mix", backend="simulated", inventory=MIX)
    services.inventory_sync(cluster=mix)

    def submit(name: str, cluster: Cluster | None) -> Job:
        return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster, name=name,
                                   groups=[gpu_group(gpu_count=1, replicas=4)], preemptible=True,
                                   mixed_gpu_models=True)

    pinned, floating = submit("pinned", mix), submit("floating", None)
    _project(world, gpu_memory_mib_limits_all_clusters={A100: 2 * CARD, "GH200-96G": 2 * 98304})
    services.cycle_run(cluster=mix)
    placement.placement_run()
    for job in (pinned, floating):
        job.refresh_from_db()
        assert job.state == JobState.QUEUED, (job.name, job.state, job.reason)
        assert "can never" not in job.reason and "can never" not in job.why_across_clusters
    assert pinned.reason.startswith("Over your project's A100-80G GPU memory limit across all clusters")
    # Lowered to 80 + 96 GiB: 4 cards hold 320 GiB at the least, more than 176 GiB: never.
    _project(world, gpu_memory_mib_limits_all_clusters={A100: CARD, "GH200-96G": 98304})
    services.cycle_run(cluster=mix)
    placement.placement_run()
    msg = ("320 GiB of GPU memory in all, more than the GPU memory limits on all clusters together of "
           "every GPU model class it may use (A100-80G, GH200-96G: 176 GiB in all)")
    assert _rejected(pinned).reason == f"The job asks {msg}: it can never start"
    assert msg in _rejected(floating).reason
