"""Quotas across all clusters (issue 16) in a cluster's cycle: the GPU limit and the GPU memory
limits per GPU model class that tenant and project quotas may hold over every cluster together
(docs/ARCHITECTURE.md, "Quotas across all clusters").

Two places, as for the GPU limit before: the snapshot (``hold``: jobs that would cross a quota
across all clusters wait, said why, and are not offered to the engine; cards of a class over
its memory limit are closed to a job that may use others) and the admission, under the
per-tenant advisory lock (``admissible``: counted again with the other clusters' committed
admissions). The engine is unchanged.
"""

from __future__ import annotations

import dataclasses
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

from .. import selectors


@dataclasses.dataclass
class Held:
    statuses: list[JobStatus]
    closed: dict[str, str]
    """Job name → why some classes were closed to it: should the engine then reject it, it
    waits with this reason instead (those cards may open again)."""


def hold(inputs: selectors.CycleInputs, limits: selectors.AllClusterLimits,
         use: selectors.AllClusterUse) -> tuple[selectors.CycleInputs, Held]:
    """The snapshot's part (see the module's docstring)."""
    in_use = use.as_in_use()
    cards = card_classes(inputs.snapshot.nodes) if (limits.project_memory or limits.tenant_memory) else {}
    keep: list[E.Job] = []
    held = Held([], {})
    for job in inputs.pending:
        row = inputs.jobs[job.name]
        ask = job_gpus(job)
        reason = selectors.over_all_clusters(limits, in_use, row.project_id, row.tenant_id, ask)
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


def admissible(job_ids: tuple[int, int], pods: tuple[E.PodPlacement, ...], n: float,
               limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
               in_use: tuple[dict[int, float], dict[int, float]]) -> str:
    """The admission's re-check of one job, under the per-tenant lock ("" when it may go):
    the GPU limit and the class memory limits, counted from what every cluster holds now."""
    pid, tid = job_ids
    reason = selectors.over_all_clusters(limits, in_use, pid, tid, n)
    if not reason and (limits.project_memory or limits.tenant_memory):
        reason = selectors.over_class_memory(limits, use, pid, tid, placement_memory(pods))
    return reason
