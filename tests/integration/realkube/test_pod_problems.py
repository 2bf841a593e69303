"""Issue 28 findings 1, 2 and 7 on the real kube-apiserver: a pod that cannot start says why
(its container's waiting reason, its unbound volume claim, its events) and, after the start
deadline, gives up and frees what it holds; a failed container's reason, exit code, signal
and message reach the job's reason. The kubelet stand-in (harness.py) writes the statuses
and events the real kubelet writes."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from scheduling import services
from scheduling.models import Allocation, Job, JobState

from .harness import camp_pods, default_storage_class, wait_until
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def _admit(kube: Any, cluster: Any, job: Job, *, waiting: tuple[str, str] | None = None,
           hold: bool = False) -> list[Any]:
    """Admit and dispatch the job; its pods, which the kubelet stand-in first makes wait
    with ``waiting`` (reason, message) or leaves Pending (``hold``)."""
    services.cycle_run(cluster=cluster)
    names = set(Allocation.objects.filter(job_id=job.pk).values_list("pod_name", flat=True))
    assert names, Job.objects.get(pk=job.pk).reason
    for name in names:
        if waiting:
            kube.kubelet.waiting[name] = waiting
        if hold:
            kube.kubelet.hold.add(name)
    assert services.job_dispatch(job_id=job.pk) == "created", Job.objects.get(pk=job.pk).reason
    return [p for p in camp_pods(kube.core) if p.metadata.name in names]


def _reason_until(cluster: Any, job: Job, text: str) -> Job:
    def says() -> bool:
        services.cluster_reconcile(cluster=cluster)
        return text in Job.objects.get(pk=job.pk).reason

    wait_until(says, f"the job's reason to say {text!r}")
    return Job.objects.get(pk=job.pk)


def _release(kube: Any, cluster: Any, job: Job) -> None:
    """The stop the give-up queued (a worker runs it), with the kubelet's part of a graceful delete."""
    services.job_stop(job_id=job.pk)

    def gone() -> bool:
        for p in kube.core.list_pod_for_all_namespaces().items:
            if p.metadata.deletion_timestamp is not None:
                kube.core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
        services.cluster_reconcile(cluster=cluster)
        return not Allocation.objects.filter(job_id=job.pk).exists()

    wait_until(gone, "the job's resources to be released")


def test_an_image_that_cannot_be_pulled_says_so_then_fails_and_frees_the_quota(world: Any, kube: Any) -> None:
    kube.node("cpu-a")
    cluster = kube.register(world)
    job = submit(world, cluster, "pull", gpu_count=0)
    (pod,) = _admit(kube, cluster, job,
                    waiting=("ImagePullBackOff", 'Back-off pulling image "pytorch/nope:1"'))
    job = _reason_until(cluster, job, "ImagePullBackOff")
    # Before the deadline: still starting, and the reason is the kubelet's, in words.
    assert job.state == JobState.STARTING
    assert job.reason == (f'Pod {pod.metadata.name} cannot start: ImagePullBackOff: Back-off pulling '
                          f'image "pytorch/nope:1"')
    with override_settings(CAMP_POD_START_PROBLEM_SECONDS=0):
        services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "ImagePullBackOff" in job.reason and "gave up" in job.reason
    _release(kube, cluster, job)


def test_a_home_volume_nothing_can_bind_says_so_and_the_job_is_requeued(world: Any, kube: Any) -> None:
    from workspaces import services as ws

    default_storage_class(kube.server, False)
    kube.node("cpu-a")
    cluster = kube.register(world)
    env, _ = ws.environment_launch(actor=world.a.member, project=world.a.project, cluster=cluster,
                                   name="nb", kind="jupyter", image_reference="jupyter/base:1",
                                   gpu_count=0, cpu_millicores=1000, ram_mib=1024)
    job = env.job
    _admit(kube, cluster, job)
    with override_settings(CAMP_POD_START_PROBLEM_SECONDS=3600):
        from scheduling.services import reconcile

        reconcile.PROBLEM_READ_SECONDS, before = 0, reconcile.PROBLEM_READ_SECONDS
        try:
            job = _reason_until(cluster, job, "no default one")
        finally:
            reconcile.PROBLEM_READ_SECONDS = before
    assert job.state == JobState.STARTING
    assert f"volume claim {env.home_claim} is not bound" in job.reason
    with override_settings(CAMP_POD_START_PROBLEM_SECONDS=0):
        services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and "no default one" in job.reason
    _release(kube, cluster, job)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.reason.startswith("Requeued: Pod ")


