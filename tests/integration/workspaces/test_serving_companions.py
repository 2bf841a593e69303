"""Model services with companions (issue 15: a same-node group, the draft and target of
speculative decoding) and an optional Ingress, on the simulated backend through the real
services and scheduler: every replica is one job of one pod per model with same-node
affinity, so draft and target always share a node and are placed, scaled and removed
together; bad companions are a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from scheduling import services as scheduling
from scheduling.models import Allocation, JobState
from scheduling.services import job_specs
from tenants import services as tenant_services
from tenants.models import AuditEvent, Role
from tests.conftest import client_for, make_user
from workspaces.models import ModelService, ServiceReplica
from workspaces.selectors import ENV_MASK
from workspaces.services import serving

from .conftest import advance

pytestmark = pytest.mark.django_db

TWO_NODES = """
start_delay_seconds: 0
default_duration_seconds: 86400
nodes:
  - name: node-a
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 2, memory_mib: 81920}
  - name: node-b
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 2, memory_mib: 81920}
"""
ONE_CARD_EACH = """
start_delay_seconds: 0
default_duration_seconds: 86400
nodes:
  - name: node-a
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 1, memory_mib: 81920}
  - name: node-b
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 1, memory_mib: 81920}
"""
DRAFT = {"name": "draft", "image_reference": "docker.io/vllm/vllm-openai:v0.6.3",
         "model_source": "hf://Qwen/Qwen2.5-0.5B-Instruct", "port": 8001, "gpu_memory_mib": 20480,
         "gpu_cores_percent": 20, "cpu_millicores": 1000, "ram_mib": 4096, "env": {"HF_TOKEN": "hf_draft"}}


def _cluster(world: Any, inventory: str) -> Any:
    cluster = scheduling.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                        inventory=inventory)
    scheduling.inventory_sync(cluster=cluster)
    return cluster


def _service(world: Any, cluster: Any, **kw: Any) -> ModelService:
    base: dict[str, Any] = {"image_reference": "docker.io/vllm/vllm-openai:v0.6.3",
                            "model_source": "hf://Qwen/Qwen2.5-14B-Instruct", "gpu_memory_mib": 40960,
                            "gpu_cores_percent": 50, "cpu_millicores": 2000, "ram_mib": 8192,
                            "companions": [dict(DRAFT)]}
    base.update(kw)
    return serving.model_service_create(actor=world.a.member, project=world.a.project, cluster=cluster,
                                        name="spec", **base)


def _nodes_of(r: ServiceReplica) -> dict[str, str]:
    """Pod group → node of a replica's pods."""
    return dict(Allocation.objects.filter(job=r.job).values_list("group__name", "node__name"))


def test_draft_and_target_of_every_replica_share_a_node(world: Any) -> None:
    cluster = _cluster(world, TWO_NODES)
    svc = _service(world, cluster, min_replicas=4, max_replicas=4)
    advance(cluster)
    reps = list(svc.replicas.select_related("job").order_by("number"))
    assert [r.job.state for r in reps] == [JobState.RUNNING] * 4
    assert {r.job.affinity for r in reps} == {"same-node"}
    placed = [_nodes_of(r) for r in reps]
    # One pod per model in each replica, both on one node; the replicas use both nodes.
    assert all(set(p) == {"server", "draft"} and len(set(p.values())) == 1 for p in placed), placed
    assert {p["server"] for p in placed} == {"node-a", "node-b"}
    svc = serving.model_service_autoscale(service=svc, load=1)
    assert (svc.ready_replicas, svc.status) == (4, "ready")  # a replica is ready when both pods are


def test_a_replica_waits_rather_than_split_across_nodes(world: Any) -> None:
    """node-a keeps room for the draft only (a 60 GiB slice of its card is taken), node-b
    for both: the first replica goes whole to node-b; the second fits neither node whole and
    waits — its draft is not put into node-a's free 20 GiB."""
    cluster = _cluster(world, ONE_CARD_EACH)
    filler = scheduling.job_submit(
        actor=world.a.project_admin, project=world.a.project, cluster=cluster, name="filler",
        groups=[{"name": "w", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 61440, "gpu_cores_percent": 40,
                 "cpu_millicores": 1000, "ram_mib": 1024}], priority_class="high")
    advance(cluster)
    filler_node = Allocation.objects.get(job=filler).node.name
    other = ({"node-a", "node-b"} - {filler_node}).pop()
    svc = _service(world, cluster, min_replicas=1, max_replicas=2)
    advance(cluster)
    first = svc.replicas.select_related("job").get(number=1)
    assert first.job.state == JobState.RUNNING and set(_nodes_of(first).values()) == {other}
    serving.model_service_scale(actor=world.a.member, service=svc, replicas=2)
    advance(cluster)
    second = svc.replicas.select_related("job").get(number=2)
    second.job.refresh_from_db()
    assert second.job.state == JobState.QUEUED and not _nodes_of(second)


