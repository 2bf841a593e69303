"""A model service on the real node (issue 28): its replica is a real HTTP server whose
readiness probe (the service's health path) fails while it "loads the model" and passes
after; Camp counts the replica ready — ``ready_replicas``, ``status`` — only once the kubelet
says the probe passed, never while the server answers 503, and the service's ClusterIP then
serves requests. Once."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from tests.conftest import client_for
from workspaces.services import serving

from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)

LOAD_SECONDS = 20


def _pod(node: Any, service_id: int) -> Any:
    listed = node.core.list_pod_for_all_namespaces(label_selector=f"{serving.LABEL_SERVICE}={service_id}")
    pods = [p for p in listed.items if p.metadata.deletion_timestamp is None]
    return pods[0] if pods else None


def _ready(pod: Any) -> bool:
    return pod is not None and any(c.type == "Ready" and c.status == "True"
                                   for c in (pod.status.conditions or []))


def _answering(pod: Any) -> int | None:
    """The server's own answer on the health path (from the host, to the pod's IP)."""
    if pod is None or not pod.status.pod_ip:
        return None
    try:
        return requests.get(f"http://{pod.status.pod_ip}:8000/healthz", timeout=5).status_code
    except requests.RequestException:
        return None


def test_a_replica_is_ready_only_once_its_readiness_probe_passes(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    api = client_for(world.a.member)
    r = api.post("/api/v1/services/", {
        "name": "echo", "project": world.a.project.pk, "cluster": "node",
        "image_reference": node.image("serve"),
        "model_source": "hf://camp/tiny", "port": 8000, "health_path": "/healthz",
        "args": ["--load-seconds", str(LOAD_SECONDS)], "gpu_count": 0, "gpu_memory_mib": 0,
        "gpu_cores_percent": 0, "cpu_millicores": 200, "ram_mib": 256,
        "min_replicas": 1, "max_replicas": 1}, format="json")
    assert r.status_code == 201, r.content
    sid = r.json()["id"]

    def service() -> dict[str, Any]:
        serving.model_services_autoscale(ids=[sid])  # the beat's step: it sets the ready count
        got = api.get(f"/api/v1/services/{sid}/")
        assert got.status_code == 200, got.content
        return dict(got.json())

    # While the server runs but answers 503 (its probe fails), Camp says not ready.
    loading: list[int] = []

    def ready() -> bool:
        pod = _pod(node, sid)
        answer = _answering(pod)
        svc = service()
        if svc["ready_replicas"] >= 1:
            assert _ready(_pod(node, sid)), "Camp said ready before the readiness probe passed"
            assert svc["status"] == "ready", svc
            return True
        assert svc["status"] in ("pending", "degraded"), svc
        if answer == 503:
            loading.append(answer)
        return False

    wait(ready, "the replica to be ready", timeout=300)
    assert loading, "never saw the server up and not ready (its probe failing)"
    # the probe Camp wrote is the service's health path on the named port
    probe = _pod(node, sid).spec.containers[0].readiness_probe
    assert (probe.http_get.path, probe.http_get.port) == ("/healthz", "http")
    # ready means it serves: through the service's ClusterIP Service (kube-proxy)
    ns = _pod(node, sid).metadata.namespace
    (svc_obj,) = [s for s in node.core.list_namespaced_service(ns).items
                  if (s.spec.selector or {}).get(serving.LABEL_SERVICE) == str(sid)]
    url = f"http://{svc_obj.spec.cluster_ip}:{svc_obj.spec.ports[0].port}/v1/models"
    answer = requests.get(url, timeout=10)
    assert answer.status_code == 200 and answer.json()["ready"] is True, answer.text
