"""The platform level of the queue tree (issue 16), beyond the GPU limit across all clusters: a
GPU guarantee across all clusters and GPU memory limits per GPU model class across all
clusters, on real PostgreSQL with two simulated clusters (also racing, on two connections)."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection

from scheduling import services
from scheduling.models import Cluster, GpuSlice, Job, JobState
from tenants import services as tenant_services

from .conftest import gpu_group
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


# --- the GPU guarantee across all clusters ------------------------------------------------------


def test_a_guarantee_across_clusters_lets_a_queued_job_reclaim_a_borrower(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    # globex (no guarantee anywhere) borrows all of east.
    borrowers = [_submit(world, f"b{i}", east, 4, side="b") for i in range(2)]
    services.cycle_run(cluster=east)
    assert [_state(b) for b in borrowers] == [JobState.STARTING] * 2
    # acme's project holds 2 GPUs on west; its guarantee across all clusters is 5: 3 left for east.
    _submit(world, "w", west, 2)
    services.cycle_run(cluster=west)
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(5))
    job = _submit(world, "reclaim", east, 4)
    services.cycle_run(cluster=east)
    assert _state(job) == JobState.QUEUED  # 4 > 5 − 2: not within its guarantee there, no reclaim
    assert not Job.objects.filter(state=JobState.PREEMPTING).exists()
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(6))  # 6 − 2 = 4 on east
    summary = services.cycle_run(cluster=east)
    assert summary is not None and summary.preempting == [job.pk]
    victims = Job.objects.filter(state=JobState.PREEMPTING)
    assert victims.count() == 1 and victims.get().project == world.b.project
    assert victims.get().preempted_by_id == job.pk


def test_a_guarantee_across_clusters_protects_from_reclaim_where_its_jobs_run(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    # globex's project is guaranteed 4 GPUs on each cluster; acme's 8 across all clusters.
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                              values={"gpus_guaranteed": Decimal(4)})
    _quota(world, world.b.project, gpus_guaranteed=Decimal(4))
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(8))
    mine = [_submit(world, f"a{i}", east, 4) for i in range(2)]  # all of east, preemptible
    services.cycle_run(cluster=east)
    assert [_state(j) for j in mine] == [JobState.STARTING] * 2
    theirs = _submit(world, "reclaim", east, 4, side="b")
    services.cycle_run(cluster=east)
    # acme's 8 on east are within its guarantee across all clusters: nothing to reclaim.
    assert _state(theirs) == JobState.QUEUED
    assert [_state(j) for j in mine] == [JobState.STARTING] * 2
    # acme now also holds 4 GPUs on west: on east its guarantee is 8 − 4 = 4, so 4 of its 8
    # there are borrowed and globex takes its guaranteed 4 back.
    _submit(world, "w", west, 4)
    services.cycle_run(cluster=west)
    summary = services.cycle_run(cluster=east)
    assert summary is not None and summary.preempting == [theirs.pk]
    assert sorted(_state(j) for j in mine) == sorted([JobState.STARTING, JobState.PREEMPTING])


def test_non_preemptible_work_stays_within_the_guarantee_across_clusters(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(4))
    first = _submit(world, "np-east", east, 3, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(first) == JobState.STARTING
    second = _submit(world, "np-west", west, 2, preemptible=False)
    services.cycle_run(cluster=west)
    assert _state(second) == JobState.QUEUED  # 3 held on east: 1 left of 4, it asks 2
    assert "gpu guarantee across all clusters for non-preemptible work: 3 of 4 held on other" \
        in second.reason.lower()
    third = _submit(world, "np-west-1", west, 1, preemptible=False)
    services.cycle_run(cluster=west)
    assert _state(third) == JobState.STARTING


def _race(clusters: tuple[Cluster, Cluster]) -> None:
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(cluster: Cluster) -> None:
        try:
            barrier.wait(timeout=30)
            services.cycle_run(cluster=cluster)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in clusters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors


@pytest.mark.django_db(transaction=True)
def test_racing_cycles_keep_non_preemptible_work_within_the_guarantee(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Both snapshots see nothing held elsewhere, so each cluster's tree guarantees the
    project 4 and each engine admits 4 non-preemptible GPUs; the re-check under the
    per-tenant lock lets one side through."""
    east, west = two
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(4))
    jobs = [_submit(world, "e", east, 4, preemptible=False), _submit(world, "w", west, 4, preemptible=False)]
    _race(two)
    states = sorted(_state(j) for j in jobs)
    assert states == sorted([JobState.STARTING, JobState.QUEUED])
    waiting = next(j for j in jobs if j.state == JobState.QUEUED)
    assert "guarantee across all clusters" in waiting.reason.lower()
    for c in two:  # the next cycles keep it waiting (their snapshot sees the other cluster)
        services.cycle_run(cluster=c)
    assert GpuSlice.objects.filter(allocation__job__project=world.a.project).count() == 4


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


