"""Issue 27 findings 4 and 5 on the real kube-apiserver: a device plugin's refusal at the
kubelet's admission (phase Failed, ``UnexpectedAdmissionError``, written in the same step as
HAMi's ``bind-phase: failed``) requeues the job with the documented reason on whichever path
sees it first (the watcher or the dispatch's poll); a silent device plugin does not hold the
dispatch for the whole bind timeout; pod events are matched by UID and attempt, never by name
alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from kubernetes import watch as k8s_watch

from scheduling import services, tasks
from scheduling.backends.base import PodEvent
from scheduling.backends.kubernetes import _pod_status
from scheduling.models import Cluster, Job, JobState

from .harness import BIND_PHASE, LOCK, camp_pods, hami_devices, wait_until
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def watcher(cluster: Any, seconds: float = 40) -> Iterator[threading.Thread]:
    """``camp_watch`` for this cluster in a thread, running when this yields."""
    Cluster.objects.filter(pk=cluster.pk).update(watch_heartbeat_at=None)

    def watch() -> None:
        try:
            call_command("camp_watch", cluster=cluster.name, duration=seconds, window=5)
        finally:
            connection.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    wait_until(lambda: Cluster.objects.get(pk=cluster.pk).watch_heartbeat_at, "the watch to start")
    try:
        yield thread
    finally:
        thread.join(timeout=seconds + 30)


def _requeued_with_the_refusal(job: Job) -> Job:
    job = wait_until(lambda: (j := Job.objects.get(pk=job.pk)).state != JobState.STARTING and j,
                     "the job to leave starting")
    assert job.state == JobState.QUEUED, (job.state, job.reason)
    assert "HAMi's device plugin on node gpu-a refused the GPUs" in job.reason
    assert job.reason.endswith("; requeued") and job.attempts == 1
    assert not job.allocations.exists()
    return job


@override_settings(CAMP_HAMI_BIND_TIMEOUT_SECONDS=20)
def test_a_refusal_at_admission_racing_the_dispatch_requeues_the_job(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    # Refuses: bind-phase failed and, in the same step, the kubelet fails the pod at admission.
    kube.plugin.mode["gpu-a"] = "fail"
    cluster = kube.register(world)
    job = submit(world, cluster, "nb", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    with watcher(cluster):
        # The watcher sees the Failed pod while the dispatch polls bind-phase.
        assert services.job_dispatch(job_id=job.pk) in ("failed", "aborted")
        _requeued_with_the_refusal(job)
    assert [p for p in camp_pods(kube.core) if p.metadata.deletion_timestamp is None] == []
    assert LOCK not in (kube.core.read_node("gpu-a").metadata.annotations or {})


@override_settings(CAMP_HAMI_BIND_TIMEOUT_SECONDS=20, CAMP_HAMI_BIND_POLL_SECONDS=1)
def test_a_silent_plugin_hands_the_wait_over_and_the_watcher_concludes_a_refusal(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    kube.plugin.mode["gpu-a"] = "silent"
    cluster = kube.register(world)
    job = submit(world, cluster, "nb", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    # No answer within the poll: the dispatch hands over (pod bound, node locked) instead of
    # holding its worker for the 20-s bind timeout.
    assert services.job_dispatch(job_id=job.pk) == "pending"
    (pod,) = camp_pods(kube.core)
    assert pod.spec.node_name == "gpu-a" and pod.metadata.annotations[BIND_PHASE] == "allocating"
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING
    with watcher(cluster):
        kube.plugin.mode["gpu-a"] = "fail"  # the plugin comes back and refuses
        _requeued_with_the_refusal(job)
        wait_until(lambda: not camp_pods(kube.core), "the refused pod to be deleted")
    # The follow-up dispatch, arriving late, finds nothing to do.
    assert services.job_dispatch(job_id=job.pk) == "skipped"


@override_settings(CAMP_HAMI_BIND_TIMEOUT_SECONDS=20, CAMP_HAMI_BIND_POLL_SECONDS=1)
def test_a_follow_up_dispatch_resumes_the_wait_and_the_job_runs(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    kube.plugin.mode["gpu-a"] = "silent"
    cluster = kube.register(world)
    job = submit(world, cluster, "nb", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "pending"
    (first,) = camp_pods(kube.core)
    kube.plugin.mode["gpu-a"] = "ok"
    assert services.job_dispatch(job_id=job.pk) == "created"
    job = wait_running(cluster, job)
    (pod,) = camp_pods(kube.core)
    assert pod.metadata.uid == first.metadata.uid and job.attempts == 1


def test_a_late_event_for_the_previous_attempts_pod_leaves_the_current_one_alone(
        world: Any, kube: Any, hami_webhook: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    job = submit(world, cluster, "train", gpu_memory_mib=20000, gpu_cores_percent=25)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    wait_running(cluster, job)
    (first,) = camp_pods(kube.core)
    since = kube.core.list_pod_for_all_namespaces().metadata.resource_version
    # Attempt 1 ends (its node drained); attempt 2 starts a pod of the same name.
    assert services.job_evict(job_id=job.pk, reason="node drained")
    assert tasks.job_stop(job.pk, 1) == "waiting"
    kube.core.delete_namespaced_pod(first.metadata.name, first.metadata.namespace,
                                    grace_period_seconds=0)
    wait_until(lambda: not camp_pods(kube.core), "attempt 1's pod to go")
    services.cluster_reconcile(cluster=cluster)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    job = wait_running(cluster, job)
    (second,) = camp_pods(kube.core)
    assert second.metadata.name == first.metadata.name and second.metadata.uid != first.metadata.uid
    # A watcher that resumes from an older resourceVersion (the API server replays what
    # happened since) gets attempt 1's DELETED after attempt 2 is running, then attempt 2's.
    view: dict[str, Any] = {}
    outcomes = []
    stream = k8s_watch.Watch().stream(kube.core.list_pod_for_all_namespaces,
                                      resource_version=since, timeout_seconds=5)
    for raw in stream:
        status = _pod_status(raw["object"])
        outcomes.append((raw["type"], status.uid, services.pod_event_watch_apply(
            cluster=cluster, event=PodEvent(raw["type"], status), pods=view)))
    deleted = [o for t, uid, o in outcomes if t == "DELETED" and uid == first.metadata.uid]
    assert deleted == ["stale"], outcomes
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.attempts == 2, job.reason
    (kept,) = camp_pods(kube.core)
    assert kept.metadata.uid == second.metadata.uid and kept.metadata.deletion_timestamp is None
