"""A model service with a companion (draft + target of speculative decoding) and an Ingress
on the real kube-apiserver (issue 15), with HAMi's admission webhook and a real ``celery
worker``: every replica's two pods are bound to one node with their HAMi slice annotations,
each companion has its own ClusterIP Service, the Ingress routes the service's host to its
Service, and deleting the service removes pods, Services and Ingress; the sweep removes an
Ingress whose service is gone. The test process plays only the kubelet and the device plugin."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from scheduling.backends.base import LABEL_JOB_ID
from scheduling.selectors import project_namespace_name
from tests.integration.scheduling.test_concurrency import celery_worker
from workspaces.models import ServiceReplica
from workspaces.services import serving

from .harness import ALLOCATED, BIND_PHASE, TO_ALLOCATE, camp_pods, hami_devices, wait_until
from .steps import camp_namespace, wait_running
from .test_worker_path import _finalise_deletes

pytestmark = pytest.mark.django_db(transaction=True)
IMAGE = "docker.io/vllm/vllm-openai:v0.6.3"


def _read(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _job_pods(kube: Any, job_id: int) -> list[Any]:
    return [p for p in camp_pods(kube.core) if p.metadata.labels.get(LABEL_JOB_ID) == str(job_id)
            and p.metadata.deletion_timestamp is None]


def test_draft_and_target_share_a_node_and_the_ingress_lives_with_the_service(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    # One 80 GiB card per node: a replica (40 + 20 GiB) fits one node, two replicas need both.
    kube.node("gpu-a", devices=hami_devices(1))
    kube.node("gpu-b", devices=hami_devices(1))
    net = k8s.NetworkingV1Api(kube.core.api_client)
    with celery_worker():
        cluster = kube.register(world)
        svc = serving.model_service_create(
            actor=world.a.member, project=world.a.project, cluster=cluster, name="spec",
            image_reference=IMAGE, model_source="hf://Qwen/Qwen2.5-14B-Instruct", gpu_memory_mib=40960,
            gpu_cores_percent=50, cpu_millicores=1000, ram_mib=2048, min_replicas=2, max_replicas=2,
            ingress_host="spec.example.com",
            companions=[{"name": "draft", "image_reference": IMAGE, "model_source": "hf://Qwen/Qwen2.5-0.5B",
                         "port": 8001, "gpu_memory_mib": 20480, "gpu_cores_percent": 20,
                         "cpu_millicores": 500, "ram_mib": 1024}])
        ns = project_namespace_name(cluster=cluster, project=world.a.project)
        nodes = set()
        for rep in ServiceReplica.objects.filter(service=svc).select_related("job"):
            wait_running(cluster, rep.job)
            pods = {p.metadata.labels["camp.io/role"]: p for p in _job_pods(kube, rep.job_id)}
            assert set(pods) == {"server", "draft"}
            server, draft = pods["server"], pods["draft"]
            assert server.spec.node_name and server.spec.node_name == draft.spec.node_name
            nodes.add(server.spec.node_name)
            for pod, slice_ in ((server, ",NVIDIA,40960,50:"), (draft, ",NVIDIA,20480,20:")):
                ann = pod.metadata.annotations
                assert ann[BIND_PHASE] == "success" and ann[TO_ALLOCATE] == ";"
                assert ann[ALLOCATED].endswith(slice_ + ";")
            assert [(p.name, p.container_port) for p in draft.spec.containers[0].ports] == [("http", 8001)]
            assert draft.metadata.labels[serving.LABEL_COMPANION] == "draft"
            assert serving.LABEL_SERVICE not in draft.metadata.labels
            env = {e.name: e.value for e in server.spec.containers[0].env}
            assert env["CAMP_COMPANION_DRAFT_URL"] == f"http://{svc.service_name}-draft.{ns}.svc:8001"
        assert nodes == {"gpu-a", "gpu-b"}

        main = _read(kube.core.read_namespaced_service, svc.service_name, ns)
        assert main.spec.selector == {serving.LABEL_SERVICE: str(svc.pk)}
        companion = _read(kube.core.read_namespaced_service, f"{svc.service_name}-draft", ns)
        assert companion.spec.selector == {serving.LABEL_COMPANION_OF: str(svc.pk),
                                           serving.LABEL_COMPANION: "draft"}
        assert [(p.port, p.target_port) for p in companion.spec.ports] == [(8001, "http")]
        ingress = _read(net.read_namespaced_ingress, svc.service_name, ns)
        (rule,) = ingress.spec.rules
        (path,) = rule.http.paths
        assert rule.host == "spec.example.com"
        assert (path.backend.service.name, path.backend.service.port.number) == (svc.service_name, 8000)

        svc = serving.model_service_autoscale(service=svc)  # ready only when both pods are
        assert (svc.ready_replicas, svc.status) == (2, "ready")
        serving.model_service_delete(actor=world.a.member, service=svc)

        def gone() -> bool:
            _finalise_deletes(kube)
            return (not [p for p in camp_pods(kube.core) if p.metadata.deletion_timestamp is None]
                    and _read(kube.core.read_namespaced_service, svc.service_name, ns) is None
                    and _read(kube.core.read_namespaced_service, f"{svc.service_name}-draft", ns) is None
                    and _read(net.read_namespaced_ingress, svc.service_name, ns) is None)

        wait_until(gone, "the pods, both Services and the Ingress to be deleted", timeout=60)


def test_the_sweep_deletes_ingresses_of_deleted_model_services(world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    live = serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="live", image_reference=IMAGE,
        model_source="hf://a/b", cpu_millicores=1000, ram_mib=1024, ingress_host="live.example.com")
    net = k8s.NetworkingV1Api(kube.core.api_client)
    ns = "camp-sweep-ingress"
    camp_namespace(cluster, ns, world.a.project)  # left by a deleted project
    for name, owner in ((live.service_name, live.pk), ("svc-999999-gone", 999999)):
        body = serving.ingress_manifest(live)
        body["metadata"] = {"name": name, "labels": {serving.LABEL_SERVICE: str(owner),
                                                     "app.kubernetes.io/managed-by": "camp"}}
        net.create_namespaced_ingress(ns, body)
    # (Objects earlier tests left on the shared apiserver may be swept too: only ours are asserted.)
    removed = serving.model_service_objects_sweep(cluster=cluster)
    assert f"{ns}/Ingress/svc-999999-gone" in removed and f"{ns}/Ingress/{live.service_name}" not in removed
    assert _read(net.read_namespaced_ingress, "svc-999999-gone", ns) is None
    assert _read(net.read_namespaced_ingress, live.service_name, ns) is not None