def test_a_floating_non_preemptible_job_beyond_the_guarantee_is_bound_nowhere(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from scheduling.services import placement

    east, west = two
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(4))
    held = _submit(world, "held", east, 3, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(held) == JobState.STARTING
    # East: 3 non-preemptible of 4 guaranteed there; west: 4 − 3 held on east = 1.
    big = _submit(world, "big", None, 2, preemptible=False)
    placement.placement_run()
    big.refresh_from_db()
    assert big.cluster is None and big.state == JobState.QUEUED
    assert ("cluster east: over your project's GPU guarantee across all clusters for "
            "non-preemptible work (4 guaranteed here, 3 non-preemptible here)") in big.reason
    assert "cluster west: over your project's GPU guarantee across all clusters" in big.reason
    small = _submit(world, "small", None, 1, preemptible=False)
    placement.placement_run()
    small.refresh_from_db()
    assert small.cluster is not None
    services.cycle_run(cluster=small.cluster)
    assert _state(small) == JobState.STARTING


def test_used_elsewhere_a_non_preemptible_job_waits_rather_than_being_rejected(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    _quota(world, world.a.project, gpus_guaranteed_all_clusters=Decimal(4))
    _submit(world, "w", west, 3)  # preemptible, on the other cluster
    services.cycle_run(cluster=west)
    # On east the guarantee is 4 − 3 = 1: the engine alone would reject a non-preemptible ask
    # of 2 as "never within its guarantee"; it may fit once west's job ends, so it waits.
    job = _submit(world, "np", east, 2, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(job) == JobState.QUEUED
    assert job.reason.startswith("Over your project's GPU guarantee across all clusters for "
                                 "non-preemptible work: 3 of 4 held on other clusters")
    # More than the guarantee itself can never be within it: rejected, as on one cluster.
    never = _submit(world, "never", east, 5, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(never) == JobState.REJECTED


def test_a_tenant_guarantee_across_clusters_counts_all_its_projects(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed_all_clusters": Decimal(4)})
    first = _submit(world, "p1", east, 3, preemptible=False)
    services.cycle_run(cluster=east)
    assert _state(first) == JobState.STARTING
    other = _submit(world, "p2", west, 2, preemptible=False, project=world.a.other_project)
    services.cycle_run(cluster=west)
    assert _state(other) == JobState.QUEUED
    assert other.reason.startswith("Over your tenant's GPU guarantee across all clusters for "
                                   "non-preemptible work: 3 of 4 held on other clusters")
    within = _submit(world, "p2-1", west, 1, preemptible=False, project=world.a.other_project)
    services.cycle_run(cluster=west)
    assert _state(within) == JobState.STARTING
    # globex, with no such guarantee, is not bound by acme's.
    theirs = _submit(world, "b", west, 4, side="b", preemptible=False)
    services.cycle_run(cluster=west)
    assert _state(theirs) == JobState.STARTING
