"""Reads: the database turned into the engine's immutable inputs (DESIGN.md §2, step 2).

``cycle_inputs`` builds, for one cluster, the ``ClusterSnapshot`` (nodes, GPUs with what
is allocated, running allocations), the queue tree (cluster → tenant → project with
their quotas) and the pending jobs. Engine names are database ids as strings, so the
decisions map back to rows without ambiguity.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Prefetch, QuerySet
from django.utils import timezone

from scheduling import engine as E
from scheduling.engine.queueing import (
    ProjectQueue,
    QueueTree,
    RunningJob,
    TenantQueue,
    running_jobs,
)
from scheduling.engine.queueing import Quota as EQuota
from tenants.models import Project, Quota, QuotaScope, Tenant
from tenants.permissions import restrict

from .backends.vendors import VENDORS
from .models import (
    ACTIVE_STATES,
    Allocation,
    Cluster,
    GpuDevice,
    GpuSlice,
    Job,
    JobState,
    Node,
    NodePool,
    PodGroup,
    SchedulingDecision,
)

POOL_LABEL = "camp.io/pool"
"""Without a matching NodePool row, this node label names a shared pool (display only)."""


def queue_name(tenant_name: str, project_name: str) -> str:
    return f"{tenant_name}/{project_name}"


def pod_key(job_id: int, group: str, replica: int) -> str:
    """The engine's pod name for a job's pod (``Job.pods()`` names them the same way)."""
    return f"{job_id}-{group}-{replica}"


# --- node pools --------------------------------------------------------------------------


def pools_in_order(cluster: Cluster) -> list[NodePool]:
    """A node belongs to the first pool whose selector it matches: dedicated pools first
    (so dedicating a subset of a shared pool works), then by name."""
    return sorted(NodePool.objects.filter(cluster=cluster), key=lambda p: (not p.dedicated, p.name))


def hidden_pools(user: Any) -> dict[tuple[int, str], frozenset[str]]:
    """The dedicated pools ``user`` may not see, as (cluster id, pool name) → the node label
    keys that select them. A dedicated pool's name and selector name whom it serves, so
    readers of nodes in it see neither (the node itself, as infrastructure, stays visible)."""
    dedicated = NodePool.objects.filter(dedicated=True)
    visible = restrict(dedicated, user).values_list("pk", flat=True)
    return {(p.cluster_id, p.name): frozenset({*map(str, p.selector or {}), POOL_LABEL})
            for p in dedicated.exclude(pk__in=list(visible)).only("cluster_id", "name", "selector")}


def pool_of(labels: dict[str, str], pools: list[NodePool]) -> str:
    """The pool a node with ``labels`` belongs to (all selector labels must match; an empty
    selector matches every node), else the ``camp.io/pool`` label, else none."""
    for p in pools:
        if all(labels.get(str(k)) == str(v) for k, v in (p.selector or {}).items()):
            return p.name
    return str(labels.get(POOL_LABEL, ""))


def pool_model(model: str, pool: str) -> str:
    """The GPU model the engine sees for a card of a dedicated pool.

    The engine (pure, owned elsewhere) has no per-job node selector, but every pod carries
    GPU-model allow/deny lists. Cards of a dedicated pool therefore appear under their own
    model name, and each job's lists admit exactly the dedicated pools its tenant may use."""
    return f"{model}@{pool}"


def plain_model(model: str) -> str:
    return model.split("@", 1)[0]


@dataclass(frozen=True)
class PoolAccess:
    """Dedicated pools of one cluster: who may use them and which GPU models they hold."""

    tenants: dict[str, frozenset[int]]
    """Dedicated pool name → the tenant ids it serves."""
    models: dict[str, frozenset[str]]
    """Dedicated pool name → the (plain) GPU models of its nodes."""
    node_pool: dict[str, str]
    """Node name → dedicated pool name (nodes of shared pools are absent)."""

    def closed_to(self, tenant_id: int) -> list[str]:
        return sorted(p for p, ts in self.tenants.items() if tenant_id not in ts)

    def open_to(self, tenant_id: int) -> list[str]:
        return sorted(p for p, ts in self.tenants.items() if tenant_id in ts)

    def forbidden_nodes(self, tenant_id: int) -> set[str]:
        closed = set(self.closed_to(tenant_id))
        return {n for n, p in self.node_pool.items() if p in closed}

    def model_lists(self, tenant_id: int, allowed: frozenset[str]
                    ) -> tuple[frozenset[str], frozenset[str]]:
        """(allowlist, denylist) of engine GPU models for a pod of this tenant."""
        deny = frozenset(pool_model(m, p) for p in self.closed_to(tenant_id) for m in self.models[p])
        if not allowed:
            return allowed, deny
        extra = {pool_model(m, p) for p in self.open_to(tenant_id) for m in allowed}
        return allowed | extra, deny


