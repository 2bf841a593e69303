"""Access rules of the scheduler's models (tenants/permissions.py explains the rules).

Registered from ``SchedulingConfig.ready()``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model, Q

from tenants.permissions import (
    CHANGE,
    DELETE,
    PROJECT_ADMIN,
    PROJECT_MEMBER,
    TENANT_MEMBER,
    VIEW,
    Internal,
    PlatformOnly,
    ProjectScoped,
    Scope,
    Special,
    register,
)

from .models import (
    Allocation,
    Cluster,
    ExternalPod,
    ExternalWorkload,
    GpuDevice,
    GpuSlice,
    Installation,
    Job,
    NamespaceBinding,
    Node,
    NodePool,
    PodGroup,
    PodLogTail,
    PriorityClassMapping,
    ProjectNamespace,
    SchedulingDecision,
    SimulatedPod,
)

# A job: project members see it and submit to the project; its owner, a project admin
# and above change and cancel it. Workloads built on jobs (workspaces) follow the same rule.
JOB_RULE = ProjectScoped(view=PROJECT_MEMBER, create=PROJECT_MEMBER, change=PROJECT_ADMIN,
                         delete=PROJECT_ADMIN, owner="owner", owner_may=(CHANGE, DELETE))


def _pool_visible(scope: Scope, user: Any) -> Q | None:
    if not scope.tenants:
        return None
    return Q(dedicated=False) | Q(tenants__in=scope.tenants)


def _pool_can(user: Any, scope: Scope, action: str, obj: NodePool) -> bool:
    # Shared pools are infrastructure every tenant member reads; a dedicated pool is seen
    # only by its tenants (its existence names who it serves). Platform admins manage them.
    if action != VIEW or not scope.tenants:
        return False
    return not obj.dedicated or (
        obj.pk is not None and obj.tenants.filter(pk__in=scope.tenants).exists())


def register_rules() -> None:
    # Clusters, nodes and GPUs: every tenant member reads them; platform admins manage them.
    infrastructure: tuple[type[Model], ...] = (Cluster, Node, GpuDevice)
    for model in infrastructure:
        register(model, PlatformOnly(view=TENANT_MEMBER))
    register(NodePool, Special(visible=_pool_visible, can=_pool_can))
    register(Job, JOB_RULE)
    # A decision is read by whoever reads its job; only the scheduler writes them.
    register(SchedulingDecision, ProjectScoped(project="job__project", tenant="job__tenant",
                                               view=PROJECT_MEMBER))
    # Shown only inside their job (the API nests them), whose rule is checked.
    bookkeeping: tuple[type[Model], ...] = (PodGroup, Allocation, GpuSlice)
    for model in bookkeeping:
        register(model, Internal("the scheduler's bookkeeping, shown only within its job"))
    register(ProjectNamespace, Internal("named by the scheduler; shown within jobs"))
    # A namespace bound to a project (issue 34): its members see it, its admins bind and unbind.
    register(NamespaceBinding, ProjectScoped(view=PROJECT_MEMBER, create=PROJECT_ADMIN,
                                             change=PROJECT_ADMIN, delete=PROJECT_ADMIN))
    # Which Camp class an external pod's PriorityClass maps to: cluster-wide, read by every
    # tenant member (what their pods will get), set by platform admins.
    register(PriorityClassMapping, PlatformOnly(view=TENANT_MEMBER))
    register(ExternalPod, Internal("the pods of an external job, shown within its job"))
    register(ExternalWorkload, Internal("the batch/v1 Job an external job admits, shown within its job"))
    register(SimulatedPod, Internal("the simulated backend's stand-in for a cluster's pods"))
    # A finished pod's last lines: read by whoever reads its job (served within the job's logs).
    register(PodLogTail, ProjectScoped(project="job__project", tenant="job__tenant",
                                       view=PROJECT_MEMBER))
    register(Installation, Internal("this installation's identity, written once by the backend"))
