"""Writes for scheduling: clusters, inventory, jobs, cycles, dispatch and reconcile.

HackSoft style (DESIGN.md §5): ``<entity>_<action>``, keyword-only, explicit ``actor=``
for user actions (the scheduler itself acts as the system), access through
``tenants.permissions``, every change that matters audited in its own transaction.

Allocation invariant: ``Allocation``/``GpuSlice`` rows exist exactly while resources
are held, and each ``GpuDevice`` carries running totals of its slices, guarded by
CHECK constraints. Admission adds rows and totals in one savepoint, release removes
them in one transaction, so a slice can never be given twice, even by racing workers.
Resources are released only once the backend reports the pods gone, so a preemptor
starts only after its victims have actually left the GPUs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import gc
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, ProtectedError, Q
from django.db.models.fields.reverse_related import ForeignObjectRel
from django.utils import timezone

from scheduling import engine as E
from scheduling.engine.cycle import CycleConfig, CycleResult, JobStatus, run_cycle
from tenants import permissions
from tenants.audit import audit_batch, audit_record, snapshot
from tenants.models import Project, Quota, QuotaScope, User

from . import selectors, signals
from .backends import backend_for
from .backends.base import (
    LABEL_JOB,
    LABEL_JOB_ID,
    LABEL_PROJECT,
    LABEL_PROJECT_ID,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_TENANT,
    MANAGED_BY,
    BackendError,
    JobObjects,
    NamespaceSpec,
    NodeInfo,
    PodSpec,
    PodStatus,
    SliceSpec,
)
from .backends.credentials import decrypt_credentials, encrypt_credentials, kubeconfig_problems
from .backends.naming import job_object_name, namespace_name, pod_name
from .backends.simulated import InventoryError, parse_inventory
from .extensions import apply_job_spec_hooks
from .models import (
    ACTIVE_STATES,
    FINAL_STATES,
    NON_PREEMPTIBLE_CLASSES,
    PRIORITY_VALUES,
    Allocation,
    Backend,
    Cluster,
    DecisionKind,
    GpuDevice,
    GpuSlice,
    Job,
    JobState,
    Node,
    NodePool,
    PodGroup,
    PodPhase,
    PriorityClass,
    ProjectNamespace,
    SchedulingDecision,
)

logger = logging.getLogger(__name__)

SCHEDULER = "scheduler"  # actor_username of the scheduler's own audit events
CLUSTER_FIELDS = ("name", "display_name", "enabled", "backend", "api_server", "prometheus_url",
                  "namespace_prefix", "placement_policy")
JOB_FIELDS = ("name", "kind", "priority_class", "priority", "preemptible", "checkpoint_capable",
              "gang", "mixed_gpu_models", "duration_seconds", "state", "reason")
GROUP_FIELDS = ("name", "replicas", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive",
                "gpu_models", "cpu_millicores", "ram_mib", "image", "command", "env")
MAX_ATTEMPTS = 5
# Row locks here are ``select_for_update(no_key=True)``: FOR NO KEY UPDATE on PostgreSQL
# (ignored where row locks are not supported), and on a job of the job row only
# (``_locked_job``). Every update here leaves keys alone, and a plain FOR UPDATE would
# also block the foreign-key checks (FOR KEY SHARE) of other transactions
# inserting rows that point at the locked one (a decision or an audit event naming the job,
# its tenant, its project). Those checks run at COMMIT (deferred constraints), after the
# audit chain lock is taken: a cycle committing its decisions waited for a cancel's job lock
# while the cancel waited for the chain lock — a deadlock (seen in the apiserver fault test).


def _locked_job(pk: int) -> Job:
    """The job, its row locked (FOR NO KEY UPDATE of the job row alone) until the
    transaction ends, with its tenant and project read (not locked)."""
    return Job.objects.select_for_update(no_key=True, of=("self",)).select_related(
        "tenant", "project").get(pk=pk)


_CYCLE_LOCK_CLASS = 0x43414D50  # "CAMP": first key of the two-int advisory lock
_DISPATCH_LOCK_CLASS = 0x43414D44  # "CAMD": a job's dispatch in flight (key 2: job id)


def _require(actor: Any, action: str, obj: Any) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _record_all(decisions: list[SchedulingDecision]) -> None:
    """Insert history rows in bulk and tell observers (live pages) which jobs changed."""
    if not decisions:
        return
    if connection.vendor == "postgresql":
        _insert_decisions(decisions)
    else:
        SchedulingDecision.objects.bulk_create(decisions, batch_size=2000)
    signals.decisions_recorded.send_robust(sender=SchedulingDecision,
                                           job_ids=[d.job_id for d in decisions])


_DECISION_COLUMNS = (("job_id", "bigint"), ("cluster_id", "bigint"), ("kind", "varchar"),
                     ("reason", "varchar"), ("queue_position", "integer"), ("placement", "jsonb"),
                     ("victims", "jsonb"), ("preemptor_id", "bigint"), ("created_at", "timestamptz"))


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _insert_decisions(decisions: list[SchedulingDecision]) -> None:
    """``INSERT … SELECT … FROM jsonb_to_recordset(%s)``: the rows travel as one JSON
    parameter. Hand-written because ``bulk_create`` compiles and quotes every value in
    Python (about 1 s for the 18,000 "waiting" rows of a sweep's first cycle, issue 13);
    ``json.dumps`` is C. Same columns and values as ``bulk_create``, one ``created_at``."""
    now = timezone.now()
    rows = [{"job_id": d.job_id, "cluster_id": d.cluster_id, "kind": d.kind, "reason": d.reason,
             "queue_position": d.queue_position, "placement": d.placement,
             "victims": d.victims if d.victims is not None else [],
             "preemptor_id": d.preemptor_id, "created_at": d.created_at or now} for d in decisions]
    qn = connection.ops.quote_name
    names = ", ".join(qn(c) for c, _ in _DECISION_COLUMNS)
    types = ", ".join(f"{qn(c)} {t}" for c, t in _DECISION_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(SchedulingDecision._meta.db_table)} ({names}) "  # noqa: S608
            f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS v({types})",
            [json.dumps(rows, default=_json_value)])


def _record(job: Job, kind: str, reason: str = "", **extra: Any) -> SchedulingDecision:
    return SchedulingDecision.objects.create(
        job=job, cluster_id=job.cluster_id, kind=kind, reason=reason[:500], **extra
    )


def _audit_job(action: str, job: Job, *, actor: User | None = None, **extra: Any) -> None:
    audit_record(
        actor=actor, actor_username=None if actor is not None else SCHEDULER, action=action,
        target=job, tenant=job.tenant, project=job.project, **extra,
    )


# --- cycle requests ------------------------------------------------------------------------


def request_cycle(cluster_id: int, *, countdown: float | None = None) -> None:
    """Ask for one scheduling cycle of a cluster after the current transaction commits.

    Requests coalesce: while one cycle is queued and not yet started, more requests add
    nothing (the queued one will see every job committed before it starts). The marker
    lives two beat ticks at most, so a request lost with its message (a broker restart)
    holds back no later one for longer. A broker or cache that is down never fails the
    caller's committed work: the beat's ``scheduler_tick`` asks again from the database."""
    from .tasks import cluster_cycle

    try:
        if not cache.add(f"camp:cycle-queued:{cluster_id}", 1,
                         timeout=max(5, 2 * settings.SCHEDULER_TICK_SECONDS)):
            return
    except Exception:  # redis-py's ConnectionError and kin: the cache is down
        logger.warning("cycle request for cluster %s not queued (cache unavailable)", cluster_id)
        return
    _send_after_commit(cluster_cycle, cluster_id, countdown=countdown)


def _send_after_commit(task: Any, *args: Any, countdown: float | None = None) -> None:
    """Queue ``task`` once the transaction commits; a broker that is down is logged, not
    raised (robust on_commit): the row is the truth and the periodic tick re-requests it."""
    kwargs = {"countdown": countdown} if countdown else {}
    transaction.on_commit(lambda: task.apply_async(args, **kwargs), robust=True)


def cycle_request_taken(cluster_id: int) -> None:
    cache.delete(f"camp:cycle-queued:{cluster_id}")


RECONCILE_REQUEST_SECONDS = 60
"""A queued reconcile lost with a killed worker is asked for again after this long."""


def reconcile_request(cluster_id: int) -> bool:
    """Whether a reconcile of the cluster may be queued now: not while one is queued or
    running (the key is dropped when it ends, or expires)."""
    return bool(cache.add(f"camp:reconcile-queued:{cluster_id}", 1, timeout=RECONCILE_REQUEST_SECONDS))


def reconcile_request_taken(cluster_id: int) -> None:
    cache.delete(f"camp:reconcile-queued:{cluster_id}")


# --- clusters ------------------------------------------------------------------------------


def _validate_cluster(cluster: Cluster) -> None:
    if cluster.backend == Backend.SIMULATED:
        try:
            nodes, _ = parse_inventory(cluster.inventory)
        except InventoryError as exc:
            raise ValidationError({"inventory": [str(exc)]}) from exc
        if cluster.enabled and not nodes:
            raise ValidationError({"inventory": ["A simulated cluster needs at least one node."]})
    cluster.full_clean(exclude=["credentials_encrypted"])


def _validate_credentials(credentials: dict[str, str]) -> None:
    if credentials.get("kubeconfig"):
        problems = kubeconfig_problems(credentials["kubeconfig"])
        if problems:
            raise ValidationError({"kubeconfig": problems})


def _merged_credentials(cluster: Cluster, given: dict[str, str]) -> str:
    """The stored credentials with ``given`` keys replaced (an empty value clears its key;
    keys not given are kept: a new token keeps the CA certificate and the kubeconfig)."""
    try:
        current = decrypt_credentials(cluster.credentials_encrypted)
    except ValueError:
        current = {}  # unreadable with the configured key: what is given replaces them
    return encrypt_credentials({**current, **given})


def _cluster_snapshot(cluster: Cluster) -> dict[str, Any]:
    data = snapshot(cluster, CLUSTER_FIELDS)
    data["has_credentials"] = cluster.has_credentials  # never the credentials themselves
    return data


def _verify_cluster(cluster: Cluster) -> None:
    """A Kubernetes cluster must answer, accept the credentials and allow what Camp does
    (``kubernetes.access_problems``); else a 400 naming the field, in words."""
    if cluster.backend != Backend.KUBERNETES or not cluster.enabled:
        return
    from .backends.kubernetes import access_problems

    problems = access_problems(cluster)
    if problems:
        raise ValidationError({k: [v] for k, v in problems.items()})


@transaction.atomic
def cluster_create(*, actor: User, name: str, credentials: dict[str, str] | None = None,
                   verify: bool = True, **fields: Any) -> Cluster:
    """Register a cluster. A Kubernetes one is checked first (reachable, credentials valid,
    Camp's permissions granted). ``verify=False`` skips that check: only for tests of a
    cluster that is meant to be dead (no API or console path passes it)."""
    cluster = Cluster(name=name, **fields)
    _require(actor, permissions.CREATE, cluster)
    _validate_cluster(cluster)
    if credentials:
        _validate_credentials(credentials)
        cluster.credentials_encrypted = encrypt_credentials(credentials)
    if verify:
        _verify_cluster(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["A cluster with this name already exists."]}) from exc
    audit_record(actor=actor, action="cluster.created", target=cluster,
                 after=_cluster_snapshot(cluster))
    if cluster.enabled:
        _after_commit_inventory(cluster.pk)
    return cluster


@transaction.atomic
def cluster_update(*, actor: User, cluster: Cluster, credentials: dict[str, str] | None = None,
                   verify: bool = True, **changes: Any) -> Cluster:
    """Change a cluster; a change of how Camp reaches a Kubernetes cluster (server,
    credentials, backend, enabling it) is checked as at registration."""
    _require(actor, permissions.CHANGE, cluster)
    before = _cluster_snapshot(cluster)
    for key, value in changes.items():
        if key not in (*CLUSTER_FIELDS, "inventory"):
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(cluster, key, value)
    _validate_cluster(cluster)
    if credentials is not None:
        _validate_credentials(credentials)
        cluster.credentials_encrypted = _merged_credentials(cluster, credentials)
    reach = {"api_server", "backend", "enabled"}
    if verify and (credentials or any(before.get(k) != getattr(cluster, k) for k in reach)):
        _verify_cluster(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["A cluster with this name already exists."]}) from exc
    audit_record(actor=actor, action="cluster.updated", target=cluster, before=before,
                 after=_cluster_snapshot(cluster))
    if cluster.enabled:
        _after_commit_inventory(cluster.pk)
    return cluster


def _cluster_users(cluster: Cluster) -> list[str]:
    """What keeps ``cluster`` from being deleted, as "3 jobs", "1 dev environment": its
    unfinished jobs (finished ones go with it) and every row of another model that refers
    to it with ``on_delete=PROTECT`` (workloads, found by introspection so that scheduling
    does not import the apps built on it)."""
    active = Job.objects.filter(Q(cluster=cluster) & (
        ~Q(state__in=FINAL_STATES) | Q(allocations__isnull=False)))  # or its pods still stopping
    counts: list[tuple[Any, int]] = [(Job._meta, active.distinct().count())]
    for rel in Cluster._meta.get_fields(include_hidden=True):  # hidden: related_name="+"
        if not isinstance(rel, ForeignObjectRel) or getattr(rel, "on_delete", None) is not models.PROTECT:
            continue
        model = rel.related_model
        if model is Job or not isinstance(model, type):
            continue
        counts.append((model._meta, model._base_manager.filter(**{rel.field.name: cluster}).count()))
    return [f"{n} {meta.verbose_name if n == 1 else meta.verbose_name_plural}"
            for meta, n in counts if n]


@transaction.atomic
def cluster_delete(*, actor: User, cluster: Cluster) -> None:
    """Delete a cluster with its nodes and finished jobs; refused (naming what blocks it)
    while jobs or workloads still use it."""
    _require(actor, permissions.DELETE, cluster)
    blockers = _cluster_users(cluster)
    if blockers:
        listed = blockers[0] if len(blockers) == 1 else f"{', '.join(blockers[:-1])} and {blockers[-1]}"
        verb = "uses" if len(blockers) == 1 and blockers[0].startswith("1 ") else "use"
        raise ValidationError({"cluster": [
            f"{listed} still {verb} this cluster; stop and delete them first."]})
    audit_record(actor=actor, action="cluster.deleted", target=cluster,
                 before=_cluster_snapshot(cluster))
    try:
        with transaction.atomic():
            Job.objects.filter(cluster=cluster).delete()
            cluster.delete()
    except ProtectedError as exc:  # something started using it meanwhile
        raise ValidationError({"cluster": [
            "Jobs or workloads still use this cluster; stop and delete them first."]}) from exc


def _after_commit_inventory(cluster_id: int) -> None:
    from .tasks import cluster_inventory_sync

    cluster_inventory_sync.delay_on_commit(cluster_id)


# --- inventory -----------------------------------------------------------------------------


@dataclass
class InventoryResult:
    nodes: int = 0
    gpus: int = 0
    quarantined: list[str] = field(default_factory=list)
    evicted_jobs: list[int] = field(default_factory=list)


def inventory_sync(*, cluster: Cluster) -> InventoryResult:
    """Converge Node/GpuDevice rows with what the cluster reports.

    Rule (faulty hardware): a node that is NotReady, or a GPU reported unhealthy, is
    quarantined (no new placements) and the jobs on it are rescheduled; a node whose
    problem is gone leaves quarantine automatically unless an admin put it there."""
    def camp_jobs() -> set[str]:
        """Jobs whose pods are Camp's: those holding an allocation in this cluster."""
        return {str(j) for j in Allocation.objects.filter(cluster=cluster)
                .values_list("job_id", flat=True).distinct()}

    infos = backend_for(cluster).list_nodes(camp_jobs)
    result = InventoryResult()
    pools = selectors.pools_in_order(cluster)
    with transaction.atomic():
        seen = {info.name for info in infos}
        result.nodes = len(infos)
        result.gpus = sum(len(info.gpus) for info in infos)
        _upsert_nodes(cluster, infos, result, pools)
        Node.objects.filter(cluster=cluster, present=True).exclude(name__in=seen).update(
            present=False, updated_at=timezone.now())
        Cluster.objects.filter(pk=cluster.pk).update(last_inventory_at=timezone.now(), last_error="")
    # Jobs on nodes that vanished or broke, or on unhealthy GPUs, are rescheduled.
    for job_id, why in sorted(broken_jobs(cluster=cluster).items()):
        if job_evict(job_id=job_id, reason=why):
            result.evicted_jobs.append(job_id)
    request_cycle(cluster.pk)
    return result


def broken_jobs(*, cluster: Cluster) -> dict[int, str]:
    """Active jobs on a node that left the cluster or is NotReady, or holding a slice of an
    unhealthy GPU, each with the first problem found (as its users will read it). Jobs on
    the healthy GPUs of a quarantined node keep running (an admin's quarantine evicts
    explicitly, ``node_quarantine``)."""
    out: dict[int, str] = {}
    for a in Allocation.objects.filter(cluster=cluster, job__state__in=ACTIVE_STATES).select_related(
            "node").order_by("job_id", "pk"):
        n = a.node
        if not n.present:
            out.setdefault(a.job_id, f"node {n.name} left the cluster")
        elif not n.ready:
            out.setdefault(a.job_id, f"node {n.name} is NotReady")
    for s in GpuSlice.objects.filter(
            allocation__cluster=cluster, allocation__job__state__in=ACTIVE_STATES).filter(
            Q(gpu__healthy=False) | Q(gpu__quarantined=True)).select_related(
            "gpu__node", "allocation").order_by("allocation__job_id", "pk"):
        out.setdefault(s.allocation.job_id, f"GPU {s.gpu.index} of node {s.gpu.node.name} is unhealthy")
    return out


_NODE_SYNCED = ("cpu_millicores", "ram_mib", "max_pods", "labels", "taints", "pool", "nvlink_islands",
                "ready", "cordoned", "present", "quarantined", "quarantine_reason")
_GPU_SYNCED = ("uuid", "model", "vendor", "memory_mib", "numa_node", "healthy", "sharing", "templates",
               "max_sharers", "quarantined", "foreign_memory_mib", "foreign_cores", "foreign_sharers",
               "foreign_exclusive", "foreign_pods")


def _upsert_nodes(cluster: Cluster, infos: list[NodeInfo], result: InventoryResult,
                  pools: list[NodePool]) -> None:
    """Converge the cluster's Node and GpuDevice rows with ``infos`` in bulk, writing only
    the rows that changed (issue 13: 1,213 nodes took ~9 s as two statements per node and
    one per GPU, every minute, for nothing when nothing changed). Missing rows are inserted
    first (ON CONFLICT DO NOTHING: a concurrent sync may insert the same node), then every
    row is locked in id order and compared field by field."""
    names = [info.name for info in infos]
    have = set(Node.objects.filter(cluster=cluster, name__in=names).values_list("name", flat=True))
    Node.objects.bulk_create([Node(cluster=cluster, name=n) for n in names if n not in have],
                             batch_size=1000, ignore_conflicts=True)
    nodes = {n.name: n for n in Node.objects.select_for_update(no_key=True)
             .filter(cluster=cluster, name__in=names).order_by("pk")}
    have_gpus = set(GpuDevice.objects.filter(node__in=nodes.values()).values_list("node_id", "index"))
    GpuDevice.objects.bulk_create(
        [GpuDevice(node=nodes[info.name], index=g.index, uuid=g.uuid, model=g.model, vendor=g.vendor,
                   memory_mib=g.memory_mib, max_sharers=g.max_sharers)
         for info in infos for g in info.gpus if (nodes[info.name].pk, g.index) not in have_gpus],
        batch_size=2000, ignore_conflicts=True)
    gpus: dict[int, dict[int, GpuDevice]] = defaultdict(dict)
    for row in (GpuDevice.objects.select_for_update(no_key=True).filter(node__in=nodes.values())
                .order_by("pk")):
        gpus[row.node_id][row.index] = row
    now = timezone.now()
    changed_nodes: list[Node] = []
    changed_gpus: list[GpuDevice] = []
    for info in infos:
        node = nodes[info.name]
        before = [getattr(node, f) for f in _NODE_SYNCED]
        _sync_node(node, info, result, pools)
        if [getattr(node, f) for f in _NODE_SYNCED] != before:
            node.updated_at = now
            changed_nodes.append(node)
        existing = gpus[node.pk]
        rows: list[tuple[GpuDevice, list[Any]]] = []
        for g in info.gpus:
            row = existing.pop(g.index)
            before = [getattr(row, f) for f in _GPU_SYNCED]
            row.uuid = g.uuid
            row.model = g.model
            row.vendor = g.vendor
            # Never shrink below what is allocated (the CHECK constraint would refuse it).
            row.memory_mib = max(g.memory_mib, row.memory_allocated_mib)
            row.numa_node = g.numa_node
            row.healthy = g.healthy
            row.sharing = g.sharing
            row.templates = [dict(t) for t in g.templates]
            row.max_sharers = max(g.max_sharers, row.sharers)
            row.quarantined = not g.healthy
            if info.foreign_known:  # else the pods could not be listed: keep the last figures
                row.foreign_memory_mib = max(0, g.foreign_memory_mib)
                row.foreign_cores = max(0, g.foreign_cores_percent)
                row.foreign_sharers = max(0, g.foreign_sharers)
                row.foreign_exclusive = False
                row.foreign_pods = sorted(g.foreign_pods)
            rows.append((row, before))
        if info.foreign_known:
            _foreign_whole_cards(node, info, [row for row, _ in rows])
        for row, before in rows:
            if [getattr(row, f) for f in _GPU_SYNCED] != before:
                changed_gpus.append(row)
        for gone in existing.values():  # no longer reported by the node
            if gone.healthy or not gone.quarantined:
                gone.healthy, gone.quarantined = False, True
                changed_gpus.append(gone)
    Node.objects.bulk_update(changed_nodes, [*_NODE_SYNCED, "updated_at"], batch_size=500)
    GpuDevice.objects.bulk_update(changed_gpus, list(_GPU_SYNCED), batch_size=1000)


def _sync_node(node: Node, info: NodeInfo, result: InventoryResult, pools: list[NodePool]) -> None:
    """Set the node's fields from what the cluster reports (in memory)."""
    node.cpu_millicores = info.cpu_millicores
    node.ram_mib = info.ram_mib
    node.max_pods = info.max_pods
    node.labels = dict(info.labels)
    node.taints = [dict(t) for t in info.taints]
    node.pool = selectors.pool_of(dict(info.labels), pools)
    node.nvlink_islands = [list(i) for i in info.nvlink_islands]
    node.ready = info.ready
    node.cordoned = info.cordoned
    node.present = True
    auto = node.quarantine_reason.startswith("auto:") or not node.quarantined
    # No new placements on a node that is NotReady or reports an unhealthy GPU (a GPU
    # fault often means a node problem: XID errors, a fallen-off bus). Its GPUs still count
    # as present, so jobs that need them wait for the repair rather than being rejected.
    # Only the jobs on the broken GPU itself are rescheduled (``broken_jobs``).
    problems = []
    if not info.ready:
        problems.append("node NotReady")
    bad = [g.index for g in info.gpus if not g.healthy]
    if bad:
        problems.append("unhealthy GPU " + ", ".join(str(i) for i in bad))
    if auto:
        if problems:
            if not node.quarantined:
                result.quarantined.append(node.name)
            node.quarantined = True
            node.quarantine_reason = "auto: " + "; ".join(problems)
        else:
            node.quarantined = False
            node.quarantine_reason = ""


def _foreign_whole_cards(node: Node, info: NodeInfo, rows: list[GpuDevice]) -> None:
    """Rule (foreign whole cards): pods Camp did not create that ask ``nvidia.com/gpu`` on
    this node without HAMi's per-device annotation (the default scheduler's pods) hold that
    many whole cards, but which ones the cluster does not say. The device plugin gives such a
    pod cards no other pod holds, so Camp marks that many of the cards free of Camp's and of
    other HAMi pods' slices as taken, highest index first (stable from one sync to the next:
    Camp never places on a card so marked). Cards short (the node is over-committed) are
    logged, never invented."""
    want = info.foreign_whole_cards
    if want <= 0:
        return
    free = sorted((r for r in rows if r.sharers == 0 and not r.exclusive_held and r.foreign_sharers == 0),
                  key=lambda r: -r.index)
    for row in free[:want]:
        row.foreign_exclusive = True
        row.foreign_pods = [*row.foreign_pods, *info.foreign_card_pods]
    if len(free) < want:
        logger.warning("node %s: pods %s hold %d whole GPUs, only %d are free of other pods",
                       node.name, ", ".join(info.foreign_card_pods), want, len(free))


@transaction.atomic
def node_quarantine(*, actor: User, node: Node, quarantined: bool, reason: str = "") -> Node:
    """An admin takes a node out of (or back into) service; its jobs are rescheduled."""
    _require(actor, permissions.CHANGE, node)
    before = {"quarantined": node.quarantined, "reason": node.quarantine_reason}
    node.quarantined = quarantined
    node.quarantine_reason = (reason or "quarantined by an admin")[:255] if quarantined else ""
    node.save(update_fields=["quarantined", "quarantine_reason", "updated_at"])
    audit_record(actor=actor, action="node.quarantined" if quarantined else "node.released",
                 target=node, before=before,
                 after={"quarantined": node.quarantined, "reason": node.quarantine_reason})
    if quarantined:
        for job_id in sorted(set(Allocation.objects.filter(
                node=node, job__state__in=ACTIVE_STATES).values_list("job_id", flat=True))):
            job_evict(job_id=job_id, reason=f"node {node.name} was quarantined")
    request_cycle(node.cluster_id)
    return node


# --- utilisation feed ----------------------------------------------------------------------


@dataclass
class UtilizationResult:
    matched: int = 0
    cleared: int = 0
    unmatched: int = 0


def utilization_sync(*, cluster: Cluster) -> UtilizationResult:
    """Read per-GPU utilisation and used memory from the cluster's Prometheus into the GPU
    rows (``selectors`` put fresh values into the snapshot for load-aware placement).

    GPUs are matched by UUID, else by node name and index. A GPU without a sample loses its
    old values, so stale load never steers placement. Telemetry, not a decision: no audit
    event (it changes every few seconds and grants nothing)."""
    from .backends.metrics import gpu_samples

    if not cluster.prometheus_url:
        return UtilizationResult()
    samples = gpu_samples(cluster.prometheus_url)
    by_uuid = {s.uuid: s for s in samples if s.uuid}
    by_place = {(s.node, s.index): s for s in samples if s.node and s.index is not None}
    now = timezone.now()
    result = UtilizationResult()
    used: set[int] = set()
    with transaction.atomic():
        for gpu in GpuDevice.objects.filter(node__cluster=cluster).select_related("node"):
            sample = by_uuid.get(gpu.uuid) or by_place.get((gpu.node.name, gpu.index))
            if sample is None:
                if gpu.utilization_at is not None:
                    GpuDevice.objects.filter(pk=gpu.pk).update(
                        utilization_percent=None, memory_used_mib=None, utilization_at=None)
                    result.cleared += 1
                continue
            used.add(id(sample))
            GpuDevice.objects.filter(pk=gpu.pk).update(
                utilization_percent=sample.utilization_percent,
                memory_used_mib=sample.memory_used_mib, utilization_at=now)
            result.matched += 1
    result.unmatched = sum(1 for s in samples if id(s) not in used)
    return result


# --- node pools ----------------------------------------------------------------------------

POOL_FIELDS = ("name", "selector", "dedicated")


def _pool_snapshot(pool: NodePool) -> dict[str, Any]:
    data = snapshot(pool, POOL_FIELDS)
    data["cluster"] = pool.cluster.name
    data["tenants"] = sorted(t.name for t in pool.tenants.all()) if pool.pk else []
    return data


def _validate_pool(pool: NodePool, tenants: list[Any]) -> None:
    sel = pool.selector
    if not isinstance(sel, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k for k, v in sel.items()):
        raise ValidationError({"selector": ["A mapping of node label names to values."]})
    if pool.dedicated and not tenants:
        raise ValidationError({"tenants": ["A dedicated pool needs at least one tenant."]})
    if not pool.dedicated and tenants:
        raise ValidationError({"tenants": ["Only dedicated pools name tenants."]})
    try:
        pool.full_clean(exclude=["cluster"], validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc


def pools_assign(*, cluster: Cluster) -> int:
    """Recompute which pool every node of ``cluster`` belongs to (after pools change).
    Dedication applies to new placements; jobs already running stay where they are."""
    pools = selectors.pools_in_order(cluster)
    changed = 0
    for node in Node.objects.filter(cluster=cluster).only("pk", "labels", "pool"):
        pool = selectors.pool_of(dict(node.labels), pools)
        if pool != node.pool:
            Node.objects.filter(pk=node.pk).update(pool=pool)
            changed += 1
    return changed


def _save_pool(pool: NodePool, tenants: list[Any]) -> None:
    try:
        with transaction.atomic():
            pool.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["This cluster already has a pool with this name."]}) from exc
    pool.tenants.set(tenants)
    pools_assign(cluster=pool.cluster)
    request_cycle(pool.cluster_id)


@transaction.atomic
def nodepool_create(*, actor: User, cluster: Cluster, name: str, selector: dict[str, str],
                    dedicated: bool = False, tenants: list[Any] | None = None) -> NodePool:
    """A pool of the nodes whose labels match ``selector``; a dedicated one places only the
    jobs of ``tenants``, a shared one everyone's."""
    pool = NodePool(cluster=cluster, name=name, selector=selector, dedicated=dedicated)
    _require(actor, permissions.CREATE, pool)
    tenants = list(tenants or [])
    _validate_pool(pool, tenants)
    _save_pool(pool, tenants)
    audit_record(actor=actor, action="nodepool.created", target=pool, after=_pool_snapshot(pool))
    return pool


@transaction.atomic
def nodepool_update(*, actor: User, pool: NodePool, tenants: list[Any] | None = None,
                    **changes: Any) -> NodePool:
    _require(actor, permissions.CHANGE, pool)
    before = _pool_snapshot(pool)
    for key, value in changes.items():
        if key not in POOL_FIELDS:
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(pool, key, value)
    new_tenants = list(tenants) if tenants is not None else list(pool.tenants.all())
    if not pool.dedicated and tenants is None:
        new_tenants = []
    _validate_pool(pool, new_tenants)
    _save_pool(pool, new_tenants)
    audit_record(actor=actor, action="nodepool.updated", target=pool, before=before,
                 after=_pool_snapshot(pool))
    return pool


@transaction.atomic
def nodepool_delete(*, actor: User, pool: NodePool) -> None:
    _require(actor, permissions.DELETE, pool)
    audit_record(actor=actor, action="nodepool.deleted", target=pool, before=_pool_snapshot(pool))
    cluster = pool.cluster
    pool.delete()
    pools_assign(cluster=cluster)
    request_cycle(cluster.pk)


# --- jobs ----------------------------------------------------------------------------------


def _clean_group(n: int, data: dict[str, Any]) -> PodGroup:
    unknown = set(data) - set(GROUP_FIELDS)
    if unknown:
        raise ValidationError({f"groups[{n}]": [f"Unknown field(s): {', '.join(sorted(unknown))}."]})
    group = PodGroup(**data)
    try:
        group.full_clean(exclude=["job"], validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError({f"groups[{n}].{k}": v for k, v in exc.message_dict.items()}) from exc
    if group.gpu_count == 0 and (group.gpu_memory_mib or group.gpu_cores_percent):
        raise ValidationError({f"groups[{n}].gpu_count": ["A GPU slice needs gpu_count ≥ 1."]})
    if not isinstance(group.gpu_models, list) or not all(isinstance(m, str) for m in group.gpu_models):
        raise ValidationError({f"groups[{n}].gpu_models": ["A list of GPU model names."]})
    return group


def _job_build(
    *,
    actor: User,
    project: Project,
    cluster: Cluster,
    name: str,
    groups: list[dict[str, Any]],
    kind: str = "batch",
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    checkpoint_capable: bool = False,
    gang: bool = True,
    duration_seconds: int | None = None,
    mixed_gpu_models: bool = False,
) -> tuple[Job, list[PodGroup]]:
    """A validated, unsaved job and its pod groups (the rules of a submit, without writes)."""
    if priority_class not in PRIORITY_VALUES:
        raise ValidationError({"priority_class": [f"Choose one of: {', '.join(PRIORITY_VALUES)}."]})
    if preemptible is None:
        preemptible = priority_class == PriorityClass.BATCH
    if preemptible and priority_class in NON_PREEMPTIBLE_CLASSES:
        raise ValidationError({"preemptible": [f"{priority_class} jobs are never preemptible."]})
    job = Job(
        tenant=project.tenant, project=project, owner=actor, cluster=cluster, name=name, kind=kind,
        priority_class=priority_class, priority=PRIORITY_VALUES[priority_class],
        preemptible=preemptible, checkpoint_capable=checkpoint_capable, gang=gang,
        mixed_gpu_models=mixed_gpu_models, duration_seconds=duration_seconds, state=JobState.QUEUED,
    )
    _require(actor, permissions.CREATE, job)
    if not cluster.enabled:
        raise ValidationError({"cluster": ["This cluster is disabled."]})
    if not groups:
        raise ValidationError({"groups": ["A job needs at least one pod group."]})
    rows = [_clean_group(n, g) for n, g in enumerate(groups)]
    if len({g.name for g in rows}) != len(rows):
        raise ValidationError({"groups": ["Pod group names must be distinct."]})
    if sum(g.replicas for g in rows) > 256:
        raise ValidationError({"groups": ["At most 256 pods per job."]})
    try:
        job.full_clean(exclude=["owner", "tenant", "project", "cluster"], validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    return job, rows


def _job_submitted(actor: User, job: Job, rows: list[PodGroup]) -> SchedulingDecision:
    """The history row and audit event of a submitted job (its rows saved); the decision
    is returned unsaved so that bulk submits insert them together."""
    _audit_job("job.submitted", job, actor=actor, after={
        **snapshot(job, JOB_FIELDS), "groups": [snapshot(g, GROUP_FIELDS) for g in rows]})
    return SchedulingDecision(job=job, cluster_id=job.cluster_id, kind=DecisionKind.SUBMITTED,
                              reason="Queued; waiting for the next scheduling cycle")


@transaction.atomic
def job_submit(
    *,
    actor: User,
    project: Project,
    cluster: Cluster,
    name: str,
    groups: list[dict[str, Any]],
    kind: str = "batch",
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    checkpoint_capable: bool = False,
    gang: bool = True,
    duration_seconds: int | None = None,
    mixed_gpu_models: bool = False,
) -> Job:
    """Queue a job (state QUEUED) and ask for a scheduling cycle after commit (requests
    coalesce per cluster: ``request_cycle``).

    The audit event is appended as the transaction's last statement (``audit_batch``): the
    chain lock every writer of the audit log queues on is then held only for that insert
    and the commit, not for the rest of the submit."""
    job, rows = _job_build(
        actor=actor, project=project, cluster=cluster, name=name, groups=groups, kind=kind,
        priority_class=priority_class, preemptible=preemptible,
        checkpoint_capable=checkpoint_capable, gang=gang, duration_seconds=duration_seconds,
        mixed_gpu_models=mixed_gpu_models)
    with audit_batch():
        try:
            with transaction.atomic():
                job.save()
        except IntegrityError as exc:
            raise ValidationError({"name": ["This project already has a job with this name."]}) from exc
        for g in rows:
            g.job = job
        PodGroup.objects.bulk_create(rows)
        _job_submitted(actor, job, rows).save()
        request_cycle(cluster.pk)
    return job


MAX_BULK_JOBS = 1000
"""Jobs per bulk submit (a sweep larger than this is sent in several requests)."""


def job_submit_many(*, actor: User, jobs: list[dict[str, Any]]) -> list[Job]:
    """Queue many jobs at once, all or nothing (parameter sweeps).

    Each item takes ``job_submit``'s arguments (without ``actor``) and is checked by the
    same rules; every problem is reported, keyed ``jobs[<index>].<field>``, and then
    nothing is written. Otherwise jobs, pod groups, decisions and audit events are
    inserted in bulk in one transaction, and one cycle is requested per cluster."""
    if not jobs:
        raise ValidationError({"jobs": ["Submit at least one job."]})
    if len(jobs) > MAX_BULK_JOBS:
        raise ValidationError({"jobs": [f"At most {MAX_BULK_JOBS} jobs per request."]})
    errors: dict[str, list[str]] = {}
    built: list[tuple[Job, list[PodGroup]]] = []
    seen: dict[tuple[int, str], int] = {}
    for i, item in enumerate(jobs):
        try:
            job, rows = _job_build(actor=actor, **item)
        except ValidationError as exc:
            for field_name, msgs in exc.message_dict.items():
                errors[f"jobs[{i}].{field_name}"] = list(msgs)
            continue
        key = (job.project_id, job.name)
        if key in seen:
            errors[f"jobs[{i}].name"] = [f"Also the name of jobs[{seen[key]}] in this project."]
            continue
        seen[key] = i
        built.append((job, rows))
    taken = set(Job.objects.filter(project_id__in={p for p, _ in seen}, name__in={n for _, n in seen})
                .values_list("project_id", "name"))
    for (project_id, name), i in seen.items():
        if (project_id, name) in taken:
            errors[f"jobs[{i}].name"] = ["This project already has a job with this name."]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic(), audit_batch():
        try:
            with transaction.atomic():
                Job.objects.bulk_create([job for job, _ in built], batch_size=500)
        except IntegrityError as exc:  # a job of the same name committed meanwhile
            raise ValidationError({"jobs": ["A job name was taken meanwhile; submit again."]}) from exc
        for job, rows in built:
            for g in rows:
                g.job = job
        PodGroup.objects.bulk_create([g for _, rows in built for g in rows], batch_size=500)
        _record_all([_job_submitted(actor, job, rows) for job, rows in built])
        for cluster_id in sorted({job.cluster_id for job, _ in built}):
            request_cycle(cluster_id)
    return [job for job, _ in built]


def job_cancel(*, actor: User, job: Job) -> Job:
    """Cancel a job: a queued one at once; an admitted one once its pods are gone."""
    with transaction.atomic():
        locked = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        _require(actor, permissions.DELETE, locked)
        if locked.is_final:
            raise ValidationError({"state": [f"The job is already {locked.get_state_display().lower()}."]})
        before = locked.state
        _finish(locked, JobState.CANCELLED, f"Cancelled by {actor.get_username()}")
        _record(locked, DecisionKind.CANCELLED, locked.reason)
        _audit_job("job.cancelled", locked, actor=actor, before={"state": before},
                   after={"state": locked.state})
        if before in ACTIVE_STATES:
            _stop_after_commit(locked.pk)
        else:
            request_cycle(locked.cluster_id)
    return locked


def job_terminate(*, job_id: int, reason: str, by: str = SCHEDULER) -> bool:
    """Cancel a job on the platform's behalf — idle culling, a maximum runtime, a failed
    dependency (workspaces/) — with ``reason`` recorded as given and ``by`` as the audit
    actor name. Like ``job_cancel`` but without a user; False if it had already ended."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.is_final:
            return False
        before = job.state
        _finish(job, JobState.CANCELLED, reason)
        _record(job, DecisionKind.CANCELLED, job.reason)
        audit_record(actor=None, actor_username=by, action="job.cancelled", target=job,
                     tenant=job.tenant, project=job.project, before={"state": before},
                     after={"state": job.state, "reason": job.reason})
        if before in ACTIVE_STATES:
            _stop_after_commit(job.pk)
        else:
            request_cycle(job.cluster_id)
    return True


def _finish(job: Job, state: str, reason: str) -> None:
    job.state = state
    job.reason = reason[:500]
    job.reason_kind = ""
    job.queue_position = None
    job.queue_length = None
    job.finished_at = timezone.now()
    job.save(update_fields=["state", "reason", "reason_kind", "queue_position", "queue_length",
                            "finished_at", "updated_at"])


def _stop_after_commit(job_id: int) -> None:
    from .tasks import job_stop

    _send_after_commit(job_stop, job_id)


def job_evict(*, job_id: int, reason: str) -> bool:
    """Take a running job off broken hardware: stop its pods and requeue it (checkpoint-
    capable jobs resume from their latest checkpoint). Returns False if nothing to do."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return False
        job.state = JobState.PREEMPTING
        job.preempted_by = None
        job.reason = f"Rescheduling: {reason}"
        job.save(update_fields=["state", "preempted_by", "reason", "updated_at"])
        _record(job, DecisionKind.PREEMPTED, job.reason)
        _audit_job("job.evicted", job, after={"reason": reason})
        _stop_after_commit(job.pk)
    return True


def job_checkpoint_record(*, job: Job, path: str, actor: User | None = None) -> Job:
    """Remember a checkpoint-capable job's latest checkpoint: when the job is preempted or
    rescheduled off broken hardware, its next pods get ``CAMP_RESUME_FROM=<path>``.
    Workloads (or the job itself) report checkpoints; ``actor`` None means the platform."""
    path = path.strip()
    if not path or len(path) > 500:
        raise ValidationError({"path": ["A checkpoint path of 1 to 500 characters."]})
    with transaction.atomic():
        locked = _locked_job(job.pk)
        if actor is not None:
            _require(actor, permissions.CHANGE, locked)
        if not locked.checkpoint_capable:
            raise ValidationError({"path": ["This job is not checkpoint-capable."]})
        before = locked.last_checkpoint
        if before != path:
            locked.last_checkpoint = path
            locked.save(update_fields=["last_checkpoint", "updated_at"])
            _audit_job("job.checkpointed", locked, actor=actor, before={"checkpoint": before},
                       after={"checkpoint": path})
    return locked


# --- the scheduling cycle ------------------------------------------------------------------


@contextlib.contextmanager
def cycle_lock(cluster_id: int) -> Iterator[bool]:
    """One cycle per cluster at a time, across any number of workers.

    PostgreSQL: a session-level advisory lock, released here (or when a killed worker's
    connection drops), so that the cycle can read, decide and write in separate short
    transactions. SQLite (the demo): an exclusive file lock."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_CYCLE_LOCK_CLASS, cluster_id])
            row = cursor.fetchone()
        got = bool(row and row[0])
        try:
            yield got
        finally:
            if got:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_CYCLE_LOCK_CLASS, cluster_id])
        return
    lock_dir = settings.BASE_DIR / "var" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"cycle-{cluster_id}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _consistent_read() -> Iterator[None]:
    """A read-only transaction that sees one snapshot of the database (REPEATABLE READ on
    PostgreSQL), so nodes, GPU totals, allocations and jobs agree with each other. Inside
    an outer transaction (tests) the outer one's view is used."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


@dataclass
class CycleSummary:
    admitted: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    preempting: list[int] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)


def engine_policy(name: str) -> E.Policy | None:
    """The engine policy for a cluster's ``placement_policy``; None is the engine's default
    (fragmentation-aware, profiled on the pending workload)."""
    shapes = {"binpack": ("binpack", "binpack"), "spread": ("spread", "spread"),
              "binpack-spread": ("binpack", "spread"), "spread-binpack": ("spread", "binpack")}
    if name in shapes:
        node, card = shapes[name]
        return E.ResourcePolicy(node=node, card=card, name=name)  # type: ignore[arg-type]
    return None


def cycle_run(*, cluster: Cluster, now: float | None = None) -> CycleSummary | None:
    """One scheduling cycle of ``cluster``; None when another cycle holds the lock.

    Three steps under the cluster's lock, none of them long in a transaction: read a
    consistent snapshot; let the engine decide (no transaction open); persist the decisions
    in one short transaction with bulk statements and optimistic checks (``_apply``): a job
    that left QUEUED meanwhile, or whose GPUs' totals moved since the snapshot, is not
    admitted, nor does it preempt (it waits for the next cycle) while the rest of the cycle
    goes through. Pods
    are created after commit (``job_dispatch``)."""
    started = time.perf_counter()
    with cycle_lock(cluster.pk) as got:
        if not got:
            return None
        inputs, statuses = _decide(cluster, now)
        summary = _persist(cluster, inputs, statuses)
    signals.cycle_finished.send_robust(
        sender=Cluster, cluster_id=cluster.pk, seconds=time.perf_counter() - started,
        admitted=len(summary.admitted), waiting=len(summary.waiting),
        rejected=len(summary.rejected), preempting=len(summary.preempting),
    )
    return summary


def _decide(cluster: Cluster, now: float | None) -> tuple[selectors.CycleInputs, list[JobStatus]]:
    """The snapshot (one consistent read) and the engine's decisions (no transaction open).
    Nothing queued: nothing to decide, and no snapshot to read (an idle tick is one query)."""
    if not Job.objects.filter(cluster=cluster, state=JobState.QUEUED).exists():
        return selectors.CycleInputs.empty(), []
    with _gc_paused(), _consistent_read():
        inputs = selectors.cycle_inputs(cluster)
    if not inputs.pending:
        return inputs, []
    with _gc_paused():
        result = _run_engine(cluster, inputs, now)
    return inputs, list(result.statuses.values())


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the snapshot and the engine build hundreds of
    thousands of small objects (none of them garbage yet): CPython would otherwise walk
    them all again and again (0.3–0.5 s of a 20,000-job snapshot). Bounded: re-enabled after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def heads_per_queue(inputs: selectors.CycleInputs) -> int | None:
    """How many jobs of each project queue the cycle tries (None: all).

    ``SCHEDULER_HEADS_PER_QUEUE`` (default 8) bounds a cycle's work on a full cluster,
    where every tried job that does not fit searches for victims. On a cluster with room
    that bound only costs cycles: 10,000 jobs behind 200 queues took ten cycles to reach
    the ones that fit (issue 13). So, with ``SCHEDULER_HEADS_FILL`` (default on), each queue
    offers at least its share of the free GPUs (free GPU-equivalents on schedulable nodes ÷
    queues with pending jobs, rounded up). The engine still orders all offered heads by
    fair share and priority, so the room goes to queues in the same order; only the cut-off
    per queue moves, and only when more than ``heads × queues`` GPUs are free."""
    base = settings.SCHEDULER_HEADS_PER_QUEUE
    if not base:
        return None
    if not getattr(settings, "SCHEDULER_HEADS_FILL", True) or not inputs.pending:
        return base
    free = 0.0
    for node in inputs.snapshot.nodes:
        if not node.schedulable:
            continue
        for g in node.gpus:
            row = inputs.gpus[(node.name, g.index)]
            # Room held by pods Camp did not create is not free room.
            if (g.healthy and not row.exclusive_held and not row.foreign_exclusive and row.memory_mib
                    and row.sharers + row.foreign_sharers < row.max_sharers):
                free += max(0.0, 1 - (row.memory_allocated_mib + row.foreign_memory_mib) / row.memory_mib)
    queues = len({j.queue for j in inputs.pending})
    return max(base, math.ceil(free / queues))


def _run_engine(cluster: Cluster, inputs: selectors.CycleInputs, now: float | None) -> CycleResult:
    return run_cycle(
        inputs.snapshot, inputs.pending, inputs.tree,
        now=now if now is not None else timezone.now().timestamp(),
        running=inputs.running,
        # Kueue-style heads of queues: a cycle tries the first N jobs of each project
        # (the rest wait "behind" with their position); the task re-runs while it admits.
        config=CycleConfig(heads_per_queue=heads_per_queue(inputs)),
        policy=engine_policy(cluster.placement_policy),
    )


def _persist(cluster: Cluster, inputs: selectors.CycleInputs, statuses: list[JobStatus]) -> CycleSummary:
    """Write the decisions in one short transaction; audit events chained in one insert
    at its end (``audit_batch``)."""
    summary = CycleSummary()
    with transaction.atomic(), audit_batch():
        _apply(inputs, statuses, summary)
        Cluster.objects.filter(pk=cluster.pk).update(last_cycle_at=timezone.now())
    return summary


CONFLICT_REASON = "Its placement was taken concurrently; retrying in the next cycle"


def _apply(inputs: selectors.CycleInputs, statuses: list[JobStatus], summary: CycleSummary) -> None:
    """Persist one cycle's decisions (inside the caller's transaction).

    Admissions, preemptions and waits are written in bulk (``_admit_all``, ``_preempt_all``,
    ``_wait_all``); rejections, a handful per cycle, job by job. The outcome is the one the
    row-by-row path gave (tests/integration/scheduling/test_cycle_equivalence.py)."""
    admits: list[tuple[Job, E.Placement, JobStatus]] = []
    preemptions: list[tuple[Job, E.Preempt]] = []
    waits: list[_WaitRow] = []
    # The snapshot holds rows, not models: the jobs admitted, preempting, preempted or
    # rejected (a few thousand at most) are loaded as models in one query for their writes.
    acting = {int(st.job) for st in statuses if not isinstance(st.decision, E.Wait)}
    acting.update(int(v) for st in statuses if isinstance(st.decision, E.Preempt)
                  for v in st.decision.victims)
    models_ = selectors.job_models(sorted(acting))
    for status in statuses:
        row, d = inputs.jobs[status.job], status.decision
        if isinstance(d, (E.Admit, E.Preempt)):
            blocked = _outside_pools(inputs, row.tenant_id, d.placement)
            if blocked:
                waits.append(_WaitRow(row, blocked, "capacity", None, None))
                continue
        if isinstance(d, E.Wait):
            waits.append(_WaitRow(row, d.reason, status.kind, status.position, status.queue_length))
            summary.waiting.append(row.pk)
            continue
        job = models_.get(row.pk)
        if job is None:  # deleted since the snapshot
            summary.conflicts.append(row.pk)
            continue
        if isinstance(d, E.Admit):
            admits.append((job, d.placement, status))
        elif isinstance(d, E.Preempt):
            preemptions.append((job, d))
        elif isinstance(d, E.Reject):
            updated = Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                state=JobState.REJECTED, reason=d.reason[:500], reason_kind=status.kind,
                queue_position=None, queue_length=None, finished_at=timezone.now(),
            )
            if updated:
                job.state, job.reason = JobState.REJECTED, d.reason[:500]
                _record(job, DecisionKind.REJECTED, d.reason)
                _audit_job("job.rejected", job, after={"reason": d.reason})
                summary.rejected.append(job.pk)
    locked = _lock_rows(inputs, admits, preemptions, models_)
    for job in _preempt_all(inputs, models_, preemptions, summary, locked):
        waits.append(_WaitRow(job, CONFLICT_REASON, "capacity", None, None))
    for job in _admit_all(inputs, admits, summary, locked):
        waits.append(_WaitRow(job, CONFLICT_REASON, "capacity", None, None))
    _wait_all(waits)


@dataclass(frozen=True, slots=True)
class _Locked:
    """What ``_lock_rows`` read under lock: job id → (state, attempts); GPU id → its
    current totals (``GpuRow.totals()`` order); the GPUs whose totals moved since the
    snapshot."""
    jobs: dict[int, tuple[str, int]]
    gpus: dict[int, tuple[Any, ...]]
    moved: set[int]


def _placement_gpus(inputs: selectors.CycleInputs, placement: E.Placement) -> set[int]:
    return {inputs.gpus[(pp.node, g.index)].pk for pp in placement.pods for g in pp.gpus}


def _lock_rows(inputs: selectors.CycleInputs, admits: list[tuple[Job, E.Placement, JobStatus]],
               preemptions: list[tuple[Job, E.Preempt]], jobs: dict[int, Job]) -> _Locked:
    """Lock, once for the whole write, the rows the admissions and preemptions are checked
    against: first the jobs (admitted, preemptors, victims), then the GPUs their placements
    use, each in ascending id order — jobs before GPUs, as a release locks its job and then
    updates its GPUs, so a cycle and a release never wait on each other in a circle. FOR NO
    KEY UPDATE (see the note on row locks above). Two statements however many jobs."""
    pks = {job.pk for job, _, _ in admits} | {job.pk for job, _ in preemptions}
    pks.update(int(v) for _, d in preemptions for v in d.victims if int(v) in jobs)
    used: set[int] = set()
    for _, placement, _ in admits:
        used |= _placement_gpus(inputs, placement)
    for _, d in preemptions:
        used |= _placement_gpus(inputs, d.placement)
    locked_jobs: dict[int, tuple[str, int]] = {}
    if pks:
        locked_jobs = {pk: (state, attempts) for pk, state, attempts in Job.objects.select_for_update(
            no_key=True).filter(pk__in=sorted(pks)).order_by("pk").values_list("pk", "state", "attempts")}
    current: dict[int, tuple[Any, ...]] = {}
    if used:
        current = {row[0]: row[1:] for row in GpuDevice.objects.select_for_update(no_key=True).filter(
            pk__in=sorted(used)).order_by("pk").values_list(
            "pk", "memory_allocated_mib", "cores_allocated", "sharers", "exclusive_held", "memory_mib",
            "max_sharers", "foreign_memory_mib", "foreign_cores", "foreign_sharers", "foreign_exclusive")}
    by_pk = {gpu.pk: gpu for gpu in inputs.gpus.values() if gpu.pk in used}
    # Moved also when an inventory sync changed what other schedulers' pods hold there.
    moved = {pk for pk in used if current.get(pk) != by_pk[pk].totals()}
    return _Locked(locked_jobs, current, moved)


def _outside_pools(inputs: selectors.CycleInputs, tenant_id: int, placement: E.Placement) -> str:
    """Backstop for dedicated pools: GPU pods are kept out by their model lists (see
    ``selectors.pool_model``); a pod without GPUs has no such list, so a placement that
    puts one on a pool closed to the job's tenant is not persisted: the job waits, for the
    reason returned (empty when the placement is allowed)."""
    forbidden = inputs.pools.forbidden_nodes(tenant_id)
    bad = sorted({pp.node for pp in placement.pods if pp.node in forbidden})
    if not bad:
        return ""
    pools = sorted({inputs.pools.node_pool[n] for n in bad})
    return f"The free room is in pool(s) dedicated to other tenants ({', '.join(pools)})"


@dataclass(frozen=True, slots=True)
class _WaitRow:
    job: Job | selectors.JobRow
    reason: str
    kind: str
    position: int | None
    length: int | None


def _wait(job: Job, reason: str, kind: str, position: int | None, length: int | None) -> None:
    _wait_all([_WaitRow(job, reason, kind, position, length)])


def _wait_all(rows: list[_WaitRow]) -> None:
    """Record why jobs wait and where they stand. A job whose reason, kind, position and
    queue length are unchanged costs nothing; the changed ones are one bulk update (guarded:
    only jobs still QUEUED), and the history keeps one row per change of *why*, not per
    change of position."""
    changed: dict[int, tuple[_WaitRow, str]] = {}
    for r in rows:
        reason = r.reason[:500]
        if (r.job.reason, r.job.reason_kind, r.job.queue_position, r.job.queue_length) == (
                reason, r.kind, r.position, r.length):
            continue
        changed[r.job.pk] = (r, reason)  # a later row for the same job wins, as it did row by row
    if not changed:
        return
    updated = _update_from_values(
        Job, [("reason", "varchar"), ("reason_kind", "varchar"), ("queue_position", "integer"),
              ("queue_length", "integer")],
        [(pk, reason, r.kind, r.position, r.length) for pk, (r, reason) in changed.items()],
        where=("state", JobState.QUEUED.value),
    )
    history = []
    for pk in sorted(updated):
        r, reason = changed[pk]
        if r.job.reason.split(" — ")[0] != reason.split(" — ")[0] or r.job.reason_kind != r.kind:
            history.append(SchedulingDecision(job_id=pk, cluster_id=r.job.cluster_id,
                                              kind=DecisionKind.WAITING, reason=reason,
                                              queue_position=r.position))
        r.job.reason, r.job.reason_kind = reason, r.kind
        r.job.queue_position, r.job.queue_length = r.position, r.length
    _record_all(history)


def _update_from_values(model: type[models.Model], columns: list[tuple[str, str]],
                        rows: list[tuple[Any, ...]], *, where: tuple[str, Any] | None = None
                        ) -> set[int]:
    """``UPDATE <table> SET col = v.col … FROM jsonb_to_recordset(<rows>) v WHERE id = v.id`` and,
    if given, ``where`` (column, value or list of values): only rows whose column has that
    value (one of them); returns the
    primary keys updated. Hand-written because Django's ``bulk_update`` writes one CASE WHEN
    per row and column, can add no per-row guard and does not say which rows it changed.
    Column names and types come from this module, never from input; values are parameters."""
    if not rows:
        return set()
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    pk = qn(str(model._meta.pk.column))  # type: ignore[union-attr]
    sets = ", ".join(f"{qn(c)} = v.{qn(c)}" for c, _ in columns)
    guard = ""
    extra: list[Any] = []
    if where is not None and isinstance(where[1], list):  # one of several values
        guard = f" AND t.{qn(where[0])} IN ({', '.join(['%s'] * len(where[1]))})"
        extra = list(where[1])
    elif where is not None:
        guard = f" AND t.{qn(where[0])} = %s"
        extra = [where[1]]
    done: set[int] = set()
    if connection.vendor != "postgresql":  # the demo's SQLite: row by row, same guard
        for row in rows:
            with connection.cursor() as cursor:
                assigns = ", ".join(f"{qn(c)} = %s" for c, _ in columns)
                cursor.execute(f"UPDATE {table} AS t SET {assigns} WHERE t.{pk} = %s{guard}",  # noqa: S608
                               [*row[1:], row[0], *extra])
                if cursor.rowcount:
                    done.add(row[0])
        return done
    # The rows travel as one JSON parameter (json.dumps is C; the driver would quote
    # array parameters element by element in Python: ~1 s for 18,000 rows).
    keys = ["id", *(c for c, _ in columns)]
    types = ", ".join(["id bigint", *(f"{qn(c)} {t}" for c, t in columns)])
    data = json.dumps([dict(zip(keys, row, strict=True)) for row in rows], default=_json_value)
    sql = (f"UPDATE {table} AS t SET {sets} FROM jsonb_to_recordset(%s::jsonb) "  # noqa: S608
           f"AS v({types}) WHERE t.{pk} = v.id{guard} RETURNING t.{pk}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [data, *extra])
        done.update(r[0] for r in cursor.fetchall())
    return done


def _placement_json(placement: E.Placement) -> list[dict[str, Any]]:
    return [
        {"pod": pp.pod, "node": pp.node, "cpu_millicores": pp.cpu_millicores, "ram_mib": pp.ram_mib,
         "gpus": [{"index": g.index, "uuid": g.uuid, "model": selectors.plain_model(g.gpu_model),
                   "memory_mib": g.gpu_memory_mib, "cores_percent": g.gpu_cores_percent,
                   "exclusive": g.exclusive, "container": g.container} for g in pp.gpus]}
        for pp in placement.pods
    ]


def _admit_all(inputs: selectors.CycleInputs, admits: list[tuple[Job, E.Placement, JobStatus]],
               summary: CycleSummary, locked: _Locked) -> list[Job]:
    """Persist the cycle's admissions in bulk; returns the jobs that must wait instead
    because their placement was taken since the snapshot.

    Optimistic, job by job in the engine's order: the admitted jobs' rows and the GPUs they
    use are locked (``_lock_rows``: ids in ascending order, as everywhere: no deadlock between
    cycles and releases); a job no longer QUEUED (cancelled meanwhile) is skipped; a job using a GPU
    whose totals moved since the snapshot, or that would overfill one (the CHECK
    constraints' rules), waits; the others are written with one statement per table, still
    guarded by the constraints. Should the database refuse the bulk write anyway, each job
    is admitted on its own (``_admit``), as before."""
    if not admits:
        return []
    queued = {pk: attempts for pk, (state, attempts) in locked.jobs.items() if state == JobState.QUEUED}
    current, moved = locked.gpus, locked.moved
    totals = {pk: list(row[:4]) for pk, row in current.items()}
    accepted: list[tuple[Job, E.Placement, JobStatus]] = []
    taken: list[Job] = []
    for job, placement, status in admits:
        if job.pk not in queued:
            summary.conflicts.append(job.pk)  # cancelled meanwhile
            continue
        delta = _gpu_delta(inputs, placement)
        if any(pk in moved or not _fits(current[pk], totals[pk], d) for pk, d in delta.items()):
            # Moved: released or taken since the snapshot. Overfilled: the engine counted
            # on room the database does not have yet (a preemption victim still holds it).
            logger.warning("admission of job %s: its GPUs moved or are still held; it waits", job.pk)
            summary.conflicts.append(job.pk)
            taken.append(job)
            continue
        for pk, d in delta.items():
            t = totals[pk]
            t[0], t[1], t[2], t[3] = t[0] + d[0], t[1] + d[1], t[2] + d[2], t[3] or bool(d[3])
        accepted.append((job, placement, status))
    try:
        with transaction.atomic():
            _write_admissions(inputs, accepted, queued, {pk: totals[pk] for pk in sorted(
                {pk for _, placement, _ in accepted for pk in _gpu_delta(inputs, placement)})})
    except IntegrityError:
        logger.warning("bulk admission refused by the database; admitting job by job")
        for job, placement, status in accepted:
            if _admit(inputs, job, placement, status):
                summary.admitted.append(job.pk)
            else:
                summary.conflicts.append(job.pk)
        return taken
    from .tasks import jobs_dispatch

    history = []
    for job, placement, status in accepted:
        pj = _placement_json(placement)
        job.state = JobState.STARTING
        history.append(SchedulingDecision(job=job, cluster_id=job.cluster_id,
                                          kind=DecisionKind.ADMITTED,
                                          reason=_admit_reason(placement)[:500], placement=pj))
        _audit_job("job.admitted", job, after={"placement": pj, "borrowing": status.borrowing})
        summary.admitted.append(job.pk)
    _record_all(history)
    if accepted:
        jobs_dispatch.delay_on_commit([job.pk for job, _, _ in accepted])
    return taken


def _gpu_delta(inputs: selectors.CycleInputs, placement: E.Placement) -> dict[int, list[int]]:
    """GPU id → [memory MiB, cores %, slices, exclusive] that ``placement`` adds."""
    delta: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for pp in placement.pods:
        for g in pp.gpus:
            d = delta[inputs.gpus[(pp.node, g.index)].pk]
            d[0] += g.gpu_memory_mib
            d[1] += g.gpu_cores_percent
            d[2] += 1
            d[3] = d[3] or int(g.exclusive)
    return delta


def _fits(row: tuple[Any, ...], total: list[Any], d: list[int]) -> bool:
    """Whether adding ``d`` to a GPU's ``total`` keeps the CHECK constraints of GpuDevice
    (``row`` holds its memory_mib and max_sharers at indices 4 and 5)."""
    sharers = total[2] + d[2]
    return (total[0] + d[0] <= row[4] and total[1] + d[1] <= 100 and sharers <= row[5]
            and not ((total[3] or d[3]) and sharers > 1))


def _write_admissions(inputs: selectors.CycleInputs, accepted: list[tuple[Job, E.Placement, JobStatus]],
                      attempts: dict[int, int], totals: dict[int, list[Any]]) -> None:
    """Jobs STARTING, their Allocation and GpuSlice rows, the GPUs' new totals: one
    statement per table. (Rows locked by the caller: ``attempts`` are current.)"""
    now = timezone.now()
    # Each job records its project's namespace at admission: the namespaces already assigned
    # in one query, the others assigned now (first admission of a project on this cluster).
    namespaces: dict[int, str] = {}
    if accepted:
        cluster = inputs.cluster or accepted[0][0].cluster
        namespaces = dict(ProjectNamespace.objects.filter(
            cluster=cluster, project_id__in={job.project_id for job, _, _ in accepted})
            .values_list("project_id", "name"))
    for job, _, _ in accepted:
        if job.project_id not in namespaces:
            namespaces[job.project_id] = project_namespace_ensure(
                cluster=inputs.cluster or job.cluster, project=job.project)
    # Admission times follow the engine's order (a microsecond apart), as they did when jobs
    # were admitted one by one: preemption picks the most recently started victims first.
    _update_from_values(
        Job, [("state", "varchar"), ("admitted_at", "timestamptz"), ("reason", "varchar"),
              ("reason_kind", "varchar"), ("queue_position", "integer"),
              ("queue_length", "integer"), ("attempts", "integer"), ("namespace", "varchar")],
        [(job.pk, JobState.STARTING.value, now + dt.timedelta(microseconds=i), "Admitted; creating pods",
          status.kind, None, None, attempts[job.pk] + 1, namespaces[job.project_id])
         for i, (job, _, status) in enumerate(accepted)])
    allocs: list[tuple[Allocation, E.PodPlacement]] = []
    for job, placement, _ in accepted:
        groups = inputs.groups[job.pk]
        for pp in placement.pods:
            group_name, replica = pp.pod[len(f"{job.pk}-"):].rsplit("-", 1)
            allocs.append((Allocation(
                cluster_id=job.cluster_id, job=job, group_id=groups[group_name], replica=int(replica),
                pod_name=pod_name(job.name, job.pk, group_name, int(replica)),
                node_id=inputs.nodes[pp.node], cpu_millicores=pp.cpu_millicores, ram_mib=pp.ram_mib,
            ), pp))
    Allocation.objects.bulk_create([a for a, _ in allocs], batch_size=2000)
    GpuSlice.objects.bulk_create([
        GpuSlice(allocation=a, gpu_id=inputs.gpus[(pp.node, g.index)].pk, container=g.container,
                 memory_mib=g.gpu_memory_mib, cores_percent=g.gpu_cores_percent, exclusive=g.exclusive)
        for a, pp in allocs for g in pp.gpus], batch_size=2000)
    # Refuses (IntegrityError) rather than over-allocate: the CHECK constraints.
    _update_from_values(GpuDevice, [("memory_allocated_mib", "integer"), ("cores_allocated", "integer"),
                                    ("sharers", "integer"), ("exclusive_held", "boolean")],
                        [(pk, *t) for pk, t in totals.items()])


def _admit(inputs: selectors.CycleInputs, job: Job, placement: E.Placement, status: JobStatus) -> bool:
    """Persist an admission: job STARTING, allocation rows, GPU totals. All or nothing.
    The fallback of ``_admit_all``, one job at a time."""
    groups = inputs.groups[job.pk]
    now = timezone.now()
    try:
        with transaction.atomic():
            namespace = project_namespace_ensure(cluster=inputs.cluster or job.cluster,
                                                 project=job.project)
            if not Job.objects.filter(pk=job.pk, state=JobState.QUEUED).update(
                state=JobState.STARTING, admitted_at=now, reason="Admitted; creating pods",
                namespace=namespace,
                reason_kind=status.kind, queue_position=None, queue_length=None,
                attempts=F("attempts") + 1,
            ):
                return False  # cancelled meanwhile
            gpu_delta: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
            for pp in placement.pods:
                group_name, replica = pp.pod[len(f"{job.pk}-"):].rsplit("-", 1)
                alloc = Allocation.objects.create(
                    cluster_id=job.cluster_id, job=job, group_id=groups[group_name], replica=int(replica),
                    pod_name=pod_name(job.name, job.pk, group_name, int(replica)),
                    node_id=inputs.nodes[pp.node], cpu_millicores=pp.cpu_millicores, ram_mib=pp.ram_mib,
                )
                for g in pp.gpus:
                    gpu = inputs.gpus[(pp.node, g.index)]
                    GpuSlice.objects.create(allocation=alloc, gpu_id=gpu.pk, container=g.container,
                                            memory_mib=g.gpu_memory_mib,
                                            cores_percent=g.gpu_cores_percent, exclusive=g.exclusive)
                    delta = gpu_delta[gpu.pk]
                    delta[0] += g.gpu_memory_mib
                    delta[1] += g.gpu_cores_percent
                    delta[2] += 1
                    delta[3] = delta[3] or int(g.exclusive)
            for gpu_id in sorted(gpu_delta):  # one order everywhere: no deadlocks between cycles
                mem, cores, n, excl = gpu_delta[gpu_id]
                changes: dict[str, Any] = {
                    "memory_allocated_mib": F("memory_allocated_mib") + mem,
                    "cores_allocated": F("cores_allocated") + cores,
                    "sharers": F("sharers") + n,
                }
                if excl:
                    changes["exclusive_held"] = True
                # Refuses (IntegrityError) rather than over-allocate: the CHECK constraints.
                GpuDevice.objects.filter(pk=gpu_id).update(**changes)
    except IntegrityError:
        logger.warning("admission of job %s refused by the database; it stays queued", job.pk)
        _wait(job, "Its placement was taken concurrently; retrying in the next cycle",
              "capacity", None, None)
        return False
    job.state = JobState.STARTING
    _record(job, DecisionKind.ADMITTED, _admit_reason(placement), placement=_placement_json(placement))
    _audit_job("job.admitted", job, after={"placement": _placement_json(placement),
                                          "borrowing": status.borrowing})
    from .tasks import job_dispatch

    job_dispatch.delay_on_commit(job.pk)
    return True


def _admit_reason(placement: E.Placement) -> str:
    nodes = sorted(set(placement.nodes()))
    gpus = sum(len(pp.gpus) for pp in placement.pods)
    return f"Admitted: {len(placement.pods)} pod(s) on {', '.join(nodes)} with {gpus} GPU slice(s)"


def _preempted_reason(victim: Job, preemptor: Job | None) -> str:
    """Why ``victim`` was preempted, as everyone who may see the victim reads it (its reason,
    its decisions, live pages). The preemptor is named only when it is in the victim's
    project: a job's readers may not see other projects' jobs, never other tenants'. Else
    the kind of eviction: a higher priority, or a guarantee reclaimed (the engine's two
    eligibility rules, ``engine.preemption.may_preempt``)."""
    if preemptor is None:
        return "Preempted"
    if preemptor.project_id == victim.project_id:
        return f"Preempted by job {preemptor.name} (#{preemptor.pk}, priority {preemptor.priority_class})"
    whose = "another project" if preemptor.tenant_id == victim.tenant_id else "another tenant"
    if preemptor.priority > victim.priority:
        return f"Preempted by a higher-priority job of {whose}"
    return (f"Preempted: the capacity it borrowed was reclaimed by the owner of the guaranteed "
            f"capacity ({whose})")


def _preempt_all(inputs: selectors.CycleInputs, jobs: dict[int, Job],
                 preemptions: list[tuple[Job, E.Preempt]], summary: CycleSummary,
                 locked: _Locked) -> list[Job]:
    """Mark the victims PREEMPTING (their pods are deleted after commit); each preemptor
    waits, out of the queue, until its victims' resources are actually released. Reasons and
    audit events name jobs of other projects / tenants only by count (``_preempted_reason``);
    the decision rows keep the ids, shown only to those who may see those jobs.

    In bulk (issue 13: at ~90 % allocation a cycle starts hundreds of preemptions, and job by
    job that was about five statements a victim): one guarded update of the victims (only
    jobs still STARTING or RUNNING: a victim that finished meanwhile is not preempted, and a
    victim is claimed by the first preemptor that names it, as row by row), one of the
    preemptors (only jobs still QUEUED), their history rows in one insert, one stop task.

    Checked first, like admissions, against the rows ``_lock_rows`` locked: a preemptor no
    longer QUEUED (cancelled meanwhile) is skipped, and one whose planned GPUs' totals moved
    since the snapshot (taken by another job, or by another scheduler's pods) evicts nobody
    and is returned, to wait ("placement taken concurrently"): its victims are not killed
    for room it could not use."""
    if not preemptions:
        return []
    taken: list[Job] = []
    going: list[tuple[Job, E.Preempt]] = []
    for job, d in preemptions:
        if locked.jobs.get(job.pk, ("", 0))[0] != JobState.QUEUED:
            summary.conflicts.append(job.pk)  # cancelled meanwhile
        elif _placement_gpus(inputs, d.placement) & locked.moved:
            logger.warning("preemption by job %s: its GPUs moved since the snapshot; it waits", job.pk)
            summary.conflicts.append(job.pk)
            taken.append(job)
        else:
            going.append((job, d))
    preemptions = going
    if not preemptions:
        return taken
    claimed: dict[int, tuple[Job, Job, str]] = {}
    for job, d in preemptions:
        for v in d.victims:
            victim = jobs.get(int(v))
            if victim is not None and victim.pk not in claimed:  # None: gone since the snapshot
                claimed[victim.pk] = (victim, job, _preempted_reason(victim, job))
    updated = _update_from_values(
        Job, [("state", "varchar"), ("preempted_by_id", "bigint"), ("reason", "varchar")],
        [(pk, JobState.PREEMPTING.value, job.pk, reason) for pk, (_, job, reason) in claimed.items()],
        where=("state", [JobState.STARTING.value, JobState.RUNNING.value]))
    history: list[SchedulingDecision] = []
    evicted: dict[int, list[Job]] = defaultdict(list)
    for pk, (victim, job, reason) in claimed.items():
        if pk not in updated:
            continue
        evicted[job.pk].append(victim)
        history.append(SchedulingDecision(job_id=pk, cluster_id=victim.cluster_id,
                                          kind=DecisionKind.PREEMPTED, reason=reason[:500],
                                          preemptor_id=job.pk))
        same_tenant = job.tenant_id == victim.tenant_id
        _audit_job("job.preempted", victim, after={
            "preemptor": job.pk if same_tenant else None, "reason": reason,
            "checkpoint_capable": victim.checkpoint_capable})
    waiting: list[tuple[int, str, str, None, None]] = []
    for job, d in preemptions:
        mine = evicted.get(job.pk, [])
        named = [f"#{v.pk}" for v in mine if v.project_id == job.project_id]
        elsewhere = len(mine) - len(named)
        listed = ", ".join(named + ([f"{elsewhere} of other projects or tenants"] if elsewhere else []))
        reason = f"Preempting {len(mine)} job(s) ({listed}); starts once their resources are released"
        waiting.append((job.pk, reason, "preempting", None, None))
        history.append(SchedulingDecision(job_id=job.pk, cluster_id=job.cluster_id,
                                          kind=DecisionKind.PREEMPTING, reason=reason[:500],
                                          victims=[v.pk for v in mine],
                                          placement=_placement_json(d.placement)))
        _audit_job("job.preempting", job, after={
            "victims": [v.pk for v in mine if v.tenant_id == job.tenant_id],
            "victims_of_other_tenants": sum(v.tenant_id != job.tenant_id for v in mine)})
        summary.preempting.append(job.pk)
        summary.victims.extend(v.pk for v in mine)
    _update_from_values(
        Job, [("reason", "varchar"), ("reason_kind", "varchar"), ("queue_position", "integer"),
              ("queue_length", "integer")], waiting, where=("state", JobState.QUEUED.value))
    _record_all(history)
    stopped = sorted(pk for pk in claimed if pk in updated)
    if stopped:
        from .tasks import jobs_stop

        _send_after_commit(jobs_stop, stopped)
    return taken


# --- release -------------------------------------------------------------------------------


def _release(job: Job) -> int:
    """Give back everything the job holds (call inside a transaction with the job locked)."""
    allocs = list(Allocation.objects.select_for_update(no_key=True).filter(job=job).order_by("pk"))
    if not allocs:
        return 0
    delta: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for s in GpuSlice.objects.filter(allocation__in=allocs):
        d = delta[s.gpu_id]
        d[0] += s.memory_mib
        d[1] += s.cores_percent
        d[2] += 1
        d[3] = d[3] or int(s.exclusive)
    for gpu_id in sorted(delta):
        mem, cores, n, excl = delta[gpu_id]
        changes: dict[str, Any] = {
            "memory_allocated_mib": F("memory_allocated_mib") - mem,
            "cores_allocated": F("cores_allocated") - cores,
            "sharers": F("sharers") - n,
        }
        if excl:
            changes["exclusive_held"] = False
        GpuDevice.objects.filter(pk=gpu_id).update(**changes)
    Allocation.objects.filter(pk__in=[a.pk for a in allocs]).delete()
    return len(allocs)


# --- dispatch ------------------------------------------------------------------------------


def project_namespace_ensure(*, cluster: Cluster, project: Project) -> str:
    """The project's namespace on ``cluster``, stored on first use (``ProjectNamespace``):
    ``naming.namespace_name`` (id-based, unique by construction), and should that name be
    taken anyway (a namespace kept from before, ``0005_i11b``), one with a numbered suffix.
    The unique constraint is the check: two projects never get one namespace."""
    row = ProjectNamespace.objects.filter(cluster=cluster, project=project).first()
    if row is not None:
        return row.name
    base = namespace_name(cluster.namespace_prefix, project.pk, project.name)
    for n in range(10):
        name = base if n == 0 else namespace_name(cluster.namespace_prefix, project.pk, f"{n}")
        try:
            with transaction.atomic():
                row = ProjectNamespace.objects.create(cluster=cluster, project=project, name=name)
                audit_record(actor=None, actor_username=SCHEDULER, action="namespace.assigned",
                             target=row, tenant=project.tenant, project=project,
                             after={"cluster": cluster.name, "namespace": name})
                return row.name
        except IntegrityError:
            row = ProjectNamespace.objects.filter(cluster=cluster, project=project).first()
            if row is not None:  # created concurrently for this project
                return row.name
    raise ValidationError({"namespace": [f"No free namespace name for project {project.name}."]})


def namespace_spec(job: Job, cluster: Cluster) -> NamespaceSpec:
    project = job.project
    labels = {MANAGED_BY: "camp", LABEL_TENANT: project.tenant.name, LABEL_PROJECT: project.name,
              LABEL_PROJECT_ID: str(project.pk)}
    quota: dict[str, str] = {}
    q = Quota.objects.filter(scope=QuotaScope.PROJECT, project=project).first()
    if q is not None:
        # A backstop mirroring the project's limits; Camp's own quota check comes first.
        if q.gpu_memory_mib_limit is not None:
            quota["requests.nvidia.com/gpumem"] = str(q.gpu_memory_mib_limit)
        if q.cpu_cores_limit is not None:
            quota["requests.cpu"] = str(q.cpu_cores_limit.normalize())
        if q.ram_mib_limit is not None:
            quota["requests.memory"] = f"{q.ram_mib_limit}Mi"
        if q.gpus_limit is not None:
            # nvidia.com/gpu counts vGPU devices (slices), at most max sharers per card.
            quota["requests.nvidia.com/gpu"] = str(math.ceil(q.gpus_limit) * 10)
    # A job admitted before namespaces were stored keeps the one its pods are in.
    name = job.namespace or selectors.project_namespace_name(cluster=cluster, project=project)
    return NamespaceSpec(name=name, labels=labels, quota=quota)


def job_specs(job: Job, cluster: Cluster) -> tuple[NamespaceSpec, JobObjects, list[PodSpec]]:
    """Everything to create for an admitted job, derived only from rows (deterministic)."""
    ns = namespace_spec(job, cluster)
    owner = job_object_name(job.name, job.pk)
    base_labels = {MANAGED_BY: "camp", LABEL_TENANT: job.tenant.name, LABEL_PROJECT: job.project.name,
                   LABEL_JOB: job.name[:63], LABEL_JOB_ID: str(job.pk)}
    allocs = list(job.allocations.select_related("group", "node").prefetch_related("slices__gpu")
                  .order_by("group_id", "replica"))
    distributed = len(allocs) > 1
    world = len(allocs)
    master = f"{allocs[0].pod_name}.{owner}.{ns.name}.svc" if allocs else ""
    pods: list[PodSpec] = []
    hostfile = []
    for rank, a in enumerate(allocs):
        g = a.group
        env = {str(k): str(v) for k, v in (g.env or {}).items()}
        env.update({"CAMP_JOB": job.name, "CAMP_JOB_ID": str(job.pk), "CAMP_ROLE": g.name,
                    "CAMP_ATTEMPT": str(job.attempts)})
        if job.checkpoint_capable and job.last_checkpoint:
            env["CAMP_RESUME_FROM"] = job.last_checkpoint
        if distributed:
            env.update({"MASTER_ADDR": master, "MASTER_PORT": "29500", "WORLD_SIZE": str(world),
                        "RANK": str(rank), "NODE_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": str(max(1, g.gpu_count))})
        slices = tuple(
            SliceSpec(uuid=s.gpu.uuid, vendor=s.gpu.vendor,
                      memory_mib=s.memory_mib, cores_percent=s.cores_percent, container=s.container)
            for s in sorted(a.slices.all(), key=lambda s: (s.container, s.gpu.index))
        )
        if g.name != MPI_LAUNCHER:  # mpirun runs on the launcher; ranks go to the workers
            hostfile.append(f"{a.pod_name}.{owner}.{ns.name}.svc slots={max(1, g.gpu_count)}")
        pods.append(PodSpec(
            name=a.pod_name, namespace=ns.name, node=a.node.name, image=g.image,
            command=tuple(str(c) for c in (g.command or [])), env=env,
            labels={**base_labels, LABEL_ROLE: g.name, LABEL_REPLICA: str(a.replica)},
            cpu_millicores=a.cpu_millicores, ram_mib=a.ram_mib, slices=slices, owner=owner,
            subdomain=owner if distributed else "", duration_seconds=job.duration_seconds,
        ))
    data = {"job": job.name, "job-id": str(job.pk)}
    if job.kind == "mpi":
        data["hostfile"] = "\n".join(hostfile) + "\n"
    objs = JobObjects(name=owner, namespace=ns.name, labels=base_labels, data=data,
                      headless_service=distributed)
    # Workloads (workspaces/) add ports, volumes, pull secrets and objects (scheduling/extensions.py).
    objs, pods = apply_job_spec_hooks(job, ns, objs, pods)
    return ns, objs, pods


MPI_LAUNCHER = "launcher"
"""The pod group of an MPI job that runs ``mpirun`` (left out of the hostfile)."""


@contextlib.contextmanager
def _dispatching(job_id: int) -> Iterator[None]:
    """Mark a dispatch of ``job_id`` in flight, waiting for one already in flight (or for a
    release being committed, ``_dispatch_in_flight``). PostgreSQL: a session-level advisory
    lock (released here, or when a killed worker's connection drops); SQLite (the demo): an
    exclusive file lock."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [_DISPATCH_LOCK_CLASS, job_id])
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_DISPATCH_LOCK_CLASS, job_id])
        return
    with open(_dispatch_lock_path(job_id), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _dispatch_in_flight(job_id: int) -> bool:
    """Whether another worker is creating the job's pods right now. Call inside the
    transaction that would release the job's resources: on PostgreSQL the lock taken here
    is held until that transaction ends, so a dispatch starting meanwhile waits for the
    release and then sees the job's new state. (The same session's own dispatch, which
    holds the lock, is not "another": advisory locks are re-entrant per session.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_DISPATCH_LOCK_CLASS, job_id])
            row = cursor.fetchone()
        return not (row and row[0])
    with open(_dispatch_lock_path(job_id), "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _dispatch_lock_path(job_id: int) -> Any:
    lock_dir = settings.BASE_DIR / "var" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    return lock_dir / f"dispatch-{job_id}.lock"


def job_dispatch(*, job_id: int, final_attempt: bool = True) -> str:
    """Create the job's namespace, owner object, service and pods (idempotent).

    Retryable backend errors propagate when ``final_attempt`` is False (the task retries
    with backoff); otherwise a failure removes every pod already created (all or nothing)
    and requeues the job with the error as its reason, or fails it after MAX_ATTEMPTS.

    Race with a stop (cancel, preemption, eviction): while the pods are being created the
    dispatch is marked in flight, and a stop that finds no pods then does not release the
    job's resources (``_pods_gone``), since pods may be about to appear on those GPUs.
    Once the pods exist, the job's state is checked again under its row lock; if it left
    STARTING meanwhile the dispatch is "aborted" and stops the job itself (pods deleted,
    resources released once they are gone), so GPUs are never free in the database while
    pods run on them."""
    with _dispatching(job_id):
        outcome = _dispatch(job_id, final_attempt)
    if outcome == "aborted":
        job_stop(job_id=job_id)
    return outcome


def _dispatch(job_id: int, final_attempt: bool) -> str:
    job = Job.objects.select_related("tenant", "project", "cluster").get(pk=job_id)
    if job.state != JobState.STARTING:
        return "skipped"
    cluster = job.cluster
    backend = backend_for(cluster)
    ns, objs, pods = job_specs(job, cluster)
    try:
        backend.ensure_namespace(ns)
        backend.ensure_job_objects(objs)
        for spec in pods:
            backend.create_pod(spec)
    except BackendError as exc:
        if Job.objects.filter(pk=job_id, state=JobState.RUNNING).exists():
            # A redundant dispatch (redelivered after a worker died, or re-requested by
            # reconcile) of a job whose pods all run: its failure harms nothing, and
            # cleaning up would kill a healthy job.
            return "running"
        if exc.retryable and not final_attempt:
            raise
        for spec in pods:
            with contextlib.suppress(BackendError):
                backend.delete_pod(spec.namespace, spec.name, grace_seconds=0)
        with contextlib.suppress(BackendError):
            backend.delete_job_objects(objs.namespace, objs.name)
        return "failed" if _dispatch_failed(job_id, str(exc)) else "aborted"
    with transaction.atomic():
        current = Job.objects.select_for_update(no_key=True).only("state").get(pk=job_id)
        if current.state == JobState.RUNNING:
            # Its pods were created (by this or an earlier dispatch) and all run: the watch
            # saw them start while this one was still going. Nothing to undo.
            Allocation.objects.filter(job_id=job_id, phase=PodPhase.PENDING).update(
                phase=PodPhase.CREATED)
            return "running"
        if current.state != JobState.STARTING:
            return "aborted"  # stopped while its pods were being created
        Allocation.objects.filter(job_id=job_id, phase=PodPhase.PENDING).update(phase=PodPhase.CREATED)
    return "created"


def _dispatch_failed(job_id: int, message: str) -> bool:
    """Release and requeue (or fail) a job whose pods could not be created; False if the
    job had already left STARTING (its stop then takes over)."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state != JobState.STARTING:
            return False
        _release(job)
        reason = f"Could not create its pods: {message}"[:500]
        signals.dispatch_failed.send_robust(sender=Job, cluster_id=job.cluster_id, job_id=job.pk,
                                            message=message)
        if job.attempts >= MAX_ATTEMPTS:
            _finish(job, JobState.FAILED, reason)
            _record(job, DecisionKind.FAILED, reason)
            _audit_job("job.failed", job, after={"reason": reason})
        else:
            job.state = JobState.QUEUED
            job.reason = reason + "; requeued"
            job.save(update_fields=["state", "reason", "updated_at"])
            _record(job, DecisionKind.REQUEUED, job.reason)
            _audit_job("job.requeued", job, after={"reason": reason})
        request_cycle(job.cluster_id, countdown=2)
    return True


def job_stop(*, job_id: int) -> str:
    """Delete a job's pods (with a grace period) and release its resources once gone."""
    job = Job.objects.select_related("tenant", "project", "cluster").get(pk=job_id)
    backend = backend_for(job.cluster)
    allocs = list(job.allocations.select_related("node"))
    names = [a.pod_name for a in allocs]
    if not names:
        return "nothing"
    ns = namespace_spec(job, job.cluster).name
    dead = _on_dead_nodes(allocs)
    for name in names:
        backend.delete_pod(ns, name, grace_seconds=0 if name in dead else 30)
    remaining = ({p.name for p in backend.list_pods()} & set(names)) - dead
    if remaining or not _pods_gone(job_id):
        # The reconcile task releases once the pods are gone (or the dispatch in flight,
        # finding the job stopped, stops it again).
        return "waiting"
    return "released"


def _on_dead_nodes(allocs: list[Allocation]) -> set[str]:
    """Pods on a node that is NotReady or gone: its kubelet cannot confirm their end, so they
    are force-deleted and count as gone (Kubernetes' pod garbage collector makes the same
    call for lost nodes); waiting for them would leave the job stuck."""
    return {a.pod_name for a in allocs if not a.node.ready or not a.node.present}


def _pods_gone(job_id: int) -> bool:
    """The job's pods are gone: release, and requeue a preempted job or end a finished one.

    Not while another worker is dispatching the job (False): pods it is creating would run
    on GPUs the database shows free (``job_dispatch`` stops the job again when it ends)."""
    with transaction.atomic():
        if _dispatch_in_flight(job_id):
            return False
        job = _locked_job(job_id)
        released = _release(job)
        if job.state == JobState.PREEMPTING:
            preemptor = job.preempted_by
            job.state = JobState.QUEUED
            note = " (resumes from its latest checkpoint)" if job.checkpoint_capable else ""
            job.reason = (f"{_preempted_reason(job, preemptor)}; requeued{note}" if preemptor
                          else job.reason.replace("Rescheduling", "Requeued") + note)[:500]
            job.preempted_by = None
            job.started_at = None
            job.save(update_fields=["state", "reason", "preempted_by", "started_at", "updated_at"])
            _record(job, DecisionKind.REQUEUED, job.reason, preemptor=preemptor)
            _audit_job("job.requeued", job, after={"reason": job.reason})
        elif job.state in ACTIVE_STATES:
            # Pods vanished under a starting/running job: lost. Checkpointed jobs resume.
            if job.checkpoint_capable and job.attempts < MAX_ATTEMPTS:
                job.state = JobState.QUEUED
                job.reason = "Its pods were lost; requeued (resumes from its latest checkpoint)"
                job.started_at = None
                job.save(update_fields=["state", "reason", "started_at", "updated_at"])
                _record(job, DecisionKind.REQUEUED, job.reason)
            else:
                _finish(job, JobState.FAILED, "Its pods disappeared from the cluster")
                _record(job, DecisionKind.FAILED, job.reason)
                _audit_job("job.failed", job, after={"reason": job.reason})
        if released:
            request_cycle(job.cluster_id)
    if released:
        _job_objects_delete(job)
    return True


def _job_objects_delete(job: Job) -> None:
    """The job's pods are gone: delete its ConfigMap, headless Service and owned extras
    (a requeued job's next dispatch makes them again, for its new placement). Best effort:
    reconcile deletes what is left (``_sweep_job_objects``)."""
    try:
        backend_for(job.cluster).delete_job_objects(namespace_spec(job, job.cluster).name,
                                                    job_object_name(job.name, job.pk))
    except BackendError as exc:
        logger.info("job %s: its objects are left for reconcile: %s", job.pk, exc)


OBJECT_SWEEP_SECONDS = 60


def _sweep_job_objects(backend: Any, cluster: Cluster, result: ReconcileResult) -> None:
    """Per-job objects of jobs that hold nothing (ended, requeued or deleted) are deleted:
    what ``_job_objects_delete`` could not (a crash, an unreachable API server). At most
    once a minute per cluster (one list call)."""
    if not cache.add(f"camp:objects-swept:{cluster.pk}", 1, timeout=OBJECT_SWEEP_SECONDS):
        return
    found = backend.list_job_objects()
    if not found:
        return
    holding = set(Allocation.objects.filter(job_id__in={j for _, _, j in found}).values_list(
        "job_id", flat=True))
    starting = set(Job.objects.filter(pk__in={j for _, _, j in found},
                                      state=JobState.STARTING).values_list("pk", flat=True))
    for namespace, name, job_id in found:
        if job_id in holding or job_id in starting:
            continue
        with contextlib.suppress(BackendError):
            backend.delete_job_objects(namespace, name)
            result.objects_deleted.append(name)


# --- reconcile -----------------------------------------------------------------------------


# How long an admitted job may miss pods before reconcile asks for its dispatch again (when
# no dispatch of it is running). Short: a duplicate dispatch is harmless (idempotent).
DISPATCH_GRACE_SECONDS = 5


@dataclass
class ReconcileResult:
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    redispatched: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    objects_deleted: list[str] = field(default_factory=list)


# Reachability: a cluster whose API server fails is skipped by the periodic ticks until its
# ``retry_at``: 2, 4, 8 ... seconds after each failure, at most this long.
MAX_RETRY_SECONDS = 300
PROBE_TIMEOUT_SECONDS = (5.0, 30.0)
"""Reconcile's one attempt per tick: connect within 5 s (a dead server), read within 30 s
(listing a large cluster's pods takes a while)."""


def cluster_reachability_record(*, cluster_id: int, error: str | None) -> None:
    """Record a reconcile's outcome for the cluster's backoff: ``error`` None means it
    answered. The first failure and the recovery are audited (the system as actor); the
    cluster page and /metrics show the state."""
    now = timezone.now()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster_id)
        if error is None:
            if cluster.unreachable_since is None and not cluster.failures:
                return
            down_for = (now - cluster.unreachable_since).total_seconds() if cluster.unreachable_since else 0
            Cluster.objects.filter(pk=cluster_id).update(
                unreachable_since=None, retry_at=None, failures=0, last_error="")
            audit_record(actor=None, actor_username=SCHEDULER, action="cluster.reachable",
                         target=cluster, before={"failures": cluster.failures},
                         after={"unreachable_seconds": round(down_for)})
            return
        failures = cluster.failures + 1
        wait = min(2 ** failures, MAX_RETRY_SECONDS)
        Cluster.objects.filter(pk=cluster_id).update(
            failures=failures, retry_at=now + dt.timedelta(seconds=wait),
            unreachable_since=cluster.unreachable_since or now, last_error=error[:500])
        if cluster.unreachable_since is None:
            audit_record(actor=None, actor_username=SCHEDULER, action="cluster.unreachable",
                         target=cluster, after={"error": error[:500]})


