"""The cycle's admission write (issue 29: one admission, not a bulk and a one-job copy): the
bulk write and its job-by-job fallback are the same write through the lifecycle's ``admit``,
and the GPUs' totals are those of the jobs actually admitted."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Sum

from scheduling import services
from scheduling.backends.naming import pod_name
from scheduling.models import Allocation, GpuDevice, GpuSlice, Job, JobState, Node
from tenants.models import AuditEvent

from .conftest import gpu_group, submit

pytestmark = pytest.mark.django_db(transaction=True)


def _totals_match_slices(cluster: Any) -> None:
    for gpu in GpuDevice.objects.filter(node__cluster=cluster):
        held = GpuSlice.objects.filter(gpu=gpu).aggregate(m=Sum("memory_mib"), c=Sum("cores_percent"))
        assert (gpu.memory_allocated_mib, gpu.cores_allocated, gpu.sharers) == (
            held["m"] or 0, held["c"] or 0, GpuSlice.objects.filter(gpu=gpu).count()), gpu


def test_a_refused_bulk_admission_admits_the_others_one_by_one(world: Any, sim_cluster: Any) -> None:
    first = submit(world, sim_cluster, "first", group={"gpu_count": 1})
    blocked = submit(world, sim_cluster, "blocked", group={"gpu_count": 1})
    # A leftover allocation (of an ended job) holds the pod name the second job's pod will take:
    # the bulk insert of the cycle's allocations is refused by the unique pod name.
    ended = submit(world, sim_cluster, "ended", group={"gpu_count": 0})
    Job.objects.filter(pk=ended.pk).update(cluster=sim_cluster)
    Allocation.objects.create(cluster=sim_cluster, job=ended, group=ended.groups.get(), replica=0,
                              pod_name=pod_name(blocked.name, blocked.pk, "worker", 0),
                              node=Node.objects.filter(cluster=sim_cluster).first())
    services.job_cancel(actor=world.a.member, job=ended)  # no pods: only its stale row is left
    summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and summary.admitted == [first.pk] and blocked.pk in summary.conflicts
    first.refresh_from_db()
    blocked.refresh_from_db()
    assert first.state == JobState.STARTING and blocked.state == JobState.QUEUED
    assert blocked.reason == services.CONFLICT_REASON
    # The one admitted is told once; the refused one's savepoint left nothing behind.
    assert AuditEvent.objects.filter(action="job.admitted", target_id=str(first.pk)).count() == 1
    assert not AuditEvent.objects.filter(action="job.admitted", target_id=str(blocked.pk)).exists()
    assert not blocked.allocations.exists()
    _totals_match_slices(sim_cluster)


def test_a_job_held_back_by_a_limit_across_clusters_adds_nothing_to_its_cards(
        world: Any, sim_cluster: Any) -> None:
    """Two half cards, the second over the tenant's limit across all clusters, judged in the
    write step: the card's totals are the first job's slice only (they counted both)."""
    from tenants import services as tenant_services

    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_limit_all_clusters": Decimal("0.5")})
    half = {"gpu_count": 1, "gpu_memory_mib": 40960, "gpu_cores_percent": 50, "gpu_models": ["A100-80G"]}
    a = submit(world, sim_cluster, "half-a", groups=[gpu_group(**half)])
    b = submit(world, sim_cluster, "half-b", groups=[gpu_group(**half)])
    services.cycle_run(cluster=sim_cluster)
    states = dict(Job.objects.filter(pk__in=[a.pk, b.pk]).values_list("pk", "state"))
    assert sorted(states.values()) == [JobState.QUEUED, JobState.STARTING]
    _totals_match_slices(sim_cluster)
