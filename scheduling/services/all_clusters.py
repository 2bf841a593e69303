"""Quotas across all clusters (issue 16) in a cluster's cycle: the GPU limit, the GPU guarantee
and the GPU memory limits per GPU model class that tenant and project quotas may hold over every
cluster together (docs/ARCHITECTURE.md, "Quotas across all clusters").

The guarantee reaches the engine through the queue tree: each guarantee across all clusters is
split into per-cluster parts that sum to it (``selectors.guarantee_parts``, the pure rule in
``engine/guarantees.py``), and this cluster's part is added to the per-cluster guarantee of the
project or tenant (``with_parts``). Non-preemptible work beyond the part here waits (``hold``);
the admission re-checks, under the per-tenant lock, non-preemptible admissions and the reclaim
preemptions that rely on a part (``guarantee_refusal``) against what every cluster holds now.

Two places, as for the GPU limit before: the snapshot (``hold``: jobs that would cross a quota
across all clusters wait, said why, and are not offered to the engine; one asking more than
such a limit itself — GPUs, or the memory of every class it may use here — is rejected as a job
over a per-cluster limit is, ``never_here``; cards of a class over its memory limit are closed
to a job that may use others) and the admission, under the
per-tenant advisory lock (``admissible``: counted again with the other clusters' committed
admissions). The engine is unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from decimal import Decimal

from scheduling import engine as E
from scheduling.engine.cycle import JobStatus, Kind
from scheduling.engine.guarantees import EPS, Holding, Owner, beyond_words, claim_held, nonpreemptible_refusal
from scheduling.engine.multicluster import (
    AllClusterOwner,
    card_classes,
    class_floors,
    job_gpus,
    job_memory,
    never_all_clusters,
    placement_memory,
    usable_classes,
    without_models,
)
from scheduling.engine.queueing import QueueTree
from scheduling.engine.queueing import Quota as EQuota

from .. import selectors

Parts = dict[tuple[str, int], dict[int, float]]


@dataclasses.dataclass
class Guarantees:
    """The guarantees across all clusters as this cycle sees them: the split (``parts``) and
    what it was computed from (``book``)."""

    parts: Parts
    book: selectors.GuaranteeBook

    def base(self, level: str, key: int) -> float:
        return (self.book.project_base if level == "project" else self.book.tenant_base).get(key, 0.0)


def guarantees(limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
               names: bool = False) -> Guarantees | None:
    """The split of every guarantee across all clusters (None, no query, when there is none)."""
    book = selectors.guarantee_book(limits, names=names)
    if book is None:
        return None
    return Guarantees(selectors.guarantee_parts(limits, use, book), book)


def _plus(quota: EQuota, extra: float | None) -> EQuota:
    if not extra:
        return quota
    return dataclasses.replace(quota, gpus_guaranteed=Decimal(str(quota.gpus_guaranteed))
                               + Decimal(str(round(extra, 3))))


def engine_part(g: Guarantees, use: selectors.AllClusterUse, level: str, key: int,
                cluster_id: int) -> float:
    """The part of an owner's guarantee across all clusters the engine sees on this cluster.

    The split counts the owner's preemptors waiting here for their victims as held
    (``guarantee_parts``), while the engine, which leaves them out of its snapshot, does not:
    the share of the part their asks claimed is taken off, so the next cycle does not reclaim
    the same GPUs again for another job. Only the asks of preemptors whose victims are still
    being evicted (``book.evicting``): one whose victims are gone is back in the engine's queue
    and needs the whole part (taking its own ask off held it back, and a borrower took the GPUs
    it had evicted for). Only that share: the part covers what the owner's
    jobs hold here beyond the per-cluster guarantee first (the split claims what is held
    before what is asked), so its running work within the guarantee never looks borrowed (a
    borrower's reclaim would take it). That is ``max(min(part, running beyond the per-cluster
    guarantee), part − asks)``."""
    part = g.parts.get((level, key), {}).get(cluster_id, 0.0)
    asks = g.book.evicting.get((level, key, cluster_id), 0.0)
    running = max(0.0, use.by_cluster.get((level, key, cluster_id), 0.0) - g.base(level, key))
    return max(min(part, running), part - asks, 0.0)


def with_parts(tree: QueueTree, g: Guarantees, cluster_id: int, use: selectors.AllClusterUse) -> QueueTree:
    """This cluster's queue tree with each part the engine sees (``engine_part``) added to its
    owner's per-cluster GPU guarantee (a tenant's name has no "/", so it never meets a
    project's queue name)."""
    extra = {g.book.names[key]: engine_part(g, use, *key, cluster_id)
             for key in g.parts if key in g.book.names}
    if not any(extra.values()):
        return tree
    return dataclasses.replace(tree, tenants=tuple(
        dataclasses.replace(t, quota=_plus(t.quota, extra.get(t.name)), projects=tuple(
            dataclasses.replace(p, quota=_plus(p.quota, extra.get(p.name))) for p in t.projects))
        for t in tree.tenants))


