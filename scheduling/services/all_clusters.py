"""Quotas across all clusters (issue 16) in a cluster's cycle: the GPU limit, the GPU guarantee
and the GPU memory limits per GPU model class that tenant and project quotas may hold over
every cluster together (docs/ARCHITECTURE.md, "Quotas across all clusters").

Two places, as for the GPU limit before: the snapshot (``hold``: jobs that would cross a quota
across all clusters wait, said why, and are not offered to the engine; cards of a class over
its memory limit are closed to a job that may use others) and the admission, under the
per-tenant advisory lock (``admissible``: counted again with the other clusters' committed
admissions). The engine is unchanged: the guarantee reaches it through the queue tree
(``selectors.queue_tree``: the effective guarantee of each cluster).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable

from scheduling import engine as E
from scheduling.engine.cycle import JobStatus
from scheduling.engine.multicluster import (
    card_classes,
    job_gpus,
    job_memory,
    placement_memory,
    usable_classes,
    without_models,
)
from scheduling.engine.queueing import QueueTree
from tenants.models import Project, Quota, QuotaScope

from .. import selectors

EPS = 1e-9


def over_guarantee(limits: selectors.AllClusterLimits, use: selectors.AllClusterUse, cluster_id: int,
                   job: E.Job, ids: tuple[int, int], eff: dict[tuple[str, int], float],
                   ask: float, caps: dict[tuple[str, int], float] | None = None) -> str:
    """Why a non-preemptible job may not run here within its project's or tenant's guarantee
    across all clusters: its non-preemptible GPUs here + the ask go beyond the effective
    guarantee of this cluster. "" when within, when no such guarantee applies, or when the
    engine rejects it itself, rightly: it asks more than the effective guarantee (which the
    engine enforces when above 0) and more than the guarantee across all clusters or the
    per-cluster limit (``caps``), so it can never be within."""
    caps = caps or {}
    if job.preemptible or ask <= 0:
        return ""
    for level, key, g, who in (("project", ids[0], limits.project_guarantee.get(ids[0]), "project's"),
                               ("tenant", ids[1], limits.tenant_guarantee.get(ids[1]), "tenant's")):
        if not g:
            continue
        here = use.np_gpus.get((level, key, cluster_id), 0.0)
        room = eff.get((level, key), 0.0)
        never = ask > g + EPS or ask > caps.get((level, key), math.inf) + EPS
        if here + ask <= room + EPS or (room > 0 and ask > room + EPS and never):
            continue
        return (f"over your {who} GPU guarantee across all clusters for non-preemptible work: "
                f"{use.elsewhere(level, key, cluster_id):g} of {g:g} held on other clusters, "
                f"{here:g} non-preemptible here (it asks {ask:g}); mark it preemptible to borrow")
    return ""


def _tree_guarantees(tree: QueueTree, ids: dict[str, tuple[int, int]]
                     ) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """The effective guarantees and the GPU limits the cycle's tree carries, by
    ("project"|"tenant", id)."""
    tenant_ids = {q.split("/", 1)[0]: t for q, (_, t) in ids.items()}
    eff: dict[tuple[str, int], float] = {}
    caps: dict[tuple[str, int], float] = {}
    for t in tree.tenants:
        for key, quota in ([(("tenant", tenant_ids[t.name]), t.quota)] if t.name in tenant_ids else []) + [
                (("project", ids[p.name][0]), p.quota) for p in t.projects if p.name in ids]:
            eff[key] = float(quota.gpus_guaranteed)
            if quota.gpus_limit is not None:
                caps[key] = float(quota.gpus_limit)
    return eff, caps


@dataclasses.dataclass
class Held:
    statuses: list[JobStatus]
    closed: dict[str, str]
    """Job name → why some classes were closed to it: should the engine then reject it, it
    waits with this reason instead (those cards may open again)."""


def hold(inputs: selectors.CycleInputs, limits: selectors.AllClusterLimits,
         use: selectors.AllClusterUse) -> tuple[selectors.CycleInputs, Held]:
    """The snapshot's part (see the module's docstring)."""
    cid = inputs.cluster.pk if inputs.cluster is not None else 0
    in_use = use.as_in_use()
    ids = {j.queue: (inputs.jobs[j.name].project_id, inputs.jobs[j.name].tenant_id) for j in inputs.pending}
    eff, caps = _tree_guarantees(inputs.tree, ids)
    cards = card_classes(inputs.snapshot.nodes) if (limits.project_memory or limits.tenant_memory) else {}
    keep: list[E.Job] = []
    held = Held([], {})
    for job in inputs.pending:
        row = inputs.jobs[job.name]
        ask = job_gpus(job)
        reason = (selectors.over_all_clusters(limits, in_use, row.project_id, row.tenant_id, ask)
                  or over_guarantee(limits, use, cid, job, (row.project_id, row.tenant_id), eff, ask, caps))
        if not reason and cards and ask > 0 and (row.project_id in limits.project_memory
                                                 or row.tenant_id in limits.tenant_memory):
            job, reason, closed = _close_classes(job, cards, limits, use, (row.project_id, row.tenant_id))
            if closed:
                held.closed[job.name] = closed
        if reason:
            held.statuses.append(JobStatus(job=job.name, queue=job.queue, kind="quota", decision=E.Wait(
                job=job.name, reason=reason[:1].upper() + reason[1:])))
        else:
            keep.append(job)
    if not held.statuses and not held.closed:
        return inputs, held
    return dataclasses.replace(inputs, pending=keep), held


def _close_classes(job: E.Job, cards: dict[str, tuple[int, frozenset[str]]],
                   limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
                   ids: tuple[int, int]) -> tuple[E.Job, str, str]:
    """(the job, why it waits, why some classes are closed to it): every class it may use here
    over a memory limit → it waits; some → their cards are excluded for this cycle."""
    usable = usable_classes(job, cards)
    over = {cls: selectors.over_class_memory(limits, use, ids[0], ids[1],
                                              {cls: job_memory(job, cards[cls][0])})
            for cls in usable}
    over = {cls: why for cls, why in over.items() if why}
    if not over:
        return job, "", ""
    first = over[min(over)]
    if len(over) == len(usable):
        return job, first, ""
    return without_models(job, frozenset(m for cls in over for m in cards[cls][1])), "", first


def reopen(statuses: Iterable[JobStatus], closed: dict[str, str]) -> list[JobStatus]:
    """An engine rejection of a job whose cards were closed by a memory limit becomes a wait."""
    out = []
    for st in statuses:
        if st.job in closed and isinstance(st.decision, E.Reject):
            why = closed[st.job]
            st = dataclasses.replace(st, kind="quota",
                                     decision=E.Wait(job=st.job, reason=why[:1].upper() + why[1:]))
        out.append(st)
    return out


@dataclasses.dataclass
class GuaranteeRows:
    """The rows ``selectors.effective_guarantees`` needs, read once per admission."""

    per_cluster: dict[tuple[str, int], float]
    caps: dict[tuple[str, int], float | None]
    projects: dict[int, list[int]]

    def effective(self, cluster_id: int, limits: selectors.AllClusterLimits,
                  use: selectors.AllClusterUse) -> dict[tuple[str, int], float]:
        return selectors.effective_guarantees(cluster_id, limits, use, self.per_cluster, self.caps,
                                              self.projects)


def guarantee_rows(limits: selectors.AllClusterLimits) -> GuaranteeRows | None:
    """The per-cluster quotas and projects of the tenants concerned (two queries), or None when
    no quota has a guarantee across all clusters."""
    if not (limits.project_guarantee or limits.tenant_guarantee):
        return None
    tids = limits.tenant_ids
    rows = GuaranteeRows({}, {}, defaultdict(list))
    for scope, tid, pid, g, lim in Quota.objects.filter(tenant_id__in=tids).values_list(
            "scope", "tenant_id", "project_id", "gpus_guaranteed", "gpus_limit"):
        key = ("project", pid) if scope == QuotaScope.PROJECT else ("tenant", tid)
        rows.per_cluster[key], rows.caps[key] = float(g), None if lim is None else float(lim)
    for pid, tid in Project.objects.filter(tenant_id__in=tids).values_list("pk", "tenant_id"):
        rows.projects[tid].append(pid)
    return rows


def admissible(job_ids: tuple[int, int], preemptible: bool, pods: tuple[E.PodPlacement, ...], n: float,
               cluster_id: int, limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
               in_use: tuple[dict[int, float], dict[int, float]], eff: dict[tuple[str, int], float]) -> str:
    """The admission's re-check of one job, under the per-tenant lock ("" when it may go):
    the GPU limit, the guarantee (non-preemptible work here within this cluster's effective
    guarantee, recomputed from what every cluster holds now) and the class memory limits."""
    pid, tid = job_ids
    reason = selectors.over_all_clusters(limits, in_use, pid, tid, n)
    if not reason and not preemptible:
        for level, key, g, who in (("project", pid, limits.project_guarantee.get(pid), "project's"),
                                   ("tenant", tid, limits.tenant_guarantee.get(tid), "tenant's")):
            here = use.np_gpus.get((level, key, cluster_id), 0.0)
            if g and here + n > eff.get((level, key), 0.0) + EPS:
                reason = (f"over your {who} GPU guarantee across all clusters for non-preemptible "
                          f"work: {use.elsewhere(level, key, cluster_id):g} of {g:g} held on other "
                          f"clusters, {here:g} non-preemptible here (it asks {n:g})")
                break
    if not reason and (limits.project_memory or limits.tenant_memory):
        reason = selectors.over_class_memory(limits, use, pid, tid, placement_memory(pods))
    return reason