NO_POOLS = PoolAccess({}, {}, {})


def pool_access(cluster: Cluster, nodes: dict[str, Node] | None = None) -> PoolAccess:
    dedicated = {p.name: frozenset(t.pk for t in p.tenants.all())
                 for p in NodePool.objects.filter(cluster=cluster, dedicated=True)
                 .prefetch_related("tenants")}
    if not dedicated:
        return NO_POOLS
    if nodes is None:
        nodes = {n.name: n for n in Node.objects.filter(cluster=cluster, present=True)
                 .prefetch_related("gpus")}
    node_pool = {name: n.pool for name, n in nodes.items() if n.pool in dedicated}
    models: dict[str, set[str]] = {p: set() for p in dedicated}
    for name, p in node_pool.items():
        models[p].update(g.model for g in nodes[name].gpus.all())
    return PoolAccess(dedicated, {p: frozenset(m) for p, m in models.items()}, node_pool)


# --- inventory ---------------------------------------------------------------------------


def _fresh_utilization(g: GpuDevice) -> float | None:
    """A utilisation reading steers placement only while it is recent."""
    if g.utilization_percent is None or g.utilization_at is None:
        return None
    max_age = dt.timedelta(seconds=getattr(settings, "SCHEDULER_UTILIZATION_MAX_AGE_SECONDS", 120))
    return g.utilization_percent if timezone.now() - g.utilization_at <= max_age else None


def _engine_gpu(g: GpuDevice, node_usable: bool, pool: str = "") -> E.GpuDevice:
    templates = tuple(
        E.SliceTemplate(int(t["memory_mib"]), int(t["cores"]), str(t.get("name", "")))
        for t in (g.templates or [])
    )
    sharing = E.SharingMode(g.sharing) if g.sharing in E.SharingMode._value2member_map_ else (
        E.SharingMode.SHAREABLE)
    return E.GpuDevice(
        index=g.index, uuid=g.uuid, model=pool_model(g.model, pool) if pool else g.model,
        memory_mib=g.memory_mib, vendor=g.vendor,
        # On a quarantined node the node itself is unschedulable; its GPUs still count as
        # present so that jobs needing them wait for the repair instead of being rejected
        # as "never fits" (the engine treats an unhealthy GPU as gone for good).
        numa_node=g.numa_node, healthy=g.usable or not node_usable, sharing=sharing, templates=templates,
        max_sharers=g.max_sharers, utilization_percent=_fresh_utilization(g),
        foreign_memory_mib=g.foreign_memory_mib, foreign_cores_percent=g.foreign_cores,
        foreign_sharers=g.foreign_sharers, foreign_exclusive=g.foreign_exclusive,
    )


# Taints Camp's pods tolerate: a GPU node tainted with its GPU resource name (the
# ExtendedResourceToleration convention); Camp's GPU pods carry that toleration.
_TOLERATED_TAINTS = frozenset(v.count_resource for v in VENDORS.values())


def node_repelling_taints(n: Node) -> list[str]:
    """The node's NoSchedule/NoExecute taints that Camp's pods do not tolerate (e.g. the
    node lifecycle controller's ``node.kubernetes.io/not-ready``): such a node takes no pod."""
    return [str(t.get("key", "")) for t in (n.taints or [])
            if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in _TOLERATED_TAINTS]


def _engine_node(n: Node, access: PoolAccess = NO_POOLS) -> E.Node:
    pool = access.node_pool.get(n.name, "")
    schedulable = n.schedulable and not node_repelling_taints(n)
    gpus = tuple(_engine_gpu(g, schedulable, pool) for g in n.gpus.all())
    islands = tuple(frozenset(int(i) for i in isl) for isl in (n.nvlink_islands or []))
    return E.Node(
        name=n.name, cpu_millicores=n.cpu_millicores, ram_mib=n.ram_mib, gpus=gpus,
        max_pods=n.max_pods, labels=tuple(sorted((str(k), str(v)) for k, v in n.labels.items())),
        pool=n.pool, schedulable=schedulable, healthy=True,
        topology=E.Topology(nvlink_islands=islands),
    )


def pod_placement(a: Allocation, access: PoolAccess = NO_POOLS) -> E.PodPlacement:
    pool = access.node_pool.get(a.node.name, "")
    gpus = tuple(
        E.GpuGrant(
            index=s.gpu.index, uuid=s.gpu.uuid,
            gpu_model=pool_model(s.gpu.model, pool) if pool else s.gpu.model,
            gpu_memory_mib=s.memory_mib,
            gpu_cores_percent=s.cores_percent, exclusive=s.exclusive, container=s.container,
            vendor=s.gpu.vendor,
        )
        for s in a.slices.all()
    )
    return E.PodPlacement(
        pod=pod_key(a.job_id, a.group.name, a.replica), node=a.node.name, gpus=gpus,
        cpu_millicores=a.cpu_millicores, ram_mib=a.ram_mib,
    )