def cluster_due(cluster: Cluster, now: dt.datetime | None = None) -> bool:
    """Whether the periodic ticks may talk to the cluster now (not backing off)."""
    return cluster.retry_at is None or cluster.retry_at <= (now or timezone.now())


def cluster_reconcile(*, cluster: Cluster, pods: list[PodStatus] | None = None,
                      backend: Any = None) -> ReconcileResult:
    """Converge the database and the cluster (after events, crashes or lost events).

    Rules: pod phases map to job states (all running → Running; all succeeded →
    Succeeded; any failed → Failed); a job whose pods are gone releases its resources
    (preempted ones are requeued); an admitted job whose pods were never created gets
    them (re)created; pods that belong to no admitted job (orphans) are deleted."""
    backend = backend or backend_for(cluster)
    if pods is None:
        pods = backend.list_pods()
    by_name = {p.name: p for p in pods}
    result = ReconcileResult()
    allocs: dict[int, list[Allocation]] = defaultdict(list)
    for a in Allocation.objects.filter(cluster=cluster).select_related("job", "node"):
        allocs[a.job_id].append(a)
    known = {a.pod_name for rows in allocs.values() for a in rows}
    for job_id, rows in allocs.items():
        _reconcile_job(backend, job_id, rows, by_name, result)
    for p in pods:
        if p.name not in known and p.labels.get(MANAGED_BY) == "camp" and not p.deleting:
            with contextlib.suppress(BackendError):
                backend.delete_pod(p.namespace, p.name, grace_seconds=30)
            result.orphans_deleted.append(p.name)
    _sweep_job_objects(backend, cluster, result)
    return result


