"""The scheduling cycle on real PostgreSQL: decisions persisted, allocations guarded."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from scheduling import services
from scheduling.models import Allocation, GpuDevice, Job, JobState, SchedulingDecision
from tenants.models import AuditEvent

from .conftest import gpu_group, submit

pytestmark = pytest.mark.django_db


def _refresh(*jobs: Any) -> None:
    for j in jobs:
        j.refresh_from_db()


def test_inventory_from_yaml(sim_cluster: Any) -> None:
    assert sim_cluster.nodes.count() == 3
    assert GpuDevice.objects.filter(node__cluster=sim_cluster).count() == 10
    a100 = sim_cluster.nodes.get(name="a100-0")
    assert a100.nvlink_islands == [[0, 1, 2, 3]]
    assert {g.model for g in a100.gpus.all()} == {"A100-80G"}


def test_admit_allocates_rows_and_gpu_totals(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "half", group={"gpu_memory_mib": 40960, "gpu_cores_percent": 50})
    summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and summary.admitted == [job.pk]
    job.refresh_from_db()
    assert job.state == JobState.STARTING
    alloc = Allocation.objects.get(job=job)
    gpu_slice = alloc.slices.get()
    assert (gpu_slice.memory_mib, gpu_slice.cores_percent) == (40960, 50)
    gpu = gpu_slice.gpu
    assert (gpu.memory_allocated_mib, gpu.cores_allocated, gpu.sharers) == (40960, 50, 1)
    kinds = list(SchedulingDecision.objects.filter(job=job).order_by("id").values_list("kind", flat=True))
    assert kinds == ["submitted", "admitted"]
    assert AuditEvent.objects.filter(action="job.admitted", target_id=str(job.pk)).exists()


def test_database_refuses_an_over_allocated_gpu(world: Any, sim_cluster: Any) -> None:
    gpu = GpuDevice.objects.filter(node__name="l4-0").first()
    assert gpu is not None
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuDevice.objects.filter(pk=gpu.pk).update(memory_allocated_mib=gpu.memory_mib + 1)
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuDevice.objects.filter(pk=gpu.pk).update(sharers=2, exclusive_held=True)


def test_waiting_job_gets_reason_and_position(world: Any, sim_cluster: Any) -> None:
    big = [submit(world, sim_cluster, f"full-{i}", group={"gpu_count": 4}) for i in range(2)]
    waiting = [submit(world, sim_cluster, f"more-{i}", group={"gpu_count": 4}) for i in range(2)]
    services.cycle_run(cluster=sim_cluster)
    _refresh(*big, *waiting)
    assert [j.state for j in big] == [JobState.STARTING] * 2
    assert [j.state for j in waiting] == [JobState.QUEUED] * 2
    assert [j.queue_position for j in waiting] == [1, 2]
    assert all(j.queue_length == 2 for j in waiting)
    assert "4 GPU" in waiting[0].reason and "1st of 2" in waiting[0].reason


def test_never_fitting_job_is_rejected_with_reason(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "huge", group={"gpu_count": 16})
    services.cycle_run(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.REJECTED
    assert "No node can ever fit" in job.reason


def test_simulated_job_runs_to_success_and_releases(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "short", duration_seconds=1, group={"gpu_count": 2})
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.started_at is not None
    from scheduling.models import SimulatedPod
    SimulatedPod.objects.filter(cluster=sim_cluster).update(finish_at=job.started_at)
    services.cluster_reconcile(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    # job_stop (queued by reconcile) deletes the pods and gives the GPUs back
    services.job_stop(job_id=job.pk)
    services.cluster_reconcile(cluster=sim_cluster)
    assert not Allocation.objects.filter(job=job).exists()
    assert sum(GpuDevice.objects.values_list("sharers", flat=True)) == 0


def test_priority_preemption_waits_for_release(world: Any, sim_cluster: Any) -> None:
    batch = [submit(world, sim_cluster, f"batch-{i}", priority_class="batch",
                    group={"gpu_count": 4}) for i in range(2)]
    small = submit(world, sim_cluster, "l4", priority_class="batch", group={"gpu_count": 2,
                                                                           "gpu_models": ["L4"]})
    services.cycle_run(cluster=sim_cluster)
    for j in (*batch, small):
        services.job_dispatch(job_id=j.pk)
    urgent = submit(world, sim_cluster, "urgent", priority_class="high", group={"gpu_count": 4})
    summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and summary.preempting == [urgent.pk]
    victim = Job.objects.get(pk=summary.victims[0])
    assert victim.state == JobState.PREEMPTING and victim.preempted_by_id == urgent.pk
    urgent.refresh_from_db()
    assert urgent.state == JobState.QUEUED and "Preempting 1 job" in urgent.reason
    # Until the victim's pods are gone, the preemptor does not start (and nobody else is evicted).
    again = services.cycle_run(cluster=sim_cluster)
    assert again is not None and again.victims == [] and again.admitted == []
    assert services.job_stop(job_id=victim.pk) == "released"
    victim.refresh_from_db()
    assert victim.state == JobState.QUEUED and "Preempted by job urgent" in victim.reason
    services.cycle_run(cluster=sim_cluster)
    urgent.refresh_from_db()
    assert urgent.state == JobState.STARTING
    assert SchedulingDecision.objects.filter(job=victim, kind="preempted", preemptor=urgent).exists()


def test_cancel_queued_and_running(world: Any, sim_cluster: Any) -> None:
    running = submit(world, sim_cluster, "run", group={"gpu_count": 1})
    services.cycle_run(cluster=sim_cluster)
    services.job_dispatch(job_id=running.pk)
    queued = submit(world, sim_cluster, "later", group={"gpu_count": 1})
    services.job_cancel(actor=world.a.member, job=queued)
    services.job_cancel(actor=world.a.member, job=running)
    _refresh(queued, running)
    assert queued.state == running.state == JobState.CANCELLED
    services.job_stop(job_id=running.pk)
    assert not Allocation.objects.filter(job=running).exists()


def test_unhealthy_gpu_quarantines_node_and_reschedules(world: Any, sim_cluster: Any) -> None:
    from .conftest import SMALL_INVENTORY

    job = submit(world, sim_cluster, "ck", checkpoint_capable=True,
                 group={"gpu_count": 2, "gpu_models": ["L4"]})
    services.cycle_run(cluster=sim_cluster)
    services.job_dispatch(job_id=job.pk)
    sim_cluster.inventory = SMALL_INVENTORY.replace(
        "memory_mib: 23034}", "memory_mib: 23034, unhealthy: [1]}")
    sim_cluster.save()
    result = services.inventory_sync(cluster=sim_cluster)
    assert result.quarantined == ["l4-0"] and result.evicted_jobs == [job.pk]
    services.job_stop(job_id=job.pk)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and "checkpoint" in job.reason
    services.cycle_run(cluster=sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # the only L4 node is quarantined


def test_bad_group_input_names_the_field(world: Any, sim_cluster: Any) -> None:
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as exc:
        submit(world, sim_cluster, "bad", groups=[gpu_group(gpu_cores_percent=150)])
    assert "groups[0].gpu_cores_percent" in exc.value.message_dict