_WHO = {"project": "your project's", "tenant": "your tenant's"}


def _owners(limits: selectors.AllClusterLimits, pid: int, tid: int
            ) -> list[tuple[str, int, float]]:
    out = []
    if pid in limits.project_guarantee:
        out.append(("project", pid, limits.project_guarantee[pid]))
    if tid in limits.tenant_guarantee:
        out.append(("tenant", tid, limits.tenant_guarantee[tid]))
    return out


def over_guarantee_here(limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
                        g: Guarantees, cluster_id: int, ids: tuple[int, int], ask: float,
                        ) -> tuple[str, str]:
    """(kind, why) for a non-preemptible job of a project or tenant with a guarantee across
    all clusters: beyond per-cluster guarantee + guarantee across all clusters → it can never
    start (``over-guarantee``); beyond per-cluster guarantee + this cluster's part, counting
    what its non-preemptible jobs hold here → it waits (``guarantee``). ("", "") when within."""
    for level, key, total in _owners(limits, *ids):
        base = g.base(level, key)
        # The part the engine sees (``engine_part``: less the share waiting preemptors' asks
        # claimed here), so that a job let through never asks more than the engine's
        # guarantee (it would reject it as "can never start").
        part = engine_part(g, use, level, key, cluster_id)
        here = use.np_by_cluster.get((level, key, cluster_id), 0.0)
        verdict = nonpreemptible_refusal(here, ask, base + part, ever=base + total)
        if verdict == "never":
            return "over-guarantee", (
                f"Non-preemptible jobs must fit within {_WHO[level]} GPU guarantee ({base:g} per "
                f"cluster + {total:g} across all clusters), and the job asks {ask:g}; {beyond_words()}")
        if verdict:
            return "guarantee", (
                f"Non-preemptible jobs must fit within {_WHO[level]} GPU guarantee on this "
                f"cluster ({here:g} of {base + part:g} held by non-preemptible jobs; {part:g} of "
                f"its {total:g} across all clusters is this cluster's part now, the rest is "
                f"held or waited for on other clusters; job asks {ask:g}); {beyond_words()}")
    return "", ""


def _beyond(held: Mapping[int, float], base: float) -> float:
    return sum(max(0.0, v - base) for v in held.values())


def _covered(use: selectors.AllClusterUse, book: selectors.GuaranteeBook, total: float, pid: int,
             ) -> dict[int, float]:
    """What project ``pid``'s own guarantees cover of its work per cluster, waiting
    preemptors' asks counted as held: its per-cluster guarantee, then its guarantee across all
    clusters claimed as the split claims it (``engine.guarantees.claim_held``: non-preemptible
    work first, clusters in the fixed order). The rest is borrowing, reclaimable itself."""
    base = book.project_base.get(pid, 0.0)
    held = {c: use.by_cluster.get(("project", pid, c), 0.0) + book.preempting.get(("project", pid, c), 0.0)
            for c in book.clusters}
    owner = Owner(total, base, {c: Holding(held[c], use.np_by_cluster.get(("project", pid, c), 0.0)
                                           + book.np_asks("project", pid, c)) for c in book.clusters})
    parts = claim_held(owner, book.clusters)
    return {c: min(held[c], base) + parts[c] for c in book.clusters}