def test_companion_pods_specs_services_and_the_audit(world: Any) -> None:
    cluster = _cluster(world, TWO_NODES)
    svc = _service(world, cluster, ingress_host="Spec.Example.com")
    assert svc.ingress_host == "spec.example.com"
    advance(cluster)
    rep = svc.replicas.select_related("job").get()
    ns, objs, pods = job_specs(rep.job, cluster)
    by_role = {p.labels["camp.io/role"]: p for p in pods}
    main, draft = by_role["server"], by_role["draft"]
    assert main.labels[serving.LABEL_SERVICE] == str(svc.pk) and serving.LABEL_SERVICE not in draft.labels
    assert draft.labels[serving.LABEL_COMPANION] == "draft"
    assert draft.ports == ({"name": "http", "containerPort": 8001},)
    assert draft.image == DRAFT["image_reference"]
    assert draft.env["CAMP_MODEL"] == DRAFT["model_source"] and draft.env["HF_TOKEN"] == "hf_draft"
    assert draft.readiness_probe is not None and draft.readiness_probe["tcpSocket"] == {"port": "http"}
    draft_svc = f"{svc.service_name}-draft"
    assert main.env["CAMP_COMPANION_DRAFT_URL"] == f"http://{draft_svc}.{ns.name}.svc:8001"
    manifests = {(e.manifest["kind"], e.manifest["metadata"]["name"]): e.manifest for e in objs.extra}
    assert manifests[("Service", draft_svc)]["spec"]["selector"] == {
        serving.LABEL_COMPANION_OF: str(svc.pk), serving.LABEL_COMPANION: "draft"}
    ingress = manifests[("Ingress", svc.service_name)]
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "spec.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": svc.service_name,
                                                              "port": {"number": 8000}}
    created = AuditEvent.objects.get(action="service.created", target_id=str(svc.pk))
    assert created.after["companions"][0]["env_names"] == ["HF_TOKEN"]
    assert "hf_draft" not in str(created.after)
    assert created.after["ingress_host"] == "spec.example.com"


def test_bad_companions_and_hosts_name_the_field(world: Any) -> None:
    cluster = _cluster(world, TWO_NODES)
    cases = [
        ({"companions": [DRAFT, {**DRAFT, "port": 8002}]}, "companions[1].name"),
        ({"companions": [{**DRAFT, "name": "server"}]}, "companions[0].name"),
        ({"companions": [{**DRAFT, "gpu_cores_percent": 140}]}, "companions[0].gpu_cores_percent"),
        ({"companions": [{**DRAFT, "gpu_memory_mib": 90000}]}, "companions[0].gpu_memory_mib"),
        ({"companions": [{**DRAFT, "image_reference": "Not A Ref"}]}, "companions[0].image_reference"),
        ({"companions": [{**DRAFT, "env": {"CAMP_X": "1"}}]}, "companions[0].env"),
        ({"companions": [{**DRAFT, "colour": "red"}]}, "companions[0].colour"),
        # Each slice fits a card, but both pods need one node: 2 × 80 GiB + 40 GiB > a node's 160.
        ({"companions": [{**DRAFT, "gpu_count": 2, "gpu_memory_mib": 81920, "gpu_cores_percent": 0}]},
         "companions"),
        ({"ingress_host": "http://spec.example.com"}, "ingress_host"),
    ]
    for kw, field in cases:
        with pytest.raises(ValidationError) as exc:
            _service(world, cluster, **kw)
        assert field in exc.value.message_dict, (kw, exc.value.message_dict)
    assert not ModelService.objects.exists()


def test_companions_through_the_api(world: Any) -> None:
    _cluster(world, TWO_NODES)
    member = client_for(world.a.member)
    body = {"name": "spec", "project": world.a.project.pk, "cluster": "sim",
            "image_reference": "docker.io/vllm/vllm-openai:v0.6.3", "model_source": "hf://a/b",
            "gpu_memory_mib": 40960, "gpu_cores_percent": 50, "ram_mib": 8192,
            "companions": [{**DRAFT, "gpu_memory_mib": 100000}], "ingress_host": "spec.example.com"}
    too_large = member.post("/api/v1/services/", body, format="json")
    assert too_large.status_code == 400 and "companions[0].gpu_memory_mib" in too_large.json()
    made = member.post("/api/v1/services/", {**body, "companions": [DRAFT]}, format="json")
    assert made.status_code == 201, made.content
    data = made.json()
    assert data["companions"][0]["name"] == "draft" and data["companions"][0]["gpu_memory_mib"] == 20480
    assert data["ingress_host"] == "spec.example.com"
    colleague = make_user("acme-colleague")  # sees the service, may not change it
    tenant_services.membership_create(actor=world.a.owner, user=colleague, tenant=world.a.tenant,
                                      project=world.a.project, role=Role.PROJECT_MEMBER)
    seen = client_for(colleague).get(f"/api/v1/services/{data['id']}/").json()
    assert seen["companions"][0]["env"] == {"HF_TOKEN": ENV_MASK} and "hf_draft" not in str(seen)
    changed = member.patch(f"/api/v1/services/{data['id']}/",
                           {"companions": [{**DRAFT, "port": 9001}]}, format="json")
    assert changed.status_code == 400 and "companions[0].port" in changed.json()


