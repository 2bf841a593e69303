"""A pod of another scheduler holding a GPU is respected (issue 11), on the real kube-apiserver:
a HAMi-scheduled pod's ``hami.io/vgpu-devices-allocated`` is subtracted from its card and a
default-scheduler pod asking ``nvidia.com/gpu`` on a plain node takes a whole card there; Camp's
jobs go elsewhere or wait with a reason naming those pods, and start once they are gone."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from scheduling import services
from scheduling.backends import kubernetes as kubernetes_backend
from scheduling.models import GpuDevice, Job, JobState

from .harness import ALLOCATED, BIND_PHASE, VGPU_NODE, camp_pods, hami_devices, wait_until
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def _foreign_pod(kube: Any, name: str, node: str, *, scheduler: str, gpus: int = 1,
                 annotations: dict[str, str] | None = None) -> None:
    """A pod another scheduler placed: bound to ``node``, asking ``gpus`` cards; HAMi's pods
    carry what HAMi's scheduler and device plugin wrote on them."""
    kube.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"schedulerName": scheduler, "nodeName": node, "containers": [{
            "name": "main", "image": "pytorch/pytorch:2",
            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})


def _console(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _started(cluster: Any, job: Job) -> Job:
    """Dispatched through the real backend and Running on the apiserver (kubelet stand-in)."""
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.reason
    assert services.job_dispatch(job_id=job.pk) == "created"
    return wait_running(cluster, job)


def test_a_pod_of_another_scheduler_holding_a_gpu_is_respected(
        world: Any, kube: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # One pod per page: the API server's limit/continue paging is walked to the end.
    monkeypatch.setattr(kubernetes_backend, "POD_PAGE", 1)
    busy = hami_devices(1, prefix="GPU-BUSY")
    kube.node("gpu-busy", devices=busy)
    kube.node("gpu-free", devices=hami_devices(1, prefix="GPU-FREE"))
    kube.node("gpu-plain", gfd_gpus=1, gfd_product="Tesla-T4", gfd_memory_mib=15360)
    uuid = busy[0]["id"]
    # HAMi placed a pod using 70 000 of the card's 81 920 MiB and 60 % of its cores.
    _foreign_pod(kube, "hami-pod", "gpu-busy", scheduler="hami-scheduler", annotations={
        VGPU_NODE: "gpu-busy", ALLOCATED: f"{uuid},NVIDIA,70000,60:;", BIND_PHASE: "success"})
    # The default scheduler placed a pod asking a whole card of the plain node.
    _foreign_pod(kube, "plain-pod", "gpu-plain", scheduler="default-scheduler")
    # A pod whose annotation HAMi could not decode either: ignored with a log, never a crash.
    _foreign_pod(kube, "garbled", "gpu-busy", scheduler="hami-scheduler", annotations={
        VGPU_NODE: "gpu-busy", ALLOCATED: f"{uuid},NVIDIA,lots,10:", BIND_PHASE: "success"})
    wait_until(lambda: all(p.status.phase == "Running" for p in kube.core.list_namespaced_pod(
        "default").items), "the other schedulers' pods to run")

    with caplog.at_level(logging.WARNING, logger="scheduling.backends.kubernetes"):
        cluster = kube.register(world)
    assert "default/garbled" in caplog.text and "invalid memory field 'lots'" in caplog.text
    card = GpuDevice.objects.get(uuid=uuid)
    assert (card.foreign_memory_mib, card.foreign_cores, card.foreign_sharers, card.foreign_pods) == (
        70000, 60, 1, ["default/hami-pod"])
    plain = GpuDevice.objects.get(node__name="gpu-plain")
    assert plain.foreign_exclusive and plain.foreign_pods == ["default/plain-pod"]

    # A 50 GB slice would fit either HAMi card by size; the busy one has 11 920 MiB left.
    first = submit(world, cluster, "first", gpu_memory_mib=50000, gpu_cores_percent=30)
    services.cycle_run(cluster=cluster)
    assert _started(cluster, first).allocations.get().node.name == "gpu-free"
    # A second one fits nowhere now, and its reason says who holds the card.
    second = submit(world, cluster, "second", gpu_memory_mib=50000, gpu_cores_percent=30)
    # A whole card: the plain node's only card is the default-scheduler pod's.
    whole = submit(world, cluster, "whole")
    services.cycle_run(cluster=cluster)
    second.refresh_from_db()
    whole.refresh_from_db()
    assert second.state == JobState.QUEUED and not second.allocations.exists()
    assert "1 GPU that would fit is held by pods Camp did not create" in second.reason, second.reason
    assert whole.state == JobState.QUEUED and "held by pods Camp did not create" in whole.reason, whole.reason
    # Those pods are outside Camp's tenants: their names reach the cluster's admins only.
    assert "hami-pod" not in second.reason + whole.reason and "plain-pod" not in whole.reason
    admin_page = _console(world.admin).get("/scheduling/clusters/real/nodes/").content.decode()
    member_page = _console(world.a.member).get("/scheduling/clusters/real/nodes/").content.decode()
    assert "default/hami-pod" in admin_page and "default/plain-pod" in admin_page
    assert "68.4 GiB, 60%" in member_page and "hami-pod" not in member_page
    # A re-sync keeps the figures (nothing changed on the cluster).
    services.inventory_sync(cluster=cluster)
    services.cycle_run(cluster=cluster)
    assert Job.objects.get(pk=second.pk).state == JobState.QUEUED
    assert GpuDevice.objects.get(uuid=uuid).foreign_memory_mib == 70000

    # The HAMi pod ends: the next inventory sync gives its card back and the job starts there.
    kube.core.delete_namespaced_pod("hami-pod", "default", grace_period_seconds=0)
    services.inventory_sync(cluster=cluster)
    services.cycle_run(cluster=cluster)
    assert _started(cluster, second).allocations.get().node.name == "gpu-busy"
    assert GpuDevice.objects.get(uuid=uuid).foreign_pods == []
    # The plain pod finishes (Succeeded, not yet deleted): a finished pod holds nothing.
    kube.kubelet.finish("default", "plain-pod")
    services.inventory_sync(cluster=cluster)
    services.cycle_run(cluster=cluster)
    whole = _started(cluster, whole)
    assert whole.allocations.get().node.name == "gpu-plain"
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(whole.pk)]
    assert pod.spec.node_name == "gpu-plain" and pod.status.phase == "Running"


def test_a_pod_copying_camps_label_is_still_foreign(world: Any, kube: Any) -> None:
    """Only Camp's label with the id of a job holding an allocation in this cluster makes a pod
    Camp's: a look-alike's card counts as taken (Camp would otherwise place on top of it)."""
    kube.node("gpu-plain", gfd_gpus=1)
    kube.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "lookalike", "labels": {"app.kubernetes.io/managed-by": "camp"}},
        "spec": {"nodeName": "gpu-plain", "containers": [{
            "name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    cluster = kube.register(world)
    assert GpuDevice.objects.get(node__name="gpu-plain").foreign_pods == ["default/lookalike"]
    job = submit(world, cluster, "j")
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and "held by pods Camp did not create" in job.reason
