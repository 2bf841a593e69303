"""Reads for the home page: what a member, a tenant owner and a platform admin each need
first. Built from the dashboards' selectors (quota bars, cluster state, held resources) and
the launch forms' preset cards; each part runs a fixed number of queries, whatever the
number of workloads (the lists are cut to a few rows)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone

from scheduling.models import (
    ACTIVE_STATES,
    Allocation,
    Cluster,
    GpuDevice,
    Job,
    JobState,
    Node,
    without_cluster_bulk,
)
from scheduling.selectors import AllClusterUse
from tenants.models import Project, Quota, Tenant, User
from tenants.permissions import restrict, scope_of

from . import selectors

ROWS = 8  # rows per list on the home page; the full lists are a click away


@dataclass
class WorkloadRow:
    kind: str  # "notebook" | "training" | "service" | "job"
    name: str
    url: str
    project: str
    state: str
    state_label: str
    gpu: str
    since: dt.datetime | None
    waiting_reason: str
    obj: Any
    job: Any = None
    """The job whose reason ``waiting_reason`` is (its "as of" is shown beside it)."""


def _gpu_words(gpu_count: int, mem: int, cores: int, exclusive: bool, models: list[str],
               workers: int = 1, unit: str = "workers") -> str:
    if not gpu_count:
        return "no GPU"
    model = models[0].split("@", 1)[0] if models else "GPU"
    if mem or cores:
        part = f"slice of {'an' if model[:1] in 'AEFHILMNORSX8' else 'a'} {model}"
        part += f" ({mem // 1024} GB" if mem else " ("
        part += f"{', ' if mem and cores else ''}{cores} %)" if cores else ")"
        each = part if gpu_count == 1 else f"{gpu_count}× {part}"
    else:
        each = f"{gpu_count}× {model}"
    return each if workers == 1 else f"{workers} {unit} × {each}"


def my_workloads(user: Any) -> list[WorkloadRow]:
    """The user's notebooks, training jobs and model services that run or wait (newest first),
    among those the user may still see (an owner removed from a project no longer sees them)."""
    from workspaces.models import DevEnvironment, ModelService, ServiceStatus, TrainingJob
    from workspaces.selectors import page_reason, with_ready_now

    live = list(ACTIVE_STATES) + [JobState.QUEUED]
    rows: list[WorkloadRow] = []
    envs = (restrict(DevEnvironment.objects.filter(owner=user, job__state__in=live), user)
            .select_related("project__tenant", "job__cluster").order_by("-created_at")[:ROWS])
    for e in envs:
        rows.append(WorkloadRow(
            "notebook", e.name, f"/workspaces/environments/{e.pk}/", str(e.project), e.state,
            e.job.get_state_display() if e.job else e.state, _gpu_words(
                e.gpu_count, e.gpu_memory_mib, e.gpu_cores_percent, e.exclusive, e.gpu_models),
            e.job.started_at if e.job else None,
            page_reason(e.job) if e.job and e.state == "queued" else "", e,
            e.job if e.job and e.state == "queued" else None))
    trainings = (restrict(TrainingJob.objects.filter(owner=user), user)
                 .filter(Q(job__state__in=live) | Q(job__isnull=True, failed_dependency=False))
                 .select_related("project__tenant", "job__cluster").order_by("-created_at")[:ROWS])
    for t in trainings:
        rows.append(WorkloadRow(
            "training", t.name, f"/workspaces/training/{t.pk}/", str(t.project), t.state,
            t.job.get_state_display() if t.job else "Waiting", _gpu_words(
                t.gpu_count, t.gpu_memory_mib, t.gpu_cores_percent, t.exclusive, t.gpu_models,
                t.workers),
            t.job.started_at if t.job else None,
            (page_reason(t.job) if t.job and t.state == "queued" else t.blocked_reason), t,
            t.job if t.job and t.state == "queued" else None))
    services = (with_ready_now(restrict(ModelService.objects.filter(owner=user), user)
                               .exclude(status=ServiceStatus.IDLE))
                .select_related("project__tenant").order_by("-created_at")[:ROWS])
    for svc in services:
        ready = int(getattr(svc, "ready_now", 0))  # annotated by with_ready_now
        rows.append(WorkloadRow(
            "service", svc.name, f"/workspaces/services/{svc.pk}/", str(svc.project),
            "running" if ready else "queued",
            f"{ready} of {svc.desired_replicas} replicas ready",
            _gpu_words(svc.gpu_count, svc.gpu_memory_mib, svc.gpu_cores_percent, svc.exclusive,
                       svc.gpu_models, svc.desired_replicas, unit="replicas"),
            svc.created_at if ready else None, "", svc))
    rows.sort(key=lambda r: (r.state != "running", r.name))
    return rows[:ROWS]


def quota_left(user: Any) -> list[dict[str, Any]]:
    """GPU quota bars for each project the user may see, and what is left as the scheduler
    checks it (``selectors.projects_left``: per cluster, the project's and tenant's limits
    there; across all clusters, those limits). Fixed queries: the projects, the quotas, the
    clusters, the allocations, grouped slice reads."""
    projects = list(restrict(Project.objects.select_related("tenant"), user)[:ROWS])
    usage = selectors.project_usage([p.pk for p in projects])
    inputs = selectors.quota_left_inputs(projects)
    clusters = list(restrict(Cluster.objects.filter(enabled=True), user).order_by("name"))
    lefts = selectors.projects_left(projects, clusters, inputs)
    out = []
    for p in projects:
        q = inputs.project.get(p.pk)
        bars = selectors.quota_bars(q, usage.get(p.pk, selectors.Held()), "on all clusters")
        pl = lefts[p.pk]
        out.append({"project": p, "bars": bars[:1], "left": pl.left, "where": pl.best,
                    "per_cluster": pl.clusters if len(pl.clusters) > 1 else [],
                    "guaranteed_left": pl.guaranteed_left,
                    "all_clusters_left": pl.all_clusters_left,
                    "guaranteed_all_clusters": selectors.guaranteed_left_lines(p, inputs),
                    "class_limits": _class_left(q, inputs.use)})
    return out


def _class_left(q: Quota | None, use: AllClusterUse) -> list[str]:
    """"A100-80G: 40 of 160 GiB left across all clusters" per GPU model class limit."""
    limits = (q.gpu_memory_mib_limits_all_clusters if q is not None else None) or {}
    if not limits or q is None or q.project_id is None:
        return []
    pid = q.project_id
    return [f"{cls}: {max(0, lim - use.memory.get(('project', pid, cls), 0)) / 1024:g} of "
            f"{lim / 1024:g} GiB GPU memory left across all clusters" for cls, lim in sorted(limits.items())]


def can_start_now(user: Any) -> list[dict[str, Any]]:
    """Per cluster: the presets this user could start at once as a notebook (non-preemptible)
    (``workspaces.presets.startable_now``: what fits on the free cards, bounded by the quota
    left and the guarantee's room of the user's best project there), with why when they bound
    it."""
    from workspaces.presets import offered_presets, preset_cards, startable_now

    clusters = list(restrict(Cluster.objects.filter(enabled=True), user))
    cards = preset_cards(offered_presets(user), clusters, user)
    can = startable_now(user, cards, clusters)
    out = []
    for c in clusters:
        free: list[tuple[str, int]] = []
        bounded: list[str] = []
        for card in cards:
            s = can.get((card.profile.pk, c.pk))
            if s is None or not s.fit:
                continue
            if s.count < s.fit:
                bounded.append(f"{card.title}: {s.fit} fit on the free cards, you can start {s.count} "
                               f"({s.why})")
            if s.count:
                free.append((card.title, s.count))
        out.append({"cluster": c, "free": free, "bounded": bounded})
    return out


def owner_view(tenant: Tenant) -> dict[str, Any]:
    """A tenant's usage against guarantee and limit per project, top consumers, waiting jobs."""
    tenant_bars, per_project = selectors.tenant_quota_bars(tenant)
    projects = {p.pk: p for p in Project.objects.filter(tenant=tenant)}
    held = selectors.held_by(Allocation.objects.filter(job__tenant=tenant))
    per_user: dict[int | None, float] = defaultdict(float)
    for (_t, _p, user_id), h in held.items():
        per_user[user_id] += h.gpus
    names = dict(User.objects.filter(pk__in=[u for u in per_user if u]).values_list("pk", "username"))
    top = sorted(((names.get(u, "—") if u else "—", round(g, 2)) for u, g in per_user.items() if g),
                 key=lambda x: -x[1])[:5]
    waiting_qs = Job.objects.filter(tenant=tenant, state=JobState.QUEUED)
    waiting = list(without_cluster_bulk(waiting_qs.select_related("project", "owner", "cluster"), "cluster")
                   .order_by("submitted_at")[:5])
    return {
        "tenant": tenant,
        "bars": tenant_bars[:1],
        "projects": [(projects[pk], bars[:1]) for pk, bars in per_project.items() if pk in projects],
        "top": top,
        "waiting": waiting,
        "waiting_count": waiting_qs.count(),
    }


