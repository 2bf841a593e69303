"""Reads for dashboards, quota bars, showback and metrics."""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from scheduling import accounting
from scheduling.engine import accounting as unit
from scheduling.models import ACTIVE_STATES, Allocation, Cluster, GpuDevice, GpuSlice, Job, JobState
from tenants.models import RESOURCE_LABELS, Project, Quota, QuotaScope, Tenant

from .models import ClusterSample, UsageSample

if TYPE_CHECKING:
    from scheduling.selectors import AllClusterUse


@dataclass
class Held:
    """Resources held by running jobs, in the units of the quota model."""

    gpus: float = 0.0
    gpu_memory_mib: int = 0
    cpu_cores: float = 0.0
    ram_mib: int = 0

    def add(self, other: Held) -> None:
        self.gpus += other.gpus
        self.gpu_memory_mib += other.gpu_memory_mib
        self.cpu_cores += other.cpu_cores
        self.ram_mib += other.ram_mib

    def get(self, resource: str) -> float:
        return float(getattr(self, resource))


def held_by(allocations: QuerySet[Allocation], *,
            by_model: bool = False) -> dict[tuple[Any, ...], Held]:
    """Held resources keyed by (tenant id, project id, owner id) for the given allocations (GPUs
    in the one GPU unit, ``scheduling.accounting``); with ``by_model``, by (tenant id, project
    id, owner id, GPU model) — an allocation's CPU and RAM go with the model of its GPUs ("" for
    a CPU-only one), as showback prices them."""
    from django.db.models import OuterRef, Subquery, Value
    from django.db.models.functions import Coalesce

    out: dict[tuple[Any, ...], Held] = defaultdict(Held)
    owner = ("job__tenant_id", "job__project_id", "job__owner_id")
    rows = allocations.order_by()
    if by_model:
        first_model = (GpuSlice.objects.filter(allocation=OuterRef("pk")).order_by("pk")
                       .values("gpu__model")[:1])
        rows = rows.annotate(model=Coalesce(Subquery(first_model), Value("")))
    columns = (*owner, "model") if by_model else owner
    for *key, cpu, ram in (rows.values(*columns).annotate(cpu=Sum("cpu_millicores"), ram=Sum("ram_mib"))
                           .values_list(*columns, "cpu", "ram")):
        held = out[tuple(key)]
        held.cpu_cores += (cpu or 0) / 1000
        held.ram_mib += ram or 0
    keys = tuple(f"allocation__{k}" for k in owner) + (("gpu__model",) if by_model else ())
    slices = GpuSlice.objects.filter(allocation__in=allocations)
    for key, (n, mib) in accounting.held(slices, *keys).items():
        out[key].gpus += n
        out[key].gpu_memory_mib += mib
    return dict(out)


def project_usage(projects: Iterable[int] | None = None, *,
                  cluster: Cluster | int | None = None) -> dict[int, Held]:
    """Held resources per project: on every cluster, or on ``cluster`` only (what that
    cluster's queue tree and per-cluster quota count)."""
    allocations = Allocation.objects.all()
    if cluster is not None:
        allocations = allocations.filter(cluster=cluster)
    if projects is not None:
        allocations = allocations.filter(job__project_id__in=list(projects))
    per: dict[int, Held] = defaultdict(Held)
    for (_t, project_id, _u), held in held_by(allocations).items():
        per[project_id].add(held)
    return dict(per)


@dataclass
class QuotaBar:
    """One resource of one queue: used, guaranteed and limit, with percentages for a bar."""

    resource: str
    label: str
    used: float
    guaranteed: float
    limit: float | None
    where: str = ""
    """Where ``used`` was counted ("on all clusters", "on east"): per-cluster quotas apply on
    each cluster, so a total over clusters is said to be one."""
    borrowed: float = field(init=False)
    scale: float = field(init=False)

    @property
    def unit(self) -> str:
        """The GPU unit in words, under each GPU bar (empty for other resources)."""
        return unit.UNIT_WORDS if self.resource == "gpus" else ""

    def __post_init__(self) -> None:
        self.borrowed = max(0.0, self.used - self.guaranteed)
        top = max(self.limit or 0.0, self.guaranteed, self.used, 1e-9)
        self.scale = top

    @property
    def within_pct(self) -> float:
        return round(100 * min(self.used, self.guaranteed) / self.scale, 1)

    @property
    def borrowed_pct(self) -> float:
        return round(100 * self.borrowed / self.scale, 1)

    @property
    def guaranteed_pct(self) -> float:
        return round(100 * self.guaranteed / self.scale, 1)


