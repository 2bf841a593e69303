"""Reads: the database turned into the engine's immutable inputs (DESIGN.md §2, step 2).

``cycle_inputs`` builds, for one cluster, the ``ClusterSnapshot`` (nodes, GPUs with what
is allocated, running allocations), the queue tree (cluster → tenant → project with
their quotas) and the pending jobs. Engine names are database ids as strings, so the
decisions map back to rows without ambiguity.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import FloatField, Max, Q, QuerySet, TextField
from django.db.models.functions import Cast, Extract
from django.utils import timezone

from scheduling import engine as E
from scheduling.engine.multicluster import platform_arch
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
    without_cluster_bulk,
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


def pool_access(cluster: Cluster, node_pools: dict[str, str] | None = None,
                gpu_models: dict[str, set[str]] | None = None) -> PoolAccess:
    """``node_pools`` (node name → pool) and ``gpu_models`` (node name → its GPU models),
    when the caller has read them already; otherwise they are read here."""
    dedicated = {p.name: frozenset(t.pk for t in p.tenants.all())
                 for p in NodePool.objects.filter(cluster=cluster, dedicated=True)
                 .prefetch_related("tenants")}
    if not dedicated:
        return NO_POOLS
    if node_pools is None or gpu_models is None:
        node_pools = dict(Node.objects.filter(cluster=cluster, present=True).values_list("name", "pool"))
        gpu_models = defaultdict(set)
        for name, model in GpuDevice.objects.filter(node__cluster=cluster, node__present=True).values_list(
                "node__name", "model"):
            gpu_models[name].add(model)
    node_pool = {name: pool for name, pool in node_pools.items() if pool in dedicated}
    models: dict[str, set[str]] = {p: set() for p in dedicated}
    for name, p in node_pool.items():
        models[p].update(gpu_models.get(name, ()))
    return PoolAccess(dedicated, {p: frozenset(m) for p, m in models.items()}, node_pool)


# --- the cycle's snapshot ------------------------------------------------------------------
#
# Read as tuples (``values_list``), straight into the engine's structures: building Django
# model instances for 20,000 jobs, their pod groups and every GPU and allocation was most
# of the snapshot's time (issue 13). The columns read are the ones the engine and the
# cycle's writes use; the few jobs a cycle admits, preempts or rejects are loaded as models
# afterwards (``job_models``).


@dataclass(frozen=True, slots=True)
class GpuRow:
    """A GPU as the snapshot saw it: its id and the totals an admission is checked against."""

    pk: int
    memory_allocated_mib: int
    cores_allocated: int
    sharers: int
    exclusive_held: bool
    memory_mib: int
    max_sharers: int
    foreign_memory_mib: int = 0
    foreign_cores: int = 0
    foreign_sharers: int = 0
    foreign_exclusive: bool = False

    def totals(self) -> tuple[int, int, int, bool, int, int, int, int, int, bool]:
        """What an admission is checked against: Camp's own counters, the card's size and the
        usage of pods Camp did not create (a change in any of them makes the admission wait)."""
        return (self.memory_allocated_mib, self.cores_allocated, self.sharers, self.exclusive_held,
                self.memory_mib, self.max_sharers, self.foreign_memory_mib, self.foreign_cores,
                self.foreign_sharers, self.foreign_exclusive)


@dataclass(slots=True)
class JobRow:
    """A pending or running job as the snapshot saw it: what the cycle's bulk writes compare
    and update (a waiting job's reason and position) without a model instance."""

    pk: int
    cluster_id: int
    tenant_id: int
    project_id: int
    reason: str
    reason_kind: str
    queue_position: int | None
    queue_length: int | None


# Taints Camp's pods tolerate: a GPU node tainted with its GPU resource name (the
# ExtendedResourceToleration convention); Camp's GPU pods carry that toleration.
_TOLERATED_TAINTS = frozenset(v.count_resource for v in VENDORS.values())


def repelling_taints(taints: list[dict[str, Any]] | None) -> list[str]:
    """The node's NoSchedule/NoExecute taints that Camp's pods do not tolerate (e.g. the
    node lifecycle controller's ``node.kubernetes.io/not-ready``): such a node takes no pod."""
    return [str(t.get("key", "")) for t in (taints or [])
            if t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") not in _TOLERATED_TAINTS]


_NODE_COLUMNS = ("pk", "name", "cpu_millicores", "ram_mib", "max_pods", "labels", "taints", "pool",
                 "nvlink_islands", "ready", "cordoned", "quarantined")
_GPU_COLUMNS = ("pk", "node_id", "index", "uuid", "model", "vendor", "memory_mib", "numa_node",
                "healthy", "quarantined", "sharing", "templates", "max_sharers", "utilization_percent",
                "utilization_at", "memory_allocated_mib", "cores_allocated", "sharers", "exclusive_held",
                "foreign_memory_mib", "foreign_cores", "foreign_sharers", "foreign_exclusive")
_JOB_COLUMNS = ("pk", "cluster_id", "tenant_id", "project_id", "reason", "reason_kind",
                "queue_position", "queue_length")
_PENDING_COLUMNS = (*_JOB_COLUMNS, "tenant__name", "project__name", "priority", "priority_class",
                    "gang", "preemptible", "mixed_gpu_models", "affinity", "submitted_at", "duration_seconds",
                    "checkpoint_capable")
_GROUP_COLUMNS = ("job_id", "pk", "name", "replicas", "gpu_count", "gpu_memory_mib",
                  "gpu_cores_percent", "exclusive", "cpu_millicores", "ram_mib", "image", "gpu_models")
_ALLOC_COLUMNS = ("pk", "job_id", "group__name", "replica", "node__name", "cpu_millicores", "ram_mib")
_RUNNING_COLUMNS = (*_JOB_COLUMNS, "tenant__name", "project__name", "priority", "preemptible",
                    "state", "started_at", "admitted_at", "submitted_at", "checkpoint_capable",
                    "duration_seconds")


def _cluster_part(cluster: Cluster) -> tuple[tuple[E.Node, ...], dict[str, int],
                                              dict[tuple[str, int], GpuRow], dict[int, tuple[Any, ...]],
                                              PoolAccess]:
    """Nodes as the engine sees them, node name → id, (node, index) → GpuRow, GPU id → its row
    (for allocations' slices) and the dedicated pools."""
    node_rows = list(Node.objects.filter(cluster=cluster, present=True).order_by("name")
                     .values_list(*_NODE_COLUMNS))
    gpu_rows = list(GpuDevice.objects.filter(node__cluster=cluster, node__present=True)
                    .order_by("node_id", "index").values_list(*_GPU_COLUMNS))
    by_node: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for g in gpu_rows:
        by_node[g[1]].append(g)
    node_name = {n[0]: n[1] for n in node_rows}
    access = pool_access(cluster, {n[1]: n[7] for n in node_rows},
                         {node_name[nid]: {g[4] for g in gs} for nid, gs in by_node.items()
                          if nid in node_name})
    now = timezone.now()
    max_age = dt.timedelta(seconds=getattr(settings, "SCHEDULER_UTILIZATION_MAX_AGE_SECONDS", 120))
    sharing_modes = E.SharingMode._value2member_map_
    enodes = []
    gpus: dict[tuple[str, int], GpuRow] = {}
    gpu_by_id: dict[int, tuple[Any, ...]] = {}
    for (pk, name, cpu, ram, max_pods, labels, taints, pool, islands, ready, cordoned,
         quarantined) in node_rows:
        # present: the only nodes read
        schedulable = ready and not cordoned and not quarantined and not repelling_taints(taints)
        dpool = access.node_pool.get(name, "")
        egpus = []
        for (gpk, _, index, uuid, model, vendor, memory_mib, numa, healthy, gquar, sharing, templates,
             max_sharers, util, util_at, mem_alloc, cores_alloc, sharers, excl, f_mem, f_cores, f_sharers,
             f_excl) in by_node.get(pk, ()):
            gpu_by_id[gpk] = (name, index, uuid, model, vendor, memory_mib)
            gpus[(name, index)] = GpuRow(gpk, mem_alloc, cores_alloc, sharers, excl, memory_mib, max_sharers,
                                         f_mem, f_cores, f_sharers, f_excl)
            fresh = util if util is not None and util_at is not None and now - util_at <= max_age else None
            egpus.append(E.GpuDevice(
                index=index, uuid=uuid, model=pool_model(model, dpool) if dpool else model,
                memory_mib=memory_mib, vendor=vendor, numa_node=numa,
                # On a quarantined node the node itself is unschedulable; its GPUs still count
                # as present so that jobs needing them wait for the repair instead of being
                # rejected as "never fits" (the engine treats an unhealthy GPU as gone for good).
                healthy=(healthy and not gquar) or not schedulable,
                sharing=E.SharingMode(sharing) if sharing in sharing_modes else E.SharingMode.SHAREABLE,
                templates=tuple(E.SliceTemplate(int(t["memory_mib"]), int(t["cores"]), str(t.get("name", "")))
                                for t in (templates or [])),
                max_sharers=max_sharers, utilization_percent=fresh,
                foreign_memory_mib=f_mem, foreign_cores_percent=f_cores, foreign_sharers=f_sharers,
                foreign_exclusive=f_excl,
            ))
        enodes.append(E.Node(
            name=name, cpu_millicores=cpu, ram_mib=ram, gpus=tuple(egpus), max_pods=max_pods,
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())), pool=pool,
            schedulable=schedulable, healthy=True,
            topology=E.Topology(nvlink_islands=tuple(frozenset(int(i) for i in isl)
                                                      for isl in (islands or []))),
        ))
    return tuple(enodes), {n[1]: n[0] for n in node_rows}, gpus, gpu_by_id, access


