"""The GPU unit on the database side: rows in, the engine's rule applied (issue 29).

The rule itself is :mod:`scheduling.engine.accounting` (what one GPU of a slice counts as).
Nothing here re-states it in SQL: the database groups slices (or asked shapes) by their shape
and counts them, and each distinct shape is priced once by the engine's function. A cluster has
few distinct shapes, so this reads few rows whatever the number of slices.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, QuerySet, Sum

from .engine import accounting as A
from .models import GpuDevice, GpuSlice, PodGroup

UNIT_WORDS = A.UNIT_WORDS

_SLICE_SHAPE = ("memory_mib", "cores_percent", "exclusive", "gpu__memory_mib")


def held(slices: QuerySet[GpuSlice], *keys: str) -> dict[Any, tuple[float, int]]:
    """(GPUs, GPU memory MiB) held by ``slices`` per value of ``keys`` (columns reachable from
    ``GpuSlice``; one key: plain values, several: tuples). GPUs in the one unit
    (:func:`engine.accounting.slice_milli`); a card held whole holds all its memory. One query,
    grouped by slice shape."""
    milli: dict[Hashable, int] = defaultdict(int)
    mib: dict[Hashable, int] = defaultdict(int)
    for row in (slices.order_by().values(*keys, *_SLICE_SHAPE).annotate(n=Count("id"))
                .values_list(*keys, *_SLICE_SHAPE, "n")):
        key = row[0] if len(keys) == 1 else tuple(row[:len(keys)])
        mem, cores, exclusive, card, n = row[len(keys):]
        milli[key] += n * A.slice_milli(memory_mib=mem, cores_percent=cores, exclusive=exclusive,
                                        card_memory_mib=card or 0)
        mib[key] += n * (card if exclusive and card else mem)
    return {k: (v / A.MILLI, mib[k]) for k, v in milli.items()}


def held_gpus(slices: QuerySet[GpuSlice], *keys: str) -> dict[Any, float]:
    """GPUs of :func:`held`."""
    return {k: v[0] for k, v in held(slices, *keys).items()}


def asked_gpus(groups: QuerySet[PodGroup], *keys: str) -> dict[Any, float]:
    """GPUs the pod groups ask before placement (:func:`engine.accounting.shape_ask_gpus`, the
    lower bound the engine uses), per value of ``keys`` (columns reachable from ``PodGroup``).
    One query."""
    out: dict[Hashable, float] = defaultdict(float)
    shape = ("gpu_count", "exclusive", "gpu_memory_mib", "gpu_cores_percent")
    for row in (groups.order_by().values(*keys, *shape).annotate(r=Sum("replicas"))
                .values_list(*keys, *shape, "r")):
        key = row[0] if len(keys) == 1 else tuple(row[:len(keys)])
        count, exclusive, mem, cores, replicas = row[len(keys):]
        out[key] += A.shape_ask_gpus(replicas=int(replicas or 0), gpu_count=count, exclusive=exclusive,
                                     memory_mib=mem, memory_percent=0, cores_percent=cores)
    return dict(out)


CARD_FREE_COLUMNS = ("memory_mib", "memory_allocated_mib", "cores_allocated", "exclusive_held",
                     "foreign_memory_mib", "foreign_cores", "foreign_exclusive")
"""The ``GpuDevice`` columns :func:`card_free_gpus` reads, in its order."""


def card_free_gpus(memory_mib: int, memory_allocated_mib: int, cores_allocated: int, exclusive_held: bool,
                   foreign_memory_mib: int = 0, foreign_cores: int = 0, foreign_exclusive: bool = False
                   ) -> float:
    """What is free on one card, in the one GPU unit (:func:`engine.accounting.card_free_milli`):
    what Camp's slices and pods Camp did not create hold both count."""
    return A.card_free_milli(
        memory_mib=memory_mib, memory_used_mib=memory_allocated_mib + foreign_memory_mib,
        cores_used_percent=cores_allocated + foreign_cores,
        held_whole=exclusive_held or foreign_exclusive) / A.MILLI


def device_free_gpus(g: GpuDevice) -> float:
    """:func:`card_free_gpus` of a loaded card."""
    return card_free_gpus(*(getattr(g, c) for c in CARD_FREE_COLUMNS))


def usable_gpus() -> dict[str, float]:
    """GPUs each enabled cluster can give (cluster name → its usable cards: present, healthy,
    not quarantined, each one GPU in the unit). One query and the clusters'."""
    from .models import Cluster

    cards: dict[str, float] = {name: 0.0 for name in Cluster.objects.filter(enabled=True)
                               .values_list("name", flat=True)}
    for name, n in (GpuDevice.objects.filter(node__cluster__enabled=True, node__present=True,
                                             healthy=True, quarantined=False)
                    .order_by().values("node__cluster__name").annotate(n=Count("id"))
                    .values_list("node__cluster__name", "n")):
        cards[name] = float(n)
    return cards


@dataclass(frozen=True)
class GuaranteeRow:
    """One line of the quota-by-cluster view: where (a cluster, or all clusters together),
    what it has, what the other guarantees drawn from it take, what this tenant or project can
    still be guaranteed there (``engine.accounting.guarantee_room``), its guarantee and limit
    there, what it holds there now, and whether the guarantee is more than the room."""

    where: str
    capacity: float
    others: float
    room: float
    guaranteed: float
    limit: float | None
    used: float
    over: bool


