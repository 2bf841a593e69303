"""Deleting a cluster that jobs or workloads still use: a 400 naming what blocks it, never
the database's generic refusal (real services and API, real PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, Job, JobState, Node
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import submit

pytestmark = pytest.mark.django_db


def test_delete_names_the_jobs_and_environments_that_block_it(world: Any, sim_cluster: Any) -> None:
    from registry.models import Image
    from workspaces import services as ws

    admin = client_for(world.admin)
    url = f"/api/v1/clusters/{sim_cluster.pk}/"
    jobs = [submit(world, sim_cluster, f"j{i}") for i in range(2)]
    env, _ = ws.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="nb",
        kind="jupyter", image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000,
        ram_mib=1024)

    r = admin.delete(url)
    assert r.status_code == 400
    # the environment's own run is a job too
    assert r.json() == {"cluster": ["3 jobs and 1 dev environment still use this cluster; "
                                    "stop and delete them first."]}

    # the environment alone still blocks (finished jobs go with the cluster)
    for j in Job.objects.filter(cluster=sim_cluster):
        services.job_cancel(actor=world.admin, job=j)
    for j in Job.objects.filter(cluster=sim_cluster):
        services.job_stop(job_id=j.pk)
    assert not Job.objects.filter(cluster=sim_cluster).exclude(state=JobState.CANCELLED).exists()
    r = admin.delete(url)
    assert r.status_code == 400
    assert r.json() == {"cluster": ["1 dev environment still uses this cluster; "
                                    "stop and delete them first."]}
    assert Cluster.objects.filter(pk=sim_cluster.pk).exists()
    assert not AuditEvent.objects.filter(action="cluster.deleted").exists()

    env.delete()  # (as its owner would, once stopped)
    assert admin.delete(url).status_code == 204
    assert not Cluster.objects.filter(pk=sim_cluster.pk).exists()
    assert not Node.objects.filter(cluster_id=sim_cluster.pk).exists()
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs]).exists()
    assert AuditEvent.objects.filter(action="cluster.deleted").count() == 1


def test_a_job_still_stopping_blocks_too(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "busy")
    services.cycle_run(cluster=sim_cluster)
    services.job_dispatch(job_id=job.pk)
    services.job_cancel(actor=world.a.member, job=job)  # cancelled, its pod not yet gone
    r = client_for(world.admin).delete(f"/api/v1/clusters/{sim_cluster.pk}/")
    assert r.status_code == 400
    assert r.json() == {"cluster": ["1 job still uses this cluster; stop and delete them first."]}