def _running_part(cluster: Cluster, nodes: dict[str, int], gpu_by_id: dict[int, tuple[Any, ...]],
                  access: PoolAccess, jobs: dict[str, JobRow]
                  ) -> tuple[list[E.Allocation], dict[str, bool], dict[str, float]]:
    """The allocations as the engine sees them; adds their jobs to ``jobs``."""
    allocs = [a for a in Allocation.objects.filter(cluster=cluster).order_by("job_id", "group_id", "replica")
              .values_list(*_ALLOC_COLUMNS) if a[4] in nodes]
    slices: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for s in (GpuSlice.objects.filter(allocation__cluster=cluster)
              .order_by("allocation_id", "container", "gpu_id")
              .values_list("allocation_id", "gpu_id", "memory_mib", "cores_percent", "exclusive",
                           "container")):
        slices[s[0]].append(s)
    running = {r[0]: r for r in Job.objects.filter(pk__in={a[1] for a in allocs})
               .values_list(*_RUNNING_COLUMNS)}
    n = len(_JOB_COLUMNS)
    eallocs = []
    for pk, job_id, group, replica, node, cpu, ram in allocs:
        r = running[job_id]
        tenant, project, priority, preemptible, state, started, admitted, submitted = r[n:n + 8]
        jobs[str(job_id)] = JobRow(*r[:n])
        pool = access.node_pool.get(node, "")
        grants = []
        for _, gpu_id, memory_mib, cores, exclusive, container in slices.get(pk, ()):
            _, index, uuid, model, vendor, card_mib = gpu_by_id[gpu_id]
            grants.append(E.GpuGrant(
                index=index, uuid=uuid, gpu_model=pool_model(model, pool) if pool else model,
                gpu_memory_mib=memory_mib, gpu_cores_percent=cores, exclusive=exclusive,
                container=container, vendor=vendor, card_memory_mib=card_mib))
        eallocs.append(E.Allocation(
            job=str(job_id),
            placement=E.PodPlacement(pod=pod_key(job_id, group, replica), node=node, gpus=tuple(grants),
                                     cpu_millicores=cpu, ram_mib=ram),
            queue=queue_name(tenant, project), priority=priority,
            preemptible=preemptible and state != JobState.PREEMPTING,
            start_time=(started or admitted or submitted).timestamp(),
        ))
    checkpointable = {str(k): bool(r[n + 8]) for k, r in running.items()}
    estimates = {str(k): float(r[n + 9]) for k, r in running.items() if r[n + 9]}
    return eallocs, checkpointable, estimates


