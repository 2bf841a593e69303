"""The real-apiserver harness itself: the stand-ins behave as the components they replace, and
Camp reads a real cluster's inventory (the other realkube tests build on these)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from .harness import (
    ALLOCATED,
    BIND_PHASE,
    BIND_TIME,
    LOCK,
    TO_ALLOCATE,
    VGPU_NODE,
    hami_admission,
    hami_devices,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _gpu_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {"nvidia.com/gpu": "1",
                                                              "nvidia.com/gpumem": "20000"}}}],
                     **spec}}


def test_hami_webhook_rule_as_in_webhook_go() -> None:
    denied = hami_admission(_gpu_pod("a", nodeName="n1"))
    assert denied[:2] == (False, "pod has node assigned")
    allowed, _, patch = hami_admission(_gpu_pod("b"))
    assert allowed and patch == [{"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}]
    other = hami_admission(_gpu_pod("c", schedulerName="camp-scheduler", nodeName="n1"))
    assert other == (True, "pod already has different scheduler assigned", [])
    cpu_only = hami_admission({"spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
    assert cpu_only[0] is True


def test_the_real_apiserver_runs_the_hami_webhook(kube: Any, hami_webhook: Any) -> None:
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod("default", _gpu_pod("bound-early", nodeName="gpu-a"))
    assert "pod has node assigned" in refused.value.body
    created = kube.core.create_namespaced_pod("default", _gpu_pod("for-hami"))
    assert created.spec.scheduler_name == "hami-scheduler"
    ours = kube.core.create_namespaced_pod("default", _gpu_pod("for-camp", schedulerName="camp-scheduler"))
    assert ours.spec.scheduler_name == "camp-scheduler"
    assert ("for-camp", True, "pod already has different scheduler assigned") in hami_webhook.reviews


def test_bind_handshake_with_the_device_plugin_and_kubelet_standins(kube: Any) -> None:
    devices = hami_devices(2)
    kube.node("gpu-a", devices=devices)
    kube.core.create_namespaced_pod("default", _gpu_pod("p1", schedulerName="camp-scheduler"))
    entry = f"{devices[1]['id']},NVIDIA,20000,30:;"
    # A scheduler's side of the handshake: lock the node, annotate, bind.
    node = kube.core.read_node("gpu-a")
    kube.core.patch_node("gpu-a", {"metadata": {
        "annotations": {LOCK: "2026-01-01T00:00:00Z,default,p1"},
        "resourceVersion": node.metadata.resource_version}})
    kube.core.patch_namespaced_pod("p1", "default", {"metadata": {"annotations": {
        VGPU_NODE: "gpu-a", BIND_TIME: str(int(time.time())), BIND_PHASE: "allocating",
        TO_ALLOCATE: entry, ALLOCATED: entry}}})
    kube.core.create_namespaced_binding(
        "default", {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}},
        _preload_content=False)
    pod = wait_until(lambda: (p := kube.core.read_namespaced_pod("p1", "default")).status.phase == "Running"
                     and p, "p1 Running")
    assert pod.metadata.annotations[BIND_PHASE] == "success"
    # HAMi's patchErasedAnnotation: what was allocated is erased, one ";" per container.
    assert pod.metadata.annotations[TO_ALLOCATE] == ";"
    assert pod.metadata.annotations[ALLOCATED] == entry
    assert LOCK not in (kube.core.read_node("gpu-a").metadata.annotations or {})
    assert kube.plugin.allocations == [("gpu-a", "p1", entry)]


def test_a_device_the_node_lacks_fails_the_handshake(kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    kube.core.create_namespaced_pod("default", _gpu_pod("p2", schedulerName="camp-scheduler"))
    kube.core.patch_namespaced_pod("p2", "default", {"metadata": {"annotations": {
        VGPU_NODE: "gpu-a", BIND_TIME: str(int(time.time())), BIND_PHASE: "allocating",
        TO_ALLOCATE: "GPU-not-here,NVIDIA,1000,10:;"}}})
    kube.core.create_namespaced_binding(
        "default", {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p2"},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}},
        _preload_content=False)
    pod = wait_until(lambda: (p := kube.core.read_namespaced_pod("p2", "default")).status.phase
                     == "Failed" and p, "p2 Failed")
    # The refusal: bind-phase failed and, in the same step, the kubelet's admission error.
    assert pod.metadata.annotations[BIND_PHASE] == "failed"
    assert pod.status.reason == "UnexpectedAdmissionError"


def test_camp_reads_the_inventory_of_a_real_cluster(world: Any, kube: Any) -> None:
    from scheduling.models import Node

    kube.node("gpu-a", devices=hami_devices(4))
    kube.node("gpu-b", gfd_gpus=2, gfd_product="Tesla-T4", gfd_memory_mib=15360)
    kube.node("cpu-a")
    cluster = kube.register(world)
    nodes = {n.name: n for n in Node.objects.filter(cluster=cluster)}
    assert set(nodes) == {"gpu-a", "gpu-b", "cpu-a"}
    assert nodes["gpu-a"].gpus.count() == 4
    assert {g.sharing for g in nodes["gpu-b"].gpus.all()} == {"exclusive-only"}
    register = json.loads(kube.core.read_node("gpu-a").metadata.annotations["hami.io/node-nvidia-register"])
    assert {g.uuid for g in nodes["gpu-a"].gpus.all()} == {d["id"] for d in register}