def _num(value: Decimal | int | None) -> float | None:
    return None if value is None else float(value)


def quota_bars(quota: Quota | None, held: Held, where: str = "") -> list[QuotaBar]:
    bars = []
    for resource, attr in (("gpus", "gpus"), ("gpu_memory_mib", "gpu_memory_mib"),
                           ("cpu_cores", "cpu_cores"), ("ram_mib", "ram_mib")):
        g = _num(getattr(quota, f"{resource}_guaranteed")) if quota else 0.0
        lim = _num(getattr(quota, f"{resource}_limit")) if quota else None
        bars.append(QuotaBar(resource, RESOURCE_LABELS[resource], round(held.get(attr), 2), g or 0.0, lim,
                             where))
    return bars


def tenant_quota_bars(tenant: Tenant) -> tuple[list[QuotaBar], dict[int, list[QuotaBar]]]:
    """Bars for the tenant and each of its projects, from current allocations."""
    projects = list(Project.objects.filter(tenant=tenant))
    usage = project_usage([p.pk for p in projects])
    total = Held()
    for held in usage.values():
        total.add(held)
    quotas = {q.project_id: q for q in Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=tenant)}
    tenant_quota = Quota.objects.filter(scope=QuotaScope.TENANT, tenant=tenant).first()
    where = "on all clusters"  # the quotas apply per cluster: the bar says the total is one
    per_project = {p.pk: quota_bars(quotas.get(p.pk), usage.get(p.pk, Held()), where) for p in projects}
    return quota_bars(tenant_quota, total, where), per_project


# --- quota left across all clusters (issue 16) -----------------------------------------


@dataclass
class QuotaLeftInputs:
    """What "quota left" reads for a list of projects: their quotas, their tenants' quotas and
    what is held on every cluster (``scheduling.selectors.all_cluster_use``)."""

    project: dict[int, Quota]
    tenant: dict[int, Quota]
    use: AllClusterUse
    asks: dict[tuple[str, int, int], float] = field(default_factory=dict)
    """What queued preemptors waiting for their victims ask, per owner and cluster
    (``scheduling.selectors.preemptor_asks``): the split counts them as held."""


def quota_left_inputs(projects: list[Project]) -> QuotaLeftInputs:
    """One query for the projects' and their tenants' quotas, one usage aggregate over
    ``GpuSlice`` (none when no project or tenant among them has a class memory limit or a GPU
    guarantee across all clusters) and one over the waiting preemptors' ``PodGroup`` rows (none
    without a GPU guarantee across all clusters), whatever the number of projects."""
    from scheduling.selectors import AllClusterUse, all_cluster_use, preemptor_asks

    tenant_ids = sorted({p.tenant_id for p in projects})
    project_q: dict[int, Quota] = {}
    tenant_q: dict[int, Quota] = {}
    if projects:
        for q in Quota.objects.filter(Q(scope=QuotaScope.PROJECT, project__in=projects)
                                      | Q(scope=QuotaScope.TENANT, tenant_id__in=tenant_ids)):
            if q.scope == QuotaScope.PROJECT and q.project_id is not None:
                project_q[q.project_id] = q
            elif q.scope == QuotaScope.TENANT and q.tenant_id is not None:
                tenant_q[q.tenant_id] = q
    needed: set[int] = {tid for tid, q in tenant_q.items() if q.gpus_guaranteed_all_clusters}
    for q in project_q.values():
        across = q.gpu_memory_mib_limits_all_clusters or q.gpus_guaranteed_all_clusters
        if across and q.tenant_id is not None:
            needed.add(q.tenant_id)
    use = all_cluster_use(sorted(needed)) if needed else AllClusterUse()
    guaranteed = {q.tenant_id for q in [*project_q.values(), *tenant_q.values()]
                  if q.gpus_guaranteed_all_clusters and q.tenant_id is not None}
    asks = preemptor_asks(sorted(guaranteed)) if guaranteed else {}
    return QuotaLeftInputs(project_q, tenant_q, use, asks)