def image_arches(uses: Iterable[tuple[int, int, str]]) -> dict[tuple[int, str], frozenset[str]]:
    """(tenant id, project id, image reference) → (project id, reference) → the CPU
    architectures the registry catalog records for that image, as that project sees the
    catalog: enabled images of the platform, of its tenant and of the project only (another
    tenant's catalog never changes where this project's jobs may run, nor is it revealed).
    Absent when Camp cannot tell — not in the project's catalog, or a record with no
    architectures (unknown, e.g. an image catalogued before architectures were recorded) —
    and then the job is not restricted. Several records of one reference: the union."""
    from registry.models import Image  # registry sits above scheduling (it imports its models)

    wanted = {(t, p, ref) for t, p, ref in uses if ref}
    if not wanted:
        return {}
    refs = {ref for _, _, ref in wanted}
    tenants = {t for t, _, _ in wanted}
    projects = {p for _, p, _ in wanted}
    rows = list(Image.objects.filter(enabled=True, reference__in=refs).filter(
        Q(scope="platform") | Q(scope="tenant", tenant_id__in=tenants)
        | Q(scope="project", project_id__in=projects)).order_by().values_list(
        "reference", "scope", "tenant_id", "project_id", "architectures"))  # a union: no order
    out: dict[tuple[int, str], frozenset[str]] = {}
    for tenant_id, project_id, ref in wanted:
        seen: set[str] = set()
        unknown = False
        for r, scope, t, p, platforms in rows:
            if r != ref or (scope == "tenant" and t != tenant_id) or (scope == "project" and p != project_id):
                continue
            if not platforms:
                unknown = True
            seen.update(platform_arch(str(x)) for x in platforms or ())
        if seen and not unknown:
            out[(project_id, ref)] = frozenset(seen)
    return out


def _pending_part(cluster: Cluster, access: PoolAccess, jobs: dict[str, JobRow],
                  ids: Collection[int] | None = None,
                  ) -> tuple[list[E.Job], dict[int, dict[str, int]]]:
    """The queued jobs as the engine sees them (in submission order) and their pod groups
    (job id → group name → group id); adds the jobs to ``jobs``. With ``ids``: those queued
    jobs instead of the cluster's (floating jobs offered to it, scheduling/multicluster.py)."""
    where = Q(pk__in=list(ids)) if ids is not None else Q(cluster=cluster)
    queued = Job.objects.filter(where, state=JobState.QUEUED).order_by("submitted_at", "id")
    if connection.vendor == "postgresql":
        # Seconds since the epoch as a float, computed by the server: Django's timestamptz
        # loader parses text in Python (~20 µs a row). The same double as .timestamp().
        queued = queued.annotate(submit_s=Cast(Extract("submitted_at", "epoch"), FloatField()))
        columns = (*_PENDING_COLUMNS[:-3], "submit_s", *_PENDING_COLUMNS[-2:])
    else:
        columns = _PENDING_COLUMNS
    rows = list(queued.values_list(*columns))
    # gpu_models read as text and parsed once per distinct list (a few dozen), not per row.
    parsed: dict[str | None, list[str]] = {}
    group_rows: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    gwhere = Q(job_id__in=list(ids)) if ids is not None else Q(job__cluster=cluster)
    for g in (PodGroup.objects.filter(gwhere, job__state=JobState.QUEUED).order_by("id")
              .annotate(models_text=Cast("gpu_models", TextField()))
              .values_list(*_GROUP_COLUMNS[:-1], "models_text")):
        text = g[-1]
        if text not in parsed:
            parsed[text] = json.loads(text) if text else []
        group_rows[g[0]].append((*g[:-1], parsed[text]))
    # A preemptor waits, out of the queue, until its victims have released their resources.
    waiting_for_victims = set() if ids is not None else set(
        Job.objects.filter(cluster=cluster, state=JobState.PREEMPTING, preempted_by__isnull=False)
        .values_list("preempted_by_id", flat=True))
    project_of = {r[0]: (r[2], r[3]) for r in rows}
    arches = image_arches((*project_of[g[0]], g[-2]) for gs in group_rows.values() for g in gs
                          if g[0] in project_of)
    lists: dict[tuple[int, frozenset[str]], tuple[frozenset[str], frozenset[str]]] = {}
    n = len(_JOB_COLUMNS)
    pending: list[E.Job] = []
    groups: dict[int, dict[str, int]] = {}
    for r in rows:
        pk, tenant_id = r[0], r[2]
        gs = group_rows.get(pk)
        if not gs:  # left QUEUED between the two reads (only without REPEATABLE READ: SQLite)
            continue
        (tenant, project, priority, priority_class, gang, preemptible, mixed, affinity, submitted, duration,
         ckpt) = r[n:]
        groups[pk] = {g[2]: g[1] for g in gs}
        jobs[str(pk)] = JobRow(*r[:n])
        if pk in waiting_for_victims:
            continue
        egroups = []
        for (_, _, name, replicas, gpu_count, gpu_mem, gpu_cores, exclusive, cpu, ram, image,
             gpu_models) in gs:
            key = (tenant_id, frozenset(gpu_models or ()))
            if key not in lists:
                lists[key] = access.model_lists(tenant_id, key[1])
            allow, deny = lists[key]
            egroups.append(E.PodGroup(
                name=name,
                template=E.pod(f"{pk}-{name}", gpu_count=gpu_count, gpu_memory_mib=gpu_mem,
                               gpu_cores_percent=gpu_cores, exclusive=exclusive, cpu_millicores=cpu,
                               ram_mib=ram, gpu_models=allow, excluded_gpu_models=deny,
                               arches=arches.get((r[3], image), frozenset())),
                replicas=replicas,
            ))
        pending.append(E.Job(
            name=str(pk), groups=tuple(egroups), gang=gang, priority=priority,
            priority_class=priority_class, queue=queue_name(tenant, project), preemptible=preemptible,
            submit_time=submitted if isinstance(submitted, float) else submitted.timestamp(),
            runtime_estimate_s=float(duration) if duration else None,
            checkpointable=ckpt, mixed_gpu_models=mixed, affinity=E.JobAffinity(affinity or "none"),
        ))
    return pending, groups


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
    jobs: dict[str, JobRow]
    """Pending and running jobs by engine name."""
    nodes: dict[str, int]
    """Node name → id."""
    gpus: dict[tuple[str, int], GpuRow]
    groups: dict[int, dict[str, int]]
    """Pending job id → pod group name → group id."""
    pools: PoolAccess = NO_POOLS
    cluster: Cluster | None = None
    quota_times: dict[tuple[str, int], str] | None = None
    """When each quota row last changed, read with the snapshot when floating jobs are queued
    (``placement.quota_times``): the stamp a refusal records is the one its verdict read."""
    held_out: tuple[E.Job, ...] = ()
    """Pending jobs ``all_clusters.hold`` kept from the engine (waiting or rejected on a quota
    across all clusters): a floating one it rejects is refused with its fingerprint."""

    @classmethod
    def empty(cls) -> CycleInputs:
        """The inputs of a cycle with nothing pending (no decision to take)."""
        return cls(E.ClusterSnapshot(nodes=()), QueueTree(tenants=()), [], [], {}, {}, {}, {})


