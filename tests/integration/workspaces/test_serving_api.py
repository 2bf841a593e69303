"""Model services through ``/api/v1/services/`` and ``camp serve …`` (the CLI as a subprocess
against a live server, with a real API token). Roles × tenants are in test_permission_matrix."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings

from registry.models import Image
from scheduling.models import Job
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.conftest import client_for
from workspaces.models import ModelService

from .conftest import advance

pytestmark = pytest.mark.django_db
URL = "/api/v1/services/"


def _body(world: Any, **kw: Any) -> dict[str, Any]:
    return {"name": "chat", "project": world.a.project.pk, "cluster": "sim",
            "image": Image.objects.get(name="vllm").pk, "model_source": "hf://Qwen/Qwen2.5-7B-Instruct",
            "gpu_memory_mib": 20480, "gpu_cores_percent": 30, "ram_mib": 8192, **kw}


def test_create_scale_rollout_delete_through_the_api(world: Any, sim_cluster: Any) -> None:
    member = client_for(world.a.member)
    bad = member.post(URL, _body(world, model_source="llama", gpu_cores_percent=30), format="json")
    assert bad.status_code == 400 and "model_source" in bad.json()
    made = member.post(URL, _body(world, env={"HF_TOKEN": "hf_secret"}), format="json",
                       HTTP_X_REQUEST_ID="req-svc-1")
    assert made.status_code == 201, made.content
    svc = made.json()
    assert (svc["desired_replicas"], svc["status"], svc["priority_class"]) == (1, "pending", "inference")
    assert [r["job"]["state"] for r in svc["replicas"]] == ["queued"]
    assert svc["image_reference"] == "docker.io/vllm/vllm-openai:v0.6.3"
    assert svc["endpoint"].startswith(f"http://svc-{svc['id']}-chat.") and svc["endpoint"].endswith(":8000")
    created = AuditEvent.objects.get(action="service.created", target_id=str(svc["id"]))
    assert created.request_id == "req-svc-1" and created.actor_id == world.a.member.pk
    # The append-only log keeps the environment's names, never its values (secrets).
    assert created.after["env_names"] == ["HF_TOKEN"] and "hf_secret" not in str(created.after)
    advance(sim_cluster)
    scaled = member.post(f"{URL}{svc['id']}/scale/", {"replicas": 2}, format="json")
    assert scaled.status_code == 200 and scaled.json()["desired_replicas"] == 2
    assert len(scaled.json()["replicas"]) == 2
    # Other members of the project see the service, not its secret values.
    seen = client_for(world.a.project_admin).get(f"{URL}{svc['id']}/").json()
    assert seen["env"] == {"HF_TOKEN": "hf_secret"}  # a project admin may change it: sees it
    rolled = member.post(f"{URL}{svc['id']}/rollout/", {"args": ["--max-model-len", "8192"]}, format="json")
    assert rolled.status_code == 200
    assert (rolled.json()["revision"], rolled.json()["status"]) == (2, "rolling")
    port = member.patch(f"{URL}{svc['id']}/", {"port": 9000}, format="json")
    assert port.status_code == 400 and "port" in port.json()
    patched = member.patch(f"{URL}{svc['id']}/", {"max_replicas": 4, "autoscale_target": 4}, format="json")
    assert patched.status_code == 200 and patched.json()["revision"] == 2  # scaling only: no new revision
    # PUT takes the whole representation back (read-only fields ignored, not refused).
    whole = {k: v for k, v in patched.json().items() if v is not None}
    put = member.put(f"{URL}{svc['id']}/", {**whole, "min_replicas": 2, "project": 999999}, format="json")
    assert put.status_code == 200, put.content
    assert put.json()["min_replicas"] == 2 and put.json()["project"] == world.a.project.pk
    gone = member.delete(f"{URL}{svc['id']}/")
    assert gone.status_code == 204 and not ModelService.objects.exists()
    assert not Job.objects.filter(kind="service").exclude(state__in=["cancelled"]).exists()
    assert AuditEvent.objects.filter(action="service.deleted", target_id=str(svc["id"])).exists()
    logged = AuditEvent.objects.filter(target_type__contains="modelservice").values_list("before", "after")
    assert logged and not any("hf_secret" in str(pair) for pair in logged)


def test_a_foreign_tenant_sees_nothing(world: Any, sim_cluster: Any) -> None:
    made = client_for(world.a.member).post(URL, _body(world), format="json")
    sid = made.json()["id"]
    other = client_for(world.b.owner)
    assert other.get(f"{URL}{sid}/").status_code == 404
    assert other.post(f"{URL}{sid}/scale/", {"replicas": 3}, format="json").status_code == 404
    assert other.get(URL).json()["results"] == []
    # Nor may it create in acme's project (the reference does not resolve: 400, not 403).
    assert client_for(world.b.member).post(URL, _body(world, name="x"), format="json").status_code == 400


def test_camp_serve_commands(world: Any, sim_cluster: Any, live_server: Any, tmp_path: Any) -> None:
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    project = f"{world.a.tenant.name}/{world.a.project.name}"
    made = camp("serve", "create", "embedder", "--project", project, "--cluster", "sim", "--image", "tgi",
                "--model", "hf://BAAI/bge-large-en", "--port", "80", "--gpu-memory", "10240",
                "--gpu-cores", "20", "--min", "1", "--max", "3", "--arg", "--max-batch-size=64",
                "--env", "LOG_LEVEL=info")
    assert made.returncode == 0, made.stdout + made.stderr
    assert "embedder" in made.stdout and "1 replica(s) queued" in made.stdout
    svc = ModelService.objects.get(name="embedder")
    assert (svc.port, svc.gpu_memory_mib, svc.max_replicas, svc.args, svc.env) == (
        80, 10240, 3, ["--max-batch-size=64"], {"LOG_LEVEL": "info"})
    assert svc.image is not None and svc.image.name == "tgi"
    advance(sim_cluster)
    listed = camp("serve", "list")
    assert listed.returncode == 0 and "embedder" in listed.stdout
    scaled = camp("serve", "scale", "embedder", "2")
    assert scaled.returncode == 0 and "2 desired" in scaled.stdout, scaled.stdout + scaled.stderr
    status = camp("serve", "status", "embedder")
    assert status.returncode == 0
    assert "#1 r1 embedder-r1-1: running" in status.stdout and "#2 r1 embedder-r1-2: queued" in status.stdout
    assert "latency: —" in status.stdout  # the simulated load knows no latency
    ModelService.objects.filter(pk=svc.pk).update(latency_p50_seconds=0.25, latency_p95_seconds=1.75,
                                                  load_error="Prometheus at http://prom:9090 did not answer")
    status = camp("serve", "status", "embedder")
    assert "latency: p50 250 ms · p95 1750 ms" in status.stdout
    assert "replicas held: Prometheus at http://prom:9090 did not answer" in status.stdout
    updated = camp("serve", "update", "embedder", "--max", "4", "--target", "16")
    assert updated.returncode == 0 and "max 4" in updated.stdout and "target 16" in updated.stdout
    svc.refresh_from_db()
    assert (svc.max_replicas, svc.autoscale_target, svc.revision) == (4, 16, 1)
    rolled = camp("serve", "rollout", "embedder", "--arg", "--max-batch-size=128")
    assert rolled.returncode == 0 and "revision 2" in rolled.stdout
    refused = camp("serve", "scale", "embedder", "--min", "5", "--max", "2")
    assert refused.returncode == 1 and "min_replicas" in refused.stdout + refused.stderr
    deleted = camp("serve", "delete", "embedder", "-y")
    assert deleted.returncode == 0 and not ModelService.objects.filter(name="embedder").exists()
    missing = camp("serve", "status", "embedder")
    assert missing.returncode == 1 and "No model service named embedder" in missing.stdout + missing.stderr


def test_the_list_costs_the_same_queries_whatever_its_size(world: Any, sim_cluster: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from workspaces import services

    def make(n: int, start: int) -> None:
        for i in range(start, start + n):
            services.model_service_create(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                                          name=f"m{i}", image_reference="vllm/vllm-openai:v0.6.3",
                                          model_source="hf://a/b", gpu_memory_mib=4096, gpu_cores_percent=5,
                                          ram_mib=1024)

    member = client_for(world.a.member)
    make(2, 0)
    advance(sim_cluster, rounds=1)  # a namespace exists now (stored on admission)
    with CaptureQueriesContext(connection) as few:
        assert len(member.get(URL).json()["results"]) == 2
    make(5, 2)
    with CaptureQueriesContext(connection) as many:
        body = member.get(URL).json()["results"]
    assert len(body) == 7 and len(many) == len(few)
    assert len({row["endpoint"].split(".")[1] for row in body}) == 1  # one project, one namespace
