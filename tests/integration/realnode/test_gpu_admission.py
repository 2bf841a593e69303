"""GPU pods meet a real kubelet (issue 28): a device plugin standing in for HAMi's
(deviceplugin.py, written from HAMi's sources) registers with the real kubelet over the
device-plugin API; Camp places a 1-GPU job through HAMi's bind handshake, the kubelet calls
``Allocate`` at admission, the container gets the card the annotation named, and the plugin's
answer ends the handshake. When the plugin refuses, the real kubelet fails the pod at
admission (``UnexpectedAdmissionError``) and Camp says so instead of waiting."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.models import GpuDevice, Job, JobState
from tests.conftest import client_for
from tests.integration.realkube.harness import BIND_PHASE, LOCK

from .deviceplugin import HamiNodePlugin, wait_advertised
from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(world: Any, name: str) -> int:
    r = client_for(world.a.member).post("/api/v1/jobs/", {
        "name": name, "project": world.a.project.pk, "cluster": "node", "kind": "pytorch",
        "groups": [{"name": "worker", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 4000,
                    "gpu_cores_percent": 25, "cpu_millicores": 200, "ram_mib": 128,
                    "image": "localhost/busybox:v1",
                    "command": ["sh", "-c", "env | sort; sleep 3600"]}]}, format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def _pod(core: Any, job_id: int) -> Any:
    pods = core.list_pod_for_all_namespaces(label_selector=f"camp.io/job-id={job_id}").items
    return pods[0] if pods else None


def test_a_gpu_pod_is_admitted_by_the_real_kubelet_through_hamis_allocate(camp_node: Any, world: Any) -> None:
    from scheduling import services

    node = camp_node.node
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        # The node's two HAMi cards (a device an earlier test's plugin reported and this one
        # does not is kept quarantined, never deleted: the inventory's rule)
        assert GpuDevice.objects.filter(node__cluster=camp_node.cluster, quarantined=False).count() == 2
        job_id = _submit(world, "gpu-ok")
        wait(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, "the GPU job to run", timeout=180)
        pod = _pod(node.core, job_id)
        ann = pod.metadata.annotations
        assert ann[BIND_PHASE] == "success"
        assert LOCK not in (node.core.read_node(node.node_name).metadata.annotations or {})
        assert [p for p, _ in plugin.allocations] == [pod.metadata.name]
        card = plugin.allocations[0][1].split(",")[0]
        logs = wait(lambda: node.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace),
                    "the container's output")
        assert f"NVIDIA_VISIBLE_DEVICES={card}" in logs and "CUDA_DEVICE_MEMORY_LIMIT_0=4000m" in logs
        r = client_for(world.a.member).post(f"/api/v1/jobs/{job_id}/cancel/", format="json")
        assert r.status_code == 200, r.content

        # The plugin refuses (as HAMi does when the annotation names a card it lacks): the
        # real kubelet fails the pod at admission (its event outlives the pod Camp deletes).
        plugin.refuse = True
        refused = _submit(world, "gpu-refused")
        wait(lambda: _admission_refused(node, world, camp_node.cluster, refused),
             "the kubelet to refuse the pod",
             timeout=180)
        assert not plugin.errors, plugin.errors


def _admission_refused(node: Any, world: Any, cluster: Any, job_id: int) -> bool:
    from scheduling.selectors import project_namespace_name

    ns = project_namespace_name(cluster=cluster, project=world.a.project)
    events = node.core.list_namespaced_event(ns).items
    return any(e.reason == "UnexpectedAdmissionError" and f"-{job_id}-" in e.involved_object.name
               for e in events)


def test_camp_says_the_kubelet_refused_the_gpus(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        from scheduling import services

        services.inventory_sync(cluster=camp_node.cluster)
        plugin.refuse = True
        refused = _submit(world, "gpu-refused")
        wait(lambda: _admission_refused(node, world, camp_node.cluster, refused),
             "the kubelet to refuse the pod",
             timeout=180)
        # Requeued, not failed, with the refusal in words: on the job while it waits, and in
        # its history (the next attempt's admission replaces the job's own reason).
        wait(lambda: _told_refused(refused), "Camp to say the kubelet refused the GPUs", timeout=120)
        job = Job.objects.get(pk=refused)
        assert not (job.state == "failed" and job.attempts <= 1), (job.state, job.attempts, job.reason)


def _told_refused(job_id: int) -> bool:
    job = Job.objects.get(pk=job_id)
    said = [job.reason, *job.decisions.values_list("reason", flat=True)]
    return any("refused the GPUs" in r and "at admission" in r for r in said)