def cycle_inputs(cluster: Cluster) -> CycleInputs:
    enodes, nodes, gpus, gpu_by_id, access = _cluster_part(cluster)
    jobs: dict[str, JobRow] = {}
    eallocs, checkpointable, estimates = _running_part(cluster, nodes, gpu_by_id, access, jobs)
    snapshot = E.ClusterSnapshot(nodes=enodes, allocations=tuple(eallocs))
    running = running_jobs(
        snapshot, checkpointable=[k for k, c in checkpointable.items() if c],
        runtime_estimates=estimates)
    pending, groups = _pending_part(cluster, access, jobs)
    return CycleInputs(snapshot, queue_tree(cluster), pending, running, jobs, nodes, gpus, groups,
                       access, cluster)


def job_models(ids: list[int]) -> dict[int, Job]:
    """The jobs of ``ids`` as models (tenant and project attached), for the jobs a cycle
    admits, preempts or rejects: audit events and namespaces need them. A burst's cycle admits
    thousands of jobs of a few hundred projects: each tenant and project is read and built once,
    not joined to every job (a third of this read's time at 8,000 jobs, issue 35)."""
    jobs = list(Job.objects.filter(pk__in=ids))
    projects = Project.objects.in_bulk({job.project_id for job in jobs})
    tenants = Tenant.objects.in_bulk({job.tenant_id for job in jobs}
                                     | {p.tenant_id for p in projects.values()})
    for project in projects.values():
        owner = tenants.get(project.tenant_id)
        if owner is not None:
            project.tenant = owner  # str(job) names the tenant: no query per audit event
    out = {}
    for job in jobs:
        tenant, proj = tenants.get(job.tenant_id), projects.get(job.project_id)
        if tenant is None or proj is None:
            continue  # deleted with its tenant or project since: as a job gone (a conflict)
        job.tenant, job.project = tenant, proj
        out[job.pk] = job
    return out


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
    # ``preempted_by`` is shown by id (never a second Job row per row); the clusters' bulky
    # columns are not read (``without_cluster_bulk``).
    return without_cluster_bulk(restrict(Job.objects.all(), user).select_related(
        "tenant", "project__tenant", "owner", "cluster"), "cluster").order_by("-submitted_at", "-id")


def with_latest_decisions(jobs: list[Job]) -> list[Job]:
    """Give each of ``jobs`` its newest decision as ``latest_decisions`` (``[d]``, or ``[]``
    with none), for a page in one statement: the decisions whose id is the largest of their
    job's (``decision_job_latest`` serves both). Django's sliced prefetch (``Prefetch(...,
    queryset=…[:1])``) gave the same rows through a window function and cost a jobs page
    2.15 ms of CPU against 1.31 ms for this (``bench/hot_statements.py``; issue 35,
    docs/BENCHMARKS.md §15)."""
    if not jobs:
        return jobs
    newest = SchedulingDecision.objects.filter(job_id__in=[j.pk for j in jobs]).values("job_id").annotate(
        newest=Max("id")).values("newest")
    latest = {d.job_id: d for d in SchedulingDecision.objects.filter(id__in=newest)}
    for job in jobs:
        job.latest_decisions = [latest[job.pk]] if job.pk in latest else []  # type: ignore[attr-defined]
    return jobs


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


# --- Quotas across all clusters (issue 16) --------------------------------------------------


@dataclass(frozen=True)
class AllClusterLimits:
    """The tenant and project quotas that carry a quota across all clusters: the GPU limit
    (project id → limit, tenant id → limit) and the GPU memory limits per GPU model class
    (``*_memory``), and every tenant concerned."""

    project: dict[int, float]
    tenant: dict[int, float]

    @property
    def tenant_ids(self) -> list[int]:
        return sorted(set(self.tenant) | set(self.tenant_memory) | set(self.tenant_guarantee)
                      | set(self._project_tenants.values()))

    _project_tenants: dict[int, int]
    """Project id → its tenant id."""
    project_memory: dict[int, dict[str, int]] = field(default_factory=dict)
    """Project id → {GPU model class: MiB at most on all clusters}."""
    tenant_memory: dict[int, dict[str, int]] = field(default_factory=dict)
    project_guarantee: dict[int, float] = field(default_factory=dict)
    """Project id → GPUs guaranteed on all clusters together (> 0 only)."""
    tenant_guarantee: dict[int, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.project or self.tenant or self.project_memory or self.tenant_memory
                    or self.project_guarantee or self.tenant_guarantee)


def all_cluster_limits(tenant_ids: Collection[int] | None = None) -> AllClusterLimits:
    """One query; only the quotas that set a limit or a guarantee across all clusters (a
    guarantee of 0 guarantees nothing, as per cluster: it restricts nothing)."""
    rows = Quota.objects.filter(scope__in=[QuotaScope.TENANT, QuotaScope.PROJECT]).filter(
        Q(gpus_limit_all_clusters__isnull=False) | ~Q(gpu_memory_mib_limits_all_clusters={})
        | Q(gpus_guaranteed_all_clusters__gt=0))
    if tenant_ids is not None:
        rows = rows.filter(tenant_id__in=list(tenant_ids))
    out = AllClusterLimits({}, {}, {})
    for scope, tid, pid, lim, mem, g in rows.values_list(
            "scope", "tenant_id", "project_id", "gpus_limit_all_clusters",
            "gpu_memory_mib_limits_all_clusters", "gpus_guaranteed_all_clusters"):
        key = pid if scope == QuotaScope.PROJECT else tid
        limits, memory, guarantees = (
            (out.project, out.project_memory, out.project_guarantee) if scope == QuotaScope.PROJECT
            else (out.tenant, out.tenant_memory, out.tenant_guarantee))
        if scope == QuotaScope.PROJECT:
            out._project_tenants[pid] = tid
        if lim is not None:
            limits[key] = float(lim)
        if g:
            guarantees[key] = float(g)
        if mem:
            memory[key] = {str(k): int(v) for k, v in mem.items()}
    return out