# --- jobs --------------------------------------------------------------------------------


def engine_job(job: Job, groups: list[PodGroup], access: PoolAccess = NO_POOLS) -> E.Job:
    egroups = []
    for g in groups:
        allow, deny = access.model_lists(job.tenant_id, frozenset(g.gpu_models or ()))
        egroups.append(E.PodGroup(
            name=g.name,
            template=E.pod(
                f"{job.pk}-{g.name}", gpu_count=g.gpu_count, gpu_memory_mib=g.gpu_memory_mib,
                gpu_cores_percent=g.gpu_cores_percent, exclusive=g.exclusive,
                cpu_millicores=g.cpu_millicores, ram_mib=g.ram_mib,
                gpu_models=allow, excluded_gpu_models=deny,
            ),
            replicas=g.replicas,
        ))
    return E.Job(
        name=str(job.pk), groups=tuple(egroups), gang=job.gang, priority=job.priority,
        priority_class=job.priority_class, queue=queue_name(job.tenant.name, job.project.name),
        preemptible=job.preemptible, submit_time=job.submitted_at.timestamp(),
        runtime_estimate_s=float(job.duration_seconds) if job.duration_seconds else None,
        checkpointable=job.checkpoint_capable, mixed_gpu_models=job.mixed_gpu_models,
    )


def _equota(q: Quota | None) -> EQuota:
    if q is None:
        return EQuota()
    return EQuota(
        gpus_guaranteed=q.gpus_guaranteed, gpus_limit=q.gpus_limit,
        gpu_memory_mib_guaranteed=q.gpu_memory_mib_guaranteed,
        gpu_memory_mib_limit=q.gpu_memory_mib_limit,
        cpu_cores_guaranteed=q.cpu_cores_guaranteed, cpu_cores_limit=q.cpu_cores_limit,
        ram_mib_guaranteed=q.ram_mib_guaranteed, ram_mib_limit=q.ram_mib_limit,
    )


def queue_tree(cluster: Cluster) -> QueueTree:
    """Cluster → tenant → project with their quotas. Tenant and project quotas are not
    per cluster in the data model, so they apply on every cluster alike."""
    quotas = list(Quota.objects.filter(scope__in=[QuotaScope.TENANT, QuotaScope.PROJECT]))
    tenant_q = {q.tenant_id: q for q in quotas if q.scope == QuotaScope.TENANT}
    project_q = {q.project_id: q for q in quotas if q.scope == QuotaScope.PROJECT}
    projects: dict[int, list[Project]] = defaultdict(list)
    for p in Project.objects.all():
        projects[p.tenant_id].append(p)
    tenants = tuple(
        TenantQueue(
            name=t.name, quota=_equota(tenant_q.get(t.pk)),
            projects=tuple(
                ProjectQueue(queue_name(t.name, p.name), _equota(project_q.get(p.pk)))
                for p in projects[t.pk]
            ),
        )
        for t in Tenant.objects.all()
    )
    cq = Quota.objects.filter(scope=QuotaScope.CLUSTER, cluster=cluster).first()
    return QueueTree(tenants=tenants, quota=_equota(cq), name=cluster.name)


@dataclass(frozen=True)
class CycleInputs:
    snapshot: E.ClusterSnapshot
    tree: QueueTree
    pending: list[E.Job]
    running: list[RunningJob]
    jobs: dict[str, Job]
    """Pending and running jobs by engine name."""
    nodes: dict[str, Node]
    gpus: dict[tuple[str, int], GpuDevice]
    groups: dict[int, dict[str, PodGroup]]
    pools: PoolAccess = NO_POOLS
    cluster: Cluster | None = None

    @classmethod
    def empty(cls) -> CycleInputs:
        """The inputs of a cycle with nothing pending (no decision to take)."""
        return cls(E.ClusterSnapshot(nodes=()), QueueTree(tenants=()), [], [], {}, {}, {}, {})


