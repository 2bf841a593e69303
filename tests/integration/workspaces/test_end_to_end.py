"""End to end on the simulated backend, through the REST API and the `camp` CLI.

Everything is real: pytest-django's live server answers HTTP, the CLI runs as a
subprocess (``python -m camp_cli``) with a real API token, a real Celery worker
(prefork) runs cycles, dispatches, stops and reconciles on PostgreSQL and Redis.
What is not real, and why: the simulated cluster's clock. Instead of training for
minutes, the test moves the simulated pods' start time back (as if they had run
that long), and the culling pass is asked what it would do N minutes from now.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from django.conf import settings
from django.utils import timezone

from scheduling import tasks as scheduling_tasks
from scheduling.models import DecisionKind, Job, SchedulingDecision, SimulatedPod
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.integration.scheduling.test_concurrency import celery_worker
from workspaces import services
from workspaces.models import DevEnvironment, TrainingJob

from .conftest import SMALL_INVENTORY

pytestmark = pytest.mark.django_db(transaction=True)


def _until(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    """Pump the scheduler tick (beat is not running) until ``check`` is truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        scheduling_tasks.scheduler_tick.delay()
        time.sleep(0.4)
    raise AssertionError(f"timed out waiting for: {what}")


def _camp(live_server: Any, token: str, tmp: Path, *args: str) -> str:
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp / "config.json")}
    proc = subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _pods(job: Job) -> list[SimulatedPod]:
    names = list(job.allocations.values_list("pod_name", flat=True))
    return sorted(SimulatedPod.objects.filter(name__in=names, deleted_at__isnull=True), key=lambda p: p.name)


