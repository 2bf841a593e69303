"""The platform level of the queue tree (issue 16), beyond the GPU limit across all clusters: GPU
memory limits per GPU model class across all clusters, on real PostgreSQL with two simulated
clusters (also racing, on two connections)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, GpuSlice, Job, JobState
from tenants import services as tenant_services

from .conftest import gpu_group, race_cycles
from .test_multicluster import EAST, WEST

pytestmark = pytest.mark.django_db

A100 = "A100-80G"
CARD = 81920  # MiB of one A100-80G card
EAST2 = EAST.replace("east-a100-", "east2-a100-")  # a second cluster of the same class


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST)
    for c in (east, west):
        services.inventory_sync(cluster=c)
    return east, west


def _quota(world: Any, project: Any, **values: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="project", project=project, values=values)


def _submit(world: Any, name: str, cluster: Cluster | None, gpus: int, *, side: str = "a",
            project: Any = None, preemptible: bool = True) -> Job:
    tw = getattr(world, side)
    return services.job_submit(actor=tw.owner, project=project or tw.project, cluster=cluster, name=name,
                               groups=[gpu_group(gpu_count=gpus)], preemptible=preemptible)


def _state(job: Job) -> str:
    job.refresh_from_db()
    return str(job.state)


def _race(clusters: tuple[Cluster, Cluster]) -> None:
    race_cycles(clusters)


# --- GPU memory limits per GPU model class across all clusters ----------------------------------


@pytest.mark.django_db(transaction=True)
def test_racing_cycles_keep_a_class_memory_limit(world: Any) -> None:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    east2 = services.cluster_create(actor=world.admin, name="east2", backend="simulated", inventory=EAST2)
    for c in (east, east2):
        services.inventory_sync(cluster=c)
    _quota(world, world.a.project, gpu_memory_mib_limits_all_clusters={A100: 4 * CARD})
    for i in range(2):
        _submit(world, f"e{i}", east, 2)
        _submit(world, f"f{i}", east2, 2)
    _race((east, east2))
    held = GpuSlice.objects.filter(allocation__job__project=world.a.project)
    assert sum(s.memory_mib for s in held) == 4 * CARD
    waiting = Job.objects.filter(project=world.a.project, state=JobState.QUEUED)
    assert waiting.count() == 2
    for j in waiting:
        assert f"{A100.lower()} gpu memory limit across all clusters: 320 gib of 320 gib in use" \
            in j.reason.lower()


def test_a_job_over_a_class_memory_limit_waits_with_the_class_named(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    _quota(world, world.a.project, gpu_memory_mib_limits_all_clusters={A100: 3 * CARD})
    first = _submit(world, "first", east, 2)
    second = _submit(world, "second", east, 2)
    services.cycle_run(cluster=east)
    assert _state(first) == JobState.STARTING and _state(second) == JobState.QUEUED
    assert second.reason == ("Over your project's A100-80G GPU memory limit across all clusters: "
                             "160 GiB of 240 GiB in use (it asks 160 GiB)")
    assert second.reason_kind == "quota"
    # Another project of the tenant, and the other class, are not bound by it.
    other = _submit(world, "other", east, 4, project=world.a.other_project)
    on_west = _submit(world, "west", west, 4)
    services.cycle_run(cluster=east)
    services.cycle_run(cluster=west)
    assert _state(other) == JobState.STARTING and _state(on_west) == JobState.STARTING


def test_a_floating_job_over_a_class_memory_limit_waits_with_the_class_named(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from scheduling.services import placement

    east, west = two
    _quota(world, world.a.project,
           gpu_memory_mib_limits_all_clusters={A100: 4 * CARD, "GH200-96G": 0})
    held = _submit(world, "held", east, 4)
    services.cycle_run(cluster=east)
    assert _state(held) == JobState.STARTING
    floating = _submit(world, "floating", None, 1)
    placement.placement_run()
    floating.refresh_from_db()
    assert floating.cluster is None and floating.state == JobState.QUEUED  # bound nowhere
    assert ("cluster east: over your project's A100-80G GPU memory limit across all clusters: "
            "320 GiB of 320 GiB in use") in floating.reason
    assert "cluster west: over your project's GH200-96G GPU memory limit" in floating.reason
    # Room on one class: it goes there.
    _quota(world, world.a.project, gpu_memory_mib_limits_all_clusters={A100: 4 * CARD, "GH200-96G": 98304})
    placement.placement_run()
    floating.refresh_from_db()
    assert floating.cluster == west


def test_a_class_over_its_limit_leaves_the_other_class_on_the_same_cluster(world: Any) -> None:
    mixed = EAST + """  - name: east-h100-{i}
    count: 1
    cpu_cores: 64
    ram_gib: 512
    labels: {kubernetes.io/arch: amd64}
    gpus: {model: H100-80G, count: 4, memory_mib: 81920}
