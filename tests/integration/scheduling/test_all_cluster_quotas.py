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
    # A limit of 0 on west's only class: it can never run there (but east may open up).
    assert ("cluster west: can never run there: asks 96 GiB of GH200-96G GPU memory in all, more than "
            "project acme/acme-p1's limit of 0 GiB of GH200-96G GPU memory") in floating.reason
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
    # The tenant's guarantee only: a guaranteed project's head would keep the tenant's part
    # (``split_tenant``), and the split would not go stale.
    _guarantee(world, 4)
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
        "beyond the per-cluster guarantee on all clusters (held, or asked by preemptors waiting for "
        "their victims), of 4 (it asks 4)")


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


# Review of r6-gg (docs/ARCHITECTURE.md, "GPU guarantee across all clusters"): each failed before its fix.

def test_a_tenant_only_guarantee_on_a_stale_split_never_evicts_more_than_it(world: Any) -> None:
    """Tenant a guaranteed 4 across all clusters (no project guarantee). Two cycles decide on
    splits that disagree (a higher-priority job became the tenant's head on east2 in between):
    the lock re-check is skipped (it only runs when the *project* has a guarantee)."""
    from scheduling.services import cycle as cycle_service

    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east, east2), priority_class="high")
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    first = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="first",
                                groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    decided_east = cycle_service._decide(east, None)
    second = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east2, name="second",
                                 groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    decided_east2 = cycle_service._decide(east2, None)
    kinds = ([type(st.decision).__name__ for st in decided_east[1] if st.job == str(first.pk)],
             [type(st.decision).__name__ for st in decided_east2[1] if st.job == str(second.pk)])
    print("decisions", kinds)
    cycle_service._persist(east, *decided_east)
    cycle_service._persist(east2, *decided_east2)
    print("evicted", _evicted(world))
    assert _evicted(world) <= 4


def _run_all(*clusters: Any) -> None:
    for _ in range(2):
        for c in clusters:
            services.cycle_run(cluster=c)


def _release_victims(world: Any) -> None:
    for victim in Job.objects.filter(tenant=world.b.tenant, state=JobState.PREEMPTING):
        services.job_stop(job_id=victim.pk)


def test_a_head_job_waiting_on_a_per_cluster_limit_does_not_pin_the_remainder(
        world: Any) -> None:
    """Project a: 4 GPUs guaranteed across all clusters, at most 2 per cluster. It runs 2 on
    east. Its highest-priority queued job is on east too, where the per-cluster limit keeps it
    waiting forever; so the remainder (2) of its guarantee stays on east, and its job on east2
    (project holding 2 of its 4) can never reclaim there."""
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east, east2), priority_class="high")
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_limit=2, gpus_guaranteed_all_clusters=4)

    def sub(name: str, c: Any, prio: str) -> Job:
        return services.job_submit(actor=world.a.owner, project=world.a.project, cluster=c, name=name,
                                   groups=[gpu_group(gpu_count=2)], preemptible=True, priority_class=prio)

    j1 = sub("j1", east, "high")
    _run_all(east)
    _release_victims(world)
    _run_all(east)
    assert _state(j1) == JobState.STARTING
    pinned = sub("j1b", east, "high")   # waits: per-cluster limit 2 on east
    j2 = sub("j2", east2, "high")       # submitted later: same priority, later submission
    _run_all(east, east2)
    pinned.refresh_from_db()
    j2.refresh_from_db()
    from scheduling.selectors import all_cluster_held
    print("split", all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"])
    print("pinned", pinned.state, pinned.reason_kind, pinned.reason)
    print("j2", j2.state, j2.reason_kind, j2.reason)
    assert "Preempting" in j2.reason or j2.state == JobState.STARTING


def test_a_sibling_borrowing_elsewhere_does_not_starve_a_guaranteed_project(world: Any) -> None:
    """Tenant a and its project p1 are guaranteed 4 across all clusters. Its other project p2
    (no guarantee) borrows 4 GPUs on east2, preemptibly. p1 (holding nothing, within its
    guarantee) cannot reclaim on east: the tenant's split gives its whole part to east2 for p2's
    borrowing, and p1's part is capped to the tenant's room there."""
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=4)
    sib = _submit(world, "sibling", east2, 4, project=world.a.other_project)
    _run_all(east2)
    assert _state(sib) == JobState.STARTING
    _fill_with_borrowers(world, (east,), priority_class="high")
    mine = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="mine",
                               groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    _run_all(east, east2)
    mine.refresh_from_db()
    from scheduling.selectors import all_cluster_held
    print("p1 split", all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"])
    print("tenant split", all_cluster_held(world.a.tenant.pk, None)["split"])
    print("mine", mine.state, mine.reason_kind, mine.reason)
    print("evicted", _evicted(world))
    assert "Preempting" in mine.reason or mine.state == JobState.STARTING


@pytest.mark.parametrize("kind", ["all_clusters", "per_cluster_control"])
def test_a_project_within_its_guarantee_is_not_reclaimed_while_its_preemptor_waits(
        world: Any, kind: str) -> None:
    """Project a (4 across all clusters) runs 4 on east: within its guarantee. Its high-priority
    job evicts a lower-priority job of tenant b (priority preemption) and waits for it. The
    split counts the preemptor's ask as held (part east = 4) and ``with_parts`` then takes the
    ask off the part the engine sees (4 − 4 = 0): a's running 4 GPUs look borrowed, and b's
    guaranteed project reclaims them. (Per-cluster guarantee 4 instead: never a victim.)"""
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                              values={"gpus_guaranteed": 4})
    _quota(world, world.b.project, gpus_guaranteed=4)
    field = "gpus_guaranteed_all_clusters" if kind == "all_clusters" else "gpus_guaranteed"
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant, values={field: 4})
    _quota(world, world.a.project, **{field: 4})
    mine = _submit(world, "mine", east, 4)
    _run_all(east)
    low = services.job_submit(actor=world.b.owner, project=world.b.other_project, cluster=east, name="low",
                              groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="batch")
    _run_all(east)
    assert _state(mine) == JobState.STARTING and _state(low) == JobState.STARTING
    hi = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="hi",
                             groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    services.cycle_run(cluster=east)
    hi.refresh_from_db()
    print("hi", hi.state, hi.reason_kind, hi.reason)
    rec = services.job_submit(actor=world.b.owner, project=world.b.project, cluster=east, name="rec",
                              groups=[gpu_group(gpu_count=4)], preemptible=True)
    services.cycle_run(cluster=east)
    rec.refresh_from_db()
    print("rec", rec.state, rec.reason_kind, rec.reason)
    print("mine", _state(mine))
    assert _state(mine) == JobState.STARTING  # within its guarantee: never reclaimed