def guarantee_view(tenant_id: int, project_id: int | None = None) -> list[GuaranteeRow]:
    """Per enabled cluster, then all clusters together: the tenant's (or, with ``project_id``,
    the project's) GPU guarantee and limit beside what can actually be given there. A tenant
    draws on the cluster's cards beside the other tenants (a per-cluster guarantee applies on
    every cluster; one across all clusters comes on top of them); a project draws on its
    tenant's guarantee beside its sibling projects — the capacities
    ``engine.accounting.unhonourable_guarantees`` checks. Other tenants appear only summed."""
    from tenants.models import Quota, QuotaScope

    cards = usable_gpus()
    quotas = list(Quota.objects.filter(scope__in=[QuotaScope.TENANT, QuotaScope.PROJECT])
                  .values_list("scope", "tenant_id", "project_id", "gpus_guaranteed", "gpus_limit",
                               "gpus_guaranteed_all_clusters", "gpus_limit_all_clusters"))
    tenant_q = {t: (float(g or 0), lim, float(a or 0), alim)
                for scope, t, _p, g, lim, a, alim in quotas if scope == QuotaScope.TENANT}
    mine_t = tenant_q.get(tenant_id, (0.0, None, 0.0, None))
    slices = GpuSlice.objects.filter(allocation__job__tenant_id=tenant_id)
    if project_id is None:
        g, lim, a, alim = mine_t
        other_g = sum(v[0] for t, v in tenant_q.items() if t != tenant_id)
        other_a = sum(v[2] for t, v in tenant_q.items() if t != tenant_id)
        per_cluster_cap = dict(cards)
        per_cluster_others = dict.fromkeys(cards, other_g)
        across_cap = sum(cards.values())
        across_others = A.guaranteed_across(per_cluster=other_g + g, clusters=len(cards), across=other_a)
    else:
        mine_p = next(((float(pg or 0), plim, float(pa or 0), palim) for scope, _t, p, pg, plim, pa, palim
                       in quotas if scope == QuotaScope.PROJECT and p == project_id), (0.0, None, 0.0, None))
        g, lim, a, alim = mine_p
        siblings = [(float(pg or 0), float(pa or 0)) for scope, t, p, pg, _l, pa, _al in quotas
                    if scope == QuotaScope.PROJECT and t == tenant_id and p != project_id]
        per_cluster_cap = dict.fromkeys(cards, mine_t[0])
        per_cluster_others = dict.fromkeys(cards, sum(s[0] for s in siblings))
        across_cap = mine_t[2]
        across_others = sum(s[1] for s in siblings)
        slices = slices.filter(allocation__job__project_id=project_id)
    used = held_gpus(slices, "allocation__cluster__name")
    from .models import Cluster

    shown = {c.name: str(c) for c in Cluster.objects.filter(name__in=list(cards))}  # display names
    rows = []
    for name in sorted(cards):
        room = A.guarantee_room(capacity=per_cluster_cap[name], others=per_cluster_others[name])
        rows.append(GuaranteeRow(shown.get(name, name), per_cluster_cap[name], per_cluster_others[name],
                                 room, g,
                                 float(lim) if lim is not None else None, round(used.get(name, 0.0), 2),
                                 g > room + 1e-9))
    room = A.guarantee_room(capacity=across_cap, others=across_others)
    rows.append(GuaranteeRow("all clusters together", across_cap, across_others, room, a,
                             float(alim) if alim is not None else None,
                             round(sum(used.values()), 2), a > room + 1e-9))
    return rows


def guarantee_warnings(tenant_id: int | None = None) -> list[str]:
    """The guarantees the enabled clusters cannot honour (``engine.accounting.unhonourable_guarantees``),
    from the quotas and each cluster's usable cards (present, healthy, not quarantined: each
    one GPU); only those naming ``tenant_id``'s tenant when given (the cluster-wide ones too).
    Three queries."""
    from django.db.models import Q

    from tenants.models import Quota, QuotaScope


    cards = usable_gpus()
    tenants: dict[str, tuple[float, float]] = {}
    projects: dict[str, tuple[str, float, float]] = {}
    rows = (Quota.objects.filter(scope__in=[QuotaScope.TENANT, QuotaScope.PROJECT])
            .filter(Q(gpus_guaranteed__gt=0) | Q(gpus_guaranteed_all_clusters__gt=0))
            .values_list("scope", "tenant__name", "project__name", "gpus_guaranteed",
                         "gpus_guaranteed_all_clusters"))
    for scope, tname, pname, g, a in rows:
        if scope == QuotaScope.TENANT:
            tenants[tname] = (float(g or 0), float(a or 0))
        else:
            projects[f"{tname}/{pname}"] = (tname, float(g or 0), float(a or 0))
    for tname, _g, _a in projects.values():
        tenants.setdefault(tname, (0.0, 0.0))
    lines = A.unhonourable_guarantees(clusters=cards, tenants=tenants, projects=projects)
    if tenant_id is None:
        return lines
    from tenants.models import Tenant

    name = Tenant.objects.filter(pk=tenant_id).values_list("name", flat=True).first() or ""
    return [line for line in lines if not line.startswith("Tenant ") or line.startswith(f"Tenant {name}'s")]