def admin_view() -> list[dict[str, Any]]:
    """Per enabled cluster: health, GPUs allocated and used, queue length and longest wait."""
    now = timezone.now()
    out = []
    for cluster in Cluster.objects.filter(enabled=True):
        state = selectors.cluster_now(cluster)
        nodes = Node.objects.filter(cluster=cluster, present=True).aggregate(
            total=Count("id"),
            down=Count("id", filter=Q(ready=False) | Q(cordoned=True) | Q(quarantined=True)))
        sick = GpuDevice.objects.filter(node__cluster=cluster, node__present=True).filter(
            Q(healthy=False) | Q(quarantined=True)).count()
        oldest = Job.objects.filter(cluster=cluster, state=JobState.QUEUED).aggregate(
            at=Min("submitted_at"))["at"]
        queued = state.jobs_by_state.get(JobState.QUEUED, 0)
        out.append({
            "cluster": cluster,
            "now": state,
            "alloc_pct": (round(100 * state.gpu_share_allocated / state.gpus_total, 1)
                          if state.gpus_total else 0),
            "nodes": nodes["total"],
            "nodes_down": nodes["down"],
            "gpus_sick": sick,
            "queued": queued,
            # Jobs holding GPUs (starting, running, being preempted): what "allocated" counts.
            "running": sum(state.jobs_by_state.get(s, 0) for s in ACTIVE_STATES),
            "longest_wait": (now - oldest) if oldest else None,
            "healthy": not nodes["down"] and not sick,
        })
    return out


