"""Extension points for workloads built on the generic scheduling Job.

The scheduler knows jobs, pod groups and allocations; it does not know what a notebook
or a DeepSpeed launcher is. Apps that build workloads on it (``workspaces``) register a
*job spec hook* here: after ``services.job_specs`` has derived the namespace, the job's
owner objects and its pods from the database, every hook may return them amended —
extra environment (``TF_CONFIG``), container ports, volumes, imagePullSecrets, and extra
objects such as a Service, an Ingress, a PVC or a Secret. Hooks must be deterministic
(derived from rows only) because a retried dispatch calls them again.

A *cluster user* counts the workloads that use a cluster without a foreign key to it (a
training job launched for any cluster uses the cluster its run was placed on): deleting the
cluster is refused while any is counted, as for rows that refer to it with PROTECT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backends.base import JobObjects, NamespaceSpec, PodSpec
    from .models import Cluster, Job

JobSpecHook = Callable[["Job", "NamespaceSpec", "JobObjects", "list[PodSpec]"],
                       "tuple[JobObjects, list[PodSpec]] | None"]

_job_spec_hooks: list[JobSpecHook] = []


def register_job_spec_hook(hook: JobSpecHook) -> JobSpecHook:
    """Register ``hook(job, namespace, objects, pods)``; it returns ``(objects, pods)``
    amended, or None when the job is not one of its workloads. Registering twice is a no-op."""
    if hook not in _job_spec_hooks:
        _job_spec_hooks.append(hook)
    return hook


def apply_job_spec_hooks(job: Job, ns: NamespaceSpec, objs: JobObjects,
                         pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    for hook in _job_spec_hooks:
        result = hook(job, ns, objs, pods)
        if result is not None:
            objs, pods = result
    return objs, pods


ClusterUsers = Callable[["Cluster"], "list[tuple[Any, int]]"]
"""``users(cluster) -> [(model _meta, count)]``: rows that still use the cluster."""

_cluster_users: list[ClusterUsers] = []


def register_cluster_users(users: ClusterUsers) -> ClusterUsers:
    """Register ``users(cluster)`` (registering twice is a no-op)."""
    if users not in _cluster_users:
        _cluster_users.append(users)
    return users


def cluster_users(cluster: Cluster) -> list[tuple[Any, int]]:
    return [found for users in _cluster_users for found in users(cluster)]