def guaranteed_left_lines(project: Project, inputs: QuotaLeftInputs) -> list[str]:
    """"N of G GPUs guaranteed across all clusters left" for the project and, where it has
    one, its tenant ("Tenant acme: …"); empty when neither has a guarantee across all clusters."""
    out = []
    for level, key, quota, prefix in (
            ("project", project.pk, inputs.project.get(project.pk), ""),
            ("tenant", project.tenant_id, inputs.tenant.get(project.tenant_id),
             f"Tenant {project.tenant.name}: ")):
        if quota is None or not quota.gpus_guaranteed_all_clusters:
            continue
        total = float(quota.gpus_guaranteed_all_clusters)
        # Used as the scheduler counts it: what the owner holds beyond its per-cluster
        # guarantee on each cluster (its waiting preemptors' asks counted as held), summed
        # (``AllClusterUse.guarantee_used``).
        base = float(quota.gpus_guaranteed or 0)
        used = inputs.use.guarantee_used(level, key, base, total, inputs.asks)
        left = round(max(0.0, total - used), 2)
        out.append(f"{prefix}{left:g} of {total:g} GPUs guaranteed across all clusters left")
    return out


@dataclass
class ClusterLeft:
    """What a project may still start on one cluster under its per-cluster quotas (its own
    and its tenant's, which apply on each cluster) and the limits across all clusters: the
    scheduler's check, in the one GPU unit."""

    cluster: Cluster
    used: float
    """The project's GPUs on this cluster."""
    left: float | None
    """GPUs it may still start here (None: no limit anywhere on its path)."""
    guaranteed_left: float
    """Its per-cluster guarantee not yet used here."""
    why: str
    """Which limit bounds ``left`` (empty when none does)."""


@dataclass
class ProjectLeft:
    project: Project
    quota: Quota | None
    used: float
    """GPUs on every cluster together."""
    clusters: list[ClusterLeft]
    all_clusters_left: float | None

    @property
    def best(self) -> ClusterLeft | None:
        """The cluster where most is left."""
        return max(self.clusters, key=lambda c: (c.left is None, c.left or 0.0), default=None)

    @property
    def left(self) -> float | None:
        best = self.best
        if best is None:
            return self.all_clusters_left
        return best.left

    @property
    def guaranteed_left(self) -> float:
        return max((c.guaranteed_left for c in self.clusters), default=0.0)


def AllClusterUseEmpty() -> AllClusterUse:  # noqa: N802 (a constructor)
    from scheduling.selectors import AllClusterUse

    return AllClusterUse()


def projects_left(projects: list[Project], clusters: list[Cluster],
                  inputs: QuotaLeftInputs | None = None) -> dict[int, ProjectLeft]:
    """Quota left per project and cluster, as the scheduler checks it: the project's and its
    tenant's per-cluster GPU limits against what each holds on that cluster, and the GPU limits
    across all clusters against what each holds everywhere. The one "quota left" every page
    reads (home, launch forms, free now). One grouped read of the slices, whatever the number
    of projects and clusters."""
    tids = sorted({p.tenant_id for p in projects})
    if inputs is None:  # the quotas only (no usage aggregate by GPU model: not read here)
        inputs = QuotaLeftInputs({}, {}, AllClusterUseEmpty())
        for row in Quota.objects.filter(Q(scope=QuotaScope.PROJECT, project__in=projects)
                                        | Q(scope=QuotaScope.TENANT, tenant_id__in=tids)):
            if row.scope == QuotaScope.PROJECT and row.project_id is not None:
                inputs.project[row.project_id] = row
            elif row.scope == QuotaScope.TENANT and row.tenant_id is not None:
                inputs.tenant[row.tenant_id] = row
    per: dict[tuple[str, int, int], float] = defaultdict(float)
    everywhere: dict[tuple[str, int], float] = defaultdict(float)
    if projects:
        for (pid, tid, cid), n in accounting.held_gpus(
                GpuSlice.objects.filter(allocation__job__tenant_id__in=tids), "allocation__job__project_id",
                "allocation__job__tenant_id", "allocation__cluster_id").items():
            for key in (("project", pid), ("tenant", tid)):
                per[(*key, cid)] += n
                everywhere[key] += n

    def lim(q: Quota | None, field: str) -> float | None:
        v = getattr(q, field) if q is not None else None
        return None if v is None else float(v)

    out: dict[int, ProjectLeft] = {}
    for p in projects:
        pq, tq = inputs.project.get(p.pk), inputs.tenant.get(p.tenant_id)
        bounds_all = [(f"{who} limit across all clusters ({v:g} GPUs, {everywhere[key]:.2f} in use)",
                       v - everywhere[key])
                      for who, q, key in (("the project's", pq, ("project", p.pk)),
                                          (f"tenant {p.tenant.name}'s", tq, ("tenant", p.tenant_id)))
                      if (v := lim(q, "gpus_limit_all_clusters")) is not None]
        all_left = round(max(0.0, min(b for _w, b in bounds_all)), 2) if bounds_all else None
        rows = []
        for c in clusters:
            bounds = list(bounds_all)
            for who, q, key in (("the project's", pq, ("project", p.pk)),
                                (f"tenant {p.tenant.name}'s", tq, ("tenant", p.tenant_id))):
                v = lim(q, "gpus_limit")
                if v is not None:
                    here = per[(*key, c.pk)]
                    bounds.append((f"{who} limit on {c.name} ({v:g} GPUs, {here:.2f} in use there)",
                                   v - here))
            why, left = min(bounds, key=lambda b: b[1]) if bounds else ("", None)
            g = lim(pq, "gpus_guaranteed") or 0.0
            used = per[("project", p.pk, c.pk)]
            rows.append(ClusterLeft(c, round(used, 2), None if left is None else round(max(0.0, left), 2),
                                    round(max(0.0, g - used), 2), why))
        out[p.pk] = ProjectLeft(p, pq, round(everywhere[("project", p.pk)], 2), rows, all_left)
    return out


