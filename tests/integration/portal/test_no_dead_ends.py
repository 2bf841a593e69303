"""No dead ends and no half sentences on a job's pages (issue 32, finding 6): no "Why: —"
right after submit, "Place in line" with a number or not at all, "Estimated start" with the
estimator's answer or words saying why there is none, the audit log answering a member with
Camp's page saying why, and a stopped job's pods never listed as Running."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from registry.models import Image
from scheduling import services as scheduling
from scheduling.models import Allocation, JobState, PodPhase
from tests.integration.scheduling.conftest import submit
from tests.integration.workspaces.conftest import (
    advance,
    sim_cluster,  # noqa: F401 (fixture)
)
from workspaces import services

pytestmark = pytest.mark.django_db


def _get(user: Any, url: str, status: int = 200) -> str:
    c = Client()
    c.force_login(user)
    r = c.get(url)
    assert r.status_code == status
    return r.content.decode()


def _visible(page: str) -> str:
    """The page's text without the paragraphs it sends hidden (live updates may show them)."""
    return re.sub(r"<p[^>]*\shidden[^>]*>.*?</p>", "", page, flags=re.S)


def test_right_after_submit_the_pages_say_what_the_job_waits_for(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    job = submit(world, cluster=sim_cluster, name="fresh")
    page = _visible(_get(world.a.member, f"/scheduling/jobs/{job.pk}/"))
    assert "Waiting for the next scheduling cycle" in page
    assert 'data-live-field="reason">—' not in page
    assert "Place in line" not in page  # no number yet: no sentence
    env, *_ = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), gpu_count=1, gpu_memory_mib=1024,
        gpu_cores_percent=10, cpu_millicores=500, ram_mib=1024)
    page = _visible(_get(world.a.member, f"/workspaces/environments/{env.pk}/"))
    assert "Why:</strong> <span data-live-field=\"reason\">Waiting for the next scheduling cycle" in page
    assert "Queue position" not in page
    # The API and the live channel read the same words (the job's reason as pages show it).
    from portal.live import job_payload
    assert job_payload(job)["reason"].startswith("Waiting for the next scheduling cycle")


def test_place_in_line_has_a_number_and_the_estimate_says_why_there_is_none(
        world: Any, sim_cluster: Any) -> None:  # noqa: F811
    first = submit(world, cluster=sim_cluster, name="fill", group={"gpu_count": 4, "replicas": 2})
    advance(sim_cluster)
    first.refresh_from_db()
    assert first.state == JobState.RUNNING, first.reason
    waiting = submit(world, cluster=sim_cluster, name="behind", group={"gpu_count": 4})
    advance(sim_cluster)
    waiting.refresh_from_db()
    assert waiting.state == JobState.QUEUED and waiting.queue_position
    page = _visible(_get(world.a.member, f"/scheduling/jobs/{waiting.pk}/"))
    assert re.search(r"Place in line:</strong> <span data-live-field=\"queue\">\d+ of \d+</span>", page)
    estimate = re.search(r"Estimated start:</strong> (.*?)</p>", page, flags=re.S)
    assert estimate is not None
    words = re.sub(r"<[^>]+>", "", estimate.group(1)).strip()
    assert words and not words.startswith("—"), words
    assert words.startswith(("Not known: the running jobs do not say how long they run",
                             "within a minute")) or re.match(r"\d{4}-\d\d-\d\d", words), words


def test_a_member_following_the_audit_link_gets_camps_page_saying_why(world: Any) -> None:
    page = _get(world.a.member, reverse("console:audit"), status=403)
    assert 'id="error-page"' in page and "<nav" in page  # Camp's styled page with the nav
    assert "The audit log is read by tenant owners and platform admins" in page
    home = _get(world.a.member, "/")
    assert 'href="/audit/"' not in home and reverse("console:audit") not in home


def test_a_stopped_jobs_pods_are_not_listed_as_running(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    job = submit(world, cluster=sim_cluster, name="stopme")
    advance(sim_cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert Allocation.objects.filter(job=job, phase=PodPhase.RUNNING).exists()
    assert "<td>Running</td>" in _get(world.a.member, f"/scheduling/jobs/{job.pk}/")
    scheduling.job_cancel(actor=world.a.member, job=job)  # the stop is queued, pods not gone yet
    job.refresh_from_db()
    assert job.state != JobState.RUNNING
    page = _get(world.a.member, f"/scheduling/jobs/{job.pk}/")
    assert Allocation.objects.filter(job=job).exists()  # pods still there while they are deleted
    assert "<td>Stopping</td>" in page
    assert "<td>Running</td>" not in page