@dataclass
class AllClusterUse:
    """What tenants' jobs hold on every cluster, from grouped reads of ``GpuSlice``: GPUs
    (the one GPU unit, ``engine.accounting``) per project and per tenant, on all clusters together and
    per cluster (all jobs, and non-preemptible jobs: the guarantee's split,
    ``guarantee_parts``), and GPU memory (MiB) per GPU model class."""

    gpus: dict[tuple[str, int], float] = field(default_factory=lambda: defaultdict(float))
    """("project"|"tenant", id) → GPUs held on all clusters."""
    memory: dict[tuple[str, int, str], int] = field(default_factory=lambda: defaultdict(int))
    """("project"|"tenant", id, GPU model class) → MiB held on all clusters."""
    by_cluster: dict[tuple[str, int, int], float] = field(default_factory=lambda: defaultdict(float))
    """("project"|"tenant", id, cluster id) → GPUs held there."""
    np_by_cluster: dict[tuple[str, int, int], float] = field(default_factory=lambda: defaultdict(float))
    """("project"|"tenant", id, cluster id) → GPUs held there by non-preemptible jobs."""

    def total(self, level: str, key: int) -> float:
        return self.gpus.get((level, key), 0.0)

    def guarantee_used(self, level: str, key: int, base: float, total: float,
                       asks: Mapping[tuple[str, int, int], float] | None = None) -> float:
        """GPUs of an owner's guarantee across all clusters (``total``) in use, as the split
        claims them (``engine.guarantees.claim_held``): on each cluster, what it holds beyond
        its per-cluster guarantee (``base``), the asks of its preemptors waiting there for their
        victims counted as held (``asks``: ``preemptor_asks`` or ``GuaranteeBook.preempting``),
        summed, at most ``total``."""
        asks = asks or {}
        held: dict[int, float] = defaultdict(float)
        for source in (self.by_cluster, asks):
            for (lv, k, c), v in source.items():
                if lv == level and k == key:
                    held[c] += v
        return min(max(0.0, total), sum(max(0.0, v - base) for v in held.values()))

    def as_in_use(self) -> tuple[dict[int, float], dict[int, float]]:
        """The GPUs held on all clusters together, (per project, per tenant)."""
        per: tuple[dict[int, float], dict[int, float]] = (defaultdict(float), defaultdict(float))
        for (lv, k), v in self.gpus.items():
            per[0 if lv == "project" else 1][k] += v
        return per

    def add(self, project_id: int, tenant_id: int, gpus: float, memory: dict[str, int],
            cluster_id: int = 0, nonpreemptible: bool = False) -> None:
        """Count an admission made meanwhile (this cycle's, under the per-tenant lock)."""
        for lv, k in (("project", project_id), ("tenant", tenant_id)):
            self.gpus[(lv, k)] += gpus
            self.by_cluster[(lv, k, cluster_id)] += gpus
            if nonpreemptible:
                self.np_by_cluster[(lv, k, cluster_id)] += gpus
            for cls, mib in memory.items():
                self.memory[(lv, k, cls)] += mib


def all_cluster_use(tenant_ids: Collection[int]) -> AllClusterUse:
    """Per project, cluster, preemptibility and GPU model, GPUs (the one GPU unit,
    ``scheduling.accounting.held``) and MiB held: one grouped read."""
    from .accounting import held
    from .engine.placement import model_family

    use = AllClusterUse()
    if not tenant_ids:
        return use
    cols = ("allocation__job__project_id", "allocation__job__tenant_id", "gpu__model",
            "allocation__cluster_id", "allocation__job__preemptible")
    slices = GpuSlice.objects.filter(allocation__job__tenant_id__in=list(tenant_ids))
    for (pid, tid, model, cid, preemptible), (n, mib) in held(slices, *cols).items():
        use.add(pid, tid, n, {model_family(model): mib}, cid, not preemptible)
    return use


def preemptor_asks(tenant_ids: Collection[int]) -> dict[tuple[str, int, int], float]:
    """One grouped read: ("project"|"tenant", id, cluster id) → GPUs the tenants' queued
    preemptors (waiting for their victims) ask there (``guarantee_book``'s ``preempting``,
    without its per-job detail; ``scheduling.accounting.asked_gpus``), for the pages that show
    what is left of a guarantee."""
    from .accounting import asked_gpus

    out: dict[tuple[str, int, int], float] = defaultdict(float)
    if not tenant_ids:
        return out
    for (pid, tid, cid), n in asked_gpus(
            PodGroup.objects.filter(job__tenant_id__in=list(tenant_ids), job__state=JobState.QUEUED,
                                    job__reason_kind="preempting", job__cluster__isnull=False),
            "job__project_id", "job__tenant_id", "job__cluster_id").items():
        for lv, k in (("project", pid), ("tenant", tid)):
            out[(lv, k, cid)] += n
    return out


OUTSIDE_POOLS = "The free room is in pool(s) dedicated to other tenants"
"""How a job waiting on dedicated pools' room starts its reason (``cycle._outside_pools``)."""