"""
    c = services.cluster_create(actor=world.admin, name="mixed", backend="simulated", inventory=mixed)
    services.inventory_sync(cluster=c)
    _quota(world, world.a.project, gpu_memory_mib_limits_all_clusters={A100: 0})
    job = _submit(world, "j", c, 2)
    services.cycle_run(cluster=c)
    assert _state(job) == JobState.STARTING
    models = set(GpuSlice.objects.filter(allocation__job=job).values_list("gpu__model", flat=True))
    assert models == {"H100-80G"}


# --- The GPU guarantee across all clusters (split into per-cluster parts) -----------------------


def _guarantee(world: Any, total: int, *, tenant: Any = None, project: Any = None) -> None:
    """A tenant guarantee across all clusters of ``total`` for tenant a, and, when ``project``
    is given, the project's."""
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=tenant or world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": total})
    if project is not None:
        _quota(world, project, gpus_guaranteed_all_clusters=total)


def _fill_with_borrowers(world: Any, clusters: tuple[Cluster, ...],
                         priority_class: str = "normal") -> list[Job]:
    """Tenant b (no guarantee: everything it runs borrows) fills every cluster, preemptible."""
    jobs = []
    for c in clusters:
        for i in range(2):
            jobs.append(services.job_submit(actor=world.b.owner, project=world.b.project, cluster=c,
                                            name=f"borrow-{c.name}-{i}", groups=[gpu_group(gpu_count=4)],
                                            preemptible=True, priority_class=priority_class))
        services.cycle_run(cluster=c)
    assert all(_state(j) == JobState.STARTING for j in jobs)
    return jobs


def _evicted(world: Any) -> int:
    """GPUs of tenant b's jobs being preempted (or preempted and requeued) so far."""
    return 4 * Job.objects.filter(tenant=world.b.tenant).exclude(
        state__in=[JobState.STARTING, JobState.RUNNING]).count()


def _east2(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    east2 = services.cluster_create(actor=world.admin, name="east2", backend="simulated", inventory=EAST2)
    for c in (east, east2):
        services.inventory_sync(cluster=c)
    return east, east2


def test_a_guarantee_of_4_across_two_full_clusters_evicts_at_most_4_gpus(world: Any) -> None:
    # Defect 1 of the first design: each cluster counted the whole guarantee (4 − 0 held
    # elsewhere), so both cycles reclaimed 4 — 8 GPUs evicted for a guarantee of 4.
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east, east2))
    _guarantee(world, 4, project=world.a.project)
    mine = [_submit(world, "mine-east", east, 4), _submit(world, "mine-east2", east2, 4)]
    for _ in range(2):
        services.cycle_run(cluster=east)
        services.cycle_run(cluster=east2)
    assert _evicted(world) == 4
    waiting = [j for j in mine if "Preempting" not in (j.refresh_from_db() or j.reason)]
    assert len(waiting) == 1  # the other waits: its project's guarantee is being reclaimed elsewhere
    # Once the reclaimed GPUs are free, the preemptor starts and nothing more is evicted.
    for victim in Job.objects.filter(tenant=world.b.tenant, state=JobState.PREEMPTING):
        services.job_stop(job_id=victim.pk)
    for _ in range(2):
        services.cycle_run(cluster=east)
        services.cycle_run(cluster=east2)
    assert _evicted(world) == 4
    assert sorted(_state(j) for j in mine) == [JobState.QUEUED, JobState.STARTING]


@pytest.mark.django_db(transaction=True)
def test_two_cycles_racing_on_two_clusters_evict_at_most_the_guarantee(world: Any) -> None:
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east, east2))
    _guarantee(world, 4, project=world.a.project)
    _submit(world, "mine-east", east, 4)
    _submit(world, "mine-east2", east2, 4)
    for _ in range(2):
        _race((east, east2))
    assert _evicted(world) == 4


