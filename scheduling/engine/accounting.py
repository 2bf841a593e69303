"""The GPU unit, defined once (issue 29).

Every figure that counts GPUs — per-cluster quotas and guarantees, the limits and guarantees
across all clusters, fair share, showback, "free now", the cluster cards, the queue tree, the
GPU map, the API and the console — takes it from here. The engine imports it directly; the
database side (``scheduling.accounting``) feeds it rows, never re-states it in SQL.

**The unit.** One GPU is one whole card. A slice of a card counts the larger of its share of
the card's compute and its share of the card's memory (its *dominant share*, as in DRF):
40 GiB and 10 % of an 80 GiB card is 0.5 GPU, 8 GiB and 50 % is 0.5 GPU, a whole card 1.
Why this and not the compute share alone: a slice takes from the card whichever of the two it
exhausts first, and the other sharers feel that one. Counting compute only let a project hold
most of several cards' memory while its quota read a tenth of a GPU each, and made a limit
enforced one way read another way on the pages (issue 29). The dominant share never exceeds
one card and adds up to at most the number of cards a cluster has.

Figures are kept in milli-GPUs (integers) inside the engine so sums are exact; pages show
GPUs (``milli / 1000``), rounded to two decimals.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from .model import GpuGrant, Job, PodPlacement, PodRequest

MILLI = 1000
"""Milli-GPUs in one GPU (one whole card)."""

UNIT_WORDS = ("1 GPU = one whole card; a slice counts the larger of its share of the card's "
              "compute and of its memory (40 GiB + 10 % of an 80 GiB card = 0.5 GPU).")
"""The unit in the words users read, under each GPU bar and in tooltips."""


def slice_milli(*, memory_mib: int, cores_percent: int, exclusive: bool, card_memory_mib: int) -> int:
    """Rule (the GPU unit): milli-GPUs a placed slice counts. A whole card (``exclusive``) is
    1000; a slice is the larger of its compute share (``cores_percent`` of 100) and its memory
    share (``memory_mib`` of the card's, rounded up to the next milli), at most 1000. A card whose
    memory is unknown (0) counts the compute share."""
    if exclusive:
        return MILLI
    mem = math.ceil(memory_mib * MILLI / card_memory_mib) if card_memory_mib > 0 else 0
    return min(MILLI, max(cores_percent * MILLI // 100, mem))


def slice_gpus(*, memory_mib: int, cores_percent: int, exclusive: bool, card_memory_mib: int) -> float:
    """:func:`slice_milli` in GPUs."""
    return slice_milli(memory_mib=memory_mib, cores_percent=cores_percent, exclusive=exclusive,
                       card_memory_mib=card_memory_mib) / MILLI


def grant_milli(g: GpuGrant, card_memory_mib: int | None = None) -> int:
    """:func:`slice_milli` of a granted slice (its card's memory from the grant unless given)."""
    card = g.card_memory_mib if card_memory_mib is None else card_memory_mib
    return slice_milli(memory_mib=g.gpu_memory_mib, cores_percent=g.gpu_cores_percent,
                       exclusive=g.exclusive, card_memory_mib=card)


def placement_milli(pods: Iterable[PodPlacement],
                    card_memory: Mapping[str, Sequence[int]] | None = None) -> int:
    """Milli-GPUs held by placed pods: the sum of their slices (:func:`slice_milli`). The cards'
    memory comes from each grant, or from ``card_memory`` (node → memory per card index)."""
    n = 0
    for pp in pods:
        mems = card_memory.get(pp.node, ()) if card_memory is not None else None
        for g in pp.gpus:
            if mems is None:
                n += grant_milli(g)
            else:
                n += grant_milli(g, mems[g.index] if g.index < len(mems) else 0)
    return n


def placement_gpus(pods: Iterable[PodPlacement]) -> float:
    """:func:`placement_milli` in GPUs."""
    return placement_milli(pods) / MILLI


def card_free_milli(*, memory_mib: int, memory_used_mib: int, cores_used_percent: int,
                    held_whole: bool = False) -> int:
    """Rule (free on a card, in the same unit): what is left of a card is the smaller of its
    free compute share and its free memory share — the most one more slice could count there
    (:func:`slice_milli`). A card held whole has none. Free memory and free compute are never
    mixed in one figure. Note: slices led by different resources on one card (one by compute,
    one by memory) count more together than the card's busiest resource, so a card's held and
    free may add up to more than one GPU; the free figure is what one more slice could take."""
    if held_whole:
        return 0
    cores_free = max(0, 100 - cores_used_percent) * MILLI // 100
    if memory_mib <= 0:
        return cores_free
    mem_free = max(0, memory_mib - memory_used_mib) * MILLI // memory_mib
    return max(0, min(cores_free, mem_free))


def ask_milli(*, whole: bool, cores_percent: int, memory_percent: int = 0, memory_mib: int = 0,
              card_memory_mib: int = 0) -> int:
    """Rule (a GPU ask before placement): milli-GPUs one GPU of a container will count, before
    its card is known. A whole card is 1000; a slice is the larger of its compute share and its
    memory share (:func:`slice_milli`'s rule), the memory share taken from the percent asked, or
    from the MiB asked over ``card_memory_mib`` when the caller names the card it assumes (an
    estimate: the largest card). Without a card, memory asked in MiB is not counted, so the
    ask is a lower bound: the placed slice's exact charge (:func:`slice_milli`) is checked
    again before anything is written."""
    if whole:
        return MILLI
    mem = memory_percent * MILLI // 100
    if memory_mib and card_memory_mib > 0:
        mem = max(mem, math.ceil(memory_mib * MILLI / card_memory_mib))
    return min(MILLI, max(cores_percent * MILLI // 100, mem))


def pod_ask_milli(p: PodRequest) -> int:
    """Milli-GPUs a pod asks at least (:func:`ask_milli` over its containers' GPUs)."""
    return sum(ask_milli(whole=c.whole_cards, cores_percent=c.gpu_cores_percent,
                         memory_percent=c.gpu_memory_percent) * c.gpu_count for c in p.containers)


def job_ask_milli(job: Job) -> int:
    """Milli-GPUs a job asks at least: every replica of every group (:func:`pod_ask_milli`)."""
    return sum(pod_ask_milli(g.template) * g.replicas for g in job.groups)


def job_ask_gpus(job: Job) -> float:
    """:func:`job_ask_milli` in GPUs."""
    return job_ask_milli(job) / MILLI


def shape_ask_gpus(*, replicas: int, gpu_count: int, exclusive: bool, memory_mib: int,
                   memory_percent: int, cores_percent: int, card_memory_mib: int = 0) -> float:
    """:func:`ask_milli` for a stored shape (a pod group row, a launch preset): GPUs it asks. A
    shape asking GPUs with no slice size is whole cards."""
    if not gpu_count:
        return 0.0
    whole = exclusive or not (memory_mib or memory_percent or cores_percent)
    return replicas * gpu_count * ask_milli(
        whole=whole, cores_percent=cores_percent, memory_percent=memory_percent,
        memory_mib=memory_mib, card_memory_mib=card_memory_mib) / MILLI


def startable(fit: int, ask: float, rooms: Iterable[tuple[float | None, str]]) -> tuple[int, str]:
    """Rule (what one user can start now: "free now"): of ``fit`` copies of a shape asking
    ``ask`` GPUs each that fit on the free cards, as many as the tightest of ``rooms`` allows —
    each room is (GPUs left, in this unit, under a quota limit or, for non-preemptible work,
    within a guarantee; None: no bound) and the words naming it. Returns the number and the
    words of the room that bounds it ("" when the free cards do)."""
    n, why = fit, ""
    if ask <= 0:
        return n, why
    for room, words in rooms:
        if room is None:
            continue
        k = max(0, int((room + 1e-9) // ask))
        if k < n:
            n, why = k, words
    return n, why


def gpus(milli: float) -> float:
    """Milli-GPUs as the GPUs a page shows (two decimals)."""
    return round(milli / MILLI, 2)


def unhonourable_guarantees(*, clusters: Mapping[str, float], tenants: Mapping[str, tuple[float, float]],
                            projects: Mapping[str, tuple[str, float, float]]) -> list[str]:
    """Rule (guarantees the clusters can honour): every GPU guarantee must be coverable at once
    by the cards, in this unit. ``clusters``: cluster → GPUs it has; ``tenants``: tenant →
    (GPUs guaranteed on each cluster, GPUs guaranteed across all clusters); ``projects``:
    "tenant/project" → (tenant, per cluster, across all clusters). A per-cluster guarantee
    applies on every cluster, so it is checked against each cluster: the tenants' together
    against its GPUs, the projects' of a tenant against their tenant's (the scheduler checks a
    project's share inside its tenant's). A guarantee across all clusters comes on top of
    the per-cluster ones: all together against every cluster's GPUs. One sentence per breach,
    naming the figures."""
    out: list[str] = []
    per_cluster = sum(g for g, _a in tenants.values())
    for name, n in sorted(clusters.items()):
        if per_cluster > n + 1e-9:
            out.append(f"Cluster {name} has {n:g} GPUs; the tenants' guarantees there add up to "
                       f"{per_cluster:g} GPUs (each tenant's per-cluster guarantee applies on every "
                       f"cluster).")
    for tname, (g, a) in sorted(tenants.items()):
        mine = [(pg, pa) for t, pg, pa in projects.values() if t == tname]
        if sum(pg for pg, _ in mine) > g + 1e-9:
            out.append(f"Tenant {tname}'s projects are guaranteed {sum(pg for pg, _ in mine):g} GPUs per "
                       f"cluster together, more than the tenant's {g:g}.")
        if a and sum(pa for _, pa in mine) > a + 1e-9:
            out.append(f"Tenant {tname}'s projects are guaranteed {sum(pa for _, pa in mine):g} GPUs across "
                       f"all clusters together, more than the tenant's {a:g}.")
    total = sum(clusters.values())
    across = guaranteed_across(per_cluster=per_cluster, clusters=len(clusters),
                               across=sum(a for _g, a in tenants.values()))
    if clusters and across > total + 1e-9 and any(a for _g, a in tenants.values()):
        out.append(f"All clusters together have {total:g} GPUs; the guarantees add up to {across:g} "
                   f"(per-cluster guarantees on each of {len(clusters)} clusters plus those across all "
                   f"clusters).")
    return out


def guarantee_room(*, capacity: float, others: float) -> float:
    """Rule (what a guarantee can still be given): the GPUs under ``capacity`` (a cluster's
    cards, all clusters' cards, or the parent's guarantee) that ``others`` (every other
    guarantee drawn from the same capacity) do not already take; never below zero. A guarantee
    above it is one :func:`unhonourable_guarantees` flags."""
    return max(0.0, round(capacity - others, 3))


def guaranteed_across(*, per_cluster: float, clusters: int, across: float) -> float:
    """Rule: GPUs guaranteed on all clusters together — each per-cluster guarantee once on
    every cluster, plus the guarantees across all clusters on top."""
    return per_cluster * clusters + across