def test_notebook_and_ddp_job_through_api_and_cli(world: Any, live_server: Any, tmp_path: Path) -> None:
    from scheduling import services as scheduling_services

    cluster = scheduling_services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    scheduling_services.inventory_sync(cluster=cluster)
    _, token = tenant_services.token_create(actor=world.a.member, name="e2e")
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    base = f"{live_server.url}/api/v1"

    with celery_worker():
        # 1. A Jupyter environment through the API: the answer carries a one-time link.
        r = api.post(f"{base}/environments/", json={
            "project": world.a.project.pk, "cluster": "sim", "name": "nb", "kind": "jupyter",
            "image": world_image("pytorch-jupyter"), "gpu_count": 1, "gpu_memory_mib": 8000,
            "gpu_cores_percent": 20, "cpu_millicores": 1000, "ram_mib": 2048, "home_gib": 5}, timeout=30)
        assert r.status_code == 201, r.text
        nb = r.json()
        assert nb["access_url"].startswith(f"http://localhost:8000/workspaces/simulated/ws/{nb['id']}-nb/?camp_token=")
        _until("the notebook runs", lambda: DevEnvironment.objects.get(pk=nb["id"]).state == "running")
        assert api.get(f"{base}/environments/{nb['id']}/", timeout=30).json()["access_url"] is None

        # 2. A 4-worker PyTorch DDP job through the CLI.
        job_yaml = tmp_path / "job.yaml"
        job_yaml.write_text(
            "kind: TrainingJob\nname: ddp\nproject: acme/acme-p1\ncluster: sim\nframework: pytorch\n"
            "image: pytorch-training\nworkers: 4\ngpu_count: 2\ncpu_millicores: 2000\nram_mib: 4096\n"
            "command: [torchrun, train.py]\ncheckpoint_dir: /ckpt\ncheckpoint_every: 30\n"
            "priority_class: batch\nduration_seconds: 3600\n")
        out = _camp(live_server, token, tmp_path, "submit", "-f", str(job_yaml))
        assert "training job ddp" in out
        ddp = TrainingJob.objects.get(name="ddp")
        _until("the DDP job runs", lambda: TrainingJob.objects.get(pk=ddp.pk).state == "running")
        ddp.refresh_from_db()
        job = ddp.job
        assert job is not None
        # Gang admission: one decision placed all four workers at once.
        admitted = SchedulingDecision.objects.get(job=job, kind=DecisionKind.ADMITTED)
        assert len(admitted.placement) == 4
        pods = _pods(job)
        envs = [p.annotations["camp.io/env"] for p in pods]
        master = f"ddp-{job.pk}-worker-0.ddp-{job.pk}.{job.namespace}.svc"
        assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"], e["PET_NNODES"],
                 e["PET_NPROC_PER_NODE"]) for e in envs} == {("4", master, "29500", "4", "2")}
        assert [e["PET_NODE_RANK"] for e in envs] == ["0", "1", "2", "3"]
        assert all(e["CAMP_CHECKPOINT_DIR"] == "/ckpt" and "CAMP_RESUME_FROM" not in e for e in envs)

        out = _camp(live_server, token, tmp_path, "ls")
        assert "ddp" in out and "running" in out and "nb" in out
        # 95 simulated seconds of training: rank 0 has written checkpoints at 30, 60, 90.
        SimulatedPod.objects.filter(pk__in=[p.pk for p in pods]).update(
            start_at=timezone.now() - dt.timedelta(seconds=95))
        logs = _camp(live_server, token, tmp_path, "logs", "ddp", "--tail", "20")
        assert "CAMP_CHECKPOINT step=90 path=/ckpt/step-90" in logs and "rank 3 of 4" in logs
        services.training_sync(training=ddp)
        job.refresh_from_db()
        assert job.last_checkpoint == "/ckpt/step-90"

        # 3. A high-priority job needs all eight A100s: the DDP job is preempted, requeued,
        #    and resumes from its checkpoint once the urgent job is done.
        # (high is for project admins and above: the project admin submits it)
        _, admin_token = tenant_services.token_create(actor=world.a.project_admin, name="e2e-admin")
        r = requests.post(f"{base}/training-jobs/", headers={"Authorization": f"Bearer {admin_token}"}, json={
            "project": world.a.project.pk, "cluster": "sim", "name": "urgent", "framework": "pytorch",
            "image_reference": "pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", "workers": 2,
            "gpu_count": 4, "cpu_millicores": 1000, "ram_mib": 2048, "priority_class": "high",
            "duration_seconds": 2}, timeout=30)
        assert r.status_code == 201, r.text
        _until("the DDP job is preempted", lambda: SchedulingDecision.objects.filter(
            job=job, kind=DecisionKind.PREEMPTED).exists())
        why = _camp(live_server, token, tmp_path, "why", "ddp")
        assert "ddp:" in why
        _until("the urgent job succeeds",
               lambda: TrainingJob.objects.get(name="urgent").state == "succeeded", timeout=90)
        _until("the DDP job runs again", lambda: Job.objects.get(pk=job.pk).state == "running"
               and len(_pods(Job.objects.get(pk=job.pk))) == 4, timeout=90)
        resumed = [p.annotations["camp.io/env"] for p in _pods(Job.objects.get(pk=job.pk))]
        assert {e["CAMP_RESUME_FROM"] for e in resumed} == {"/ckpt/step-90"}
        assert [e["RANK"] for e in resumed] == ["0", "1", "2", "3"]
        logs = _camp(live_server, token, tmp_path, "logs", "ddp", "--pod", f"ddp-{job.pk}-worker-0")
        assert "resuming from checkpoint /ckpt/step-90 at step 90" in logs
        services.training_sync(training=ddp)
        detail = api.get(f"{base}/training-jobs/{ddp.pk}/", timeout=30).json()
        assert detail["restarts"] == 1 and detail["lost_gpu_seconds"] > 0
        assert detail["last_checkpoint"]["path"] == "/ckpt/step-90"
        assert detail["run"]["attempts"] == 2

        # 4. Idle culling: a warning first, then the notebook is stopped (volume kept).
        services.workspace_policy_set(actor=world.a.project_admin, project=world.a.project,
                                      idle_minutes=30, warning_minutes=5)
        later = timezone.now() + dt.timedelta(minutes=26)
        assert services.environments_cull(now=later)["warned"] == [nb["id"]]
        shown = api.get(f"{base}/environments/{nb['id']}/", timeout=30).json()
        assert "will be stopped at" in shown["cull_warning"]
        assert "will be stopped at" in _camp(live_server, token, tmp_path, "ls")
        assert services.environments_cull(now=later + dt.timedelta(minutes=6))["culled"] == [nb["id"]]
        _until("the notebook is stopped", lambda: DevEnvironment.objects.get(pk=nb["id"]).state == "stopped"
               and not _pods(DevEnvironment.objects.get(pk=nb["id"]).job))  # type: ignore[arg-type]

        # 5. The CLI stops the DDP job.
        out = _camp(live_server, token, tmp_path, "stop", "ddp")
        assert "Stopped by acme-member" in out
        _until("the DDP job's pods are gone", lambda: not _pods(Job.objects.get(pk=job.pk)))

    # Every step is in the audit log, with who did it.
    actions = list(AuditEvent.objects.order_by("id").values_list("action", "actor_username"))
    for expected in [("environment.launched", "acme-member"), ("training.submitted", "acme-member"),
                     ("job.admitted", "scheduler"), ("job.preempted", "scheduler"),
                     ("job.requeued", "scheduler"), ("environment.cull_warned", "culler"),
                     ("environment.culled", "culler"), ("training.stopped", "acme-member")]:
        assert expected in actions, expected
    assert json.dumps(list(AuditEvent.objects.values_list("after", flat=True)), default=str).count(
        token) == 0


def world_image(name: str) -> int:
    from registry.models import Image

    return Image.objects.get(name=name).pk
