"""Job lifecycle on the real services (PostgreSQL; the simulated backend, whose pods live in
the database): redundant dispatches, lost pods of a gang, watched events racing a release
(issue 11, bugs 2, 3 and 7). The Kubernetes-facing variants run on the real apiserver in
tests/integration/realkube/."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from scheduling import services
from scheduling.backends.base import PodStatus
from scheduling.models import Allocation, GpuDevice, Job, JobState, SimulatedPod

from .conftest import submit

pytestmark = pytest.mark.django_db(transaction=True)


def _live_pods(job: Job) -> list[str]:
    return sorted(SimulatedPod.objects.filter(labels__contains={"camp.io/job-id": str(job.pk)},
                                              deleted_at__isnull=True).values_list("name", flat=True))


def _running(world: Any, cluster: Any, name: str, replicas: int = 3, **kw: Any) -> Job:
    job = submit(world, cluster, name, group={"replicas": replicas}, **kw)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


# --- bug 3: a second dispatch of a running job is a no-op -----------------------------------


class _WatchMarksRunning:
    """The real backend; before the last pod of a dispatch is created (again: 409, already
    there), the watcher on another connection sees every pod running and marks the job
    RUNNING — what a late, redundant dispatch meets on a live cluster."""

    def __init__(self, inner: Any, job_id: int, pods: int) -> None:
        self.inner, self.job_id, self.left = inner, job_id, pods

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_pod(self, spec: Any) -> Any:
        self.left -= 1
        if self.left == 0:
            def mark() -> None:
                try:
                    Job.objects.filter(pk=self.job_id).update(state=JobState.RUNNING,
                                                              started_at=timezone.now())
                finally:
                    connection.close()

            t = threading.Thread(target=mark)
            t.start()
            t.join(timeout=30)
        return self.inner.create_pod(spec)


def test_a_redundant_dispatch_finding_the_job_running_leaves_it_running(
        world: Any, sim_cluster: Any, monkeypatch: Any) -> None:
    job = submit(world, sim_cluster, "ddp", group={"replicas": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"  # the first dispatch
    pods = _live_pods(job)
    assert len(pods) == 2
    # A redelivered copy of the same dispatch starts while the job is still STARTING...
    real = services.dispatch.backend_for
    monkeypatch.setattr(services.dispatch, "backend_for",
                        lambda c: _WatchMarksRunning(real(c), job.pk, pods=2))
    outcome = services.job_dispatch(job_id=job.pk)
    # ...and finds it RUNNING at the end: nothing to undo, the job keeps its pods and GPUs.
    assert outcome == "running"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert _live_pods(job) == pods
    assert Allocation.objects.filter(job=job).count() == 2
    assert services.job_dispatch(job_id=job.pk) == "skipped"  # later copies: not even a look


def test_a_dispatch_that_fails_on_a_running_job_deletes_nothing(
        world: Any, sim_cluster: Any, monkeypatch: Any) -> None:
    """A redundant dispatch whose create fails (the API server hiccups) while the job is
    running must not "clean up" the job's pods."""
    from scheduling.backends.base import BackendError

    job = submit(world, sim_cluster, "ddp2", group={"replicas": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    real = services.dispatch.backend_for

    class Failing(_WatchMarksRunning):
        def create_pod(self, spec: Any) -> Any:
            super().create_pod(spec)
            raise BackendError("Kubernetes API answered 500", status=500, retryable=True)

    monkeypatch.setattr(services.dispatch, "backend_for", lambda c: Failing(real(c), job.pk, pods=1))
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "running"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and len(_live_pods(job)) == 2


# --- bug 2: a lost pod of a gang restarts (or ends) the whole gang ---------------------------


def test_a_deleted_pod_of_a_running_gang_requeues_the_whole_gang(world: Any, sim_cluster: Any) -> None:
    job = _running(world, sim_cluster, "gang", checkpoint_capable=True)
    services.job_checkpoint_record(job=job, path="/ckpt/step-100")
    lost = _live_pods(job)[1]
    # kubectl delete pod (or an eviction): the pod is gone, the job's other pods still run.
    SimulatedPod.objects.filter(name=lost).update(deleted_at=timezone.now())
    result = services.cluster_reconcile(cluster=sim_cluster)
    assert result.lost == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING
    assert f"pod {lost} was lost" in job.reason
    # Its other pods are stopped and its GPUs released; it waits in the queue to restart
    # from its checkpoint.
    services.job_stop(job_id=job.pk)
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.reason.startswith(f"Requeued: pod {lost} was lost")
    assert "resumes from its latest checkpoint" in job.reason
    assert _live_pods(job) == [] and not job.allocations.exists()
    assert not GpuDevice.objects.filter(node__cluster=sim_cluster, sharers__gt=0).exists()
    assert list(job.decisions.order_by("-id").values_list("kind", flat=True)[:2]) == [
        "requeued", "preempted"]
    from tenants.models import AuditEvent

    assert AuditEvent.objects.filter(action="job.evicted", target_id=str(job.pk)).exists()
    # And it restarts: admitted again, its pods resume from the checkpoint.
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    envs = [p.annotations["camp.io/env"] for p in SimulatedPod.objects.filter(
        labels__contains={"camp.io/job-id": str(job.pk)}, deleted_at__isnull=True)]
    assert {e["CAMP_RESUME_FROM"] for e in envs} == {"/ckpt/step-100"}


def test_a_gang_that_keeps_losing_pods_fails_with_the_reason(world: Any, sim_cluster: Any) -> None:
    job = _running(world, sim_cluster, "flaky", replicas=2)
    Job.objects.filter(pk=job.pk).update(attempts=services.MAX_ATTEMPTS)
    for pod in SimulatedPod.objects.filter(name__in=_live_pods(job)):  # made by its last attempt
        pod.labels = {**pod.labels, "camp.io/attempt": str(services.MAX_ATTEMPTS)}
        pod.save(update_fields=["labels"])
    lost = _live_pods(job)[0]
    SimulatedPod.objects.filter(name=lost).update(deleted_at=timezone.now())
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    assert job.reason.startswith(f"Pod {lost} was lost") and "failed after 5 attempts" in job.reason


def test_the_watcher_seeing_one_pod_deleted_restarts_the_gang(world: Any, sim_cluster: Any) -> None:
    job = _running(world, sim_cluster, "watched")
    view = {p.name: p for p in services.dispatch.backend_for(sim_cluster).list_pods()}
    lost = _live_pods(job)[2]
    del view[lost]
    assert services.pod_event_apply(cluster=sim_cluster, pod_name=lost, pods=view,
                                    deleted=True) == "lost"
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and lost in job.reason


def test_the_watcher_does_not_take_a_partial_view_for_lost_pods(world: Any, sim_cluster: Any) -> None:
    """After a (re)list, the watcher applies pods one by one: a view holding only the first
    pod of a gang is not a loss of the others."""
    job = _running(world, sim_cluster, "partial")
    first = next(p for p in services.dispatch.backend_for(sim_cluster).list_pods()
                 if p.name == _live_pods(job)[0])
    assert services.pod_event_apply(cluster=sim_cluster, pod_name=first.name,
                                    pods={first.name: first}) == "observed"
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


# --- bug 7: a watched event whose job is released meanwhile ----------------------------------


def test_a_pod_event_whose_allocations_are_released_meanwhile(world: Any, sim_cluster: Any) -> None:
    """Between pod_event_apply's two queries another worker releases the job (its stop
    completes): the event is applied without error (it crashed the watcher with IndexError)."""
    job = _running(world, sim_cluster, "evicted", replicas=1)
    pod = _live_pods(job)[0]
    services.job_evict(job_id=job.pk, reason="node drained")
    SimulatedPod.objects.filter(name=pod).update(deleted_at=timezone.now())
    released: dict[str, Any] = {}

    def release_after_first_lookup(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        out = execute(sql, params, many, context)
        if "scheduling_allocation" in sql and "LIMIT 1" in sql and not released:
            def other_worker() -> None:
                try:
                    released["ok"] = services._pods_gone(job.pk)
                finally:
                    connection.close()

            t = threading.Thread(target=other_worker)
            t.start()
            t.join(timeout=30)
        return out

    with connection.execute_wrapper(release_after_first_lookup):
        outcome = services.pod_event_apply(cluster=sim_cluster, pod_name=pod, pods={}, deleted=True)
    assert released == {"ok": True}
    assert outcome == "released-meanwhile"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and not job.allocations.exists()


def test_pod_status_of_an_unknown_pod_is_ignored(sim_cluster: Any) -> None:
    stray = PodStatus(name="stray", namespace="x", phase="Running", labels={})
    assert services.pod_event_apply(cluster=sim_cluster, pod_name="stray",
                                    pods={"stray": stray}) == "ignored"


# --- bug 4: a job held back by its own project's limit preempts that project's batch jobs ------


def test_an_urgent_job_held_by_its_projects_limit_preempts_its_batch_jobs(
        world: Any, sim_cluster: Any) -> None:
    from decimal import Decimal

    from tenants import services as tenant_services

    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_limit": Decimal(2)})
    batch = submit(world, sim_cluster, "batch", priority_class="batch", group={"gpu_count": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=batch.pk) == "created"
    services.cluster_reconcile(cluster=sim_cluster)
    urgent = submit(world, sim_cluster, "urgent", priority_class="high", group={"gpu_count": 2})
    services.cycle_run(cluster=sim_cluster)
    batch.refresh_from_db()
    urgent.refresh_from_db()
    assert batch.state == JobState.PREEMPTING
    assert batch.reason == f"Preempted by job urgent (#{urgent.pk}, priority high)"
    assert urgent.state == JobState.QUEUED and urgent.reason.startswith("Preempting 1 job(s)")
    services.job_stop(job_id=batch.pk)
    services.cycle_run(cluster=sim_cluster)
    urgent.refresh_from_db()
    batch.refresh_from_db()
    assert urgent.state == JobState.STARTING and batch.state == JobState.QUEUED
    from tenants.models import AuditEvent

    assert AuditEvent.objects.filter(action="job.preempted", target_id=str(batch.pk)).exists()
