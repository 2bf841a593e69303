"""Extension points for workloads built on the generic scheduling Job.

The scheduler knows jobs, pod groups and allocations; it does not know what a notebook
or a DeepSpeed launcher is. Apps that build workloads on it (``workspaces``) register a
*job spec hook* here: after ``services.job_specs`` has derived the namespace, the job's
owner objects and its pods from the database, every hook may return them amended —
extra environment (``TF_CONFIG``), container ports, volumes, imagePullSecrets, and extra
objects such as a Service, an Ingress, a PVC or a Secret. Hooks must be deterministic
(derived from rows only) because a retried dispatch calls them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backends.base import JobObjects, NamespaceSpec, PodSpec
    from .models import Job

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