def _reclaim_held(use: selectors.AllClusterUse, book: selectors.GuaranteeBook,
                  limits: selectors.AllClusterLimits, level: str, key: int) -> dict[int, float]:
    """What the reclaim re-check counts as an owner's per cluster, waiting preemptors' asks
    counted as held (the split's order, ``engine.guarantees.split_tenant``): a project's
    jobs; a tenant's non-preemptible work and, of its guaranteed projects' preemptible work,
    what their own guarantees cover (``_covered``), not the rest nor its other projects'
    preemptible work (no guarantee covers that borrowing: it is reclaimed itself)."""
    if level == "project":
        return {c: use.by_cluster.get(("project", key, c), 0.0)
                + book.preempting.get(("project", key, c), 0.0) for c in book.clusters}
    out = {c: use.np_by_cluster.get(("tenant", key, c), 0.0) + book.np_asks("tenant", key, c)
           for c in book.clusters}
    for p in book.projects_of.get(key, []):
        if p not in limits.project_guarantee:
            continue
        covered = _covered(use, book, limits.project_guarantee[p], p)
        for c in book.clusters:  # its non-preemptible work is in the tenant's already
            np = use.np_by_cluster.get(("project", p, c), 0.0) + book.np_asks("project", p, c)
            out[c] += max(0.0, covered[c] - np)
    return out


def guarantee_refusal(limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
                      book: selectors.GuaranteeBook, cluster_id: int, ids: tuple[int, int],
                      n: float, *, nonpreemptible: bool, reclaim: bool, job_id: int | None = None) -> str:
    """The admission's re-check under the per-tenant lock ("" when it may go), counted from
    what every cluster holds now (other cycles' committed admissions and preemptions included):

    * a non-preemptible admission or preemption: what the owner's non-preemptible jobs hold
      beyond the per-cluster guarantee, on every cluster, with the asks of its preemptors
      waiting for victims that rely on the guarantee (non-preemptible ones and preemptible
      reclaims: ``book.relied_asks``; not job ``job_id``'s own) and with this job, stays
      within the guarantee across all clusters (its parts sum to it);
    * a reclaim preemption (victims of equal or higher priority, evicted only because they
      borrow) that relies on the project's part here (its GPUs here, waiting preemptors'
      asks counted, + this one's beyond its per-cluster guarantee): what it holds beyond the
      per-cluster guarantee on every cluster (``_reclaim_held``), with this one, stays within
      the guarantee across all clusters, at the project's level and at the tenant's when it
      has one. So two cycles racing on two clusters never evict together for more than the
      guarantee."""
    pid, tid = ids
    for level, key, total in _owners(limits, pid, tid):
        base = book.project_base.get(key, 0.0) if level == "project" else book.tenant_base.get(key, 0.0)
        if nonpreemptible:
            # With the asks of its preemptors waiting for victims that rely on a guarantee:
            # non-preemptible ones, and preemptible ones reclaiming (their evictions too
            # count against the guarantee, so non-preemptible work is not let in beside them).
            np = {c: use.np_by_cluster.get((level, key, c), 0.0) + book.relied_asks(level, key, c, but=job_id)
                  for c in book.clusters}
            np.setdefault(cluster_id, 0.0)
            # The guaranteed-GPU rule (``nonpreemptible_refusal``, its one definition) over the
            # guarantee across all clusters: held = what the owner's non-preemptible work holds
            # beyond the per-cluster guarantee on every cluster; ask = what this job adds to it
            # (its GPUs here beyond the per-cluster guarantee). Adding nothing beyond, it goes.
            beyond = _beyond(np, base)
            ask = max(0.0, np[cluster_id] + n - base) - max(0.0, np[cluster_id] - base)
            if ask > EPS and nonpreemptible_refusal(beyond, ask, total):
                return (f"over {_WHO[level]} GPU guarantee across all clusters for non-preemptible "
                        f"work: with it, {beyond + ask:g} GPUs beyond the per-cluster guarantee on all "
                        f"clusters (held, or asked by preemptors waiting for their victims), of "
                        f"{total:g} (it asks {n:g})")
        if reclaim and pid in limits.project_guarantee:
            held = _reclaim_held(use, book, limits, level, key)
            held[cluster_id] = held.get(cluster_id, 0.0) + n
            pbase = book.project_base.get(pid, 0.0)
            relies = (use.by_cluster.get(("project", pid, cluster_id), 0.0)
                      + book.preempting.get(("project", pid, cluster_id), 0.0) + n > pbase + EPS)
            used = _beyond(held, base)
            if relies and used > total + EPS:
                return (f"{_WHO[level][:1].upper() + _WHO[level][1:]} GPU guarantee across all "
                        f"clusters is held or being reclaimed on other clusters: "
                        f"with it, {used:g} GPUs beyond the per-cluster guarantee on all clusters, "
                        f"of {total:g} (it asks {n:g}); it waits rather than preempting for more "
                        f"than the guarantee")
    return ""