def test_the_non_preemptible_re_check_counts_a_non_preemptible_preemptor_waiting_elsewhere(
        world: Any) -> None:
    """G = 4. Cycle east2 decides to admit non-preemptible Y (4) on a split made before X
    existed. Cycle east then has non-preemptible X (4, high) evict 4 GPUs of borrowers for the
    guarantee, and commits first. The re-check of Y under the lock counts non-preemptible GPUs
    *held* only, not X's waiting ask: Y is admitted too. X evicted 4 GPUs for a guarantee that
    is now held by Y: 8 GPUs evicted-for or held-by the guarantee of 4, and X never starts."""
    from scheduling.services import cycle as cycle_service

    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,), priority_class="high")
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=4)
    y = _submit(world, "y", east2, 4, preemptible=False)
    decided_east2 = cycle_service._decide(east2, None)
    x = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="x",
                            groups=[gpu_group(gpu_count=4)], preemptible=False, priority_class="high")
    decided_east = cycle_service._decide(east, None)
    print("decisions", [type(st.decision).__name__ for st in decided_east[1] if st.job == str(x.pk)],
          [type(st.decision).__name__ for st in decided_east2[1] if st.job == str(y.pk)])
    cycle_service._persist(east, *decided_east)
    cycle_service._persist(east2, *decided_east2)
    x.refresh_from_db()
    y.refresh_from_db()
    print("x", x.state, x.reason_kind, x.reason[:120])
    print("y", y.state, y.reason_kind, y.reason[:120])
    evicted = _evicted(world)
    print("evicted", evicted)
    _release_victims(world)
    _run_all(east, east2)
    x.refresh_from_db()
    print("x after", x.state, x.reason_kind, x.reason[:200])
    print("y after", _state(y))
    # 4 GPUs evicted for X's guarantee + Y's 4 non-preemptible = 8 of a guarantee of 4.
    assert not (evicted == 4 and y.state == JobState.STARTING)