@dataclass
class GuaranteeBook:
    """What the split of the GPU guarantees across all clusters reads beside the usage
    (``guarantee_book``): the clusters in their fixed order (enabled and reachable first, then
    unreachable, then disabled; by name), the per-cluster GPU
    guarantees of the tenants concerned and of their projects, the asks of their preemptors
    waiting for victims, the clusters of each owner's head jobs and the per-cluster GPU limits."""

    clusters: list[int]
    cluster_names: dict[int, str]
    tenant_base: dict[int, float]
    project_base: dict[int, float]
    projects_of: dict[int, list[int]]
    preempting: dict[tuple[str, int, int], float]
    """("project"|"tenant", id, cluster id) → GPUs its waiting preemptors ask there."""
    heads: dict[tuple[str, int], list[int]]
    """("project"|"tenant", id) → the clusters of its queued jobs that could run (enabled,
    reachable clusters; not waiting on a quota or dedicated pools), the cluster
    of its best such job (priority, submission) first."""
    names: dict[tuple[str, int], str] = field(default_factory=dict)
    """("project"|"tenant", id) → its queue name in the engine's tree."""
    limit: dict[tuple[str, int], float] = field(default_factory=dict)
    """("project"|"tenant", id) → its per-cluster GPU limit (when it has one)."""
    np_preempting: dict[int, tuple[int, int, int, float]] = field(default_factory=dict)
    """Job id → (project id, tenant id, cluster id, GPUs asked) of each non-preemptible
    preemptor waiting for its victims (the guarantee re-check counts its ask as held)."""
    reclaiming: dict[int, tuple[int, int, int, float]] = field(default_factory=dict)
    """As ``np_preempting``, for preemptible preemptors that reclaim (evict jobs of equal or
    higher priority, which only a guarantee allows) or whose victims are gone: the
    non-preemptible re-check counts their asks too (their evictions rely on the guarantee)."""
    asks: dict[int, tuple[int, int, int, float]] = field(default_factory=dict)
    """Job id → (project id, tenant id, cluster id, GPUs asked) of every preemptor in
    ``preempting`` (so that one admitted is taken off: ``admitted``)."""
    evicting: dict[tuple[str, int, int], float] = field(default_factory=dict)
    """As ``preempting``, only the preemptors whose victims are still being evicted: the ones
    the cycle leaves out of its queue (``cycle_inputs``' ``waiting_for_victims``). A preemptor
    whose victims are gone is back in the queue and judged against the whole part. At the
    tenant's level, only those relying on a guarantee (non-preemptible, or reclaiming)."""

    def add_ask(self, pk: int, pid: int, tid: int, cid: int, n: float, *, nonpreemptible: bool,
                evicting: bool = True, reclaim: bool = True) -> None:
        """Count preemptor ``pk``'s ask on cluster ``cid`` (``reclaim``: a preemptible one
        relying on a guarantee)."""
        self.asks[pk] = (pid, tid, cid, n)
        for lv, k in (("project", pid), ("tenant", tid)):
            self.preempting[(lv, k, cid)] = self.preempting.get((lv, k, cid), 0.0) + n
            # At the tenant's level, a preemption by priority alone (a project's job evicting
            # lower-priority work; no guarantee relied on) claimed none of the tenant's part.
            if evicting and (lv == "project" or nonpreemptible or reclaim):
                self.evicting[(lv, k, cid)] = self.evicting.get((lv, k, cid), 0.0) + n
        if nonpreemptible:
            self.np_preempting[pk] = (pid, tid, cid, n)
        elif reclaim:
            self.reclaiming[pk] = (pid, tid, cid, n)

    def admitted(self, pk: int) -> None:
        """Job ``pk`` admitted: its ask, if it was a preemptor's, is now held (counted in the
        usage), no longer asked."""
        ask = self.asks.pop(pk, None)
        self.np_preempting.pop(pk, None)
        self.reclaiming.pop(pk, None)
        if ask is None:
            return
        pid, tid, cid, n = ask
        for lv, k in (("project", pid), ("tenant", tid)):
            self.preempting[(lv, k, cid)] = self.preempting.get((lv, k, cid), 0.0) - n

    def np_asks(self, level: str, key: int, cluster_id: int, but: int | None = None) -> float:
        """GPUs the owner's waiting non-preemptible preemptors ask on a cluster (less job ``but``)."""
        i = 0 if level == "project" else 1
        return sum(v[3] for pk, v in self.np_preempting.items()
                   if v[i] == key and v[2] == cluster_id and pk != but)

    def relied_asks(self, level: str, key: int, cluster_id: int, but: int | None = None) -> float:
        """GPUs the owner's waiting preemptors that rely on a guarantee ask on a cluster: the
        non-preemptible ones and the reclaiming ones (less job ``but``)."""
        i = 0 if level == "project" else 1
        return self.np_asks(level, key, cluster_id, but) + sum(
            v[3] for pk, v in self.reclaiming.items() if v[i] == key and v[2] == cluster_id and pk != but)