def test_the_admission_re_checks_a_reclaim_decided_on_a_stale_split(world: Any) -> None:
    # Both cycles decide before either commits, on splits that disagree (a job of a higher
    # priority became the project's head on east2 in between): each engine reclaims 4 on its
    # cluster. The re-check under the per-tenant lock lets only the first through.
    from scheduling.services import cycle as cycle_service

    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east, east2), priority_class="high")
    _guarantee(world, 4, project=world.a.project)
    first = _submit(world, "first", east, 4)
    decided_east = cycle_service._decide(east, None)
    second = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east2, name="second",
                                 groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    decided_east2 = cycle_service._decide(east2, None)
    assert [type(st.decision).__name__ for st in decided_east[1] if st.job == str(first.pk)] == ["Preempt"]
    assert [type(st.decision).__name__ for st in decided_east2[1] if st.job == str(second.pk)] == ["Preempt"]
    cycle_service._persist(east, *decided_east)
    cycle_service._persist(east2, *decided_east2)
    assert _evicted(world) == 4
    second.refresh_from_db()
    assert second.state == JobState.QUEUED and second.reason_kind == "guarantee"
    assert second.reason.startswith(
        "Your project's GPU guarantee across all clusters is held or being reclaimed on other clusters: "
        "with it, 8 GPUs beyond the per-cluster guarantee on all clusters, of 4 (it asks 4)")


def test_a_tenant_guaranteed_4_in_all_never_holds_more_than_4_non_preemptible(world: Any) -> None:
    # Defect 2 of the first design: the tenant's guarantee was raised to its projects' without
    # counting what its other projects held elsewhere, so it held 8 non-preemptible GPUs.
    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    jobs = [_submit(world, f"np-{c.name}-{p.name}", c, 4, project=p, preemptible=False)
            for p in (world.a.project, world.a.other_project) for c in (east, east2)]
    for _ in range(2):
        services.cycle_run(cluster=east)
        services.cycle_run(cluster=east2)
    held = sum(_gpus(j) for j in jobs)
    assert held == 4
    waiting = [j for j in jobs if _state(j) == JobState.QUEUED]
    assert len(waiting) == 3
    assert all(j.reason_kind in ("guarantee", "quota") and "guarantee" in j.reason for j in waiting)
    assert any("your tenant's GPU guarantee" in j.reason for j in waiting)


@pytest.mark.django_db(transaction=True)
def test_racing_cycles_keep_a_tenant_guarantee_for_non_preemptible_work(world: Any) -> None:
    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    jobs = [_submit(world, f"np-{c.name}-{p.name}", c, 4, project=p, preemptible=False)
            for p in (world.a.project, world.a.other_project) for c in (east, east2)]
    for _ in range(2):
        _race((east, east2))
    assert sum(_gpus(j) for j in jobs) == 4


def _gpus(job: Job) -> int:
    return GpuSlice.objects.filter(allocation__job=job).count()


def test_a_project_within_its_guarantee_across_clusters_is_not_reclaimed(world: Any) -> None:
    # Project a (guaranteed 4 across all clusters, none per cluster) runs 2 GPUs on each
    # cluster: within its guarantee, so not borrowing on either. Tenant b's guaranteed project
    # reclaims from the other borrower only (a's jobs started last: a naive split would make
    # them the first victims).
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                              values={"gpus_guaranteed": 6})
    _quota(world, world.b.project, gpus_guaranteed=6)
    _guarantee(world, 4, project=world.a.project)
    borrowers, mine = [], []
    for c in (east, east2):
        for i in range(3):
            borrowers.append(services.job_submit(
                actor=world.b.owner, project=world.b.other_project, cluster=c, name=f"b-{c.name}-{i}",
                groups=[gpu_group(gpu_count=2)], preemptible=True))
        services.cycle_run(cluster=c)
    for c in (east, east2):
        mine.append(_submit(world, f"mine-{c.name}", c, 2))
        services.cycle_run(cluster=c)
    assert all(_state(j) == JobState.STARTING for j in borrowers + mine)
    reclaimers = [services.job_submit(actor=world.b.owner, project=world.b.project, cluster=c,
                                      name=f"owner-{c.name}", groups=[gpu_group(gpu_count=2, replicas=3)],
                                      preemptible=True) for c in (east, east2)]
    services.cycle_run(cluster=east)
    services.cycle_run(cluster=east2)
    assert all(_state(j) == JobState.STARTING for j in mine)  # never a victim
    assert all("Preempting 3 job" in (r.refresh_from_db() or r.reason) for r in reclaimers)
    assert all(_state(j) == JobState.PREEMPTING for j in borrowers)


