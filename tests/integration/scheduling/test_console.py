"""Console pages for clusters, nodes and jobs, as users see them."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from scheduling import services
from scheduling.models import Cluster, Job

from .conftest import SMALL_INVENTORY, gpu_group

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _setup(world: Any) -> tuple[Cluster, Job, Job]:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    mine = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                               name="mine", groups=[gpu_group(gpu_count=8)])
    theirs = services.job_submit(actor=world.b.member, project=world.b.project, cluster=cluster,
                                 name="theirs", groups=[gpu_group()])
    services.cycle_run(cluster=cluster)
    return cluster, mine, theirs


def test_jobs_pages_show_state_reason_and_hide_other_tenants(world: Any) -> None:
    _, mine, theirs = _setup(world)
    client = _client(world.a.member)
    page = client.get("/scheduling/jobs/").content.decode()
    assert "mine" in page and "theirs" not in page
    mine.refresh_from_db()
    detail = client.get(f"/scheduling/jobs/{mine.pk}/").content.decode()
    assert "Rejected" in detail and "No node can ever fit" in detail
    assert client.get(f"/scheduling/jobs/{theirs.pk}/").status_code == 404


def test_member_cancels_own_job_from_the_console(world: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name="x", groups=[gpu_group()])
    response = _client(world.a.member).post(f"/scheduling/jobs/{job.pk}/cancel/")
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == "cancelled"


def test_admin_registers_cluster_and_quarantines_node(world: Any) -> None:
    admin = _client(world.admin)
    response = admin.post("/scheduling/clusters/new/", {
        "name": "lab", "display_name": "Lab", "enabled": "on", "backend": "simulated",
        "placement_policy": "fragmentation",
        "namespace_prefix": "camp", "inventory": SMALL_INVENTORY, "token": "hidden-token"})
    assert response.status_code == 302, response.content.decode()[:2000]
    lab = Cluster.objects.get(name="lab")
    assert lab.has_credentials
    services.inventory_sync(cluster=lab)
    assert "hidden-token" not in admin.get("/scheduling/clusters/lab/edit/").content.decode()
    node = lab.nodes.get(name="l4-0")
    admin.post(f"/scheduling/nodes/{node.pk}/quarantine/", {"quarantined": "1", "reason": "fan"})
    page = admin.get("/scheduling/clusters/lab/nodes/").content.decode()
    assert "quarantined" in page and "fan" in page


def test_members_read_clusters_but_cannot_edit(world: Any) -> None:
    _setup(world)
    member = _client(world.a.member)
    assert member.get("/scheduling/clusters/").status_code == 200
    assert member.get("/scheduling/clusters/sim/edit/").status_code == 403
    assert member.post("/scheduling/nodes/1/quarantine/", {"quarantined": "1"}).status_code in (403, 404)
    assert _client(world.outsider).get("/scheduling/clusters/sim/nodes/").status_code == 404