def guarantee_rooms(projects: list[Project], clusters: list[Cluster]
                    ) -> dict[tuple[int, int], list[tuple[float, str]]]:
    """(project id, cluster id) → the rooms the per-cluster GPU guarantees of the project and
    of its tenant leave its non-preemptible work there (guarantee − what their non-preemptible
    jobs hold on that cluster; a level guaranteeing nothing restricts nothing, as in the
    engine), with the words naming each. One query for the guarantees; one grouped read of the
    non-preemptible slices only when some guarantee is set."""
    tids = sorted({p.tenant_id for p in projects})
    g: dict[tuple[str, int], float] = {}
    for scope, pid, tid, v in Quota.objects.filter(
            Q(scope=QuotaScope.PROJECT, project__in=projects)
            | Q(scope=QuotaScope.TENANT, tenant_id__in=tids), gpus_guaranteed__gt=0,
    ).values_list("scope", "project_id", "tenant_id", "gpus_guaranteed"):
        g[("project", pid) if scope == QuotaScope.PROJECT else ("tenant", tid)] = float(v)
    if not g or not clusters:
        return {}
    held: dict[tuple[str, int, int], float] = defaultdict(float)
    for (pid, tid, cid), n in accounting.held_gpus(
            GpuSlice.objects.filter(allocation__job__tenant_id__in=tids, allocation__job__preemptible=False),
            "allocation__job__project_id", "allocation__job__tenant_id", "allocation__cluster_id").items():
        held[("project", pid, cid)] += n
        held[("tenant", tid, cid)] += n
    out: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for p in projects:
        for c in clusters:
            for who, key in (("the project's", ("project", p.pk)),
                             (f"tenant {p.tenant.name}'s", ("tenant", p.tenant_id))):
                if key in g:
                    np = held[(*key, c.pk)]
                    out.setdefault((p.pk, c.pk), []).append((g[key] - np, (
                        f"a notebook runs non-preemptible, within {who} guarantee on {c.name} "
                        f"({g[key]:g} GPUs, {np:.2f} held by non-preemptible jobs there)")))
    return out


# --- cluster state ---------------------------------------------------------------------


@dataclass
class ClusterNow:
    cluster: Cluster
    gpus_total: int
    gpus_in_use: int
    gpu_share_allocated: float
    gpu_memory_total_mib: int
    gpu_memory_allocated_mib: int
    cores_allocated_percent: int
    utilization_percent: float | None
    jobs_by_state: dict[str, int]
    wait_seconds: list[float]
    gpus_held_by_others: int = 0
    """Cards Camp has nothing on that pods Camp did not create hold (some or all of)."""
    gpu_memory_held_by_others_mib: int = 0
    """Memory those pods hold (a whole card's for a card held whole)."""


