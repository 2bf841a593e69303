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