def guarantee_book(limits: AllClusterLimits, names: bool = False) -> GuaranteeBook | None:
    """None (no query) when no quota has a guarantee across all clusters; else a few small
    queries over the tenants concerned. ``names``: the queue names too (the cycle's tree)."""
    if not (limits.project_guarantee or limits.tenant_guarantee):
        return None
    from django.db.models import Exists, OuterRef

    from .accounting import asked_gpus

    tids = sorted(set(limits.tenant_guarantee) | {limits._project_tenants[p]
                                                  for p in limits.project_guarantee})
    crows = list(Cluster.objects.values_list("pk", "name", "enabled", "unreachable_since", "last_cycle_at"))
    cluster_names = {pk: name for pk, name, *_ in crows}
    last_cycle = {pk: at for pk, *_, at in crows}
    # The fixed order: enabled, reachable clusters first, then unreachable ones, then disabled
    # ones (so the remainder lands on a cluster whose cycle runs when nothing of the owner
    # waits), each group by name.
    order = [r[0] for r in sorted(crows, key=lambda r: (not r[2], r[3] is not None, r[1], r[0]))]
    book = GuaranteeBook(order, cluster_names, {}, {}, defaultdict(list), defaultdict(float), {})
    for scope, tid, pid, g, lim in Quota.objects.filter(
            scope__in=[QuotaScope.TENANT, QuotaScope.PROJECT], tenant_id__in=tids).values_list(
            "scope", "tenant_id", "project_id", "gpus_guaranteed", "gpus_limit"):
        if scope == QuotaScope.PROJECT:
            book.project_base[pid] = float(g)
        else:
            book.tenant_base[tid] = float(g)
        if lim is not None:
            book.limit[("project", pid) if scope == QuotaScope.PROJECT else ("tenant", tid)] = float(lim)
    for pid, tid in Project.objects.filter(tenant_id__in=tids).order_by("pk").values_list("pk", "tenant_id"):
        book.projects_of[tid].append(pid)
    victims = Job.objects.filter(preempted_by=OuterRef("pk"), state=JobState.PREEMPTING)
    preemptors = Job.objects.filter(tenant_id__in=tids, state=JobState.QUEUED, reason_kind="preempting",
                                    cluster__isnull=False)
    prows = list(preemptors.annotate(waits=Exists(victims),
                                    reclaims=Exists(victims.filter(priority__gte=OuterRef("priority"))))
                .order_by().values_list("pk", "project_id", "tenant_id", "cluster_id", "preemptible",
                                        "waits", "reclaims"))
    asked = asked_gpus(PodGroup.objects.filter(job__in=[r[0] for r in prows]), "job_id") if prows else {}
    for pk, pid, tid, cid, preemptible, waits, reclaims in prows:
        # Victims gone: whether it reclaimed is no longer known; counted as if (the safe side).
        book.add_ask(pk, pid, tid, cid, asked.get(pk, 0.0), nonpreemptible=not preemptible,
                     evicting=bool(waits), reclaim=bool(reclaims) or not waits)
    # The heads: a job waiting on a quota (a per-cluster or all-cluster limit, a memory limit)
    # or on dedicated pools, or queued on an unreachable cluster, may wait long: the remainder
    # of a guarantee is not parked there. One waiting on the guarantee itself (kind
    # ``guarantee``: its cluster's part too small) is not skipped: the part must come to it.
    queued = (Job.objects.filter(tenant_id__in=tids, state=JobState.QUEUED, cluster__enabled=True,
                                 cluster__unreachable_since__isnull=True)
              .exclude(reason_kind="quota")
              .exclude(reason__startswith=OUTSIDE_POOLS))
    for lv, col in (("project", "project_id"), ("tenant", "tenant_id")):
        best: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
        cols = (col, "cluster_id", "priority", "submitted_at", "pk", "reason_kind")
        if connection.vendor == "postgresql":  # the best job per owner and cluster
            rows = queued.order_by(col, "cluster_id", "-priority", "submitted_at", "pk").distinct(
                col, "cluster_id").values_list(*cols)
        else:  # the demo's SQLite has no DISTINCT ON: every row
            rows = queued.values_list(*cols)
        for key, cid, prio, at, pk, kind in rows:
            # A head that waited "capacity" in its cluster's last cycle found nothing it could
            # start or reclaim there (with the part, if it had it): heads that did not go
            # first, then the capacity ones in turn, the cluster whose cycle ran longest ago
            # first (so the remainder passes on from a head that cannot use it, to one that
            # may reclaim elsewhere, rather than staying pinned to the best by priority).
            last = last_cycle.get(cid)
            turn = (1, last.timestamp() if last is not None else 0.0) if kind == "capacity" else (0, 0.0)
            best[key].append((turn, -prio, at, pk, cid))
        for key, jobs in best.items():
            book.heads[(lv, key)] = list(dict.fromkeys(cid for *_, cid in sorted(jobs)))
    if names:
        for tid, tname in Tenant.objects.filter(pk__in=tids).values_list("pk", "name"):
            book.names[("tenant", tid)] = tname
        for pid, tname, pname in Project.objects.filter(tenant_id__in=tids).values_list(
                "pk", "tenant__name", "name"):
            book.names[("project", pid)] = queue_name(tname, pname)
    return book


def guarantee_parts(limits: AllClusterLimits, use: AllClusterUse, book: GuaranteeBook,
                    ) -> dict[tuple[str, int], dict[int, float]]:
    """Every guarantee across all clusters split into per-cluster parts that sum to it
    (``engine.guarantees.split_tenant``): ("project"|"tenant", id) → {cluster id: GPUs}."""
    from .engine.guarantees import Holding, Owner, split_tenant

    def owner(level: str, key: int, total: float, base: float) -> Owner[int]:
        holdings = {c: Holding(use.by_cluster.get((level, key, c), 0.0)
                               + book.preempting.get((level, key, c), 0.0),
                               use.np_by_cluster.get((level, key, c), 0.0)) for c in book.clusters}
        lim = book.limit.get((level, key))
        # A part above its per-cluster limit (less its per-cluster guarantee) is never held.
        room = None if lim is None else {c: max(0.0, lim - base) for c in book.clusters}
        return Owner(total, base, holdings, heads=book.heads.get((level, key), ()), limit=room)

    out: dict[tuple[str, int], dict[int, float]] = {}
    for tid in sorted(set(limits.tenant_guarantee) | {limits._project_tenants[p]
                                                      for p in limits.project_guarantee}):
        tbase = book.tenant_base.get(tid, 0.0)
        t = (owner("tenant", tid, limits.tenant_guarantee[tid], tbase)
             if tid in limits.tenant_guarantee else None)
        pids = book.projects_of.get(tid, [])
        projects = {p: owner("project", p, limits.project_guarantee[p], book.project_base.get(p, 0.0))
                    for p in pids if p in limits.project_guarantee}
        tparts, pparts = split_tenant(book.clusters, t, tbase, projects,
                                      sum(book.project_base.get(p, 0.0) for p in pids))
        if tparts is not None:
            out[("tenant", tid)] = tparts
        for p, parts in pparts.items():
            out[("project", p)] = parts
    return out


def over_class_memory(limits: AllClusterLimits, use: AllClusterUse, project_id: int, tenant_id: int,
                      memory: dict[str, int]) -> str:
    """Why holding ``memory`` more MiB per GPU model class would cross the project's or the
    tenant's GPU memory limit for that class across all clusters ("" when within)."""
    for level, key, lims, who in (("project", project_id, limits.project_memory, "project's"),
                                  ("tenant", tenant_id, limits.tenant_memory, "tenant's")):
        for cls, mib in sorted(memory.items()):
            lim = lims.get(key, {}).get(cls)
            used = use.memory.get((level, key, cls), 0)
            if lim is not None and mib > 0 and used + mib > lim:
                return (f"over your {who} {cls} GPU memory limit across all clusters: "
                        f"{_gib(used)} of {_gib(lim)} in use (it asks {_gib(mib)})")
    return ""