def test_the_placement_step_binds_non_preemptible_work_only_within_a_cluster_part(world: Any) -> None:
    from scheduling.services import placement

    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    first = _submit(world, "first", None, 4, preemptible=False)
    placement.placement_run()
    first.refresh_from_db()
    # Nothing held and nothing bound waiting: the whole guarantee is the first cluster's part.
    assert first.cluster == east
    services.cycle_run(cluster=east)
    assert _state(first) == JobState.STARTING
    # All of it is held on east now: no cluster's part has room for 4 more non-preemptible
    # GPUs, so the job is bound nowhere (it would start nowhere) and says why per cluster.
    second = _submit(world, "second", None, 4, preemptible=False)
    placement.placement_run()
    second.refresh_from_db()
    assert second.cluster is None and second.state == JobState.QUEUED
    assert "cluster east2: over your project's GPU guarantee there for non-preemptible work (0 of 0" \
        in second.reason
    # A preemptible job borrows: it is placed.
    third = _submit(world, "third", None, 4)
    placement.placement_run()
    third.refresh_from_db()
    assert third.cluster is not None


def test_a_non_preemptible_job_within_the_guarantee_waits_behind_a_preemptor_never_rejected(
        world: Any) -> None:
    # Guarantee 8 across all clusters; a non-preemptible 4-GPU job reclaims 4 on a full east
    # and waits for its victims. The next non-preemptible job (8) is within 0 + 8: it waits,
    # and is never rejected as "can never start" (the part the engine sees excludes the
    # preemptor's ask; it must not be taken for the guarantee itself).
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,))
    _guarantee(world, 8, project=world.a.project)
    first = _submit(world, "first", east, 4, preemptible=False)
    services.cycle_run(cluster=east)
    first.refresh_from_db()
    assert first.reason_kind == "preempting"
    big = _submit(world, "big", east, 8, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(big) == JobState.QUEUED
    assert big.reason_kind in ("guarantee", "capacity", "behind") and "never" not in big.reason.lower()


def test_the_admission_re_checks_non_preemptible_work_decided_on_a_stale_split(world: Any) -> None:
    from scheduling.services import cycle as cycle_service

    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    first = _submit(world, "first", east, 4, preemptible=False)
    decided_east = cycle_service._decide(east, None)
    second = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=east2,
                                 name="second", groups=[gpu_group(gpu_count=4)], preemptible=False,
                                 priority_class="high")
    decided_east2 = cycle_service._decide(east2, None)
    for (_, statuses), job in ((decided_east, first), (decided_east2, second)):
        assert [type(st.decision).__name__ for st in statuses if st.job == str(job.pk)] == ["Admit"]
    cycle_service._persist(east, *decided_east)
    cycle_service._persist(east2, *decided_east2)
    assert _gpus(first) + _gpus(second) == 4
    second.refresh_from_db()
    assert second.state == JobState.QUEUED and second.reason_kind == "guarantee"
    assert second.reason.startswith(
        "Over your tenant's GPU guarantee across all clusters for non-preemptible work: with it, 8 GPUs "
        "beyond the per-cluster guarantee on all clusters, of 4 (it asks 4)")


def test_the_split_shown_follows_the_head_job_and_skips_a_disabled_cluster(world: Any) -> None:
    from scheduling.selectors import all_cluster_held

    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    # Nothing held nor queued: the first cluster by name takes the whole guarantee.
    assert all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"] == {"east": 4.0, "east2": 0.0}
    # A job waiting on east2: the remainder follows it.
    _submit(world, "waits", east2, 2)
    assert all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"] == {"east": 0.0, "east2": 4.0}
    # A disabled cluster comes last in the order, and a job bound there is not a head.
    Job.objects.filter(project=world.a.project).delete()
    _submit(world, "on-east", east, 2)
    assert all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"] == {"east": 4.0, "east2": 0.0}
    Cluster.objects.filter(pk=east.pk).update(enabled=False)
    assert all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"] == {"east2": 4.0, "east": 0.0}
