"""A cluster's inventory: nodes and GPUs synced from the backend, foreign pods' whole cards,
quarantine, and GPU utilization samples."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tenants import permissions
from tenants.audit import audit_record
from tenants.models import User

from .. import selectors
from ..backends import backend_for
from ..backends.base import (
    NodeInfo,
)
from ..models import (
    ACTIVE_STATES,
    Allocation,
    Cluster,
    GpuDevice,
    GpuSlice,
    Node,
    NodePool,
)
from .common import _require, logger, node_not_ready_toleration, not_ready_too_long, request_cycle
from .jobs import job_evict

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
        elif not_ready_too_long(n):
            # Kubernetes' rule (taint manager): a node merely NotReady or unreachable keeps its
            # pods for the toleration; a kubelet that is back within it never lost them.
            out.setdefault(a.job_id, f"node {n.name} is NotReady (for more than "
                                     f"{node_not_ready_toleration()} s)")
    for s in GpuSlice.objects.filter(
            allocation__cluster=cluster, allocation__job__state__in=ACTIVE_STATES).filter(
            Q(gpu__healthy=False) | Q(gpu__quarantined=True)).select_related(
            "gpu__node", "allocation").order_by("allocation__job_id", "pk"):
        out.setdefault(s.allocation.job_id, f"GPU {s.gpu.index} of node {s.gpu.node.name} is unhealthy")
    return out


_NODE_SYNCED = ("cpu_millicores", "ram_mib", "max_pods", "labels", "taints", "pool", "nvlink_islands",
                "ready", "not_ready_since", "cordoned", "present", "quarantined", "quarantine_reason")
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
    if info.ready:
        node.not_ready_since = None
    else:  # the cluster's own time of the change, else when Camp first saw it
        node.not_ready_since = info.not_ready_since or (
            None if node.ready else node.not_ready_since) or timezone.now()
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
        problems.append("node NotReady" + (f" ({info.not_ready_reason})" if info.not_ready_reason else ""))
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
    from ..backends.metrics import gpu_samples

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