def _gib(mib: int) -> str:
    return f"{mib / 1024:g} GiB"


def over_all_clusters(limits: AllClusterLimits, in_use: tuple[dict[int, float], dict[int, float]],
                      project_id: int, tenant_id: int, ask: float) -> str:
    """Why ``ask`` more GPUs would break the project's or the tenant's limit across all
    clusters ("" when within)."""
    for lim, used, who in ((limits.project.get(project_id), in_use[0].get(project_id, 0.0), "project's"),
                           (limits.tenant.get(tenant_id), in_use[1].get(tenant_id, 0.0), "tenant's")):
        if lim is not None and used + ask > lim + 1e-9:
            return (f"over your {who} GPU limit across all clusters: {used:g} of {lim:g} in use"
                    f" (it asks {ask:g})")
    return ""


@dataclass
class AllClusterRoom:
    """For the placement step's trials: the quotas across all clusters and what is held on all
    clusters, keyed by queue name (``tenant/project``) and tenant name."""

    limits: dict[str, float] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)
    memory_limits: dict[str, dict[str, int]] = field(default_factory=dict)
    memory_usage: dict[tuple[str, str], int] = field(default_factory=dict)
    guarantees: dict[str, tuple[float, float, dict[str, float]]] = field(default_factory=dict)
    """Queue or tenant name → (GPU guarantee across all clusters, per-cluster guarantee, its
    parts now by cluster name: ``guarantee_parts``, what each cluster's cycle uses)."""
    np_usage: dict[tuple[str, str], float] = field(default_factory=dict)
    """(queue or tenant name, cluster name) → GPUs its non-preemptible jobs hold there."""


def all_cluster_room_by_name() -> AllClusterRoom:
    """The placement step's view of the quotas across all clusters: empty when no quota has
    one (one query then), else one more aggregate (``all_cluster_use``) and the names."""
    limits = all_cluster_limits()
    room = AllClusterRoom()
    if not limits:
        return room
    use = all_cluster_use(limits.tenant_ids)
    per_project, per_tenant = use.as_in_use()
    tenants = dict(Tenant.objects.filter(pk__in=limits.tenant_ids).values_list("pk", "name"))
    projects = {pk: queue_name(t, n) for pk, t, n in Project.objects.filter(
        tenant_id__in=limits.tenant_ids).values_list("pk", "tenant__name", "name")}
    for level, names, held, lims, memory in (
            ("project", projects, per_project, limits.project, limits.project_memory),
            ("tenant", tenants, per_tenant, limits.tenant, limits.tenant_memory)):
        for key, v in lims.items():
            room.limits[names[key]], room.usage[names[key]] = v, held.get(key, 0.0)
        for key, classes in memory.items():
            room.memory_limits[names[key]] = classes
            for cls in classes:
                room.memory_usage[(names[key], cls)] = use.memory.get((level, key, cls), 0)
    book = guarantee_book(limits)
    if book is not None:
        for (level, key), parts in guarantee_parts(limits, use, book).items():
            name = (projects if level == "project" else tenants)[key]
            total = (limits.project_guarantee if level == "project" else limits.tenant_guarantee)[key]
            base = (book.project_base if level == "project" else book.tenant_base).get(key, 0.0)
            room.guarantees[name] = (total, base, {book.cluster_names[c]: v for c, v in parts.items()})
            for c in book.clusters:
                room.np_usage[(name, book.cluster_names[c])] = use.np_by_cluster.get((level, key, c), 0.0)
    return room


def gpu_model_classes() -> set[str]:
    """The GPU model classes the inventory knows (``model_family`` of every card's model)."""
    from .engine.placement import model_family

    return {model_family(m) for m in GpuDevice.objects.values_list("model", flat=True).distinct()}


def all_cluster_held(tenant_id: int, project_id: int | None) -> dict[str, Any]:
    """What a tenant (or one of its projects) holds on all clusters together: GPUs and GPU
    memory (MiB) per GPU model class (one aggregate); and, when it has a GPU guarantee across
    all clusters, how that guarantee is split between the clusters now (``split``: cluster
    name → GPUs, the parts the clusters' cycles use; a few more small queries) and what is left
    of it (``guarantee_left``: (GPUs left, guarantee), ``AllClusterUse.guarantee_used``)."""
    use = all_cluster_use([tenant_id])
    level, key = ("project", project_id) if project_id is not None else ("tenant", tenant_id)
    memory = {cls: mib for (lv, k, cls), mib in use.memory.items() if lv == level and k == key and mib}
    out: dict[str, Any] = {"gpus": round(use.total(level, key), 2), "memory": memory, "split": {}}
    limits = all_cluster_limits([tenant_id])
    if key in (limits.project_guarantee if level == "project" else limits.tenant_guarantee):
        book = guarantee_book(limits)
        if book is not None:
            parts = guarantee_parts(limits, use, book).get((level, key), {})
            out["split"] = {book.cluster_names[c]: round(parts.get(c, 0.0), 2) for c in book.clusters}
            total = (limits.project_guarantee if level == "project" else limits.tenant_guarantee)[key]
            base = (book.project_base if level == "project" else book.tenant_base).get(key, 0.0)
            used = use.guarantee_used(level, key, base, total, book.preempting)
            out["guarantee_left"] = (round(max(0.0, total - used), 2), total)
    return out


def reason_as_of(job: Job) -> tuple[Any, bool]:
    """(When the job's waiting reason was computed, whether it is stale). A queued job's reason
    is recomputed by each cycle of its cluster: as of its cluster's last cycle; stale when that
    cycle is older than ``SCHEDULER_REASON_STALE_SECONDS`` or the cluster takes no new work (its
    cycle does not run). A job with no cluster yet: as of its last change."""
    from django.utils import timezone

    if job.state != "queued":
        return None, False
    cluster = job.cluster if job.cluster_id else None
    at = cluster.last_cycle_at if cluster is not None else job.updated_at
    limit = getattr(settings, "SCHEDULER_REASON_STALE_SECONDS", 300)
    stale = at is None or (timezone.now() - at).total_seconds() > limit or (
        cluster is not None and (not cluster.enabled or cluster.unreachable_since is not None))
    return at, stale
