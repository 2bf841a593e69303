"""Fixtures for the scheduler: a small simulated cluster on the real services."""

from __future__ import annotations

from typing import Any

import pytest

SMALL_INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: a100-{i}
    count: 2
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
    nvlink_islands: [[0, 1, 2, 3]]
  - name: l4-0
    cpu_cores: 16
    ram_gib: 64
    gpus: {model: L4, count: 2, memory_mib: 23034}
"""


@pytest.fixture
def sim_cluster(world: Any) -> Any:
    from scheduling import services

    cluster = services.cluster_create(
        actor=world.admin, name="sim", backend="simulated", inventory=SMALL_INVENTORY,
    )
    services.inventory_sync(cluster=cluster)
    return cluster


def gpu_group(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "worker", "replicas": 1, "gpu_count": 1, "cpu_millicores": 1000,
                            "ram_mib": 1024}
    base.update(kw)
    return base


def submit(world: Any, cluster: Any, name: str, *, side: str = "a", user: str = "",
           **kw: Any) -> Any:
    """Submit as the tenant's member, or (``high`` is theirs: issue 30 item 4) its project admin."""
    from scheduling import services

    tw = getattr(world, side)
    user = user or ("project_admin" if kw.get("priority_class") == "high" else "member")
    groups = kw.pop("groups", None) or [gpu_group(**kw.pop("group", {}))]
    return services.job_submit(actor=getattr(tw, user), project=tw.project, cluster=cluster,
                               name=name, groups=groups, **kw)


def project_ns(world: Any, side: str = "a", prefix: str = "camp") -> str:
    """The namespace of the tenant's first project (id-based: ``naming.namespace_name``)."""
    from scheduling.backends.naming import namespace_name

    project = getattr(world, side).project
    return namespace_name(prefix, project.pk, project.name)


def race_cycles(clusters: Any) -> None:
    """Run the clusters' cycles at the same moment, one thread each (a barrier releases them
    together, as two workers would); any exception in a thread fails the test."""
    import threading

    from django.db import connection

    from scheduling import services

    barrier = threading.Barrier(len(clusters))
    errors: list[BaseException] = []

    def run(cluster: Any) -> None:
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
