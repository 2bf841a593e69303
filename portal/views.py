"""Dashboards, showback and /metrics."""

from __future__ import annotations

import csv
import datetime as dt
import hmac
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.views.decorators.http import require_POST
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from camp.taskmetrics import CeleryCollector
from scheduling.models import Cluster, GpuDevice
from tenants.api.views import csv_safe
from tenants.models import AuditEvent, Project, Tenant
from tenants.permissions import actor_of, can, restrict, scope_of

from . import selectors
from .metrics import CampCollector

PERIODS = {"24h": dt.timedelta(hours=24), "7d": dt.timedelta(days=7), "30d": dt.timedelta(days=30)}


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus exposition. With METRICS_TOKEN set, a matching bearer token is required;
    otherwise it is open if METRICS_PUBLIC, else for platform admins' sessions only."""
    token = settings.METRICS_TOKEN
    if token:
        supplied = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            return HttpResponse("metrics token required\n", status=401, content_type="text/plain")
    elif not settings.METRICS_PUBLIC and not scope_of(request.user).platform_admin:
        return HttpResponse("set METRICS_TOKEN to scrape\n", status=401, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CampCollector())
    registry.register(CeleryCollector())
    # The scheduler's and Celery's state (every process's, from the database and Redis), then
    # this web process's own: HTTP rate, latency and status (django-prometheus) and the
    # process's CPU and memory. Scrape every web pod to sum the HTTP series.
    body = generate_latest(registry) + generate_latest(REGISTRY)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Charts: clusters (platform admins) and per-tenant usage (owners see their tenants)."""
    scope = scope_of(request.user)
    if not scope.platform_admin and not scope.owner_tenants:
        raise PermissionDenied("Dashboards are for tenant owners and platform admins.")
    period = request.GET.get("period", "24h")
    since = timezone.now() - PERIODS.get(period, PERIODS["24h"])
    clusters: list[dict[str, Any]] = []
    if scope.platform_admin:
        for cluster in Cluster.objects.filter(enabled=True):
            now = selectors.cluster_now(cluster)
            clusters.append({
                "cluster": cluster,
                "now": now,
                "alloc_pct": (round(100 * now.gpu_share_allocated / now.gpus_total, 1)
                              if now.gpus_total else 0),
                "series": selectors.cluster_series(cluster, since),
            })
    tenants = restrict(Tenant.objects.all(), request.user)
    if not scope.platform_admin:
        tenants = tenants.filter(pk__in=scope.owner_tenants)
    return render(request, "portal/dashboard.html", {
        "clusters": clusters,
        "chart_data": {
            "clusters": [{"name": c["cluster"].name, **c["series"]} for c in clusters],
            "tenants": selectors.tenant_series(tenants, since),
        },
        "period": period,
        "periods": list(PERIODS),
    })


def _period(request: HttpRequest) -> tuple[dt.datetime, dt.datetime, dict[str, str]]:
    """[since, until) from ?since=YYYY-MM-DD&until=YYYY-MM-DD (default: the last 30 days)."""
    errors: dict[str, str] = {}
    today = timezone.localdate()
    since_d, until_d = today - dt.timedelta(days=30), today
    for name in ("since", "until"):
        raw = request.GET.get(name)
        if raw:
            try:
                parsed = parse_date(raw) if len(raw) <= 10 else None
            except ValueError:  # well-formed but impossible, e.g. 2026-13-45
                parsed = None
            if parsed is not None and not dt.date(1970, 1, 1) <= parsed < dt.date.max:
                parsed = None  # the period's end + 1 day must still be a date
            if parsed is None:
                errors[name] = "Use a date like 2026-01-31."
            elif name == "since":
                since_d = parsed
            else:
                until_d = parsed
    if not errors and since_d > until_d:
        errors["until"] = "The end is before the start."
    tz = timezone.get_current_timezone()
    since = dt.datetime.combine(since_d, dt.time.min, tzinfo=tz)
    until = dt.datetime.combine(until_d + dt.timedelta(days=1), dt.time.min, tzinfo=tz)
    return since, until, errors


@login_required
def tenant_usage(request: HttpRequest, tenant_name: str) -> HttpResponse:
    """Showback: GPU-hours per project or per user over a period, with CSV export."""
    tenant = get_object_or_404(restrict(Tenant.objects.all(), request.user), name=tenant_name)
    if not can(request.user, "view", AuditEvent(tenant=tenant)):
        # Usage is the owners' (and platform admins') view, like the audit log.
        raise PermissionDenied("Usage reports are for tenant owners.")
    by = request.GET.get("by", "project")
    errors: dict[str, str] = {}
    if by not in ("project", "user"):
        errors["by"] = "Group by project or user."
        by = "project"
    since, until, period_errors = _period(request)
    errors.update(period_errors)
    report = selectors.showback(tenants=[tenant.pk] if not errors else [], since=since, until=until, by=by)
    rows = report.rows
    if request.GET.get("format") == "csv" and not errors:
        response = HttpResponse(content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="camp-usage-{tenant.name}.csv"'
        writer = csv.writer(response)
        writer.writerow(["tenant", "project", "user", "cluster", "gpu_model", "gpu_hours",
                         "gpu_memory_gib_hours", "cpu_core_hours", "ram_gib_hours", "cost", "currency",
                         "since", "until"])
        for r in rows:
            writer.writerow([csv_safe(r.tenant), csv_safe(r.project), csv_safe(r.user), csv_safe(r.cluster),
                             csv_safe(r.gpu_model), r.gpu_hours, r.gpu_memory_gib_hours,
                             r.cpu_core_hours, r.ram_gib_hours, "" if r.cost is None else r.cost,
                             report.currency, since.date().isoformat(),
                             (until - dt.timedelta(days=1)).date().isoformat()])
        return response
    bars, project_bars = selectors.tenant_quota_bars(tenant)
    query = request.GET.copy()
    query["format"] = "csv"
    ctx: dict[str, Any] = {
        "tenant": tenant, "rows": rows, "by": by, "errors": errors,
        "since": since.date().isoformat(), "until": (until - dt.timedelta(days=1)).date().isoformat(),
        "total": report.gpu_hours, "report": report, "csv_query": query.urlencode(),
        "bars": bars,
        "project_bars": [(p, project_bars[p.pk]) for p in restrict(
            Project.objects.filter(tenant=tenant), request.user) if p.pk in project_bars],
    }
    return render(request, "portal/usage.html", ctx, status=400 if errors else 200)


@login_required
def prices(request: HttpRequest) -> HttpResponse:
    """Platform admins set what an hour of each resource costs in showback."""
    from django.core.exceptions import ValidationError

    from . import services
    from .models import Price, PriceKind

    _platform_admin(request)
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        try:
            if request.POST.get("delete"):
                price = get_object_or_404(Price, pk=request.POST["delete"])
                services.price_delete(actor=actor_of(request), price=price)
            else:
                services.price_set(actor=actor_of(request), kind=request.POST.get("kind", ""),
                                   gpu_model=request.POST.get("gpu_model", ""),
                                   per_hour=request.POST.get("per_hour", ""))
        except ValidationError as exc:
            errors = exc.message_dict
        else:
            return redirect("portal:prices")
    models_seen = sorted(set(GpuDevice.objects.values_list("model", flat=True)))
    return render(request, "portal/prices.html", {
        "prices": Price.objects.all(), "kinds": PriceKind.choices, "errors": errors,
        "gpu_models": models_seen, "currency": settings.SHOWBACK_CURRENCY, "form": request.POST,
    }, status=400 if errors else 200)


def _platform_admin(request: HttpRequest) -> None:
    if not scope_of(request.user).platform_admin:
        from django.http import Http404

        raise Http404


@login_required
def gpu_map(request: HttpRequest, cluster_name: str) -> HttpResponse:
    """A card-level map of every node: slices, owners, health."""
    _platform_admin(request)
    cluster = get_object_or_404(Cluster, name=cluster_name)
    return render(request, "portal/gpu_map.html", {"cluster": cluster, "nodes": selectors.gpu_map(cluster),
                                                   "unit_words": selectors.unit.UNIT_WORDS})


@login_required
def queues(request: HttpRequest, cluster_name: str) -> HttpResponse:
    """The queue tree with quotas, usage, borrowing and fair-share state."""
    _platform_admin(request)
    cluster = get_object_or_404(Cluster, name=cluster_name)
    return render(request, "portal/queues.html", {"cluster": cluster, "rows": selectors.queue_tree(cluster),
                                                  "unit_words": selectors.unit.UNIT_WORDS})


@login_required
def preemptions(request: HttpRequest) -> HttpResponse:
    """Who preempted whom, newest first."""
    _platform_admin(request)
    from django.core.paginator import Paginator

    from scheduling.models import DecisionKind, SchedulingDecision, without_cluster_bulk

    events = without_cluster_bulk(
        SchedulingDecision.objects.filter(kind=DecisionKind.PREEMPTED)
        .select_related("job__project", "job__tenant", "preemptor__project", "cluster"), "cluster",
    ).order_by("-created_at")
    page = Paginator(events, 50).get_page(request.GET.get("page"))
    return render(request, "portal/preemptions.html", {"page": page})


@login_required
@require_POST
def demo_load(request: HttpRequest) -> HttpResponseBase:
    """Pause or resume the demo's load generator (platform admins; audited)."""
    from django.contrib import messages
    from django.core.exceptions import ValidationError

    from tenants.permissions import actor_of

    from . import demo

    paused = request.POST.get("paused") == "1"
    try:
        demo.set_paused(actor=actor_of(request), paused=paused)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, "Demo load paused." if paused else "Demo load running again.")
    return redirect("console:home")