def test_a_job_queued_on_an_unreachable_cluster_does_not_pin_the_remainder(world: Any) -> None:
    """east2 is unreachable (enabled, its cycle cannot run). A's high-priority job queued on it
    is the head, so the whole guarantee (4, nothing held) is east2's part; a's job on east,
    which borrowers fill, can never reclaim."""
    from django.utils import timezone

    from scheduling.models import Cluster
    from scheduling.selectors import all_cluster_held

    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,), priority_class="high")
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=4)
    Cluster.objects.filter(pk=east2.pk).update(unreachable_since=timezone.now())
    stuck = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east2, name="stuck",
                                groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    mine = services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="mine",
                               groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="normal")
    _run_all(east)
    mine.refresh_from_db()
    print("split", all_cluster_held(world.a.tenant.pk, world.a.project.pk)["split"], stuck.pk)
    print("mine", mine.state, mine.reason_kind, mine.reason[:150])
    assert "Preempting" in mine.reason or mine.state == JobState.STARTING


def test_a_non_preemptible_job_waiting_for_the_guarantee_still_draws_the_remainder(world: Any) -> None:
    """A head job waiting on the guarantee itself (kind ``guarantee``: its cluster's part was
    too small) is not skipped like one waiting on a quota: the remainder must come to it, or
    it would wait forever (the first cluster of the order, east, would keep it)."""
    east, east2 = _east2(world)
    _guarantee(world, 4, project=world.a.project)
    job = _submit(world, "np", east2, 4, preemptible=False)
    Job.objects.filter(pk=job.pk).update(reason_kind="guarantee", reason="Non-preemptible jobs must fit …")
    _run_all(east2)
    assert _state(job) == JobState.STARTING


# --- Second review (r6-gg2) ----------------------------------------------------------------------


def test_a_non_preemptible_preemptor_whose_victims_are_gone_starts_at_once(world: Any) -> None:
    """G=4 across all clusters. Non-preemptible X (4) reclaims 4 on a full east. Its victims
    release their GPUs. Next cycle of east: X starts (the 4 free GPUs are the ones it evicted
    for), not held back by its own ask taken off its cluster's part."""
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,))
    _guarantee(world, 4, project=world.a.project)
    x = _submit(world, "x", east, 4, preemptible=False)
    services.cycle_run(cluster=east)
    x.refresh_from_db()
    assert x.reason_kind == "preempting", x.reason
    _release_victims(world)
    services.cycle_run(cluster=east)
    assert _state(x) == JobState.STARTING, x.reason


def test_a_non_preemptible_preemptor_is_not_cut_off_by_a_borrower_readmitted_into_its_gpus(
        world: Any) -> None:
    """As above, but a borrower of tenant b is queued on east when the victims are gone: X
    starts in the GPUs it evicted for, with one round of evictions (no livelock in which a
    borrower is readmitted while X is held and X evicts again)."""
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,))
    _guarantee(world, 4, project=world.a.project)
    x = _submit(world, "x", east, 4, preemptible=False)
    services.cycle_run(cluster=east)
    evictions = 0
    for i in range(4):
        x.refresh_from_db()
        if x.state != JobState.QUEUED:
            break
        if x.reason_kind == "preempting":
            evictions += 1
            _release_victims(world)
            services.job_submit(actor=world.b.owner, project=world.b.project, cluster=east,
                                name=f"again-{i}", groups=[gpu_group(gpu_count=4)], preemptible=True)
        services.cycle_run(cluster=east)
    assert _state(x) == JobState.STARTING and evictions == 1, (x.reason, evictions)


def test_two_np_preemptors_admitted_in_one_cycle_are_not_counted_twice(world: Any) -> None:
    """a: per-cluster g=8 and G=2 across all clusters. Non-preemptible A(4) and B(4) reclaim 8 on
    a full east (within g=8). Victims gone: the next cycle admits both (8 within g=8, 0 beyond);
    A admitted first is not counted again as a preemptor's ask in B's re-check."""
    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,))
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": 8, "gpus_guaranteed_all_clusters": 2})
    _quota(world, world.a.project, gpus_guaranteed=8, gpus_guaranteed_all_clusters=2)
    ja = _submit(world, "ja", east, 4, preemptible=False)
    jb = _submit(world, "jb", east, 4, preemptible=False)
    services.cycle_run(cluster=east)
    ja.refresh_from_db()
    jb.refresh_from_db()
    assert ja.reason_kind == jb.reason_kind == "preempting"
    _release_victims(world)
    services.cycle_run(cluster=east)
    assert _state(ja) == _state(jb) == JobState.STARTING, (ja.reason, jb.reason)