def global_queue() -> dict[str, Any]:
    """Floating jobs no cluster has taken yet (one pool across clusters): they are in no
    cluster's waiting count."""
    now = timezone.now()
    row = Job.objects.filter(cluster__isnull=True, state=JobState.QUEUED).aggregate(
        n=Count("id"), at=Min("submitted_at"))
    return {"queued": row["n"], "longest_wait": (now - row["at"]) if row["at"] else None}


def home(user: Any) -> dict[str, Any]:
    scope = scope_of(user)
    owned = list(Tenant.objects.filter(pk__in=scope.owner_tenants)) if scope.owner_tenants else []
    return {
        "unit_words": selectors.unit.UNIT_WORDS,
        "workloads": my_workloads(user),
        "quota_left": quota_left(user),
        "start_now": can_start_now(user),
        "owner": [owner_view(t) for t in owned[:3]],
        "admin": admin_view() if scope.platform_admin else [],
        "guarantee_warnings": _guarantee_warnings() if scope.platform_admin else [],
        "global_queue": global_queue() if scope.platform_admin else None,
        "scheduler_lag": _scheduler_lag() if scope.platform_admin else None,
        "demo_load": _demo_load() if scope.platform_admin else None,
    }


def _guarantee_warnings() -> list[str]:
    from scheduling.accounting import guarantee_warnings

    return guarantee_warnings()


def _scheduler_lag() -> Any:
    """Whether the workers keep up with the beat (``scheduling.services.scheduler_lag``)."""
    from django.conf import settings

    from scheduling.services import scheduler_lag

    names = {c.pk: str(c) for c in Cluster.objects.filter(enabled=True).only("name", "display_name")}
    return {"lag": scheduler_lag(names), "limit": settings.SCHEDULER_LAG_SECONDS}


def _demo_load() -> Any:
    from .demo import state

    return state()
