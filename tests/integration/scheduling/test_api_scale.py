"""API lists at scale (issue 13): a page costs the same number of queries whatever its size
(no query per row), and ``page_size`` is honoured within its bound."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.utils.urls import replace_query_param

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
    """One page; a ``url`` with its own query string (a ``next`` link) is requested as is."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url) if "?" in url else client.get(url, {"page_size": size, **params})
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


def _walk(client: Any, url: str, size: int, **params: Any) -> tuple[list[int], list[int]]:
    """Follow ``next`` links from the first page to the end: the ids in order and the
    statements each page took."""
    ids: list[int] = []
    statements: list[int] = []
    link: str | None = url
    query: dict[str, Any] = {"page_size": size, **params}
    while link:
        with CaptureQueriesContext(connection) as ctx:
            response = client.get(link, query)
        assert response.status_code == 200, response.content
        statements.append(len(ctx.captured_queries))
        body = response.json()
        ids += [row["id"] for row in body["results"]]
        link, query = body["next"], {}
    return ids, statements


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/audit-events/"])
def test_cursor_pages_walk_the_list_once_in_order_at_constant_cost(busy: Any, url: str) -> None:
    """Following ``next`` from the first page gives every row once, in the list's order; a
    page reached by cursor takes the same statements at any size (no COUNT, no query per
    row) — and so at any depth, since it is the same indexed read from another position."""
    client = client_for(busy.a.owner)
    # queued jobs: no allocations, so every page prefetches the same relations
    where = {"state": "queued"} if "jobs" in url else {}
    everything = [row["id"] for row in client.get(url, {"page_size": 500, **where}).json()["results"]]
    assert len(everything) >= 12
    ids, statements = _walk(client, url, 3, **where)
    assert ids == everything
    cursor = client.get(url, {"page_size": 1, **where}).json()["next"]
    small, rows_small = _page(client, replace_query_param(cursor, "page_size", 2), 2)
    large, rows_large = _page(client, replace_query_param(cursor, "page_size", 10), 10)
    assert [r["id"] for r in rows_small] == everything[1:3]
    assert [r["id"] for r in rows_large] == everything[1:11]
    assert small == large == statements[1] == statements[0] - 1  # the first page also counts
    with CaptureQueriesContext(connection) as ctx:
        client.get(cursor)
    assert not [q for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]


def test_cursor_breaks_ties_by_id(busy: Any) -> None:
    """A bulk submit gives its jobs one submitted_at: none lost or repeated across pages."""
    from scheduling.models import Job

    client = client_for(busy.a.owner)
    Job.objects.filter(tenant=busy.a.tenant).update(submitted_at=Job.objects.first().submitted_at)
    ids = list(Job.objects.filter(tenant=busy.a.tenant).order_by("-id").values_list("pk", flat=True))
    assert _walk(client, "/api/v1/jobs/", 4)[0] == ids


def test_cursor_pages_go_back_and_keep_filters(busy: Any) -> None:
    client = client_for(busy.a.owner)
    params = {"project": busy.a.project.pk, "state": "queued"}
    first = client.get("/api/v1/jobs/", {"page_size": 3, **params}).json()
    assert first["count"] >= 7 and first["previous"] is None
    second = client.get(first["next"]).json()
    assert second["count"] is None and "project=" in second["next"] and "state=queued" in second["next"]
    back = client.get(second["previous"]).json()
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]
    assert back["previous"] is None and back["next"]
    assert all(r["state"] == "queued" for r in second["results"])
    # An explicit page number keeps the page-number contract.
    numbered = client.get("/api/v1/jobs/", {"page_size": 3, "page": 2, **params}).json()
    assert numbered["count"] == first["count"] and "page=3" in numbered["next"]
    assert [r["id"] for r in numbered["results"]] == [r["id"] for r in second["results"]]


def test_bad_cursor_is_a_400_naming_it(busy: Any) -> None:
    client = client_for(busy.a.owner)
    import base64
    import json

    def enc(values: Any, forward: Any = True) -> str:
        return base64.urlsafe_b64encode(json.dumps({"v": values, "f": forward}).encode()).decode()

    for url, bads in [
        ("/api/v1/jobs/", ["nonsense", enc([1]), enc([None, None]), enc(["2026-11-24T10:00:00+00:00", None]),
                           enc(["0001-01-01T00:00:00+05:00", 1]), enc(["2026-11-24T10:00:00", 1]),
                           enc(["2026-11-24T10:00:00+00:00", 2**70]),
                           enc(["2026-11-24T10:00:00+00:00", 1], "x"),
                           base64.urlsafe_b64encode(b"[1, 2]").decode()]),
        ("/api/v1/audit-events/", [enc([None]), enc([{"a": 1}]), enc(["x"])]),
    ]:
        for bad in bads:
            response = client.get(url, {"cursor": bad})
            assert response.status_code == 400 and "cursor" in response.json(), (url, bad)
    # An order that does not end in the id pages by number only.
    response = client.get("/api/v1/jobs/", {"cursor": "x", "ordering": "priority"})
    assert response.status_code == 400 and "page numbers" in str(response.json())
