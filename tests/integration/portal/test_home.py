"""The home page answers each role's first question: a member's running and waiting work
with its actions, quota left and what is free now; an owner's tenant against its quota, top
consumers and waiting jobs; an admin's clusters. Queries stay bounded as work grows; no role
sees another tenant's workloads."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from registry.models import Image
from tenants import services as tenant_services
from tests.integration.scheduling.conftest import submit
from tests.integration.workspaces.conftest import (
    advance,
    sim_cluster,  # noqa: F401 (fixture)
)
from workspaces import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy(world: Any, sim_cluster: Any) -> Any:  # noqa: F811
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(8)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(2), "gpus_limit": Decimal(6)})
    services.profile_create(actor=world.admin, name="a100-quarter", display_name="¼ A100 · 20 GB",
                            gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480,
                            gpu_cores_percent=25, cpu_millicores=1000, ram_mib=2048)
    jupyter = Image.objects.get(name="pytorch-jupyter")
    services.environment_launch(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                                name="nb", kind="jupyter", image=jupyter, gpu_count=1,
                                gpu_memory_mib=20480, gpu_cores_percent=25, cpu_millicores=1000,
                                ram_mib=2048)
    services.training_submit(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                             name="ddp", framework="pytorch", image_reference="pytorch/pytorch:2.4",
                             workers=2, gpu_count=1, cpu_millicores=1000, ram_mib=2048)
    advance(sim_cluster)
    # far beyond the project's limit: waits
    submit(world, cluster=sim_cluster, name="huge", group={"gpu_count": 4}, user="project_admin",
           preemptible=True)
    submit(world, cluster=sim_cluster, name="theirs", side="b")
    advance(sim_cluster)
    return sim_cluster


def _home(user: Any) -> str:
    c = Client()
    c.force_login(user)
    r = c.get("/")
    assert r.status_code == 200
    return r.content.decode()


def test_member_home_shows_own_work_quota_and_free_now(world: Any, busy: Any) -> None:
    page = _home(world.a.member)
    assert "My workloads" in page
    assert '<a href="/workspaces/environments/' in page and ">nb</a>" in page
    assert ">ddp</a>" in page and "2 workers × 1× GPU" in page
    assert "slice of a GPU (20 GB, 25 %)" in page
    assert "Open<span" in page and "Stop<span" in page and "Logs<span" in page
    assert "GPU quota left" in page and "acme/acme-p1" in page
    assert "¼ A100 · 20 GB" in page and "you can start)" in page  # what can start now
    assert "theirs" not in page  # another tenant's job
    assert "Tenant acme" not in page and "Clusters</h2>" not in page  # not an owner, not an admin


def test_owner_and_admin_homes(world: Any, busy: Any) -> None:
    owner = _home(world.a.owner)
    assert "Tenant acme" in owner and "Top consumers now" in owner
    assert "acme-member" in owner  # holds GPUs now
    from scheduling.models import Job
    states = list(Job.objects.values_list("name", "state", "reason"))
    assert ">huge</a>" in owner and "Waiting jobs" in owner, states
    assert "theirs" not in owner and "Clusters</h2>" not in owner
    admin = _home(world.admin)
    assert "Clusters</h2>" in admin and "longest wait" in admin and "Healthy" in admin
    assert "GPUs allocated" in admin


def test_home_queries_do_not_grow_with_workloads(world: Any, busy: Any) -> None:
    def count() -> int:
        c = Client()
        c.force_login(world.a.owner)
        with CaptureQueriesContext(connection) as q:
            assert c.get("/").status_code == 200
        return len(q)

    before = count()
    for i in range(6):
        submit(world, cluster=busy, name=f"more-{i}", user="owner")
    advance(busy)
    assert count() <= before + 2, "home page queries grow with the number of jobs"


def test_quota_left_shows_the_limit_across_all_clusters(world: Any, busy: Any) -> None:
    from decimal import Decimal

    from tenants import services as tenant_services

    before = _home(world.a.member)
    assert "left across all clusters" not in before
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_limit_all_clusters": Decimal(40)})
    from portal import selectors as portal_selectors

    page = _home(world.a.member)
    used = portal_selectors.project_usage([world.a.project.pk])[world.a.project.pk].gpus
    assert used > 0  # the busy fixture's jobs hold GPUs
    assert f"; {round(40 - used, 2)} left across all clusters" in page


def test_class_memory_limits_cost_one_usage_aggregate_for_all_projects(world: Any, busy: Any) -> None:
    """The home's "GPU quota left" reads what is held across all clusters once, not once per
    project with a class memory limit."""
    from scheduling.selectors import gpu_model_classes

    cls = sorted(gpu_model_classes())[0]
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpu_memory_mib_limits_all_clusters": {cls: 10 * 81920}})

    def aggregates() -> int:
        c = Client()
        c.force_login(world.a.owner)
        with CaptureQueriesContext(connection) as q:
            page = c.get("/").content.decode()
        assert f"{cls}: " in page and "GPU memory left across all clusters" in page
        # The usage across all clusters (``all_cluster_use``): the one grouped read by GPU model.
        return sum(1 for x in q.captured_queries if "gpuslice" in x["sql"].lower()
                   and "group by" in x["sql"].lower() and '"scheduling_gpudevice"."model"' in x["sql"])

    for p in (world.a.project, world.a.other_project):
        tenant_services.quota_set(actor=world.admin, scope="project", project=p,
                                  values={"gpu_memory_mib_limits_all_clusters": {cls: 81920}})
    assert aggregates() == 1