def cluster_now(cluster: Cluster, *, wait_window: dt.timedelta = dt.timedelta(hours=1)) -> ClusterNow:
    gpus = list(GpuDevice.objects.filter(node__cluster=cluster, node__present=True).values_list(
        "memory_mib", "memory_allocated_mib", "cores_allocated", "sharers", "foreign_memory_mib",
        "foreign_sharers", "foreign_exclusive", "utilization_percent"))
    share = accounting.held_gpus(GpuSlice.objects.filter(allocation__cluster=cluster),
                                 "allocation__cluster_id").get(cluster.pk, 0.0)
    utils = [u for *_rest, u in gpus if u is not None]
    states = dict.fromkeys(JobState.values, 0)
    for state, n in (Job.objects.filter(cluster=cluster).order_by().values_list("state")
                     .annotate(n=Count("id"))):
        states[state] = n
    since = timezone.now() - wait_window
    waits = [
        (admitted - submitted).total_seconds()
        for submitted, admitted in Job.objects.filter(cluster=cluster, admitted_at__gte=since)
        .values_list("submitted_at", "admitted_at")
        if admitted is not None
    ]
    return ClusterNow(
        cluster=cluster,
        gpus_total=len(gpus),
        gpus_in_use=sum(1 for g in gpus if g[3] > 0 or g[1] > 0),
        gpu_share_allocated=round(share, 3),
        gpu_memory_total_mib=sum(g[0] for g in gpus),
        gpu_memory_allocated_mib=sum(g[1] for g in gpus),
        cores_allocated_percent=sum(g[2] for g in gpus),
        utilization_percent=round(sum(utils) / len(utils), 1) if utils else None,
        jobs_by_state=states,
        wait_seconds=waits,
        gpus_held_by_others=sum(1 for g in gpus if not (g[3] > 0 or g[1] > 0)
                                and (g[5] > 0 or g[4] > 0 or g[6])),
        gpu_memory_held_by_others_mib=sum(g[0] if g[6] else min(g[0], g[4]) for g in gpus),
    )


def percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile (the value at rank ceil(p·n))."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


# --- time series and showback ------------------------------------------------------------


def cluster_series(cluster: Cluster, since: dt.datetime) -> dict[str, list[Any]]:
    rows = ClusterSample.objects.filter(cluster=cluster, at__gte=since).order_by("at")
    series: dict[str, list[Any]] = defaultdict(list)
    for s in rows:
        series["at"].append(s.at.isoformat())
        series["allocated"].append(
            round(100 * s.gpu_share_allocated / s.gpus_total, 1) if s.gpus_total else 0)
        series["utilization"].append(s.utilization_percent)
        series["queued"].append(s.jobs_queued)
        series["running"].append(s.jobs_running)
        series["wait_p50"].append(s.wait_p50_seconds)
        series["wait_p95"].append(s.wait_p95_seconds)
    return dict(series)


def tenant_series(tenants: Iterable[Tenant], since: dt.datetime) -> dict[str, Any]:
    """GPU-equivalents held per tenant at each sample time."""
    names = {t.pk: t.name for t in tenants}
    rows = (UsageSample.objects.filter(tenant_id__in=names, sample__at__gte=since)
            .values_list("sample__at", "tenant_id").annotate(g=Sum("gpu_share")).order_by("sample__at"))
    times: list[str] = []
    per: dict[str, dict[str, float]] = defaultdict(dict)
    for at, tenant_id, g in rows:
        key = at.isoformat()
        if not times or times[-1] != key:
            times.append(key)
        per[names[tenant_id]][key] = round(g or 0.0, 2)
    return {"at": times, "tenants": {n: [per[n].get(t, 0) for t in times] for n in per}}


@dataclass
class ShowbackRow:
    tenant: str
    project: str
    user: str
    cluster: str
    gpu_model: str
    gpu_hours: float
    gpu_memory_gib_hours: float
    cpu_core_hours: float
    ram_gib_hours: float
    cost: Decimal | None  # None: no price covers any of it


@dataclass
class Showback:
    rows: list[ShowbackRow]
    currency: str
    unpriced: list[str]  # the resources used in the period that have no price ("GPU-hour of L4")

    @property
    def gpu_hours(self) -> float:
        return round(sum(r.gpu_hours for r in self.rows), 3)

    @property
    def cost(self) -> Decimal | None:
        costs = [r.cost for r in self.rows if r.cost is not None]
        return sum(costs, Decimal(0)) if costs else None