def cycle_inputs(cluster: Cluster) -> CycleInputs:
    nodes = {
        n.name: n
        for n in Node.objects.filter(cluster=cluster, present=True).prefetch_related(
            Prefetch("gpus", queryset=GpuDevice.objects.order_by("index"))
        )
    }
    gpus = {(n.name, g.index): g for n in nodes.values() for g in n.gpus.all()}
    access = pool_access(cluster, nodes)
    allocations = list(
        Allocation.objects.filter(cluster=cluster)
        .select_related("job__tenant", "job__project", "group", "node")
        .prefetch_related(Prefetch("slices", queryset=GpuSlice.objects.select_related("gpu")))
    )
    eallocs = []
    jobs: dict[str, Job] = {}
    for a in allocations:
        if a.node.name not in nodes:
            continue
        job = a.job
        job.project.tenant = job.tenant  # str(job) names the tenant: no query per audit event
        jobs[str(job.pk)] = job
        eallocs.append(E.Allocation(
            job=str(job.pk), placement=pod_placement(a, access),
            queue=queue_name(job.tenant.name, job.project.name), priority=job.priority,
            preemptible=job.preemptible and job.state != JobState.PREEMPTING,
            start_time=(job.started_at or job.admitted_at or job.submitted_at).timestamp(),
        ))
    snapshot = E.ClusterSnapshot(nodes=tuple(_engine_node(n, access) for n in nodes.values()),
                                 allocations=tuple(eallocs))
    running = running_jobs(
        snapshot,
        checkpointable=[k for k, j in jobs.items() if j.checkpoint_capable],
        runtime_estimates={k: float(j.duration_seconds) for k, j in jobs.items()
                           if j.duration_seconds},
    )
    # Tens of thousands of pending jobs: their tenants and projects (a few hundred) are read
    # once and attached, and their pod groups read with one join, rather than built per row
    # by select_related / prefetch_related (the snapshot's largest cost, issue 13).
    pending_rows = list(
        Job.objects.filter(cluster=cluster, state=JobState.QUEUED).order_by("submitted_at", "id"))
    tenants = {t.pk: t for t in Tenant.objects.filter(pk__in={j.tenant_id for j in pending_rows})}
    projects = {p.pk: p for p in Project.objects.filter(pk__in={j.project_id for j in pending_rows})}
    pending_groups: dict[int, list[PodGroup]] = defaultdict(list)
    for g in PodGroup.objects.filter(job__cluster=cluster, job__state=JobState.QUEUED).order_by("id"):
        pending_groups[g.job_id].append(g)
    # A preemptor waits, out of the queue, until its victims have released their resources.
    waiting_for_victims = set(
        Job.objects.filter(cluster=cluster, state=JobState.PREEMPTING, preempted_by__isnull=False)
        .values_list("preempted_by_id", flat=True)
    )
    pending = []
    groups: dict[int, dict[str, PodGroup]] = {}
    for job in pending_rows:
        job.tenant = tenants[job.tenant_id]
        job.project = projects[job.project_id]
        job.project.tenant = job.tenant  # str(job) names the tenant: no query per audit event
        gs = pending_groups[job.pk]
        if not gs:  # left QUEUED between the two reads (only without REPEATABLE READ: SQLite)
            continue
        for g in gs:
            g.job = job
        groups[job.pk] = {g.name: g for g in gs}
        jobs[str(job.pk)] = job
        if job.pk not in waiting_for_victims:
            pending.append(engine_job(job, gs, access))
    return CycleInputs(snapshot, queue_tree(cluster), pending, running, jobs, nodes, gpus, groups,
                       access, cluster)


# --- reads for views ---------------------------------------------------------------------


def project_namespace_name(*, cluster: Cluster, project: Any) -> str:
    """The project's namespace on ``cluster``: the stored one (``ProjectNamespace``), else
    the name it will get on its first admission (``services.project_namespace_ensure``)."""
    from .backends.naming import namespace_name
    from .models import ProjectNamespace

    stored = ProjectNamespace.objects.filter(cluster=cluster, project=project).values_list(
        "name", flat=True).first()
    return stored or namespace_name(cluster.namespace_prefix, project.pk, project.name)


def job_list(*, user: Any) -> QuerySet[Job]:
    """The jobs ``user`` may see, newest first (an indexed order: ``Job.Meta.indexes``),
    with what every list renders; the portal's jobs page and the API list both use it."""
    # preempted_by is rendered as its id (preempted_by_id), so it is not joined.
    return restrict(Job.objects.all(), user).select_related(
        "tenant", "project__tenant", "owner", "cluster").order_by("-submitted_at", "-id")


def job_decisions(*, job: Job, limit: int = 50) -> list[SchedulingDecision]:
    return list(job.decisions.select_related("preemptor").order_by("-id")[:limit])


def cluster_usage(*, cluster: Cluster) -> dict[str, int]:
    """Totals for the console: GPUs, allocated GPU memory, jobs by state."""
    gpus = GpuDevice.objects.filter(node__cluster=cluster, node__present=True)
    total_mem = sum(g.memory_mib for g in gpus)
    used_mem = sum(g.memory_allocated_mib for g in gpus)
    return {
        "gpus": gpus.count(),
        "gpu_memory_mib": total_mem,
        "gpu_memory_allocated_mib": used_mem,
        "queued": Job.objects.filter(cluster=cluster, state=JobState.QUEUED).count(),
        "active": Job.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).count(),
    }
