"""API lists at scale (issue 13): a page costs the same number of queries whatever its size
(no query per row), and ``page_size`` is honoured within its bound."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from camp.pagination import CampPagination
from scheduling import services
from tests.conftest import client_for

from .conftest import gpu_group, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def busy(world: Any, sim_cluster: Any) -> Any:
    """30 jobs in acme's project: admitted (allocations, slices), preempting, waiting (with
    decisions and positions), with pod-group env (masked per reader)."""
    for i in range(2):
        submit(world, sim_cluster, f"batch-{i}", priority_class="batch",
               group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=sim_cluster)
    for i in range(28):
        submit(world, sim_cluster, f"job-{i}", priority_class="high" if i == 0 else "normal",
               groups=[gpu_group(gpu_count=1 + i % 2, env={"TOKEN": "x"}),
                       gpu_group(name="aux", gpu_count=0)])
    services.cycle_run(cluster=sim_cluster)
    services.cycle_run(cluster=sim_cluster)
    return world


def _page(client: Any, url: str, size: int, **params: Any) -> tuple[int, list[Any]]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, {"page_size": size, **params})
    assert response.status_code == 200, response.content
    return len(ctx.captured_queries), response.json()["results"]


@pytest.mark.parametrize("who", ["member", "owner"])
def test_jobs_list_queries_do_not_grow_with_the_page(busy: Any, who: str) -> None:
    client = client_for(getattr(busy.a, who))
    # oldest first: both pages hold the preempted batch jobs, which name their preemptor
    small, rows5 = _page(client, "/api/v1/jobs/", 5, ordering="submitted_at")
    large, rows25 = _page(client, "/api/v1/jobs/", 25, ordering="submitted_at")
    assert (len(rows5), len(rows25)) == (5, 25)
    assert large == small, (small, large)
    assert any(r["allocations"] for r in rows25) and all(r["last_decision"] for r in rows25)
    assert any(r["preempted_by"] for r in rows5)  # the preemptor is in the reader's project


def test_decisions_and_audit_lists_queries_do_not_grow_with_the_page(busy: Any) -> None:
    from scheduling.models import Job, SchedulingDecision

    job = Job.objects.filter(decisions__kind="preempted").first()
    assert job is not None
    for _ in range(8):  # more history for this job
        SchedulingDecision.objects.create(job=job, cluster_id=job.cluster_id, kind="waiting",
                                          preemptor=job.preempted_by, victims=[job.pk])
    owner = client_for(busy.a.owner)
    url = f"/api/v1/jobs/{job.pk}/decisions/"
    assert _page(owner, url, 2)[0] == _page(owner, url, 9)[0]
    assert _page(owner, "/api/v1/audit-events/", 5)[0] == _page(owner, "/api/v1/audit-events/", 40)[0]


def test_page_size_is_bounded(busy: Any) -> None:
    client = client_for(busy.a.member)
    data = client.get("/api/v1/jobs/", {"page_size": 7}).json()
    assert len(data["results"]) == 7 and data["count"] == 30
    # a huge page_size is cut to the bound rather than refused
    assert CampPagination.max_page_size == 500
    assert len(client.get("/api/v1/jobs/", {"page_size": 10**9}).json()["results"]) == 30


def _statements(client: Any, url: str, **params: Any) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, params)
    assert response.status_code == 200, response.content
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.parametrize("who", ["member", "owner"])
def test_list_pages_are_read_in_index_order_not_deduplicated(busy: Any, who: str) -> None:
    """A job or audit row matches a reader's scope at most once, so its page is read as the
    index gives it: with DISTINCT, PostgreSQL sorted and counted every visible row (all
    100,000 of a tenant) before taking the first page."""
    client = client_for(getattr(busy.a, who))
    urls = ["/api/v1/jobs/", f"/api/v1/jobs/?project={busy.a.project.pk}&state=queued"]
    if who == "owner":
        urls.append(f"/api/v1/audit-events/?tenant={busy.a.tenant.pk}")
    for url in urls:
        sql = _statements(client, url)
        assert not [s for s in sql if "DISTINCT" in s.upper()], url
        assert any(s.startswith('SELECT COUNT(*) AS "__count" FROM') for s in sql), url


def test_many_valued_scopes_still_list_each_row_once(busy: Any) -> None:
    """Users are seen through their memberships: one in two of the owner's projects is
    still listed once (those rules keep DISTINCT)."""
    from tenants.models import Membership, Role

    Membership.objects.create(user=busy.a.member, tenant=busy.a.tenant,
                              project=busy.a.other_project, role=Role.PROJECT_MEMBER)
    names = [u["username"] for u in client_for(busy.a.owner).get(
        "/api/v1/users/", {"page_size": 100}).json()["results"]]
    assert names.count(busy.a.member.username) == 1
