"""Preemption across tenants names no foreign job (real services, real PostgreSQL): the
victim's reason, decisions, audit and live pages say why without naming the preemptor;
the API and console show the preemptor (and victims) only to those who may see them."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, SchedulingDecision
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import submit

pytestmark = pytest.mark.django_db


def _fill_and_preempt(world: Any, cluster: Any, *, side: str) -> tuple[Job, Job]:
    """acme fills the A100s with batch jobs; ``side`` submits a high-priority job for them."""
    batch = [submit(world, cluster, f"acme-batch-{i}", priority_class="batch",
                    group={"gpu_count": 4, "gpu_models": ["A100-80G"]}) for i in range(2)]
    services.cycle_run(cluster=cluster)
    for j in batch:
        assert services.job_dispatch(job_id=j.pk) == "created"
    urgent = submit(world, cluster, "globex-secret-plan", side=side, priority_class="high",
                    group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    summary = services.cycle_run(cluster=cluster)
    assert summary is not None and summary.preempting == [urgent.pk], summary
    victim = Job.objects.get(pk=summary.victims[0])
    assert victim.state == JobState.PREEMPTING and victim.preempted_by_id == urgent.pk
    urgent.refresh_from_db()
    return victim, urgent


def _leaks(text: str, urgent: Job) -> bool:
    return "globex-secret-plan" in text or f"#{urgent.pk}" in text


def test_victim_of_another_tenant_is_not_told_the_preemptor(world: Any, sim_cluster: Any) -> None:
    victim, urgent = _fill_and_preempt(world, sim_cluster, side="b")
    assert victim.reason == "Preempted by a higher-priority job of another tenant"
    decision = SchedulingDecision.objects.get(job=victim, kind="preempted")
    assert decision.reason == victim.reason and decision.preemptor_id == urgent.pk  # row keeps it
    audit = AuditEvent.objects.get(action="job.preempted", target_id=str(victim.pk))
    assert audit.after["preemptor"] is None and not _leaks(str(audit.after), urgent)
    # the preemptor's side names no foreign victim either
    assert f"#{victim.pk}" not in urgent.reason and "1 of other projects or tenants" in urgent.reason
    mine = AuditEvent.objects.get(action="job.preempting", target_id=str(urgent.pk))
    assert mine.after == {"victims": [], "victims_of_other_tenants": 1}

    from portal.live import job_payload

    assert not _leaks(str(job_payload(victim)), urgent)

    # API: acme sees its job preempted, without the preemptor's id anywhere
    acme = client_for(world.a.member)
    job = acme.get(f"/api/v1/jobs/{victim.pk}/").json()
    assert job["preempted_by"] is None and job["last_decision"]["preemptor"] is None
    assert not _leaks(str(job), urgent)
    history = acme.get(f"/api/v1/jobs/{victim.pk}/decisions/").json()["results"]
    assert [d["preemptor"] for d in history if d["kind"] == "preempted"] == [None]
    assert not _leaks(str(history), urgent)
    # …nor globex the victim's id in its own job's decisions
    theirs = client_for(world.b.member).get(f"/api/v1/jobs/{urgent.pk}/decisions/").json()
    assert [d["victims"] for d in theirs["results"] if d["kind"] == "preempting"] == [[]]
    # platform admins see who preempted whom
    admin = client_for(world.admin).get(f"/api/v1/jobs/{victim.pk}/decisions/").json()["results"]
    assert [d["preemptor"] for d in admin if d["kind"] == "preempted"] == [urgent.pk]

    # console: no link to (or name of) the foreign job
    page = client_for(world.a.member).get(f"/scheduling/jobs/{victim.pk}/").content.decode()
    assert "another tenant" in page and "globex-secret-plan" not in page
    assert f"/scheduling/jobs/{urgent.pk}/" not in page

    # once released and requeued, still unnamed
    assert services.job_stop(job_id=victim.pk) == "released"
    victim.refresh_from_db()
    assert victim.state == JobState.QUEUED and not _leaks(victim.reason, urgent)
    assert victim.reason.startswith("Preempted by a higher-priority job of another tenant; requeued")
    requeued = SchedulingDecision.objects.get(job=victim, kind="requeued")
    assert not _leaks(requeued.reason, urgent)


def test_same_project_preemptor_is_named_and_linked(world: Any, sim_cluster: Any) -> None:
    victim, urgent = _fill_and_preempt(world, sim_cluster, side="a")
    assert victim.reason == f"Preempted by job globex-secret-plan (#{urgent.pk}, priority high)"
    assert f"(#{victim.pk})" in urgent.reason
    acme = client_for(world.a.member)
    assert acme.get(f"/api/v1/jobs/{victim.pk}/").json()["preempted_by"] == urgent.pk
    page = acme.get(f"/scheduling/jobs/{victim.pk}/").content.decode()
    assert f"/scheduling/jobs/{urgent.pk}/" in page


def test_reclaimed_guarantee_and_other_project_wordings(world: Any) -> None:
    victim = Job(name="borrower", tenant=world.a.tenant, project=world.a.project, priority=50)
    other_tenant = Job(pk=991, name="owner-job", tenant=world.b.tenant, project=world.b.project,
                       priority=50, priority_class="normal")
    sibling = Job(pk=992, name="sibling-job", tenant=world.a.tenant, project=world.a.other_project,
                  priority=90, priority_class="high")
    reclaim = services._preempted_reason(victim, other_tenant)
    assert reclaim == ("Preempted: the capacity it borrowed was reclaimed by the owner of the "
                       "guaranteed capacity (another tenant)")
    assert services._preempted_reason(victim, sibling) == (
        "Preempted by a higher-priority job of another project")