@dataclasses.dataclass
class Held:
    statuses: list[JobStatus]
    closed: dict[str, str]
    """Job name → why some classes were closed to it: should the engine then reject it, it
    waits with this reason instead (those cards may open again)."""


def hold(inputs: selectors.CycleInputs, limits: selectors.AllClusterLimits,
         use: selectors.AllClusterUse, g: Guarantees | None = None,
         ) -> tuple[selectors.CycleInputs, Held]:
    """The snapshot's part (see the module's docstring)."""
    in_use = use.as_in_use()
    cid = inputs.cluster.pk if inputs.cluster is not None else 0
    cards = card_classes(inputs.snapshot.nodes) if (limits.project_memory or limits.tenant_memory) else {}
    floors = class_floors(inputs.snapshot.nodes) if cards else {}
    keep: list[E.Job] = []
    held = Held([], {})
    changed = False  # some job's cards closed (not always with a reason to reopen them)
    for job in inputs.pending:
        row = inputs.jobs[job.name]
        ask = job_gpus(job)
        never = never_here(limits, (row.project_id, row.tenant_id), job, ask, cards, floors)
        if never:
            # It could never start, whatever the other clusters hold: rejected as a job over a
            # per-cluster limit is (a floating one goes back to the global queue, this cluster
            # refused: ``cycle._apply``).
            held.statuses.append(JobStatus(
                job=job.name, queue=job.queue, kind=Kind.OVER_LIMIT,
                decision=E.Reject(job=job.name, reason=f"The job asks {never[1]}: it can never start")))
            continue
        reason = selectors.over_all_clusters(limits, in_use, row.project_id, row.tenant_id, ask)
        if not reason and cards and ask > 0 and (row.project_id in limits.project_memory
                                                 or row.tenant_id in limits.tenant_memory):
            was = job
            job, reason, closed = _close_classes(job, cards, limits, use, (row.project_id, row.tenant_id),
                                                 floors)
            changed = changed or job is not was
            if closed:
                held.closed[job.name] = closed
        if reason:
            held.statuses.append(JobStatus(job=job.name, queue=job.queue, kind="quota", decision=E.Wait(
                job=job.name, reason=reason[:1].upper() + reason[1:])))
            continue
        if g is not None and not job.preemptible:
            kind, why = over_guarantee_here(limits, use, g, cid, (row.project_id, row.tenant_id), ask)
            if kind:
                held.statuses.append(JobStatus(
                    job=job.name, queue=job.queue, kind=kind,
                    decision=(E.Reject if kind == "over-guarantee" else E.Wait)(job=job.name, reason=why)))
                continue
        keep.append(job)
    if g is not None and inputs.cluster is not None:
        inputs = dataclasses.replace(inputs, tree=with_parts(inputs.tree, g, cid, use))
    if not held.statuses and not held.closed and not changed:
        return inputs, held
    kept = {j.name for j in keep}
    return dataclasses.replace(inputs, pending=keep,
                               held_out=tuple(j for j in inputs.pending if j.name not in kept)), held


