"""The real worker path on the real kube-apiserver (issue 11): the cluster registered and a job
submitted and cancelled through the API, a real ``celery worker`` process syncing the
inventory, running the cycle, dispatching through HAMi's bind handshake and stopping the job,
and a real ``manage.py camp_watch`` process turning pod events into job states. The test
process plays only the cluster's own parts (harness.py: kubelet and HAMi device plugin) and
no beat runs, so nothing but the watcher can move the job to RUNNING or release it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings

from scheduling.models import Allocation, Cluster, GpuDevice, Job, JobState, Node
from tests.conftest import client_for
from tests.integration.scheduling.test_concurrency import celery_worker

from .harness import BIND_PHASE, camp_pods, hami_devices, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _env() -> dict[str, str]:
    """What a worker process of this test run is started with (test_concurrency.celery_worker)."""
    db = settings.DATABASES["default"]
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "CAMP_TEST_RUN_ID": settings.TEST_RUN_ID}


@contextmanager
def camp_watch(cluster: str, seconds: int = 90) -> Iterator[subprocess.Popen[bytes]]:
    """``manage.py camp_watch --cluster NAME`` in its own process group, ended in ``finally``."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "camp_watch", "--cluster", cluster, "--duration", str(seconds),
         "--window", "30"], env=_env(), start_new_session=True, cwd=settings.BASE_DIR)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _finalise_deletes(kube: Any) -> int:
    """What the kubelet does to a pod being deleted: stop it, then remove it (grace 0)."""
    done = 0
    for p in kube.core.list_pod_for_all_namespaces().items:
        if p.metadata.deletion_timestamp is not None:
            kube.core.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
            done += 1
    return done


def test_register_submit_run_and_cancel_through_a_real_worker_and_camp_watch(world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(2))
    with celery_worker() as worker:
        r = client_for(world.admin).post("/api/v1/clusters/", {
            "name": "real", "backend": "kubernetes", "api_server": kube.server.host,
            **kube.server.credentials}, format="json")
        assert r.status_code == 201, r.content
        # The worker synced the inventory (registration queues it after commit).
        wait_until(lambda: GpuDevice.objects.filter(node__name="gpu-a").count() == 2, "the inventory")
        cluster = Cluster.objects.get(name="real")
        with camp_watch("real") as watcher:
            r = client_for(world.a.member).post("/api/v1/jobs/", {
                "name": "ddp", "project": world.a.project.pk, "cluster": "real", "kind": "pytorch",
                "groups": [{"name": "worker", "replicas": 2, "gpu_count": 1, "gpu_memory_mib": 20000,
                            "gpu_cores_percent": 25, "cpu_millicores": 1000, "ram_mib": 1024}]},
                format="json")
            assert r.status_code == 201, r.content
            job_id = r.json()["id"]
            # The worker's cycle admits it and its dispatch binds both pods through HAMi's
            # handshake; the kubelet runs them; only camp_watch can tell the job.
            wait_until(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING,
                       "the job to run", timeout=45)
            pods = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job_id)]
            assert len(pods) == 2 and {p.metadata.annotations[BIND_PHASE] for p in pods} == {"success"}
            assert {p.spec.scheduler_name for p in pods} == {"camp-scheduler"}
            assert len(kube.plugin.allocations) == 2
            assert Cluster.objects.get(pk=cluster.pk).watch_last_event_at is not None

            r = client_for(world.a.member).post(f"/api/v1/jobs/{job_id}/cancel/", format="json")
            assert r.status_code == 200, r.content
            # The worker's stop deletes the pods (gracefully: the kubelet stand-in finishes
            # the delete); the watcher sees them go and releases the GPUs.
            wait_until(lambda: _finalise_deletes(kube) >= 0 and not [
                p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job_id)],
                "the job's pods to be deleted", timeout=20)
            wait_until(lambda: not Allocation.objects.filter(job_id=job_id).exists(),
                       "the allocations to be released", timeout=20)
            job = Job.objects.get(pk=job_id)
            assert job.state == JobState.CANCELLED
            assert all(g.memory_allocated_mib == 0 and g.sharers == 0
                       for g in GpuDevice.objects.filter(node__name="gpu-a"))
            assert watcher.poll() is None, "camp_watch died"
        assert worker.poll() is None, "the worker died"
    assert Node.objects.filter(cluster=cluster, name="gpu-a").exists()
