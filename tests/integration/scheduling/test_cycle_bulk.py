"""The bulk cycle's guarantees on real PostgreSQL (issue 13): between the snapshot and the
write, a job may be cancelled or a GPU released; the write must then skip that one job and
keep the rest. Writes are proportional to change: an idle cycle writes nothing, and the
statements of a cycle do not grow with the number of jobs it admits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import connection
from django.db.models import F

from scheduling import services
from scheduling.models import Allocation, GpuDevice, Job, JobState, SchedulingDecision
from tenants.audit import verify_chain

from .conftest import submit
from .test_concurrency import assert_consistent

pytestmark = pytest.mark.django_db


class _Statements:
    """Every SQL statement the connection runs inside the block."""

    def __init__(self) -> None:
        self.sql: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.sql.append(sql)
        return execute(sql, params, many, context)

    def writes(self, table: str) -> list[str]:
        return [s for s in self.sql if s.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))
                and table in s.split("(")[0].split(" SET ")[0]]


def test_job_cancelled_after_the_snapshot_is_never_admitted(world: Any, sim_cluster: Any) -> None:
    doomed = submit(world, sim_cluster, "doomed", group={"gpu_count": 1})
    other = submit(world, sim_cluster, "other", group={"gpu_count": 1})
    inputs, statuses = services._decide(sim_cluster, None)
    assert {s.job for s in statuses if s.kind == "admitted"} == {str(doomed.pk), str(other.pk)}
    services.job_cancel(actor=world.a.member, job=doomed)  # lands between decision and write
    summary = services._persist(sim_cluster, inputs, statuses)
    assert summary.admitted == [other.pk] and summary.conflicts == [doomed.pk]
    doomed.refresh_from_db()
    assert doomed.state == JobState.CANCELLED and not Allocation.objects.filter(job=doomed).exists()
    assert not SchedulingDecision.objects.filter(job=doomed, kind="admitted").exists()
    assert Job.objects.get(pk=other.pk).state == JobState.STARTING
    assert_consistent(sim_cluster, settled=False)


def test_gpu_released_after_the_snapshot_makes_only_its_job_wait(world: Any, sim_cluster: Any) -> None:
    # binpack: the second slice goes on the card the first one already uses
    services.cluster_update(actor=world.admin, cluster=sim_cluster, placement_policy="binpack")
    l4_slice = {"gpu_memory_mib": 10000, "gpu_cores_percent": 25, "gpu_models": ["L4"]}
    first = submit(world, sim_cluster, "first", group=l4_slice)
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=first.pk) == "created"
    card = Allocation.objects.get(job=first).slices.get().gpu_id
    second = submit(world, sim_cluster, "second", group=l4_slice)
    elsewhere = submit(world, sim_cluster, "elsewhere", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
    inputs, statuses = services._decide(sim_cluster, None)
    placed = {s.job: s.decision.placement for s in statuses if s.kind == "admitted"}  # type: ignore[union-attr]
    assert inputs.gpus[(placed[str(second.pk)].pods[0].node,
                        placed[str(second.pk)].pods[0].gpus[0].index)].pk == card
    # the first job ends and gives its slice back before the cycle writes
    services.job_cancel(actor=world.a.member, job=first)
    assert services.job_stop(job_id=first.pk) == "released"
    summary = services._persist(sim_cluster, inputs, statuses)
    assert summary.admitted == [elsewhere.pk] and summary.conflicts == [second.pk]
    second.refresh_from_db()
    assert second.state == JobState.QUEUED and "taken concurrently" in second.reason
    assert_consistent(sim_cluster, settled=False)
    # the next cycle, on a fresh snapshot, admits it
    assert services.cycle_run(cluster=sim_cluster).admitted == [second.pk]  # type: ignore[union-attr]
    assert_consistent(sim_cluster, settled=False)


def test_cycle_statements_do_not_grow_with_admissions(world: Any, sim_cluster: Any) -> None:
    def cycle_writes(n: int, prefix: str) -> tuple[int, int]:
        jobs = [submit(world, sim_cluster, f"{prefix}-{i}",
                       group={"gpu_memory_mib": 2000, "gpu_cores_percent": 5}) for i in range(n)]
        seen = _Statements()
        with connection.execute_wrapper(seen):
            summary = services.cycle_run(cluster=sim_cluster)
        assert summary is not None and sorted(summary.admitted) == sorted(j.pk for j in jobs)
        return len(seen.sql), len(seen.writes("scheduling_"))

    cycle_writes(1, "warm")  # from now on the snapshot holds allocations
    small = cycle_writes(2, "small")
    large = cycle_writes(8, "large")  # 8: the heads of one queue tried per cycle
    assert large == small
    assert_consistent(sim_cluster, settled=False)
    assert not list(verify_chain())


def test_idle_cycle_writes_no_job_and_no_decision(world: Any, sim_cluster: Any) -> None:
    for i in range(2):  # the two A100 nodes
        submit(world, sim_cluster, f"big-{i}", group={"gpu_count": 4})
    for i in range(4):
        submit(world, sim_cluster, f"waits-{i}", group={"gpu_count": 4})
    services.cycle_run(cluster=sim_cluster)
    before = SchedulingDecision.objects.count()
    totals = list(GpuDevice.objects.order_by("pk").values_list("memory_allocated_mib", "sharers"))
    seen = _Statements()
    with connection.execute_wrapper(seen):
        summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and len(summary.waiting) == 4 and not summary.admitted
    assert seen.writes("scheduling_job") == [] and seen.writes("scheduling_schedulingdecision") == []
    assert SchedulingDecision.objects.count() == before
    assert list(GpuDevice.objects.order_by("pk").values_list("memory_allocated_mib", "sharers")) == totals


def test_bulk_written_decisions_reach_live_pages(world: Any, sim_cluster: Any, settings: Any,
                                                  django_capture_on_commit_callbacks: Any) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    from portal.live import project_group

    # this process's own layer: the Redis one is shared with parallel test runs
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    assert layer is not None
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(project_group(world.a.project.pk), channel)
    jobs = [submit(world, sim_cluster, f"live-{i}", group={"gpu_count": 4}) for i in range(3)]
    from celery.signals import before_task_publish

    from portal.live import push_jobs

    published: list[list[int]] = []

    def seen(sender: str, body: Any, **kwargs: Any) -> None:
        if sender == "portal.tasks.live_push_jobs":
            published.append(body[0][0])

    before_task_publish.connect(seen)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            summary = services.cycle_run(cluster=sim_cluster)
    finally:
        before_task_publish.disconnect(seen)
    assert summary is not None and len(summary.admitted) == 2 and len(summary.waiting) == 1
    # a push task per bulk write (admissions, waits), queued after commit, not one per job;
    # run here what the worker runs
    assert len(published) <= 2 and sorted(sum(published, [])) == sorted(j.pk for j in jobs)
    assert sum(push_jobs(ids) for ids in published) == 3
    async def receive() -> Any:
        return await asyncio.wait_for(layer.receive(channel), timeout=5)

    pushed = {}
    for _ in range(3):
        message = async_to_sync(receive)()
        pushed[message["job"]["id"]] = message["job"]["state"]
    assert pushed == {jobs[0].pk: "starting", jobs[1].pk: "starting", jobs[2].pk: "queued"}


def test_idle_tick_reads_no_snapshot(world: Any, sim_cluster: Any) -> None:
    for i in range(2):
        submit(world, sim_cluster, f"runs-{i}", group={"gpu_count": 2})
    assert len(services.cycle_run(cluster=sim_cluster).admitted) == 2  # type: ignore[union-attr]
    seen = _Statements()
    with connection.execute_wrapper(seen):
        summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and not (summary.admitted or summary.waiting)
    assert not any("scheduling_node" in s or "scheduling_allocation" in s for s in seen.sql)
    assert len([s for s in seen.sql if "SAVEPOINT" not in s]) <= 5, seen.sql


@pytest.mark.parametrize("fill", [True, False])
def test_heads_follow_free_room(world: Any, sim_cluster: Any, settings: Any, fill: bool) -> None:
    """With room on the cluster a queue offers its share of the free GPUs, not just the
    configured heads; once the cluster is full the configured heads bound the cycle."""
    settings.SCHEDULER_HEADS_PER_QUEUE = 2
    settings.SCHEDULER_HEADS_FILL = fill
    jobs = [submit(world, sim_cluster, f"one-{i}", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
            for i in range(8)]
    summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None
    # the 8 A100s are free: all 8 offered and admitted at once (without fill: the first 2)
    assert sorted(summary.admitted) == sorted(j.pk for j in (jobs if fill else jobs[:2]))
    if fill:
        late = [submit(world, sim_cluster, f"late-{i}", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
                for i in range(4)]
        # only the 2 L4s free: the queue's share is 2 GPUs, so 2 are offered (and wait)
        _, statuses = services._decide(sim_cluster, None)
        kinds = {s.job: s.kind for s in statuses}
        assert [kinds[str(j.pk)] for j in late[2:]] == ["behind", "behind"]
    assert_consistent(sim_cluster, settled=False)


def test_room_held_by_other_schedulers_pods_is_not_free(world: Any, sim_cluster: Any, settings: Any) -> None:
    """Heads follow the room Camp may use: cards held by pods Camp did not create (another
    scheduler's) do not count as free, so a cluster they fill offers only the configured
    heads per queue."""
    settings.SCHEDULER_HEADS_PER_QUEUE = 2
    settings.SCHEDULER_HEADS_FILL = True
    jobs = [submit(world, sim_cluster, f"one-{i}", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
            for i in range(8)]

    def behind() -> int:
        _, statuses = services._decide(sim_cluster, None)
        kinds = {s.job: s.kind for s in statuses}
        return sum(kinds[str(j.pk)] == "behind" for j in jobs)

    assert behind() == 0  # 8 A100s + 2 L4s free: all 8 offered
    GpuDevice.objects.filter(node__cluster=sim_cluster, model="A100-80G").update(foreign_exclusive=True)
    GpuDevice.objects.filter(node__cluster=sim_cluster).exclude(model="A100-80G").update(
        foreign_memory_mib=F("memory_mib"), foreign_sharers=F("max_sharers"))
    assert behind() == 6  # nothing free for Camp: the configured 2 heads only


def test_victim_that_ended_after_the_snapshot_is_not_preempted(world: Any, sim_cluster: Any) -> None:
    """Preemptions are written in bulk: a victim cancelled between the decision and the write
    is left alone, and the preemptor's reason, decision and audit count only the others."""
    batch = [submit(world, sim_cluster, f"batch-{i}", priority_class="batch",
                    group={"gpu_count": 1, "gpu_models": ["A100-80G"]}) for i in range(8)]
    services.cycle_run(cluster=sim_cluster)
    for j in batch:
        assert services.job_dispatch(job_id=j.pk) == "created"
    urgent = submit(world, sim_cluster, "urgent", priority_class="high",
                    group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    inputs, statuses = services._decide(sim_cluster, None)
    [decision] = [s.decision for s in statuses if s.job == str(urgent.pk)]
    planned = [int(v) for v in decision.victims]  # type: ignore[union-attr]
    assert len(planned) == 4
    gone = Job.objects.get(pk=planned[0])
    services.job_cancel(actor=world.a.member, job=gone)  # lands between decision and write
    seen = _Statements()
    with connection.execute_wrapper(seen):
        summary = services._persist(sim_cluster, inputs, statuses)
    assert summary.preempting == [urgent.pk] and sorted(summary.victims) == sorted(planned[1:])
    assert len(seen.writes("\"scheduling_job\"")) == 2  # the victims, the preemptor: one statement each
    assert Job.objects.get(pk=gone.pk).state == JobState.CANCELLED
    assert sorted(Job.objects.filter(state=JobState.PREEMPTING, preempted_by=urgent)
                  .values_list("pk", flat=True)) == sorted(planned[1:])
    urgent.refresh_from_db()
    assert urgent.reason.startswith("Preempting 3 job(s)") and urgent.reason_kind == "preempting"
    preempting = SchedulingDecision.objects.get(job=urgent, kind="preempting")
    assert sorted(preempting.victims) == sorted(planned[1:])
    assert not SchedulingDecision.objects.filter(job=gone, kind="preempted").exists()
    assert SchedulingDecision.objects.filter(kind="preempted", preemptor=urgent).count() == 3
    for pk in planned:  # what the stop tasks queued after commit do
        assert services.job_stop(job_id=pk) == "released"
    assert_consistent(sim_cluster, settled=False)
    assert not list(verify_chain())


def test_preemption_whose_cards_were_taken_since_the_snapshot_evicts_nobody(
        world: Any, sim_cluster: Any) -> None:
    """Another scheduler's pod takes the preemptor's planned cards between the decision and
    the write (an inventory sync records it in the foreign columns): the running victim is
    not killed for nothing; the preemptor waits as an admission whose GPUs moved does."""
    l4 = {"gpu_count": 2, "gpu_models": ["L4"], "exclusive": True}
    low = submit(world, sim_cluster, "low", group=l4, priority_class="batch", preemptible=True)
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=low.pk) == "created"
    state_before = Job.objects.get(pk=low.pk).state
    high = submit(world, sim_cluster, "high", group=l4, priority_class="high")
    inputs, statuses = services._decide(sim_cluster, None)
    [decision] = [s.decision for s in statuses if s.job == str(high.pk)]
    assert [int(v) for v in decision.victims] == [low.pk]  # type: ignore[union-attr]
    cards = {inputs.gpus[(pp.node, g.index)].pk
             for pp in decision.placement.pods for g in pp.gpus}  # type: ignore[union-attr]
    GpuDevice.objects.filter(pk__in=cards).update(foreign_exclusive=True, foreign_sharers=1)
    summary = services._persist(sim_cluster, inputs, statuses)
    assert summary.preempting == [] and summary.victims == [] and summary.conflicts == [high.pk]
    low.refresh_from_db()
    assert low.state == state_before and low.preempted_by_id is None
    assert not SchedulingDecision.objects.filter(kind__in=["preempted", "preempting"]).exists()
    high.refresh_from_db()
    assert high.state == JobState.QUEUED and high.reason == services.CONFLICT_REASON
    assert high.reason_kind == "capacity"
    assert_consistent(sim_cluster, settled=False)
    assert not list(verify_chain())


def test_preemptor_cancelled_after_the_snapshot_evicts_nobody(world: Any, sim_cluster: Any) -> None:
    l4 = {"gpu_count": 2, "gpu_models": ["L4"], "exclusive": True}
    low = submit(world, sim_cluster, "low", group=l4, priority_class="batch", preemptible=True)
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=low.pk) == "created"
    state_before = Job.objects.get(pk=low.pk).state
    high = submit(world, sim_cluster, "high", group=l4, priority_class="high")
    inputs, statuses = services._decide(sim_cluster, None)
    assert [s.kind for s in statuses if s.job == str(high.pk)] == ["preempting"]
    services.job_cancel(actor=world.a.project_admin, job=high)  # lands between decision and write
    summary = services._persist(sim_cluster, inputs, statuses)
    assert summary.preempting == [] and summary.victims == [] and summary.conflicts == [high.pk]
    assert Job.objects.get(pk=low.pk).state == state_before
    assert Job.objects.get(pk=high.pk).state == JobState.CANCELLED
    assert not SchedulingDecision.objects.filter(kind__in=["preempted", "preempting"]).exists()
    assert_consistent(sim_cluster, settled=False)
