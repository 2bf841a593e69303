"""Issue 28 finding 4: a finished job's output is kept. When its pods are stopped Camp keeps
the tail of each pod's log (``PodLogTail``: bounded, per pod and attempt, tenant-scoped),
and serves it after the pods are gone on ``GET …/logs/``, the job page and ``camp logs``
(a subprocess against Django's live server with a real API token). The simulated backend
is the cluster (its synthetic logs); the real node tier reads a kubelet's."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from scheduling.models import LOG_TAIL_BYTES, JobState, PodLogTail, SimulatedPod
from tenants import services as tenant_services
from tests.conftest import client_for
from workspaces import services

from .conftest import advance

pytestmark = pytest.mark.django_db(transaction=True)


def _failed_training(world: Any, cluster: Any) -> Any:
    t = services.training_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                                 name="oops", framework="pytorch", image_reference="pytorch/pytorch:2",
                                 workers=2, gpu_count=1, cpu_millicores=1000, ram_mib=1024,
                                 duration_seconds=3600)
    advance(cluster)
    t.refresh_from_db()
    assert t.job is not None and t.job.state == JobState.RUNNING
    # It ran for 5 minutes and its containers just exited non-zero.
    now = timezone.now()
    SimulatedPod.objects.filter(name__in=t.job.allocations.values_list("pod_name", flat=True)).update(
        start_at=now - dt.timedelta(minutes=5), finish_at=now - dt.timedelta(seconds=1), fail=True)
    advance(cluster)
    t.refresh_from_db()
    assert t.job.state == JobState.FAILED and not t.job.allocations.exists()
    assert "exit code 1" in t.job.reason
    return t


def test_a_failed_training_jobs_last_lines_are_kept_and_served(world: Any, sim_cluster: Any,
                                                               live_server: Any, tmp_path: Path) -> None:
    t = _failed_training(world, sim_cluster)
    assert not SimulatedPod.objects.filter(deleted_at__isnull=True).exists()  # the pods are gone
    kept = list(PodLogTail.objects.filter(job=t.job).order_by("pod_name"))
    assert len(kept) == 2 and {k.tenant_id for k in kept} == {world.a.tenant.pk}
    assert all(k.text and len(k.text) <= LOG_TAIL_BYTES for k in kept)

    logs = client_for(world.a.member).get(f"/api/v1/training-jobs/{t.pk}/logs/?tail=5").json()
    assert [e["pod"] for e in logs] == [k.pod_name for k in kept]
    assert [e["text"] for e in logs] == ["\n".join(k.text.splitlines()[-5:]) for k in kept]
    assert all("step" in e["text"] for e in logs)
    # Another tenant sees neither the job nor its output.
    assert client_for(world.b.member).get(f"/api/v1/training-jobs/{t.pk}/logs/").status_code == 404

    page = client_for(world.a.member).get(f"/workspaces/training/{t.pk}/").content.decode()
    last = kept[0].text.splitlines()[-1]
    assert last.split(" ", 1)[1] in page

    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    out = subprocess.run([sys.executable, "-m", "camp_cli", "logs", "oops", "--tail", "3"], env=env,
                         cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"==> {kept[0].pod_name} (worker) <==" in out.stdout and last in out.stdout


def test_a_logs_error_is_json_even_when_text_was_asked_for(world: Any, sim_cluster: Any) -> None:
    """The schema documents every error as JSON: a logs request for text (``?format=txt``, or
    an event stream) that fails — no such object, another tenant's — still gets a JSON body a
    client can read (found by the schema fuzzer: a 404 came back as ``text/plain``)."""
    t = _failed_training(world, sim_cluster)
    api = client_for(world.a.member)
    ok = api.get(f"/api/v1/training-jobs/{t.pk}/logs/?format=txt&tail=1")
    assert ok.status_code == 200 and ok["Content-Type"].startswith("text/plain")
    for path in (f"/api/v1/training-jobs/{t.pk + 10_000}/logs/?format=txt",
                 f"/api/v1/environments/{10**9}/logs/?format=txt&follow=true"):
        missing = api.get(path)
        assert missing.status_code == 404 and missing["Content-Type"] == "application/json", path
        assert "detail" in missing.json()
    outsider = client_for(world.b.member).get(f"/api/v1/training-jobs/{t.pk}/logs/?follow=true",
                                               HTTP_ACCEPT="text/event-stream")
    assert outsider.status_code == 404 and outsider["Content-Type"] == "application/json"
