"""Issue 27 finding 7 on the real kube-apiserver, with stand-ins that behave as HAMi's device
plugin (it erases ``…-devices-to-allocate`` once it has allocated) and a kubelet: every
dispatch and stop is idempotent and tied to its attempt (pod names repeat across attempts)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services, tasks
from scheduling.models import Job, JobState

from .harness import TO_ALLOCATE, camp_pods, hami_devices, wait_until
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def _pod(kube: Any, job: Job) -> Any:
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job.pk)]
    return pod


def _running_pod(kube: Any, job: Job) -> Any:
    return wait_until(lambda: (p := _pod(kube, job)).status.phase == "Running" and p,
                      f"the pod of {job.name} to run")


def test_a_second_dispatch_of_a_starting_job_keeps_its_healthy_pod(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    job = submit(world, cluster, "nb", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    pod = _running_pod(kube, job)
    # HAMi's device plugin allocated, and erased the request, as the real one does.
    assert pod.metadata.annotations[TO_ALLOCATE] == ";"
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING  # no reconcile has run yet
    # A redelivered (or reconcile-requested) dispatch while the job is still starting.
    assert services.job_dispatch(job_id=job.pk) == "created"
    again = _pod(kube, job)
    assert again.metadata.uid == pod.metadata.uid and again.metadata.deletion_timestamp is None
    assert again.metadata.labels["camp.io/attempt"] == "1"
    job = wait_running(cluster, job)
    assert job.attempts == 1 and [a[1] for a in kube.plugin.allocations] == [pod.metadata.name]


def test_a_stop_queued_for_an_earlier_attempt_never_touches_the_next(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    job = submit(world, cluster, "train", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    wait_running(cluster, job)
    # Attempt 1 is taken off its node (drained); its stop runs, its pod goes.
    assert services.job_evict(job_id=job.pk, reason="node drained")
    assert tasks.job_stop(job.pk, 1) == "waiting"
    first = _pod(kube, job)
    assert first.metadata.deletion_timestamp is not None
    kube.core.delete_namespaced_pod(first.metadata.name, first.metadata.namespace,
                                    grace_period_seconds=0)  # the kubelet ends it
    wait_until(lambda: not [p for p in camp_pods(kube.core)], "attempt 1's pod to go")
    services.cluster_reconcile(cluster=cluster)
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    # Attempt 2: same pod name, new pod.
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    job = wait_running(cluster, job)
    second = _running_pod(kube, job)
    assert job.attempts == 2 and second.metadata.name == first.metadata.name
    assert second.metadata.labels["camp.io/attempt"] == "2"
    # The stop of attempt 1 delivered again (a worker died before acking it), and a stop
    # queued without an attempt (a cycle's preemption batch) for a job no longer stopping:
    # neither acts on attempt 2.
    assert tasks.job_stop(job.pk, 1) == "stale"
    assert tasks.job_stop(job.pk) == "stale"
    kept = _pod(kube, job)
    assert kept.metadata.uid == second.metadata.uid and kept.metadata.deletion_timestamp is None
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.attempts == 2