def _storage_class(kube: Any, name: str, provisioner: str) -> None:
    from kubernetes import client as k8s
    from kubernetes.client.rest import ApiException

    storage = k8s.StorageV1Api(kube.server.client())
    try:
        storage.delete_storage_class(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
    storage.create_storage_class({"metadata": {"name": name}, "provisioner": provisioner,
                                  "volumeBindingMode": "WaitForFirstConsumer"})


def _notebook(world: Any, cluster: Any) -> Any:
    from workspaces import services as ws

    env, _ = ws.environment_launch(actor=world.a.member, project=world.a.project, cluster=cluster,
                                   name="nb", kind="jupyter", image_reference="jupyter/base:1",
                                   gpu_count=0, cpu_millicores=1000, ram_mib=1024)
    return env


def test_a_claim_that_waits_for_its_first_consumer_is_given_camps_node_and_binds(
        world: Any, kube: Any) -> None:
    """Camp binds pods itself, so it does what kube-scheduler's volume binding does: the
    home claim of a WaitForFirstConsumer class (local-path, k3s' and kind's default) is
    annotated with the chosen node, its provisioner binds it and the notebook runs."""
    _storage_class(kube, "local-path", "rancher.io/local-path")
    kube.node("cpu-a")
    cluster = kube.register(world)
    with override_settings(WORKSPACES_STORAGE_CLASS="local-path"):
        env = _notebook(world, cluster)
        _admit(kube, cluster, env.job)
    wait_running(cluster, env.job)
    ns = Job.objects.get(pk=env.job.pk).namespace
    pvc = kube.core.read_namespaced_persistent_volume_claim(env.home_claim, ns)
    assert pvc.metadata.annotations["volume.kubernetes.io/selected-node"] == "cpu-a"
    assert pvc.status.phase == "Bound"


def test_a_claim_of_a_class_without_provisioner_says_nothing_will_bind_it(world: Any, kube: Any) -> None:
    _storage_class(kube, "local-storage", "kubernetes.io/no-provisioner")
    kube.node("cpu-a")
    cluster = kube.register(world)
    with override_settings(WORKSPACES_STORAGE_CLASS="local-storage", CAMP_POD_START_PROBLEM_SECONDS=3600):
        env = _notebook(world, cluster)
        _admit(kube, cluster, env.job)
        from scheduling.services import reconcile

        reconcile.PROBLEM_READ_SECONDS, before = 0, reconcile.PROBLEM_READ_SECONDS
        try:
            job = _reason_until(cluster, env.job, "has no provisioner")
        finally:
            reconcile.PROBLEM_READ_SECONDS = before
    assert f"volume claim {env.home_claim} is not bound" in job.reason
    assert "StorageClass local-storage" in job.reason
    with override_settings(CAMP_POD_START_PROBLEM_SECONDS=0):  # gives up: requeued, not waiting forever
        services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and "has no provisioner" in job.reason
    _release(kube, cluster, job)


def test_a_failed_mount_event_is_the_reason(world: Any, kube: Any) -> None:
    from scheduling.services import reconcile

    kube.node("cpu-a")
    cluster = kube.register(world)
    job = submit(world, cluster, "mnt", gpu_count=0)
    (pod,) = _admit(kube, cluster, job, hold=True)
    kube.kubelet.event(pod, "FailedMount", "MountVolume.SetUp failed for volume \"data\" : nfs: timed out")
    reconcile.PROBLEM_READ_SECONDS, before = 0, reconcile.PROBLEM_READ_SECONDS
    try:
        job = _reason_until(cluster, job, "FailedMount")
    finally:
        reconcile.PROBLEM_READ_SECONDS = before
    assert job.reason.endswith('FailedMount: MountVolume.SetUp failed for volume "data" : nfs: timed out')


@pytest.mark.parametrize(("exit_code", "reason", "message", "expected"), [
    (137, "OOMKilled", "", "container was OOMKilled (exit code 137): out of memory: raise ram_mib"),
    (137, "Error", "", "container exited (Error, exit code 137, killed by SIGKILL)"),
    (128, "StartError", 'exec: "start-notebook.py": executable file not found in $PATH',
     'container could not start (StartError, exit code 128): exec: "start-notebook.py": '
     "executable file not found in $PATH"),
])
def test_a_failed_container_says_how_it_ended(world: Any, kube: Any, exit_code: int, reason: str,
                                              message: str, expected: str) -> None:
    kube.node("cpu-a")
    cluster = kube.register(world)
    job = submit(world, cluster, "end", gpu_count=0)
    (pod,) = _admit(kube, cluster, job)
    wait_running(cluster, job)
    kube.kubelet.finish(pod.metadata.namespace, pod.metadata.name, succeeded=False, exit_code=exit_code,
                        reason=reason, container_message=message)
    job = _reason_until(cluster, job, "failed")
    assert job.state == JobState.FAILED
    assert job.reason == f"Pod {pod.metadata.name} failed: {expected}"


def _node_condition(kube: Any, name: str, status: str, reason: str, message: str) -> None:
    """What the node-lifecycle controller writes when a kubelet stops posting its status."""
    kube.core.patch_node_status(name, {"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})


def test_a_node_that_went_not_ready_after_the_inventory_takes_no_new_pod(world: Any, kube: Any) -> None:
    kube.node("cpu-a")
    cluster = kube.register(world)
    job = submit(world, cluster, "late", gpu_count=0)
    services.cycle_run(cluster=cluster)  # placed from the inventory that still says Ready
    _node_condition(kube, "cpu-a", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    assert services.job_dispatch(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and not camp_pods(kube.core)
    assert "Node cpu-a is not Ready (NodeStatusUnknown: Kubelet stopped posting node status.)" in job.reason
    # The next sync says why nothing goes there.
    services.inventory_sync(cluster=cluster)
    node = cluster.nodes.get(name="cpu-a")
    assert not node.schedulable and node.quarantine_reason == (
        "auto: node NotReady (NodeStatusUnknown: Kubelet stopped posting node status.)")


def test_a_not_ready_node_keeps_its_pods_for_the_toleration_then_deletes_them_gracefully(
        world: Any, kube: Any) -> None:
    kube.node("cpu-a")
    cluster = kube.register(world)
    job = submit(world, cluster, "kept", gpu_count=0)
    (pod,) = _admit(kube, cluster, job)
    wait_running(cluster, job)
    _node_condition(kube, "cpu-a", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.")
    with override_settings(CAMP_NODE_NOT_READY_TOLERATION_SECONDS=10 ** 9):
        assert services.inventory_sync(cluster=cluster).evicted_jobs == []
        services.cluster_reconcile(cluster=cluster)
    live = kube.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    assert live.metadata.deletion_timestamp is None and Job.objects.get(pk=job.pk).state == JobState.RUNNING
    # Past it (the condition changed in January): evicted, the pod deleted with a grace
    # period (it stays Terminating: no kubelet confirms), and the job requeued all the same.
    assert services.inventory_sync(cluster=cluster).evicted_jobs == [job.pk]
    assert services.job_stop(job_id=job.pk) == "released"
    live = kube.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
    assert live.metadata.deletion_timestamp is not None and live.metadata.deletion_grace_period_seconds == 30
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and "is NotReady (for more than 300 s)" in job.reason