def _reconcile_job(backend: Any, job_id: int, rows: list[Allocation], pods: dict[str, PodStatus],
                   result: ReconcileResult, *, complete: bool = True, deleted: str = "") -> None:
    """The reconcile rules for one job. ``complete``: ``pods`` is a full list of the cluster's
    pods (a pod missing from it is gone); else it is the watcher's partial view, where only
    ``deleted`` (the pod of a DELETED event) is known to be gone."""
    if not rows:
        return  # released meanwhile (another worker, an eviction): nothing left to converge
    job = rows[0].job
    present = [pods[a.pod_name] for a in rows if a.pod_name in pods]
    phases = [p.phase for p in present]
    if job.state in FINAL_STATES or job.state == JobState.PREEMPTING:
        dead = _on_dead_nodes(rows)
        for p in present:
            if p.name in dead:
                with contextlib.suppress(BackendError):
                    backend.delete_pod(p.namespace, p.name, grace_seconds=0)
        present = [p for p in present if p.name not in dead]
        live = [p for p in present if p.phase in ("Pending", "Running")]
        if not present or (job.state in FINAL_STATES and not live):
            # Finished pods hold nothing; clean them up and give the resources back.
            for p in present:
                with contextlib.suppress(BackendError):
                    backend.delete_pod(p.namespace, p.name, grace_seconds=0)
            if _pods_gone(job_id):
                result.released.append(job_id)
        else:
            for p in present:
                if not p.deleting:
                    with contextlib.suppress(BackendError):
                        backend.delete_pod(p.namespace, p.name, grace_seconds=30)
        return
    # STARTING / RUNNING
    _update_phases(rows, pods)
    if "Failed" in phases:
        failed = next(p for p in present if p.phase == "Failed")
        detail = f": {failed.message}" if failed.message else ""
        _end(job_id, JobState.FAILED, f"Pod {failed.name} failed{detail}")
        result.finished.append(job_id)
        _stop_after_commit_now(job_id)
        return
    if len(present) == len(rows) and all(ph == "Succeeded" for ph in phases):
        _end(job_id, JobState.SUCCEEDED, "All pods succeeded")
        result.finished.append(job_id)
        _stop_after_commit_now(job_id)
        return
    if job.state == JobState.RUNNING and not present:
        if _pods_gone(job_id):
            result.released.append(job_id)
        return
    # A pod that was created and then vanished (deleted, or being deleted: its node drained,
    # someone ran kubectl delete) is lost. The job's other pods cannot go on without it
    # (a gang's ranks wait on each other), so the whole job restarts (or ends).
    # Only pods known to have existed: all of a running job's, or one seen running (a list
    # taken just before a dispatch finished does not show its new pods yet).
    seen = [a for a in rows if job.state == JobState.RUNNING or a.phase in (
        PodPhase.RUNNING, PodPhase.SUCCEEDED) or a.pod_name == deleted]
    lost = sorted(a.pod_name for a in seen if (
        (a.pod_name in pods and pods[a.pod_name].deleting)
        or (a.pod_name not in pods and (complete or a.pod_name == deleted))))
    if lost:
        if _job_lost_pod(job_id, lost[0]):
            result.lost.append(job_id)
        return
    if len(present) < len(rows):
        admitted = job.admitted_at or timezone.now()
        if job.state == JobState.STARTING and complete and timezone.now() - admitted > dt.timedelta(
                seconds=DISPATCH_GRACE_SECONDS) and _dispatch_lost(job_id):
            # Admitted but pods missing and no dispatch running: it was lost with a killed
            # worker (its Redis message only comes back after the visibility timeout).
            from .tasks import job_dispatch

            job_dispatch.delay(job_id)
            result.redispatched.append(job_id)
        return
    if job.state == JobState.STARTING and all(ph in ("Running", "Succeeded") for ph in phases):
        with transaction.atomic():
            if Job.objects.filter(pk=job_id, state=JobState.STARTING).update(
                state=JobState.RUNNING, started_at=timezone.now(), reason="Running",
                reason_kind="",
            ):
                fresh = Job.objects.get(pk=job_id)
                _record(fresh, DecisionKind.STARTED, "All pods are running")
                result.started.append(job_id)


