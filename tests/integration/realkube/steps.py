"""Steps the real-apiserver tests share: submit a one-group job through Camp's service, and
wait until reconcile sees its pods Running (the kubelet stand-in sets them so)."""

from __future__ import annotations

from typing import Any

from scheduling import services
from scheduling.models import Job, JobState

from .harness import wait_until


def submit(world: Any, cluster: Any, name: str, **group: Any) -> Job:
    """A project member's one-group pytorch job (1 GPU, 1 CPU, 1 GiB unless ``group`` says)."""
    spec = {"name": "worker", "replicas": 1, "gpu_count": 1, "cpu_millicores": 1000, "ram_mib": 1024}
    spec.update(group)
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                               name=name, kind="pytorch", groups=[spec])


def wait_running(cluster: Any, job: Job) -> Job:
    """Reconcile until the job is RUNNING; the job, refreshed."""

    def running() -> bool:
        services.cluster_reconcile(cluster=cluster)
        return Job.objects.get(pk=job.pk).state == JobState.RUNNING

    wait_until(running, f"{job.name} to run")
    job.refresh_from_db()
    return job


def camp_namespace(cluster: Any, name: str, project: Any) -> str:
    """A namespace as Camp makes one for ``project`` (labelled, with the RoleBinding that
    gives Camp's ServiceAccount its writes there): objects a test plants in it are ones
    Camp may clean up, as in any namespace of its own."""
    from scheduling.backends import backend_for
    from scheduling.backends.base import LABEL_PROJECT_ID, MANAGED_BY, NamespaceSpec

    backend_for(cluster).ensure_namespace(NamespaceSpec(
        name=name, labels={MANAGED_BY: "camp", LABEL_PROJECT_ID: str(project.pk)}, quota={}))
    return name
