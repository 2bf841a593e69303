"""A model service on the real kube-apiserver (issue 15), with HAMi's admission webhook
registered and a real ``celery worker`` running the cycle, the dispatch, the stops and the
clean-up the services queue: each replica is a Camp-placed pod with HAMi's slice annotations
and the health path as its readiness probe, one ClusterIP Service selects them all in the
project's namespace, scaling 1 → 2 adds a pod, and deleting the service removes the pods and
the Service. The test process plays only the kubelet and the device plugin (harness.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from scheduling.selectors import project_namespace_name
from tests.integration.scheduling.test_concurrency import celery_worker
from workspaces.models import ServiceReplica
from workspaces.services import serving

from .harness import ALLOCATED, BIND_PHASE, TO_ALLOCATE, camp_pods, hami_devices, wait_until
from .steps import camp_namespace, wait_running
from .test_worker_path import _finalise_deletes

pytestmark = pytest.mark.django_db(transaction=True)


def _pods(kube: Any, service_id: int) -> list[Any]:
    return [p for p in camp_pods(kube.core) if p.metadata.labels.get(serving.LABEL_SERVICE) == str(service_id)
            and p.metadata.deletion_timestamp is None]


def _service_object(kube: Any, ns: str, name: str) -> Any:
    try:
        return kube.core.read_namespaced_service(name, ns)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_replicas_service_object_scale_and_delete_on_the_real_apiserver(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(2))
    with celery_worker():  # started first: it purges the queue, and with it earlier requests
        cluster = kube.register(world)
        svc = serving.model_service_create(
            actor=world.a.member, project=world.a.project, cluster=cluster, name="chat",
            image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-0.5B-Instruct",
            gpu_memory_mib=20000, gpu_cores_percent=25, cpu_millicores=1000, ram_mib=2048,
            args=["--max-model-len", "4096"])
        first = ServiceReplica.objects.get(service=svc, number=1)
        wait_running(cluster, first.job)
        ns = project_namespace_name(cluster=cluster, project=world.a.project)
        (pod,) = _pods(kube, svc.pk)
        assert pod.metadata.namespace == ns and pod.spec.scheduler_name == "camp-scheduler"
        ann = pod.metadata.annotations
        assert ann[BIND_PHASE] == "success" and ann[TO_ALLOCATE] == ";"  # erased by the plugin
        assert ann[ALLOCATED].endswith(",NVIDIA,20000,25:;")
        main = pod.spec.containers[0]
        probe = main.readiness_probe.http_get
        assert (probe.path, probe.port) == ("/health", "http")
        assert [(p.name, p.container_port) for p in main.ports] == [("http", 8000)]
        assert main.args == ["--max-model-len", "4096"]
        assert {e.name: e.value for e in main.env}["CAMP_MODEL"] == "hf://Qwen/Qwen2.5-0.5B-Instruct"
        obj = _service_object(kube, ns, svc.service_name)
        assert obj is not None and obj.spec.type == "ClusterIP"
        assert obj.spec.selector == {serving.LABEL_SERVICE: str(svc.pk)}
        assert [(p.port, p.target_port) for p in obj.spec.ports] == [(8000, "http")]

        # The pod's Ready condition (set by the kubelet when the probe passes) makes it ready;
        # no load source measures a real cluster here, so the autoscaler holds one replica.
        svc = serving.model_service_autoscale(service=svc)
        assert (svc.ready_replicas, svc.status, svc.desired_replicas) == (1, "ready", 1)
        serving.model_service_scale(actor=world.a.member, service=svc, replicas=2)
        second = ServiceReplica.objects.get(service=svc, number=2)
        wait_running(cluster, second.job)
        pods = _pods(kube, svc.pk)
        assert len(pods) == 2 and {p.metadata.namespace for p in pods} == {ns}
        assert all(p.metadata.annotations[BIND_PHASE] == "success" for p in pods)

        serving.model_service_delete(actor=world.a.member, service=svc)

        def gone() -> bool:
            _finalise_deletes(kube)  # the kubelet's part: end pods being deleted
            return not _pods(kube, svc.pk) and _service_object(kube, ns, svc.service_name) is None

        wait_until(gone, "the replicas' pods and the Service to be deleted", timeout=60)


def test_the_sweep_deletes_services_of_deleted_model_services_only(world: Any, kube: Any) -> None:
    """A project deleted with its model services leaves their Service objects behind (rows
    cascade, cluster objects do not): the sweep deletes those, and only those."""
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    live = serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="live",
        image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://a/b",
        cpu_millicores=1000, ram_mib=1024)
    ns = "camp-sweep-test"
    camp_namespace(cluster, ns, world.a.project)  # left by a deleted project
    for name, owner in ((live.service_name, live.pk), ("svc-999999-gone", 999999)):
        body = serving.service_manifest(live)
        body["metadata"] = {"name": name, "labels": {serving.LABEL_SERVICE: str(owner),
                                                     "app.kubernetes.io/managed-by": "camp"}}
        kube.core.create_namespaced_service(ns, body)
    assert serving.model_service_objects_sweep(cluster=cluster) == [f"{ns}/svc-999999-gone"]
    assert _service_object(kube, ns, "svc-999999-gone") is None
    assert _service_object(kube, ns, live.service_name) is not None
