"""What a data scientist sees of the GPU guarantee across all clusters (issue 16) before choosing
a preemptible or a non-preemptible run: the home's "GPU quota left", the launch forms' quota
hint and the console's quota pages say "N of G GPUs guaranteed across all clusters left" for the
project and its tenant, "used" counted as the scheduler counts it (what is held beyond the
per-cluster guarantee on each cluster), on two simulated clusters; never another tenant's."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling import services
from scheduling.models import Cluster, Job, JobState
from tenants import services as tenant_services
from tests.integration.scheduling.conftest import gpu_group
from tests.integration.scheduling.test_all_cluster_quotas import EAST2
from tests.integration.scheduling.test_multicluster import EAST

pytestmark = pytest.mark.django_db

LEFT = "GPUs guaranteed across all clusters left"


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    east2 = services.cluster_create(actor=world.admin, name="east2", backend="simulated", inventory=EAST2)
    for c in (east, east2):
        services.inventory_sync(cluster=c)
    return east, east2


def _quotas(world: Any) -> None:
    """Tenant acme: 2 GPUs per cluster + 6 across all clusters; its project acme-p1: 1 per
    cluster + 4 across all clusters (acme-p2: nothing of its own)."""
    tenant_services.quota_set(
        actor=world.admin,
        scope="tenant",
        tenant=world.a.tenant,
        values={"gpus_guaranteed": Decimal(2), "gpus_guaranteed_all_clusters": Decimal(6)},
    )
    tenant_services.quota_set(
        actor=world.admin,
        scope="project",
        project=world.a.project,
        values={"gpus_guaranteed": Decimal(1), "gpus_guaranteed_all_clusters": Decimal(4)},
    )


def _run(world: Any, cluster: Cluster, name: str, gpus: int, *, side: str = "a", project: Any = None) -> Job:
    tw = getattr(world, side)
    job = services.job_submit(
        actor=tw.owner,
        project=project or tw.project,
        cluster=cluster,
        name=name,
        groups=[gpu_group(gpu_count=gpus)],
        preemptible=True,
    )
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, (job.state, job.reason)
    return job


def _page(user: Any, url: str = "/") -> str:
    c = Client()
    c.force_login(user)
    r = c.get(url)
    assert r.status_code == 200
    return r.content.decode()


def test_the_guarantee_left_counts_what_is_held_beyond_the_per_cluster_guarantee_on_two_clusters(
    world: Any, two: tuple[Cluster, Cluster]
) -> None:
    east, east2 = two
    _quotas(world)
    page = _page(world.a.member)
    assert f"4 of 4 {LEFT}" in page and f"Tenant acme: 6 of 6 {LEFT}" in page  # nothing held yet
    # acme-p1 holds 3 on east (2 beyond its 1 per cluster) and 2 on east2 (1 beyond): 3 of its
    # 4 used. The tenant holds 3 on east (1 beyond its 2) and, with acme-p2's 1, 3 on east2
    # (1 beyond): 2 of its 6 used. Another tenant's work counts for neither.
    _run(world, east, "p1-east", 3)
    _run(world, east2, "p1-east2", 2)
    _run(world, east2, "p2-east2", 1, project=world.a.other_project)
    _run(world, east, "globex-east", 4, side="b")
    home = _page(world.a.member)
    assert f"1 of 4 {LEFT}" in home
    assert f"Tenant acme: 4 of 6 {LEFT}" in home
    # Within the per-cluster guarantee on each cluster, nothing of the guarantee across all
    # clusters is used: the 1 GPU on east2 and the 2 on east of the tenant are its own.
    form = _page(world.a.member, reverse("workspaces:training-new"))
    assert "Guarantee across all clusters" in form
    assert f"1 of 4 {LEFT}<br>Tenant acme: 4 of 6 {LEFT}" in form
    # acme-p2 has no guarantee of its own: only its tenant's shows in its row.
    owner_form = _page(world.a.owner, reverse("workspaces:training-new"))
    p2_row = owner_form[owner_form.index("<td>acme/acme-p2</td>") :].split("</tr>", 1)[0]
    assert f"<td>Tenant acme: 4 of 6 {LEFT}</td>" in p2_row
    # A job ends: its GPUs beyond the per-cluster guarantee are guaranteed again.
    services.job_stop(job_id=Job.objects.get(name="p1-east").pk)
    services.cycle_run(cluster=east)
    home = _page(world.a.member)
    assert f"3 of 4 {LEFT}" in home and f"Tenant acme: 5 of 6 {LEFT}" in home


def test_a_preemptor_waiting_for_its_victims_counts_as_using_the_guarantee(
    world: Any, two: tuple[Cluster, Cluster]
) -> None:
    """The split counts a preemptor's ask as held (the GPUs it evicts for are the guarantee it
    relies on): so does the page, or it would promise the same GPUs to a second run."""
    east, _ = two
    _quotas(world)
    for i in range(2):  # globex borrows all of east
        _run(world, east, f"borrow-{i}", 4, side="b")
    reclaim = services.job_submit(
        actor=world.a.owner,
        project=world.a.project,
        cluster=east,
        name="reclaim",
        groups=[gpu_group(gpu_count=4)],
        preemptible=True,
    )
    services.cycle_run(cluster=east)
    reclaim.refresh_from_db()
    assert reclaim.state == JobState.QUEUED and reclaim.reason_kind == "preempting", reclaim.reason
    # It holds nothing yet; its ask of 4 on east is 3 beyond acme-p1's 1 there, 2 beyond acme's 2.
    home = _page(world.a.member)
    assert f"1 of 4 {LEFT}" in home and f"Tenant acme: 4 of 6 {LEFT}" in home
    assert f"1 of 4 {LEFT}" in _page(world.a.owner, "/t/acme/p/acme-p1/")


def test_what_the_home_shows_is_what_the_console_shows(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, east2 = two
    _quotas(world)
    _run(world, east, "p1-east", 3)
    _run(world, east2, "p1-east2", 2)
    project_page = _page(world.a.owner, "/t/acme/p/acme-p1/")
    assert f"1 of 4 {LEFT}" in project_page and "Across all clusters" in project_page
    tenant_page = _page(world.a.owner, "/t/acme/")
    assert f"5 of 6 {LEFT}" in tenant_page  # 3 on east (1 beyond 2), 2 on east2 (none beyond)


def test_no_one_sees_another_tenants_guarantee_left(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, _ = two
    _quotas(world)
    tenant_services.quota_set(
        actor=world.admin,
        scope="tenant",
        tenant=world.b.tenant,
        values={"gpus_guaranteed_all_clusters": Decimal(2)},
    )
    _run(world, east, "p1-east", 3)
    for url in ("/", reverse("workspaces:training-new"), reverse("workspaces:environment-new")):
        theirs = _page(world.b.member, url)
        # Their own tenant's, not acme's project or tenant lines.
        assert f"Tenant globex: 2 of 2 {LEFT}" in theirs, url
        assert "acme" not in theirs and f"of 4 {LEFT}" not in theirs and f"of 6 {LEFT}" not in theirs, url
        outsider = _page(world.outsider, url)
        assert LEFT not in outsider, url


def test_the_guarantee_left_costs_no_query_per_project(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """One query for the project and tenant quotas and one usage aggregate, however many
    projects have a guarantee across all clusters."""
    east, _ = two
    _quotas(world)
    _run(world, east, "p1-east", 3)

    def count() -> tuple[int, int]:
        c = Client()
        c.force_login(world.a.owner)
        with CaptureQueriesContext(connection) as q:
            page = c.get("/").content.decode()
        assert LEFT in page
        aggregates = sum(
            1 for x in q.captured_queries if "gpuslice" in x["sql"].lower() and "group by" in x["sql"].lower()
            and '"scheduling_gpudevice"."model"' in x["sql"]  # all_cluster_use's grouped read
        )
        return len(q), aggregates

    before, aggregates = count()
    assert aggregates == 1
    tenant_services.quota_set(
        actor=world.admin,
        scope="project",
        project=world.a.other_project,
        values={"gpus_guaranteed": Decimal(1), "gpus_guaranteed_all_clusters": Decimal(2)},
    )
    after, aggregates = count()
    assert aggregates == 1 and after == before
    assert f"2 of 2 {LEFT}" in _page(world.a.owner)
