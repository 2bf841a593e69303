"""Cluster health (issue 16) on the real kube-apiserver: the server is stopped (its process
ended, as an outage), and a job admitted just before is requeued without losing an attempt;
the cluster takes no new work and its pinned jobs say why; once the server is back (same port
and data) its reconcile reopens it and both jobs run."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services, tasks
from scheduling.models import Cluster, Job, JobState
from tests.conftest import client_for

from .harness import camp_pods, hami_devices
from .steps import wait_running

pytestmark = pytest.mark.django_db(transaction=True)

GROUP = {"name": "worker", "gpu_count": 1, "cpu_millicores": 1000, "ram_mib": 1024}


def _pinned(world: Any, cluster: Cluster, name: str) -> Job:
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster, name=name,
                               kind="pytorch", groups=[dict(GROUP)])


def _seen(world: Any, job: Job) -> dict[str, Any]:
    data: dict[str, Any] = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/").json()
    return data


def test_an_apiserver_outage_requeues_without_an_attempt_and_holds_new_work(world: Any, kube: Any) -> None:
    kube.node("gpu-0", devices=hami_devices(2))
    real = kube.register(world)
    first = _pinned(world, real, "admitted-before")
    services.cycle_run(cluster=real)
    assert Job.objects.get(pk=first.pk).state == JobState.STARTING
    kube.server.halt()  # the apiserver and its etcd end: connection refused from now on
    try:
        assert services.job_dispatch(job_id=first.pk, final_attempt=True) == "requeued"
        seen = _seen(world, first)
        assert seen["state"] == "queued" and seen["attempts"] == 0, seen
        assert seen["reason"].startswith("Cluster real is unreachable since"), seen["reason"]
        assert "not counted" in seen["reason"]
        Cluster.objects.filter(pk=real.pk).update(retry_at=None)  # its backoff step passed
        assert tasks.cluster_reconcile(real.pk) == "unreachable"  # the reconcile's probe fails too
        second = _pinned(world, real, "submitted-during")
        for _ in range(3):
            assert tasks.cluster_cycle(real.pk) == "unreachable"  # admits nothing
        for job in (first, second):
            seen = _seen(world, job)
            assert seen["state"] == "queued" and seen["reason_kind"] == "cluster", seen
            assert "it takes no new work until it answers again" in seen["reason"]
            assert "Kubernetes API unreachable" in seen["reason"]
            assert kube.server.agent_token not in seen["reason"]
    finally:
        kube.server.resume()  # same port, token, CA and data
        kube.kubelet.errors.clear()  # what the kubelet stand-in met during the outage
    # Back: the reconcile (once its backoff step passed) finds it answering, the next cycle
    # admits both, their pods run.
    Cluster.objects.filter(pk=real.pk).update(retry_at=None)
    assert isinstance(tasks.cluster_reconcile(real.pk), dict)
    assert Cluster.objects.get(pk=real.pk).unreachable_since is None
    assert tasks.cluster_cycle(real.pk) == {"admitted": 2, "waiting": 0, "preempting": 0, "rejected": 0}
    for job in (first, second):
        assert services.job_dispatch(job_id=job.pk) == "created"
        assert wait_running(real, job).attempts == 1
    assert len(camp_pods(kube.core)) == 2
