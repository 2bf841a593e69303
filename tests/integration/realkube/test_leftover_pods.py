"""A pod left by an earlier attempt of a job, on the real kube-apiserver (harness.py).

Pod names are deterministic per job, so when a dispatch's cleanup fails (the apiserver was
down: found by the reliability suite's apiserver restart) and the job is admitted again
elsewhere, the next dispatch finds the old pod under its name. Reusing it bound a pod whose
HAMi annotations named the old node: the device plugin of the new node never answered, the
node stayed locked for the bind timeout and the job was requeued a minute later.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from django.test import override_settings

from scheduling import services
from scheduling.backends.kubernetes import KubernetesBackend
from scheduling.models import Job, JobState

from .harness import VGPU_NODE, camp_pods, hami_devices, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@override_settings(CAMP_HAMI_BIND_TIMEOUT_SECONDS=5)
def test_a_pod_left_on_another_node_by_an_earlier_attempt_is_replaced(world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1, prefix="GPU-a-"))
    kube.node("gpu-b", devices=hami_devices(1, prefix="GPU-b-"))
    cluster = kube.register(world)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name="again", kind="pytorch", groups=[{
                                  "name": "w", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 20000,
                                  "gpu_cores_percent": 25, "cpu_millicores": 1000, "ram_mib": 1024}])
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    node = job.allocations.get().node.name
    other = "gpu-b" if node == "gpu-a" else "gpu-a"
    # What the earlier attempt left: the pod created for the other node, never bound.
    backend = KubernetesBackend.for_cluster(cluster)
    ns, objs, pods = services.job_specs(job, cluster)
    backend.ensure_namespace(ns)
    backend.ensure_job_objects(objs)
    stale = dataclasses.replace(pods[0], node=other)
    kube.core.create_namespaced_pod(stale.namespace, backend.pod_body(stale, hami=True))

    assert services.job_dispatch(job_id=job.pk) == "created", Job.objects.get(pk=job.pk).reason
    wait_until(lambda: services.cluster_reconcile(cluster=cluster) and Job.objects.get(
        pk=job.pk).state == JobState.RUNNING, "the job to run")
    (pod,) = camp_pods(kube.core)
    assert pod.spec.node_name == node and pod.metadata.annotations[VGPU_NODE] == node
    assert pod.status.phase == "Running"
