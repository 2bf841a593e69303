"""HAMi's contract on the real kube-apiserver, with HAMi's admission webhook registered: Camp's
pods pass it, go through the bind handshake and run; a refused or unanswered handshake leaves
nothing half bound; taints and plain (non-HAMi) nodes are respected."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings
from kubernetes.utils import parse_quantity

from scheduling import services
from scheduling.models import Job, JobState

from .harness import ALLOCATED, BIND_PHASE, LOCK, TO_ALLOCATE, camp_pods, hami_devices
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def _run(cluster: Any, job: Job) -> Job:
    services.cycle_run(cluster=cluster)
    outcome = services.job_dispatch(job_id=job.pk)
    job.refresh_from_db()
    assert outcome == "created", job.reason
    return wait_running(cluster, job)


def test_a_fractional_notebook_runs_through_hamis_webhook_and_handshake(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    from workspaces import services as ws

    kube.node("gpu-a", devices=hami_devices(2))
    cluster = kube.register(world)
    env, _ = ws.environment_launch(actor=world.a.member, project=world.a.project, cluster=cluster,
                                   name="nb", kind="jupyter", image_reference="jupyter/base:1",
                                   gpu_count=1, gpu_memory_mib=20000, gpu_cores_percent=25,
                                   cpu_millicores=1000, ram_mib=2048)
    job = _run(cluster, env.job)
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job.pk)]
    assert pod.spec.scheduler_name == "camp-scheduler" and pod.spec.node_name == "gpu-a"
    ann = pod.metadata.annotations
    # HAMi's encoding byte for byte (EncodePodSingleDevice): the container's list ends with ";";
    # the device plugin erased what it allocated from the to-allocate copy.
    assert ann[ALLOCATED] == f"{job.allocations.get().slices.get().gpu.uuid},NVIDIA,20000,25:;"
    assert ann[BIND_PHASE] == "success" and ann[TO_ALLOCATE] == ";"
    limits = pod.spec.containers[0].resources.limits
    # The apiserver canonicalises quantities ("20000" is stored as "20k"); HAMi reads values.
    assert (parse_quantity(limits["nvidia.com/gpumem"]), parse_quantity(limits["nvidia.com/gpucores"])) == (
        20000, 25)
    assert LOCK not in (kube.core.read_node("gpu-a").metadata.annotations or {})
    # The webhook saw the pod and let it through untouched (another scheduler named).
    assert (pod.metadata.name, True, "pod already has different scheduler assigned") in hami_webhook.reviews


def test_a_4_worker_ddp_gang_runs_one_handshake_at_a_time(world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(4))
    cluster = kube.register(world)
    job = _run(cluster, submit(world, cluster, "ddp", replicas=4, gpu_memory_mib=40000,
                                gpu_cores_percent=50))
    pods = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job.pk)]
    assert len(pods) == 4 and {p.status.phase for p in pods} == {"Running"}
    assert {p.metadata.annotations[BIND_PHASE] for p in pods} == {"success"}
    # One allocating pod per node at a time: four answers, each after the previous lock went.
    assert [a[0] for a in kube.plugin.allocations] == ["gpu-a"] * 4
    ranks = sorted(int(e.value) for p in pods for e in p.spec.containers[0].env if e.name == "RANK")
    assert ranks == [0, 1, 2, 3]


@override_settings(CAMP_HAMI_BIND_TIMEOUT_SECONDS=3)
@pytest.mark.parametrize("answer", ["fail", "silent"])
def test_a_refused_or_unanswered_handshake_requeues_and_frees_the_node(
        world: Any, kube: Any, answer: str) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    kube.plugin.mode["gpu-a"] = answer
    cluster = kube.register(world)
    job = submit(world, cluster, "t", gpu_memory_mib=10000, gpu_cores_percent=10)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    said = "refused the GPUs" if answer == "fail" else "did not answer"
    assert said in job.reason and "gpu-a" in job.reason
    assert not job.allocations.exists()
    assert [p.metadata.name for p in camp_pods(kube.core) if p.metadata.deletion_timestamp is None] == []
    assert LOCK not in (kube.core.read_node("gpu-a").metadata.annotations or {})


def test_a_tainted_node_takes_nothing_and_a_plain_node_only_whole_cards(world: Any, kube: Any) -> None:
    kube.node("gpu-tainted", devices=hami_devices(4, prefix="GPU-T"),
              taints=[{"key": "maintenance", "effect": "NoSchedule"}])
    kube.node("gpu-plain", gfd_gpus=2, gfd_product="Tesla-T4", gfd_memory_mib=15360,
              taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    cluster = kube.register(world)
    whole = _run(cluster, submit(world, cluster, "whole"))
    assert whole.allocations.get().node.name == "gpu-plain"
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(whole.pk)]
    assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpumem" not in pod.spec.containers[0].resources.limits
    assert not any(k.startswith("hami.io/") for k in (pod.metadata.annotations or {}))
    # A slice while the only shareable cards sit on the tainted node: it may take the plain
    # node's last whole card (no shareable card can hold it), never the tainted node.
    sliced = submit(world, cluster, "slice", gpu_memory_mib=4000, gpu_cores_percent=10)
    services.cycle_run(cluster=cluster)
    sliced.refresh_from_db()
    assert sliced.state == JobState.STARTING
    assert sliced.allocations.get().node.name == "gpu-plain"
    third = submit(world, cluster, "third", gpu_memory_mib=4000, gpu_cores_percent=10)
    services.cycle_run(cluster=cluster)
    third.refresh_from_db()
    assert third.state == JobState.QUEUED and not third.allocations.exists()