def prices() -> dict[tuple[str, str], Decimal]:
    """(kind, GPU model) → price of an hour, as platform admins set them."""
    from .models import Price

    return {(p.kind, p.gpu_model): p.per_hour for p in Price.objects.all()}


def showback(*, tenants: Iterable[int], since: dt.datetime, until: dt.datetime,
             by: str = "project") -> Showback:
    """GPU-hours (and GPU memory, CPU and RAM hours) per project or per user, split by cluster
    and GPU model, over [since, until), with their cost at today's prices.

    Each sample stands for the interval before it, so usage × interval summed over the
    samples in the period is the area under the usage curve. Cost: GPU-hours × the price of
    that GPU model's hour + CPU core-hours × the CPU price + RAM GiB-hours × the RAM price."""
    if by not in ("project", "user"):
        raise ValueError("by must be 'project' or 'user'")
    q = Q(tenant_id__in=list(tenants), sample__at__gte=since, sample__at__lt=until)
    rows = UsageSample.objects.filter(q).values_list(
        "tenant__name", "project__name", "user__username", "sample__cluster__name", "gpu_model",
        "gpu_share", "gpu_memory_mib", "cpu_millicores", "ram_mib", "sample__interval_seconds")
    acc: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for tenant, project, user, cluster, model, share, mem, cpu, ram, interval in rows:
        who = (user or "—") if by == "user" else ""
        key = (tenant, project, who, cluster, model)
        hours = interval / 3600
        acc[key][0] += share * hours
        acc[key][1] += mem / 1024 * hours
        acc[key][2] += cpu / 1000 * hours
        acc[key][3] += ram / 1024 * hours
    price = prices()
    unpriced: set[str] = set()
    out = []
    for (t, p, u, c, m), (gpu_h, mem_h, cpu_h, ram_h) in acc.items():
        parts: list[Decimal] = []
        for amount, kind, model, label in ((gpu_h, "gpu", m, f"GPU-hour of {m}"),
                                           (cpu_h, "cpu", "", "CPU core-hour"),
                                           (ram_h, "ram", "", "RAM GiB-hour")):
            if amount <= 0 or (kind == "gpu" and not m):
                continue
            if (kind, model) in price:
                parts.append(price[(kind, model)] * Decimal(str(round(amount, 6))))
            else:
                unpriced.add(label)
        cost = sum(parts, Decimal(0)).quantize(Decimal("0.01")) if parts else None
        out.append(ShowbackRow(t, p, u, c, m, round(gpu_h, 3), round(mem_h, 3), round(cpu_h, 3),
                               round(ram_h, 3), cost))
    out.sort(key=lambda r: (-r.gpu_hours, r.tenant, r.project, r.user, r.cluster, r.gpu_model))
    return Showback(rows=out, currency=getattr(settings, "SHOWBACK_CURRENCY", "USD"),
                    unpriced=sorted(unpriced))


def active_jobs(cluster: Cluster) -> QuerySet[Job]:
    return Job.objects.filter(cluster=cluster, state__in=ACTIVE_STATES)


# --- platform admin views ----------------------------------------------------------------


@dataclass
class SliceView:
    job_id: int
    job: str
    user: str
    tenant: str
    memory_mib: int
    cores_percent: int
    exclusive: bool
    width_pct: float
    color: int


@dataclass
class CardView:
    index: int
    model: str
    memory_mib: int
    healthy: bool
    quarantined: bool
    utilization_percent: float | None
    slices: list[SliceView]
    free_mib: int
    free_cores: int
    free_gpus: float = 0.0
    """What is free on the card in the one GPU unit (``scheduling.accounting.card_free_gpus``):
    the smaller of its free memory share and free compute share."""


