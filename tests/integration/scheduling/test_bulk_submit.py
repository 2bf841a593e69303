"""Bulk submit (issue 13): ``POST /api/v1/jobs/bulk/`` queues a sweep all or nothing, names
each bad item's field, is audited like single submits and honours Idempotency-Key."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, SchedulingDecision
from tenants.audit import verify_chain
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import gpu_group

pytestmark = pytest.mark.django_db
URL = "/api/v1/jobs/bulk/"


def _item(world: Any, cluster: Any, name: str, **kw: Any) -> dict[str, Any]:
    return {"project": world.a.project.pk, "cluster": cluster.name, "name": name,
            "groups": [gpu_group(gpu_memory_mib=10000, gpu_cores_percent=10)], **kw}


def test_bulk_submit_queues_every_job_and_audits_each(world: Any, sim_cluster: Any) -> None:
    client = client_for(world.a.member)
    body = {"jobs": [_item(world, sim_cluster, f"sweep-{i}", priority_class="batch") for i in range(20)]}
    response = client.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["count"] == 20 and [j["name"] for j in data["jobs"]] == [f"sweep-{i}" for i in range(20)]
    jobs = Job.objects.filter(project=world.a.project, name__startswith="sweep-")
    assert jobs.count() == 20 and set(jobs.values_list("state", flat=True)) == {JobState.QUEUED}
    assert all(j.preemptible and j.owner_id == world.a.member.pk for j in jobs)
    assert SchedulingDecision.objects.filter(job__in=jobs, kind="submitted").count() == 20
    audit = AuditEvent.objects.filter(action="job.submitted", actor=world.a.member)
    assert audit.count() == 20 and audit.first().after["groups"][0]["gpu_memory_mib"] == 10000
    assert not list(verify_chain())
    # and the scheduler takes them like any others
    summary = services.cycle_run(cluster=sim_cluster)
    # the heads of the project's queue follow its share of the 10 free GPUs by what the jobs ask
    # (CycleConfig.heads_fill): 20 slices of a tenth of a card are all offered, all fit, in one cycle
    assert summary is not None and sorted(summary.admitted) == sorted(jobs.values_list("pk", flat=True))


def test_bulk_submit_is_all_or_nothing_with_errors_per_item(world: Any, sim_cluster: Any) -> None:
    client = client_for(world.a.member)
    services.job_submit(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                        name="exists", groups=[gpu_group()])
    body = {"jobs": [
        _item(world, sim_cluster, "fine-0"),
        _item(world, sim_cluster, "exists"),                                      # taken in the project
        _item(world, sim_cluster, "fine-0"),                                      # twice in the request
        _item(world, sim_cluster, "bad-cores", groups=[gpu_group(gpu_cores_percent=150)]),
        {**_item(world, sim_cluster, "foreign"), "project": world.b.project.pk},  # not theirs
        _item(world, sim_cluster, "inference", priority_class="inference", preemptible=True),
    ]}
    response = client.post(URL, body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert set(errors) == {"jobs[3].groups[0].gpu_cores_percent", "jobs[4].project"}, errors
    # the serializer's checks pass once those two are fixed; then the service's rules speak
    body["jobs"] = body["jobs"][:3] + body["jobs"][5:]
    response = client.post(URL, body, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"jobs[1].name", "jobs[2].name", "jobs[3].preemptible"}
    assert "jobs[0]" in response.json()["jobs[2].name"][0]
    assert not Job.objects.filter(name__in=["fine-0", "inference"]).exists()
    assert client.post(URL, {"jobs": []}, format="json").status_code == 400


def test_bulk_submit_honours_idempotency_key(world: Any, sim_cluster: Any) -> None:
    client = client_for(world.a.member)
    body = {"jobs": [_item(world, sim_cluster, f"once-{i}") for i in range(3)]}
    first = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    again = client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and again.json() == first.json()
    assert Job.objects.filter(name__startswith="once-").count() == 3
    other = client.post(URL, {"jobs": body["jobs"][:1]}, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert other.status_code == 422


def test_bulk_submit_needs_the_right_to_submit(world: Any, sim_cluster: Any) -> None:
    body = {"jobs": [_item(world, sim_cluster, "nope")]}
    assert client_for(world.outsider).post(URL, body, format="json").status_code == 400  # unseen project
    assert client_for(None).post(URL, body, format="json").status_code in (401, 403)
    assert not Job.objects.filter(name="nope").exists()


@pytest.mark.django_db(transaction=True)
def test_camp_submit_sends_many_job_documents_in_one_bulk_request(
        world: Any, sim_cluster: Any, live_server: Any, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tenants import services as tenant_services

    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    project = f"{world.a.tenant.name}/{world.a.project.name}"
    docs = "\n---\n".join(
        f"kind: Job\nname: lr-{i}\nproject: {project}\ncluster: {sim_cluster.name}\n"
        f"priority_class: batch\ngroups: [{{name: worker, gpu_count: 1}}]" for i in range(5))
    path = tmp_path / "sweep.yaml"
    path.write_text(docs + "\n")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    done = camp("submit", "-f", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line.split()[1] for line in done.stdout.splitlines()] == [f"lr-{i}" for i in range(5)]
    assert Job.objects.filter(project=world.a.project, name__startswith="lr-").count() == 5
    # all or nothing: a sweep naming a taken job queues none of it, and says which one
    path.write_text(docs.replace("lr-0", "lr-new") + "\n")
    refused = camp("submit", "-f", str(path))
    assert refused.returncode == 1 and "jobs[1].name" in refused.stdout + refused.stderr
    assert not Job.objects.filter(name="lr-new").exists()


def test_bulk_submit_statements_do_not_grow_with_the_jobs(world: Any, sim_cluster: Any) -> None:
    """Each item names the same project and cluster; they are looked up once per request,
    not once per item (100 jobs took 311 statements, 3 of them per job)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = client_for(world.a.member)
    counts = []
    for n in (2, 12):
        body = {"jobs": [_item(world, sim_cluster, f"n{n}-{i}") for i in range(n)]}
        with CaptureQueriesContext(connection) as ctx:
            response = client.post(URL, body, format="json")
        assert response.status_code == 201, response.content
        counts.append(len(ctx.captured_queries))
    assert counts[0] == counts[1], counts
    assert not list(verify_chain())


def test_a_foreign_project_in_a_later_item_is_still_refused(world: Any, sim_cluster: Any) -> None:
    """Lookups are remembered per request only for what resolved: every item is checked."""
    client = client_for(world.a.member)
    body = {"jobs": [_item(world, sim_cluster, "mine"),
                     {**_item(world, sim_cluster, "theirs"), "project": world.b.project.pk}]}
    response = client.post(URL, body, format="json")
    assert response.status_code == 400 and "jobs[1].project" in response.json(), response.content
    assert not Job.objects.filter(name__in=["mine", "theirs"]).exists()
