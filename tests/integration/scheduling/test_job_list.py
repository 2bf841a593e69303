"""The console's job list: search, filters, sorting and pages narrow what the reader may
see (never widen it), and bulk stop cancels each chosen job through job_cancel, with its
permission check and an audit event per job."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from scheduling.models import Job, JobState
from tenants.models import AuditEvent

from .conftest import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def jobs(world: Any, sim_cluster: Any) -> list[Any]:
    out = [submit(world, sim_cluster, f"sweep-{i:02d}") for i in range(30)]
    out.append(submit(world, sim_cluster, "owner-job", user="owner"))
    out.append(submit(world, sim_cluster, "globex-job", side="b"))
    return out


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _names(html: str) -> list[str]:
    return re.findall(r'<a href="/scheduling/jobs/\d+/">([^<]+)</a>', html)


def test_search_filter_sort_and_pages(world: Any, jobs: list[Any]) -> None:
    c = _client(world.a.owner)
    first = c.get("/scheduling/jobs/").content.decode()
    assert "<strong>31</strong> jobs" in first and "Page 1 of 2" in first
    assert "globex-job" not in first
    second = c.get("/scheduling/jobs/?page=2").content.decode()
    assert len(_names(first)) == 25 and len(_names(second)) == 6
    assert not set(_names(first)) & set(_names(second))
    found = c.get("/scheduling/jobs/?q=sweep-0").content.decode()
    assert sorted(_names(found)) == [f"sweep-{i:02d}" for i in range(10)]
    mine = c.get("/scheduling/jobs/?owner=me").content.decode()
    assert _names(mine) == ["owner-job"]
    by_name = _names(c.get("/scheduling/jobs/?sort=-name&per_page=100").content.decode())
    assert by_name == sorted(by_name, reverse=True) and len(by_name) == 31
    Job.objects.filter(name="sweep-05").update(state=JobState.RUNNING)
    running = c.get("/scheduling/jobs/?state=running").content.decode()
    assert _names(running) == ["sweep-05"] and "1</strong> job matches" in running
    # another tenant's project is not a choice, and naming it filters nothing in
    foreign = c.get(f"/scheduling/jobs/?project={world.b.project.pk}").content.decode()
    assert "globex-job" not in foreign


def test_bulk_stop_checks_each_job_and_audits_it(world: Any, jobs: list[Any]) -> None:
    member = _client(world.a.member)
    mine = [j.pk for j in jobs[:3]]
    theirs = next(j for j in jobs if j.name == "owner-job")
    foreign = next(j for j in jobs if j.name == "globex-job")
    r = member.post("/scheduling/jobs/stop/", {"job": [*mine, theirs.pk, foreign.pk], "next": "q=sweep"})
    assert r.status_code == 302 and r["Location"] == "/scheduling/jobs/?q=sweep"
    assert set(Job.objects.filter(pk__in=mine).values_list("state", flat=True)) == {JobState.CANCELLED}
    assert Job.objects.get(pk=foreign.pk).state == JobState.QUEUED  # not visible: untouched
    assert Job.objects.get(pk=theirs.pk).state == JobState.QUEUED  # a colleague's: refused
    events = AuditEvent.objects.filter(action="job.cancelled")
    assert events.count() == len(mine)
    assert all(e.actor_username == "acme-member" for e in events)
    page = member.get("/scheduling/jobs/?q=sweep").content.decode()
    assert "Stopped 3 jobs" in page and "not yours to stop): owner-job" in page
    # the checkbox is offered only where stopping is allowed
    listing = member.get("/scheduling/jobs/?q=owner-job").content.decode()
    assert 'name="job"' not in listing


def test_hostile_list_parameters_answer_200_and_say_what_is_wrong(world: Any, jobs: list[Any]) -> None:
    c = _client(world.a.member)
    for query in ("project=99999999999999999999999", "project=abc", "state=nope", "sort=password",
                  "per_page=-1", "page=999", "cluster=%00", "q=" + "x" * 5000, "kind=<script>"):
        r = c.get(f"/scheduling/jobs/?{query}")
        assert r.status_code == 200, query
        assert "<script>" not in r.content.decode().split("<main")[1], query
    bad = c.get("/scheduling/jobs/?state=nope").content.decode()
    assert "Select a valid choice" in bad and "<strong>0</strong> jobs" in bad


def test_live_counts_follow_the_filters_and_rows_stay_within_reach(world: Any, jobs: list[Any]) -> None:
    """/scheduling/jobs/live/ (what static/live.js refreshes the list from): per-state counts
    of the list's own filters, and the live fields of the asked rows the reader may see."""
    c = _client(world.a.owner)
    Job.objects.filter(name__in=["sweep-05", "sweep-06"]).update(state=JobState.RUNNING)
    page = c.get("/scheduling/jobs/").content.decode()
    assert ('data-live-count="running"><span class="state state-running">Running</span>'
            ' <strong>2</strong>') in page
    assert 'data-live-count="failed" hidden' in page
    everything = c.get("/scheduling/jobs/live/?").json()
    assert everything["states"] == {"queued": 29, "running": 2} and everything["total"] == 31
    Job.objects.filter(name="sweep-06").update(state=JobState.FAILED, reason="exit code 1")
    sweep0 = c.get("/scheduling/jobs/live/?q=sweep-0").json()
    assert sweep0["states"] == {"queued": 8, "running": 1, "failed": 1} and sweep0["total"] == 10
    mine, theirs = jobs[6], jobs[-1]  # sweep-06 and the other tenant's globex-job
    rows = c.get(f"/scheduling/jobs/live/?state=running&ids={mine.pk},{theirs.pk},x").json()
    assert rows["states"] == {"running": 1} and rows["total"] == 1  # "ids" is no filter
    assert rows["jobs"] == [{"id": mine.pk, "state": "failed", "state_display": "Failed",
                             "reason": "exit code 1", "as_of": "",  # a final job's reason has no "as of"
                             "queue_position": mine.queue_position,
                             "queue_length": mine.queue_length}]
    assert Client().get("/scheduling/jobs/live/").status_code == 302  # login first