def test_a_sibling_borrowing_beyond_its_own_guarantee_does_not_block_a_guaranteed_project_reclaim(
        world: Any) -> None:
    """Tenant a G=4; its projects p1 G=2 and p2 G=2 across all clusters. p1 runs 4 preemptible on
    east (2 within its guarantee, 2 borrowed). p2, holding nothing, wants 2 on a full east2:
    within its guarantee, the tenant-level re-check counts of p1 only the 2 its guarantee covers
    (2 + 2 = 4 of 4): p2 reclaims."""
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=2)
    _quota(world, world.a.other_project, gpus_guaranteed_all_clusters=2)
    p1 = _submit(world, "p1", east, 4)
    _run_all(east)
    assert _state(p1) == JobState.STARTING
    _fill_with_borrowers(world, (east2,), priority_class="high")
    p2 = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=east2, name="p2",
                             groups=[gpu_group(gpu_count=2)], preemptible=True, priority_class="high")
    _run_all(east2)
    p2.refresh_from_db()
    assert "Preempting" in p2.reason or p2.state == JobState.STARTING, p2.reason


def test_np_admission_recheck_counts_a_preemptible_reclaim_relying_on_the_guarantee(world: Any) -> None:
    """G=4. Cycle east2 decides to admit non-preemptible Y (4). Cycle east then has preemptible
    X (4, high) reclaim 4 GPUs of borrowers for the guarantee, and commits first. Y's re-check
    counts X's reclaim: never 4 evicted relying on G and 4 non-preemptible within it (8 of 4)."""
    from scheduling.services import cycle as cycle_service

    east, east2 = _east2(world)
    _fill_with_borrowers(world, (east,), priority_class="high")
    _guarantee(world, 4, project=world.a.project)
    y = _submit(world, "y", east2, 4, preemptible=False)
    decided_east2 = cycle_service._decide(east2, None)
    services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="x",
                        groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    decided_east = cycle_service._decide(east, None)
    cycle_service._persist(east, *decided_east)
    cycle_service._persist(east2, *decided_east2)
    assert not (_evicted(world) == 4 and _state(y) == JobState.STARTING)


def test_a_siblings_priority_preemptor_does_not_take_the_tenant_part_from_a_guaranteed_projects_np_job(
        world: Any) -> None:
    """Tenant a G=4, p1 G=4 (across all clusters); p2 none. East: b runs two batch jobs (4+4).
    p2's high job evicts one of them by priority (relies on no guarantee) and waits. p1's
    non-preemptible X (4) is within p1's and the tenant's guarantee (p2's work is not
    guaranteed): it reclaims b's other job, the tenant's part not taken off by p2's ask."""
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": 4})
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=4)
    _fill_with_borrowers(world, (east,), priority_class="batch")
    hi = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=east, name="hi",
                             groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    services.cycle_run(cluster=east)
    hi.refresh_from_db()
    assert hi.reason_kind == "preempting", hi.reason
    x = _submit(world, "x", east, 4, preemptible=False)
    services.cycle_run(cluster=east)
    x.refresh_from_db()
    assert x.reason_kind == "preempting" or x.state == JobState.STARTING, x.reason


def test_a_head_that_waits_capacity_behind_guaranteed_work_passes_the_remainder_on(world: Any) -> None:
    """b (per-cluster g=8 for tenant and b.project) runs 8 non-preemptible on east: nothing there
    can be reclaimed. b.other_project borrows 8 on east2. a (G=4, holds 0): A (high) on east waits
    'capacity'; the remainder passes on to B (normal) on east2, which reclaims 4 of b's
    borrowing within a's guarantee."""
    east, east2 = _east2(world)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                              values={"gpus_guaranteed": 8})
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.b.project,
                              values={"gpus_guaranteed": 8})
    for i in range(2):
        services.job_submit(actor=world.b.owner, project=world.b.project, cluster=east, name=f"np-{i}",
                            groups=[gpu_group(gpu_count=4)], preemptible=False)
        services.job_submit(actor=world.b.owner, project=world.b.other_project, cluster=east2,
                            name=f"bor-{i}", groups=[gpu_group(gpu_count=4)], preemptible=True)
    _run_all(east, east2)
    _guarantee(world, 4, project=world.a.project)
    services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east, name="ja",
                        groups=[gpu_group(gpu_count=4)], preemptible=True, priority_class="high")
    b1 = _submit(world, "jb", east2, 4)
    for _ in range(3):
        _run_all(east, east2)
    b1.refresh_from_db()
    assert "Preempting" in b1.reason or b1.state == JobState.STARTING, b1.reason
    assert _evicted(world) == 4