@pytest.mark.django_db(transaction=True)
def test_camp_serve_create_with_a_companion(world: Any, live_server: Any, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    _cluster(world, TWO_NODES)
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    project = f"{world.a.tenant.name}/{world.a.project.name}"
    common = ("serve", "create", "spec", "--project", project, "--cluster", "sim", "--image-ref",
              "docker.io/vllm/vllm-openai:v0.6.3", "--model", "hf://Qwen/Qwen2.5-14B-Instruct",
              "--gpu-memory", "40960", "--gpu-cores", "50", "--ram", "8192",
              "--ingress-host", "spec.example.com")
    bad = camp(*common, "--companion", "name=draft,memory=lots")
    assert bad.returncode != 0 and "memory: a whole number" in bad.stderr
    too_big = camp(*common, "--companion",
                   "name=draft,image-ref=docker.io/vllm/vllm-openai:v0.6.3,memory=100000")
    assert too_big.returncode == 1 and "companions[0].gpu_memory_mib" in too_big.stdout + too_big.stderr
    made = camp(*common, "--companion",
                "name=draft,image-ref=docker.io/vllm/vllm-openai:v0.6.3,model=hf://Qwen/Qwen2.5-0.5B-Instruct,"
                "memory=20480,compute=20,port=8001")
    assert made.returncode == 0, made.stdout + made.stderr
    svc = ModelService.objects.get(name="spec")
    assert [(c["name"], c["gpu_memory_mib"], c["gpu_cores_percent"], c["model_source"])
            for c in svc.companions] == [("draft", 20480, 20, "hf://Qwen/Qwen2.5-0.5B-Instruct")]
    assert svc.ingress_host == "spec.example.com"
    status = camp("serve", "status", "spec")
    assert "companion draft (same node)" in status.stdout
    assert "ingress: http://spec.example.com/" in status.stdout


def test_the_detail_page_lists_companions_and_the_ingress(world: Any) -> None:
    from django.test import Client

    cluster = _cluster(world, TWO_NODES)
    svc = _service(world, cluster, ingress_host="spec.example.com")
    c = Client()
    c.force_login(world.a.member)
    page = c.get(f"/workspaces/services/{svc.pk}/").content.decode()
    assert "Same node in every replica" in page and "hf://Qwen/Qwen2.5-0.5B-Instruct" in page
    assert f"{svc.service_name}-draft." in page and ":8001" in page
    assert "http://spec.example.com/" in page
    assert "hf_draft" not in page  # env values never on the page


def test_the_jobs_api_takes_same_node_affinity(world: Any) -> None:
    """The affinity a replica job uses is a job option of the scheduler for every job: two
    whole-card pods on nodes of one card each fit the cluster, but never one node."""
    cluster = _cluster(world, ONE_CARD_EACH)
    member = client_for(world.a.member)
    group = {"name": "w", "replicas": 2, "gpu_count": 1, "cpu_millicores": 1000, "ram_mib": 1024}
    bad = member.post("/api/v1/jobs/", {"name": "bad", "project": world.a.project.pk, "cluster": "sim",
                                        "groups": [group], "affinity": "nearby"}, format="json")
    assert bad.status_code == 400 and "affinity" in bad.json()
    made = {}
    for affinity in ("same-node", "none"):
        r = member.post("/api/v1/jobs/", {"name": f"j-{affinity}", "project": world.a.project.pk,
                                          "cluster": "sim", "groups": [group], "affinity": affinity},
                        format="json")
        assert r.status_code == 201 and r.json()["affinity"] == affinity, r.content
        made[affinity] = r.json()["id"]
    scheduling.cycle_run(cluster=cluster)
    from scheduling.models import Job

    same, free = Job.objects.get(pk=made["same-node"]), Job.objects.get(pk=made["none"])
    assert same.state == JobState.REJECTED and "no node could hold all 2 pods" in same.reason, same.reason
    assert free.state == JobState.STARTING
