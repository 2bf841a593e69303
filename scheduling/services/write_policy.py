"""The policy steps of the cycle's write, as pure functions over what it read (issue 29).

The engine decides on a snapshot; the write step (``cycle._apply``) then re-checks a few rules
the engine cannot, against rows read at write time. Those checks are here, numbered in the
order the write applies them, each a function of its inputs that reads and writes nothing — so
each is unit-tested without a database (tests/unit/test_write_policy.py). The write step does
the I/O around them: it loads the rows (under the per-tenant locks of the quotas across all
clusters), calls the steps, and hands their plan to the lifecycle (``lifecycle.transition_many``).

1. ``outside_pools``: a placement that puts a pod on a dedicated pool closed to the job's tenant
   is not persisted: the job waits.
2. ``reject_or_unplace``: a floating job its cluster can never run goes back to the global queue
   (that cluster refused) instead of being rejected: another cluster may run it.
3. ``guaranteed_preemptions``: a preemption that relies on a guarantee across all clusters, held
   or being reclaimed elsewhere meanwhile, evicts nobody and waits.
4. ``within_all_clusters``: admissions that would cross a GPU limit (or GPU memory limit) across
   all clusters, or a non-preemptible one the guarantee across all clusters, wait.
"""

from __future__ import annotations

from typing import Any, Protocol

from scheduling import engine as E
from scheduling.engine.multicluster import gpus_of, placement_memory

from .. import selectors
from . import all_clusters


class JobLike(Protocol):
    """What the steps read of a job (a ``Job`` model, or any row with these attributes)."""

    pk: Any
    tenant_id: Any
    project_id: Any
    cluster_id: Any
    preemptible: bool
    priority: int


def _sentence(reason: str) -> str:
    return reason[:1].upper() + reason[1:]


def outside_pools(pools: selectors.PoolAccess, tenant_id: int, placement: E.Placement) -> str:
    """Step 1. Backstop for dedicated pools: GPU pods are kept out by their model lists (see
    ``selectors.pool_model``); a pod without GPUs has no such list, so a placement that puts
    one on a pool closed to the job's tenant is not persisted: the job waits, for the reason
    returned (empty when the placement is allowed)."""
    forbidden = pools.forbidden_nodes(tenant_id)
    bad = sorted({pp.node for pp in placement.pods if pp.node in forbidden})
    if not bad:
        return ""
    names = sorted({pools.node_pool[n] for n in bad})
    return f"{selectors.OUTSIDE_POOLS} ({', '.join(names)})"


def reject_or_unplace(*, floating: bool, cycle_of_a_cluster: bool) -> str:
    """Step 2. What an engine ``Reject`` becomes: ``"unplace"`` for a floating job judged by
    one cluster's cycle (back to the global queue with that cluster refused; the placement step
    rejects it once no cluster can run it), else ``"reject"``."""
    return "unplace" if floating and cycle_of_a_cluster else "reject"


def guaranteed_preemptions(preemptions: list[tuple[Any, E.Preempt]], jobs: dict[int, Any],
                           limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
                           book: selectors.GuaranteeBook,
                           ) -> tuple[list[tuple[Any, E.Preempt]], list[tuple[Any, str]]]:
    """Step 3. ``(keep, refused)``: reclaim preemptions that rely on a guarantee across all
    clusters, re-checked on what every cluster holds now (``all_clusters.guarantee_refusal``);
    one whose owner's guarantee is held or being reclaimed on other clusters meanwhile evicts
    nobody and waits, with why. A preemption whose victims all have a lower priority does not
    rely on a guarantee (unless the preemptor is non-preemptible). Each kept preemption counts
    for the next ones (``book`` is updated)."""
    keep: list[tuple[Any, E.Preempt]] = []
    refused: list[tuple[Any, str]] = []
    for job, d in preemptions:
        victims = [jobs[int(v)] for v in d.victims if int(v) in jobs]
        reclaim = any(v.priority >= job.priority for v in victims)
        n = gpus_of(d.placement.pods)
        reason = all_clusters.guarantee_refusal(
            limits, use, book, job.cluster_id or 0, (job.project_id, job.tenant_id), n,
            nonpreemptible=not job.preemptible, reclaim=reclaim,
            job_id=job.pk) if reclaim or not job.preemptible else ""
        if reason:
            refused.append((job, _sentence(reason)))
            continue
        book.admitted(job.pk)  # a preemptor preempting again: its old ask goes
        book.add_ask(job.pk, job.project_id, job.tenant_id, job.cluster_id or 0, n,
                     nonpreemptible=not job.preemptible, reclaim=reclaim)
        keep.append((job, d))
    return keep, refused


def within_all_clusters(accepted: list[tuple[Any, E.Placement, Any]], limits: selectors.AllClusterLimits,
                        use: selectors.AllClusterUse, book: selectors.GuaranteeBook | None,
                        ) -> tuple[list[tuple[Any, E.Placement, Any]], list[tuple[Any, str, str]]]:
    """Step 4. ``(keep, over)``: the admissions, in the engine's order, that stay within the
    quotas across all clusters counted on what every cluster holds now — the GPU limit and the
    GPU memory limits per model class (``all_clusters.admissible``; kind ``quota``) and, for a
    non-preemptible job, the GPU guarantee across all clusters (``guarantee_refusal``; kind
    ``guarantee``). Each admission kept counts for the next ones (``use``, ``book`` updated);
    a job that would cross one waits, with the quota named."""
    in_use = use.as_in_use()
    keep: list[tuple[Any, E.Placement, Any]] = []
    over: list[tuple[Any, str, str]] = []
    for job, placement, status in accepted:
        n = gpus_of(placement.pods)
        kind = "quota"
        reason = all_clusters.admissible((job.project_id, job.tenant_id), placement.pods, n, limits, use,
                                         in_use)
        if not reason and book is not None and not job.preemptible:
            kind = "guarantee"
            reason = all_clusters.guarantee_refusal(
                limits, use, book, job.cluster_id or 0, (job.project_id, job.tenant_id), n,
                nonpreemptible=True, reclaim=False, job_id=job.pk)
        if reason:
            over.append((job, _sentence(reason), kind))
            continue
        in_use[0][job.project_id] += n
        in_use[1][job.tenant_id] += n
        use.add(job.project_id, job.tenant_id, n, placement_memory(placement.pods),
                job.cluster_id or 0, not job.preemptible)
        if book is not None:  # a preemptor admitted: held now, its ask no longer counted
            book.admitted(job.pk)
        keep.append((job, placement, status))
    return keep, over