def owners(limits: selectors.AllClusterLimits, ids: tuple[int, int], queue: str) -> list[AllClusterOwner]:
    """The project's and the tenant's quotas across all clusters as ``never_all_clusters``
    reads them, named ("project acme/vision", "tenant acme": a queue is ``tenant/project``)."""
    pid, tid = ids
    return [(f"project {queue}", limits.project.get(pid), limits.project_memory.get(pid, {})),
            (f"tenant {queue.split('/', 1)[0]}", limits.tenant.get(tid), limits.tenant_memory.get(tid, {}))]


def never_here(limits: selectors.AllClusterLimits, ids: tuple[int, int], job: E.Job, ask: float,
               cards: Mapping[str, tuple[int, frozenset[str]]], floors: Mapping[str, int],
               ) -> tuple[str, str] | None:
    """(request field, what it asks beyond which limit) when ``job`` could never start under a
    quota across all clusters of its project or tenant, the GPU model classes it may use being
    those of ``cards`` (this cluster's; ``floors``: their smallest cards) — the engine's rule,
    ``multicluster.never_all_clusters``. None otherwise (also with no quota concerned)."""
    pid, tid = ids
    if not (pid in limits.project or tid in limits.tenant or pid in limits.project_memory
            or tid in limits.tenant_memory):
        return None
    memory: dict[str, int] = {}
    if cards and (pid in limits.project_memory or tid in limits.tenant_memory):
        memory = {cls: job_memory(job, floors.get(cls, cards[cls][0])) for cls in usable_classes(job, cards)}
    return never_all_clusters(ask, memory, owners(limits, ids, job.queue), job.mixed_gpu_models)


def _close_classes(job: E.Job, cards: dict[str, tuple[int, frozenset[str]]],
                   limits: selectors.AllClusterLimits, use: selectors.AllClusterUse,
                   ids: tuple[int, int], floors: Mapping[str, int]) -> tuple[E.Job, str, str]:
    """(the job, why it waits, why some classes are closed to it): every class it may use here
    over a memory limit → it waits; some → their cards are excluded for this cycle. A class
    whose limit the job asks more than itself stays closed with no reason to reopen it (should
    the engine reject the job on the other classes' cards, the rejection stands) — except for a
    job that may mix GPU models, which could use that class beside the others. Each class is
    counted with the whole job on it, so a mixed job waits while every class alone is over,
    though it might fit split over them (the admission re-check counts the placement itself)."""
    usable = usable_classes(job, cards)
    over = {cls: selectors.over_class_memory(limits, use, ids[0], ids[1],
                                              {cls: job_memory(job, cards[cls][0])})
            for cls in usable}
    over = {cls: why for cls, why in over.items() if why}
    if not over:
        return job, "", ""
    who, ask = owners(limits, ids, job.queue), job_gpus(job)
    # A job that may mix models could still use a class it alone would be over on, beside others.
    for_now = {cls: why for cls, why in over.items()
               if job.mixed_gpu_models
               or not never_all_clusters(ask, {cls: job_memory(job, floors.get(cls, cards[cls][0]))}, who)}
    first = over[min(for_now or over)]
    if len(over) == len(usable):
        return job, first, ""
    return (without_models(job, frozenset(m for cls in over for m in cards[cls][1])), "",
            for_now[min(for_now)] if for_now else "")


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