def _dispatch_lost(job_id: int) -> bool:
    """No dispatch of the job is running now (its advisory lock is free) and none was
    re-requested in the last ``DISPATCH_GRACE_SECONDS`` (requests coalesce)."""
    with transaction.atomic():
        if _dispatch_in_flight(job_id):
            return False
    return bool(cache.add(f"camp:dispatch-requested:{job_id}", 1, timeout=DISPATCH_GRACE_SECONDS))


def _job_lost_pod(job_id: int, pod: str) -> bool:
    """A pod of a starting/running job is gone: restart the whole job (requeued; a
    checkpoint-capable one resumes from its latest checkpoint), or fail it once it has used
    its ``MAX_ATTEMPTS``. Its other pods are deleted and its resources released."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return False
        what = f"pod {pod} was lost (deleted or evicted from its node)"
        if job.attempts >= MAX_ATTEMPTS:
            _finish(job, JobState.FAILED, f"{what[0].upper()}{what[1:]}; failed after "
                                          f"{job.attempts} attempts")
            _record(job, DecisionKind.FAILED, job.reason)
            _audit_job("job.failed", job, after={"reason": job.reason})
            _stop_after_commit(job.pk)
            return True
    return job_evict(job_id=job_id, reason=f"{what}; restarting all its pods")


def pod_event_apply(*, cluster: Cluster, pod_name: str, pods: dict[str, PodStatus],
                    deleted: bool = False) -> str:
    """Apply one watched pod event: the reconcile rules, for the one job the pod belongs to.

    ``pods`` is the watcher's current view of the cluster's managed pods (by name) with the
    event already applied; ``deleted``: the event was DELETED (the pod is gone). A pod that
    belongs to no allocation is an orphan and deleted (the same rule as
    ``cluster_reconcile``). Returns what was done, for logging."""
    job_id = Allocation.objects.filter(cluster=cluster, pod_name=pod_name).values_list(
        "job_id", flat=True).first()
    if job_id is None:
        pod = pods.get(pod_name)
        if pod is None or pod.deleting or pod.labels.get(MANAGED_BY) != "camp":
            return "ignored"
        with contextlib.suppress(BackendError):
            backend_for(cluster).delete_pod(pod.namespace, pod.name, grace_seconds=30)
        return "orphan-deleted"
    # The job's allocations may be released between the two queries (an eviction or a stop
    # on another worker): then there is nothing left to converge (``_reconcile_job``).
    allocs = list(Allocation.objects.filter(job_id=job_id).select_related("job", "node"))
    result = ReconcileResult()
    _reconcile_job(backend_for(cluster), job_id, allocs, pods, result, complete=False,
                   deleted=pod_name if deleted else "")
    for name in ("started", "finished", "released", "lost", "redispatched"):
        if job_id in getattr(result, name):
            return name
    return "observed" if allocs else "released-meanwhile"


def _update_phases(rows: list[Allocation], pods: dict[str, PodStatus]) -> None:
    mapping = {"Pending": PodPhase.CREATED, "Running": PodPhase.RUNNING,
               "Succeeded": PodPhase.SUCCEEDED, "Failed": PodPhase.FAILED}
    for a in rows:
        p = pods.get(a.pod_name)
        phase = mapping.get(p.phase, PodPhase.CREATED) if p else (
            PodPhase.GONE if a.phase not in (PodPhase.PENDING,) else PodPhase.PENDING)
        if a.phase != phase:
            Allocation.objects.filter(pk=a.pk).update(phase=phase, message=(p.message if p else "")[:500])


def _end(job_id: int, state: str, reason: str) -> None:
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return
        _finish(job, state, reason)
        _record(job, DecisionKind.FINISHED if state == JobState.SUCCEEDED else DecisionKind.FAILED,
                reason)
        _audit_job("job.succeeded" if state == JobState.SUCCEEDED else "job.failed", job,
                   after={"reason": reason})


def _stop_after_commit_now(job_id: int) -> None:
    from .tasks import job_stop

    job_stop.delay(job_id)
