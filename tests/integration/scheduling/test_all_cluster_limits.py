"""GPU limits across all clusters (issue 16, "quotas across clusters") on real PostgreSQL with
two simulated clusters: a project's limit holds over both clusters' cycles, also when they
run at the same moment on two connections."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, GpuSlice, Job, JobState
from tenants import services as tenant_services

from .conftest import gpu_group, race_cycles
from .test_multicluster import EAST, WEST

pytestmark = pytest.mark.django_db


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST)
    for c in (east, west):
        services.inventory_sync(cluster=c)
    return east, west


def _limit(world: Any, n: int) -> None:
    # No per-cluster limit: each cluster alone would take 8. (The jobs are preemptible: the
    # guarantee rule for non-preemptible jobs is a per-cluster rule of its own.)
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_limit_all_clusters": Decimal(n)})


def _submit(world: Any, name: str, cluster: Cluster, gpus: int) -> Job:
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                               name=name, groups=[gpu_group(gpu_count=gpus)], preemptible=True)


def _gpus_held(world: Any) -> int:
    return GpuSlice.objects.filter(allocation__job__project=world.a.project).count()


def test_a_project_limit_holds_across_two_clusters(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    _limit(world, 6)
    e1, e2 = _submit(world, "e1", east, 4), _submit(world, "e2", east, 4)
    w1 = _submit(world, "w1", west, 4)
    services.cycle_run(cluster=east)
    services.cycle_run(cluster=west)
    e1.refresh_from_db(), e2.refresh_from_db(), w1.refresh_from_db()
    assert e1.state == JobState.STARTING
    for j in (e2, w1):  # east alone had room for both; the limit across clusters says no
        assert j.state == JobState.QUEUED
        assert "over your project's gpu limit across all clusters: 4 of 6 in use" in j.reason.lower()
        assert j.reason_kind == "quota"
    assert _gpus_held(world) == 4
    w2 = _submit(world, "w2", west, 2)  # within what is left: runs on the other cluster
    services.cycle_run(cluster=west)
    w2.refresh_from_db()
    assert w2.state == JobState.STARTING and _gpus_held(world) == 6
    # Another project of the tenant is not bound by this project's limit.
    other = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=west,
                                name="other", groups=[gpu_group(gpu_count=4)], preemptible=True)
    services.cycle_run(cluster=west)
    other.refresh_from_db()
    assert other.state == JobState.STARTING


def test_a_tenant_limit_counts_all_its_projects_on_all_clusters(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_limit_all_clusters": Decimal(5)})
    a = _submit(world, "a", east, 4)
    b = services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=west,
                            name="b", groups=[gpu_group(gpu_count=4)], preemptible=True)
    services.cycle_run(cluster=east)
    services.cycle_run(cluster=west)
    a.refresh_from_db(), b.refresh_from_db()
    assert a.state == JobState.STARTING and b.state == JobState.QUEUED
    assert "over your tenant's gpu limit across all clusters: 4 of 5 in use" in b.reason.lower()


@pytest.mark.django_db(transaction=True)
def test_racing_cycles_on_two_clusters_hold_the_limit(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Both cycles read a snapshot with nothing held and both would admit 8 GPUs; the
    per-tenant lock at admission lets only one side's jobs through."""
    east, west = two
    _limit(world, 8)
    for i in range(2):
        _submit(world, f"e{i}", east, 4)
        _submit(world, f"w{i}", west, 4)
    race_cycles((east, west))
    assert _gpus_held(world) == 8
    started = Job.objects.filter(project=world.a.project, state=JobState.STARTING)
    waiting = Job.objects.filter(project=world.a.project, state=JobState.QUEUED)
    assert started.count() == 2 and waiting.count() == 2
    assert len({j.cluster_id for j in started}) == 1  # all of one side, none of the other
    for j in waiting:
        assert "gpu limit across all clusters: 8 of 8 in use" in j.reason.lower()
    # The next cycles keep them waiting (the snapshot now sees the other cluster's use).
    for c in two:
        services.cycle_run(cluster=c)
    assert _gpus_held(world) == 8


def test_placement_does_not_bind_a_floating_job_over_the_limit(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from scheduling.services import placement

    east, west = two
    _limit(world, 6)
    held = _submit(world, "held", east, 4)
    services.cycle_run(cluster=east)
    big = services.job_submit(actor=world.a.member, project=world.a.project, cluster=None, name="big",
                              groups=[gpu_group(gpu_count=4)], preemptible=True)
    small = services.job_submit(actor=world.a.member, project=world.a.project, cluster=None, name="small",
                                groups=[gpu_group(gpu_count=2)], preemptible=True)
    placement.placement_run()
    big.refresh_from_db(), small.refresh_from_db(), held.refresh_from_db()
    assert held.state == JobState.STARTING
    assert big.cluster is None and big.state == JobState.QUEUED  # not bound where it cannot start
    assert "gpu limit across all clusters (4 of 6 in use)" in big.reason.lower()
    assert small.cluster is not None  # 2 more fit under the limit
    services.cycle_run(cluster=small.cluster)
    small.refresh_from_db()
    assert small.state == JobState.STARTING and _gpus_held(world) == 6
