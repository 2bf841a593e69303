"""Cluster health (issue 16) on real PostgreSQL, as a user meets it: an unreachable or disabled
cluster takes no new work (its cycle admits and preempts nothing), its queued pinned jobs say
why they wait (API ``reason``, the job page, the ``why`` a CLI user reads), a job admitted just
before its cluster stopped answering is requeued without losing an attempt, a floating job goes
back to the global queue (also when an admin disables its only cluster), and everything resumes
once the cluster is back.

"east" and "west" are two simulated clusters (test_multicluster.py); a dead API server is a
real one: the cluster pointed at a closed local port (connection refused)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, Job, JobState, SchedulingDecision
from scheduling.services import dispatch as dispatch_mod
from scheduling.services import placement
from tenants.models import AuditEvent
from tests.conftest import client_for
from tests.integration.scheduling.test_multicluster import fill, two
from tests.integration.workspaces.conftest import advance

from .conftest import gpu_group

pytestmark = pytest.mark.django_db
__all__ = ["two"]  # the fixture, imported for pytest

SECRET_ERROR = ("Get https://admin:s3cret@10.0.0.9:6443/api/v1/pods?token=abc123&limit=5: dial tcp "
                "10.0.0.9:6443: connect: connection refused")


def submit(world: Any, name: str, *, cluster: Cluster | None = None, choice: dict[str, Any] | None = None,
           gpu_count: int = 1, **job: Any) -> Job:
    actor = world.a.project_admin if job.get("priority_class") == "high" else world.a.member
    return services.job_submit(actor=actor, project=world.a.project, cluster=cluster,
                               cluster_choice=choice or {}, name=name,
                               groups=[gpu_group(gpu_count=gpu_count)], **job)


def _seen(world: Any, job: Job) -> dict[str, Any]:
    """The job as its owner reads it through the REST API."""
    response = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/")
    assert response.status_code == 200
    data: dict[str, Any] = response.json()
    return data


def _page(world: Any, job: Job) -> str:
    return str(client_for(world.a.member).get(f"/scheduling/jobs/{job.pk}/").content.decode())


def _api_server_dies(cluster: Cluster) -> None:
    """The cluster's API server stops answering: a real connection refused on a closed port."""
    Cluster.objects.filter(pk=cluster.pk).update(backend="kubernetes", api_server="https://127.0.0.1:9")


def _api_server_back(cluster: Cluster) -> None:
    """It answers again (the simulated backend) and its reconcile records so."""
    Cluster.objects.filter(pk=cluster.pk).update(backend="simulated", api_server="")
    services.cluster_reachability_record(cluster_id=cluster.pk, error=None)
    cluster.refresh_from_db()