def gpu_map(cluster: Cluster) -> list[dict[str, Any]]:
    """Per node, per card: which slices are given to whom, and each card's health."""
    tenant_colors: dict[str, int] = {}
    slices_by_gpu: dict[int, list[SliceView]] = defaultdict(list)
    for s in GpuSlice.objects.filter(allocation__cluster=cluster).select_related(
        "allocation__job__tenant", "allocation__job__project", "allocation__job__owner", "gpu"
    ):
        job = s.allocation.job
        tenant = job.tenant.name
        color = tenant_colors.setdefault(tenant, len(tenant_colors) % 7)
        card_mem = s.gpu.memory_mib
        used = card_mem if s.exclusive else s.memory_mib
        slices_by_gpu[s.gpu_id].append(SliceView(
            job_id=job.pk, job=f"{job.project.name}/{job.name}",
            user=job.owner.username if job.owner else "—", tenant=tenant,
            memory_mib=used, cores_percent=100 if s.exclusive else s.cores_percent,
            exclusive=s.exclusive, width_pct=round(100 * used / card_mem, 1) if card_mem else 0,
            color=color,
        ))
    nodes = []
    for node in cluster.nodes.filter(present=True).prefetch_related("gpus").order_by("name"):
        cards = [
            CardView(
                index=g.index, model=g.model, memory_mib=g.memory_mib, healthy=g.healthy,
                quarantined=g.quarantined, utilization_percent=g.utilization_percent,
                slices=slices_by_gpu.get(g.pk, []),
                free_mib=max(0, g.memory_mib - g.memory_allocated_mib - g.foreign_memory_mib),
                free_cores=max(0, 100 - g.cores_allocated - g.foreign_cores),
                free_gpus=round(accounting.device_free_gpus(g), 2),
            )
            for g in node.gpus.all()
        ]
        nodes.append({"node": node, "cards": cards})
    return nodes


@dataclass
class QueueRow:
    level: str
    name: str
    depth: int
    bars: list[QuotaBar]
    fair_share: float | None
    queued: int
    running: int


def queue_tree(cluster: Cluster) -> list[QueueRow]:
    """cluster → tenant → project with quota, usage, borrowing and fair-share state.

    Fair share is the dominant share (DRF): the largest of used/guaranteed over the
    resources the queue is guaranteed; above 1 the queue is borrowing."""
    jobs: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for project_id, state in Job.objects.filter(cluster=cluster, state__in=[
        JobState.QUEUED, JobState.RUNNING, JobState.STARTING]).values_list("project_id", "state"):
        jobs[project_id][0 if state == JobState.QUEUED else 1] += 1
    usage = project_usage(cluster=cluster)  # this cluster's: its quotas apply here (issue 29)
    quotas = {(q.scope, q.tenant_id, q.project_id): q for q in Quota.objects.all()}
    rows: list[QueueRow] = []
    total = Held()
    for held in usage.values():
        total.add(held)
    cluster_quota = Quota.objects.filter(scope=QuotaScope.CLUSTER, cluster=cluster).first()
    all_jobs = [sum(v[0] for v in jobs.values()), sum(v[1] for v in jobs.values())]
    here = f"on {cluster}"
    rows.append(QueueRow("cluster", str(cluster), 0, quota_bars(cluster_quota, total, here),
                         _fair(cluster_quota, total), *all_jobs))
    for tenant in Tenant.objects.prefetch_related("projects").order_by("name"):
        projects = list(tenant.projects.all())
        t_held = Held()
        for p in projects:
            t_held.add(usage.get(p.pk, Held()))
        tq = quotas.get((QuotaScope.TENANT, tenant.pk, None))
        t_jobs = [sum(jobs[p.pk][0] for p in projects), sum(jobs[p.pk][1] for p in projects)]
        rows.append(QueueRow("tenant", tenant.name, 1, quota_bars(tq, t_held, here), _fair(tq, t_held),
                             *t_jobs))
        for p in projects:
            pq = quotas.get((QuotaScope.PROJECT, tenant.pk, p.pk))
            held = usage.get(p.pk, Held())
            rows.append(QueueRow("project", f"{tenant.name}/{p.name}", 2, quota_bars(pq, held, here),
                                 _fair(pq, held), *jobs[p.pk]))
    return rows


def _fair(quota: Quota | None, held: Held) -> float | None:
    if quota is None:
        return None
    shares = []
    for resource in ("gpus", "gpu_memory_mib", "cpu_cores", "ram_mib"):
        g = float(getattr(quota, f"{resource}_guaranteed") or 0)
        if g > 0:
            shares.append(held.get(resource) / g)
    return round(max(shares), 2) if shares else None


# --- estimated start ---------------------------------------------------------------------


