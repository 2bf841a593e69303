"""The job lifecycle table on the real services (PostgreSQL, the simulated backend): every state
change of a job is one row of ``lifecycle.TRANSITIONS`` and leaves exactly one history row and
one audit event, whose ``before`` is the state left (issue 29: STARTING→RUNNING wrote no audit
event; the requeue of a checkpoint-capable job whose pods all vanished was not audited)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from scheduling import services
from scheduling.models import Job, JobState, SimulatedPod
from scheduling.services.lifecycle import TRANSITIONS
from tenants.models import AuditEvent

from .conftest import submit

pytestmark = pytest.mark.django_db(transaction=True)

BY_AUDIT = {t.audit: t for t in TRANSITIONS.values()}


def _history(job: Job) -> list[tuple[str, Any]]:
    """The job's transitions as its audit log tells them: (action, state left)."""
    return [(e.action, (e.before or {}).get("state")) for e in AuditEvent.objects.filter(
        target_type="scheduling.job", target_id=str(job.pk), action__in=BY_AUDIT).order_by("id")]


def _assert_told_once(job: Job) -> None:
    """Each transition's decision kind recorded as many times as its audit event, and the
    audit events chain: each leaves the state the previous one entered."""
    kinds = list(job.decisions.order_by("id").values_list("kind", flat=True))
    history = _history(job)
    told = [BY_AUDIT[a].decision for a, _ in history]
    assert [k for k in kinds if k in {t.decision for t in TRANSITIONS.values()}] == told
    state = None
    for action, before in history:
        t = BY_AUDIT[action]
        if t.name != "submit":
            assert before == state and before in t.sources, (action, before, state)
        state = t.to
    job.refresh_from_db()
    assert job.state == state


def _pods(job: Job) -> Any:
    return SimulatedPod.objects.filter(labels__contains={"camp.io/job-id": str(job.pk)},
                                       deleted_at__isnull=True)


def test_a_job_that_starts_is_audited_at_every_step(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "steps", group={"replicas": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    # STARTING → RUNNING is in the audit log, once, by the scheduler.
    assert _history(job) == [("job.submitted", None), ("job.admitted", "queued"), ("job.started", "starting")]
    started = AuditEvent.objects.get(action="job.started", target_id=str(job.pk))
    assert started.actor_username == "scheduler" and started.tenant_id == job.tenant_id
    services.cluster_reconcile(cluster=sim_cluster)  # seen running again: nothing more
    _assert_told_once(job)
    services.job_cancel(actor=world.a.member, job=job)
    assert _history(job)[-1] == ("job.cancelled", "running")
    _assert_told_once(job)


def test_a_checkpointed_job_whose_pods_all_vanished_is_requeued_and_audited(
        world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "vanished", group={"replicas": 2}, checkpoint_capable=True)
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    services.cluster_reconcile(cluster=sim_cluster)
    # Every pod gone at once (a node wiped): nothing left to delete, the job is lost.
    _pods(job).update(deleted_at=timezone.now())
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and "pods were lost; requeued" in job.reason
    assert _history(job)[-1] == ("job.requeued", "running")
    _assert_told_once(job)


def test_a_preempted_job_and_its_preemptor_are_told_once_each(world: Any, sim_cluster: Any) -> None:
    from decimal import Decimal

    from tenants import services as tenant_services

    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_limit": Decimal(2)})
    batch = submit(world, sim_cluster, "batch", priority_class="batch", group={"gpu_count": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=batch.pk) == "created"
    services.cluster_reconcile(cluster=sim_cluster)
    urgent = submit(world, sim_cluster, "urgent", priority_class="high", group={"gpu_count": 2})
    services.cycle_run(cluster=sim_cluster)  # the bulk preemption
    services.job_stop(job_id=batch.pk)
    services.cycle_run(cluster=sim_cluster)  # the bulk admission
    assert [a for a, _ in _history(batch)] == [
        "job.submitted", "job.admitted", "job.started", "job.preempted", "job.requeued"]
    assert [a for a, _ in _history(urgent)] == ["job.submitted", "job.admitted"]
    for j in (batch, urgent):
        _assert_told_once(j)