def test_an_unreachable_cluster_admits_and_preempts_nothing_and_its_pinned_job_says_why(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _ = two
    for i in range(2):  # east full of preemptible batch work, running
        submit(world, f"batch-{i}", cluster=east, gpu_count=4, priority_class="batch", preemptible=True)
    advance(east)
    assert Job.objects.filter(cluster=east, state=JobState.RUNNING).count() == 2
    # The cluster stops answering; then a high-priority job is pinned to it.
    services.cluster_reachability_record(cluster_id=east.pk, error=SECRET_ERROR)
    urgent = submit(world, "urgent", cluster=east, gpu_count=4, priority_class="high")
    for _ in range(3):
        summary = services.cycle_run(cluster=east)
        assert summary is not None and summary.admitted == [] and summary.preempting == []
    assert Job.objects.filter(cluster=east, state=JobState.RUNNING).count() == 2  # none preempted
    seen = _seen(world, urgent)
    assert seen["state"] == "queued" and seen["reason_kind"] == "cluster"
    assert seen["reason"].startswith("Cluster east is unreachable since ")
    assert "connection refused" in seen["reason"] and "it takes no new work" in seen["reason"]
    assert "s3cret" not in seen["reason"] and "abc123" not in seen["reason"]  # no secrets to users
    assert "Cluster east is unreachable since" in _page(world, urgent)
    assert "takes no new work" in dispatch_free_why(urgent)
    page = client_for(world.admin).get("/scheduling/clusters/").content.decode()
    assert "its cycle admits and preempts nothing" in page and "jobs pinned here wait" in page
    # Back: its next cycle preempts for the urgent job, as it would have.
    _api_server_back(east)
    services.cycle_run(cluster=east)
    seen = _seen(world, urgent)
    assert "unreachable" not in seen["reason"] and seen["reason_kind"] != "cluster", seen["reason"]
    assert Job.objects.filter(cluster=east, state=JobState.PREEMPTING).exists()


def dispatch_free_why(job: Job) -> str:
    """What ``camp why`` prints as "would start" (the hint of workspaces.selectors.job_why)."""
    from workspaces.selectors import job_why

    return str(job_why(Job.objects.get(pk=job.pk))["hint"])


def test_a_pinned_job_admitted_as_its_cluster_went_down_keeps_its_attempts_and_never_fails(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """The reviewer's reproduction (finding 1): it used to be requeued and readmitted until
    MAX_ATTEMPTS, then FAILED."""
    east, _ = two
    job = submit(world, "pinned", cluster=east, gpu_count=1)
    services.cycle_run(cluster=east)
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.attempts == 1
    _api_server_dies(east)
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "requeued"
    east.refresh_from_db()
    assert east.unreachable_since is not None  # the dispatch found it dead: no new work now
    seen = _seen(world, job)
    assert seen["state"] == "queued" and seen["attempts"] == 0, seen
    assert "Cluster east is unreachable" in seen["reason"] and "not counted" in seen["reason"]
    assert not job.allocations.exists()
    for _ in range(dispatch_mod.MAX_ATTEMPTS + 2):  # what the ticks do while it is down
        services.cycle_run(cluster=east)
        if Job.objects.get(pk=job.pk).state == JobState.STARTING:
            services.job_dispatch(job_id=job.pk, final_attempt=True)
    seen = _seen(world, job)
    assert seen["state"] == "queued" and seen["attempts"] == 0
    assert seen["reason"].startswith("Cluster east is unreachable since")
    assert not SchedulingDecision.objects.filter(job=job, kind="failed").exists()
    # It answers again: admitted, its pods created, one attempt counted.
    _api_server_back(east)
    advance(east)
    seen = _seen(world, job)
    assert seen["state"] == "running" and seen["attempts"] == 1, seen


def test_a_floating_job_admitted_as_its_cluster_went_down_goes_elsewhere_without_a_failure(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    job = submit(world, "floats", choice={"prefer": {"region": "eu-east"}}, gpu_count=1)
    assert placement.placement_run() is not None
    services.cycle_run(cluster=east)
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.STARTING
    _api_server_dies(east)
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "requeued"
    job.refresh_from_db()
    assert job.cluster_id is None and job.state == JobState.QUEUED and job.attempts == 0
    assert job.reason == "Back in the global queue: cluster east is unreachable"
    assert "failed" not in (job.cluster_choice or {})  # not one of its failures there
    placement.placement_run()
    advance(west)
    seen = _seen(world, job)
    assert seen["cluster"] == "west" and seen["state"] == "running" and seen["attempts"] == 1, seen
    assert "cluster east: unreachable since" in seen["why_across_clusters"]


def test_disabling_a_cluster_sends_its_floating_jobs_back_and_says_why_its_pinned_ones_wait(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, west)  # west full: its jobs wait
    only_west = submit(world, "only-west", choice={"clusters": ["west"]}, gpu_count=1)
    placement.placement_run()
    only_west.refresh_from_db()
    assert only_west.cluster == west and only_west.state == JobState.QUEUED
    pinned = submit(world, "pinned-west", cluster=west, gpu_count=1)
    services.cycle_run(cluster=west)
    assert _seen(world, pinned)["reason_kind"] != "cluster"
    # The admin disables west through the API (the console and the CLI use the same service).
    admin = client_for(world.admin)
    response = admin.patch(f"/api/v1/clusters/{west.pk}/", {"enabled": False}, format="json")
    assert response.status_code == 200, response.content
    seen = _seen(world, only_west)
    assert seen["cluster"] is None and seen["state"] == "queued"
    assert seen["reason"] == "Back in the global queue: cluster west is disabled"
    assert AuditEvent.objects.filter(action="job.unplaced", target_id=str(only_west.pk)).exists()
    assert AuditEvent.objects.filter(action="cluster.updated", target_id=str(west.pk)).exists()
    seen = _seen(world, pinned)
    assert seen["state"] == "queued" and seen["reason_kind"] == "cluster"
    assert seen["reason"].startswith("Cluster west is disabled; it takes no new work")
    assert "Cluster west is disabled" in _page(world, pinned)
    assert "Disabled: it takes no new work" in admin.get("/scheduling/clusters/").content.decode()
    assert SchedulingDecision.objects.filter(job=pinned, kind="waiting",
                                             reason__startswith="Cluster west is disabled").exists()
    # The global queue: the only cluster it may use is closed, so it waits there, saying so.
    placement.placement_run()
    seen = _seen(world, only_west)
    assert seen["cluster"] is None and "cluster west: disabled" in seen["reason"], seen["reason"]
    # Room on west and the admin enables it again: both start there.
    for j in Job.objects.filter(name__startswith="fill-west"):
        services.job_cancel(actor=world.a.member, job=j)
    response = admin.patch(f"/api/v1/clusters/{west.pk}/", {"enabled": True}, format="json")
    assert response.status_code == 200, response.content
    placement.placement_run()
    advance(west)
    for j in (only_west, pinned):
        seen = _seen(world, j)
        assert seen["cluster"] == "west" and seen["state"] == "running", seen


def test_a_disabled_clusters_pinned_job_says_why_on_its_training_jobs_why(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """What ``camp why`` prints (it reads /why/ of a training job)."""
    east, _ = two
    fill(world, east)
    api = client_for(world.a.member)
    made = api.post("/api/v1/training-jobs/", {
        "framework": "pytorch", "image_reference": "pytorch/pytorch:2.4", "workers": 1, "gpu_count": 1,
        "cpu_millicores": 1000, "ram_mib": 2048, "duration_seconds": 3600,
        "project": world.a.project.pk, "name": "train-east", "cluster": "east"}, format="json")
    assert made.status_code == 201, made.content
    services.cycle_run(cluster=east)
    services.cluster_update(actor=world.admin, cluster=Cluster.objects.get(pk=east.pk), enabled=False)
    why = api.get(f"/api/v1/training-jobs/{made.json()['id']}/why/").json()
    assert why["state"] == "queued" and why["reason"].startswith("Cluster east is disabled")
    assert "once the cluster is enabled or answers again" in why["hint"]