@dataclass
class StartEstimate:
    at: dt.datetime | None
    note: str


def shape_demand(groups: Iterable[Any], largest_card_mib: int) -> float:
    """GPUs asked for by groups of (replicas, gpu_count, exclusive, gpu_memory_mib,
    gpu_cores_percent), in the one GPU unit with MiB taken as a share of the largest card
    (``engine.accounting.shape_ask_gpus``)."""
    return sum(unit.shape_ask_gpus(
        replicas=getattr(g, "replicas", 1), gpu_count=g.gpu_count, exclusive=g.exclusive,
        memory_mib=g.gpu_memory_mib, memory_percent=getattr(g, "gpu_memory_percent", 0),
        cores_percent=g.gpu_cores_percent, card_memory_mib=largest_card_mib) for g in groups)


def _job_demand(job: Job, largest_card_mib: int) -> float:
    return shape_demand(job.groups.all(), largest_card_mib)


@dataclass
class CapacityTimeline:
    """A cluster's GPU-equivalents free now and the running jobs' expected ends (start +
    declared duration) with the GPU-equivalents each frees, soonest first. Loaded once per
    cluster (three queries) and shared by every estimate made from it."""

    free: float
    largest_card_mib: int
    ends: list[tuple[dt.datetime, float]]


def capacity_timeline(cluster: Cluster) -> CapacityTimeline:
    cards = list(GpuDevice.objects.filter(node__cluster=cluster).values_list(
        "node__present", *accounting.CARD_FREE_COLUMNS))
    shares = accounting.held_gpus(GpuSlice.objects.filter(allocation__cluster=cluster),
                                  "allocation__job_id")
    ends = []
    for running in Job.objects.filter(pk__in=list(shares)).only("pk", "started_at", "duration_seconds"):
        if running.started_at is None or not running.duration_seconds:
            continue
        ends.append((running.started_at + dt.timedelta(seconds=running.duration_seconds),
                     shares.get(running.pk, 0.0)))
    free = sum(accounting.card_free_gpus(*card) for present, *card in cards if present)
    return CapacityTimeline(
        free=round(free, 3),
        largest_card_mib=max((c[1] for c in cards), default=0),
        ends=sorted(ends, key=lambda e: e[0]),
    )


def first_fit(demand: float, timeline: CapacityTimeline, now: dt.datetime) -> dt.datetime | None:
    """The first expected end at which the freed GPU-equivalents cover the demand (now if
    they already do; None if no running job's end is known early enough)."""
    free = timeline.free
    if demand <= free + 1e-9:
        return now
    for end, freed in timeline.ends:
        free += freed
        if demand <= free + 1e-9:
            return max(end, now)
    return None


def estimate_start(job: Job, *, now: dt.datetime | None = None) -> StartEstimate:
    """When a job waiting for capacity could start, from the running jobs' expected ends.

    Rule: walk the running jobs in order of expected end (start + declared duration); the
    estimate is the first end at which the cluster's free GPU-equivalents cover the job's
    ask. It assumes nothing ahead in the queue takes that capacity first and ignores
    fragmentation, so it is a lower bound; without durations there is no estimate."""
    now = now or timezone.now()
    if job.state != JobState.QUEUED:
        return StartEstimate(None, "")
    if job.reason_kind in ("quota", "over-limit", "guarantee"):
        return StartEstimate(None, "Waits for its project's quota, not for free GPUs.")
    if job.reason_kind in ("never-fits", "unknown-queue", "over-guarantee"):
        return StartEstimate(None, "Cannot start as it is.")
    if job.reason_kind == "cluster":  # its cluster is disabled or does not answer
        return StartEstimate(None, "Not while its cluster takes no new work; see why above.")
    if job.cluster is None:  # a floating job in the global queue: its reason names each cluster
        return StartEstimate(None, "No cluster chosen yet; see why above, cluster by cluster.")
    timeline = capacity_timeline(job.cluster)
    at = first_fit(_job_demand(job, timeline.largest_card_mib), timeline, now)
    if at == now:
        return StartEstimate(now, "GPUs are free now; it starts at a coming cycle.")
    if at is not None:
        return StartEstimate(at, "If nothing ahead of it takes the GPUs first.")
    return StartEstimate(None, "Not known: the running jobs do not say how long they run "
                                 "(a declared duration would let it be estimated).")
