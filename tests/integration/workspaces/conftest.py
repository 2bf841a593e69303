"""Fixtures for workloads: the simulated cluster of the scheduler tests, and helpers that
drive the real services the way the Celery worker does (cycle → dispatch → reconcile)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.scheduling.conftest import SMALL_INVENTORY

__all__ = ["SMALL_INVENTORY", "advance", "sim_cluster"]


@pytest.fixture
def sim_cluster(world: Any) -> Any:
    from scheduling import services

    cluster = services.cluster_create(
        actor=world.admin, name="sim", backend="simulated", inventory=SMALL_INVENTORY
    )
    services.inventory_sync(cluster=cluster)
    return cluster


def advance(cluster: Any, rounds: int = 3) -> None:
    """What the worker does between two looks at the portal: a cycle, dispatch of admitted
    jobs, stop of preempted/cancelled ones, and a reconcile with the (simulated) cluster."""
    from scheduling import services
    from scheduling.models import Job, JobState

    for _ in range(rounds):
        services.cycle_run(cluster=cluster)
        for job_id in (
            Job.objects.filter(cluster=cluster, state=JobState.STARTING, allocations__phase="pending")
            .values_list("pk", flat=True)
            .distinct()
        ):
            services.job_dispatch(job_id=job_id)
        for job_id in (
            Job.objects.filter(cluster=cluster, allocations__isnull=False)
            .exclude(state__in=[JobState.STARTING, JobState.RUNNING])
            .values_list("pk", flat=True)
            .distinct()
        ):
            services.job_stop(job_id=job_id)
        services.cluster_reconcile(cluster=cluster)
