"""The faults that matter on a real node (issue 28): containerd restarted under a running job,
a container OOM-killed, the kubelet frozen until the controller-manager marks the node
NotReady. Each once; each asserts what a user of Camp would see."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, Node
from tests.conftest import client_for

from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(world: Any, name: str, image: str, command: list[str], ram_mib: int = 64) -> int:
    r = client_for(world.a.member).post("/api/v1/jobs/", {
        "name": name, "project": world.a.project.pk, "cluster": "node", "kind": "pytorch",
        "groups": [{"name": "worker", "replicas": 1, "gpu_count": 0, "cpu_millicores": 100,
                    "ram_mib": ram_mib, "image": image, "command": command}]}, format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def _running(job_id: int) -> bool:
    return Job.objects.get(pk=job_id).state == JobState.RUNNING


def test_a_running_job_survives_a_containerd_restart(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    job_id = _submit(world, "steady", "localhost/busybox:v1",
                     ["sh", "-c", "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"])
    wait(lambda: _running(job_id), "the job to run", timeout=180)
    (pod,) = node.core.list_pod_for_all_namespaces(label_selector=f"camp.io/job-id={job_id}").items
    node.restart("containerd")
    # the container kept running (its shim outlives containerd) and its log still streams
    wait(lambda: "tick" in (node.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace,
                                                              tail_lines=1) or ""),
         "logs through the restarted containerd")
    services.cluster_reconcile(cluster=camp_node.cluster)
    fresh = node.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    assert fresh.status.container_statuses[0].restart_count == 0
    assert _running(job_id)


def test_an_oom_killed_container_says_out_of_memory(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    job_id = _submit(world, "hog", node.image("serve"),
                     ["python", "-c", "b = bytearray(512 * 1024 * 1024); print(len(b))"], ram_mib=64)
    wait(lambda: Job.objects.get(pk=job_id).state == JobState.FAILED, "the job to fail", timeout=240)
    reason = Job.objects.get(pk=job_id).reason
    assert "OOMKilled" in reason or "out of memory" in reason, reason


def test_a_frozen_kubelet_makes_the_node_not_ready_and_keeps_its_jobs(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    job_id = _submit(world, "patient", "localhost/busybox:v1", ["sleep", "3600"])
    wait(lambda: _running(job_id), "the job to run", timeout=180)
    node.freeze("kubelet")
    try:
        # the controller-manager's node lifecycle controller: no heartbeat for 40 s → Unknown
        wait(lambda: node.node_ready() != "True", "the node to go NotReady", timeout=180)
        services.inventory_sync(cluster=camp_node.cluster)
        assert not Node.objects.get(cluster=camp_node.cluster, name=node.node_name).ready
        services.cluster_reconcile(cluster=camp_node.cluster)
        # a kubelet hiccup is not a lost node: the job keeps running (Kubernetes' 300-s rule)
        assert _running(job_id), Job.objects.get(pk=job_id).reason
    finally:
        node.thaw("kubelet")
    wait(lambda: node.node_ready() == "True", "the node to be Ready again", timeout=180)
    assert _running(job_id)
