"""Template tags: the quota left in each of the user's projects, for launch forms."""

from __future__ import annotations

from typing import Any

from django import template

from tenants.models import Project
from tenants.permissions import restrict

from .. import selectors

register = template.Library()


@register.inclusion_tag("portal/quota_remaining.html", takes_context=True)
def quota_remaining(context: dict[str, Any]) -> dict[str, Any]:
    """Per visible project: GPUs in use, left within the guarantee, and left under the limit."""
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"rows": []}
    projects = list(restrict(Project.objects.select_related("tenant"), user))
    usage = selectors.project_usage([p.pk for p in projects])
    inputs = selectors.quota_left_inputs(projects)
    rows = []
    for p in projects:
        held = usage.get(p.pk, selectors.Held())
        q = inputs.project.get(p.pk)
        guaranteed = float(q.gpus_guaranteed) if q else 0.0
        limit = float(q.gpus_limit) if q and q.gpus_limit is not None else None
        # "In use" counts every cluster; the per-cluster limit applies on each cluster, the
        # limit across all clusters (issue 16) to this total.
        everywhere = (float(q.gpus_limit_all_clusters)
                      if q and q.gpus_limit_all_clusters is not None else None)
        rows.append({
            "project": p,
            "used": round(held.gpus, 2),
            "guaranteed_left": round(max(0.0, guaranteed - held.gpus), 2),
            "limit_left": None if limit is None else round(max(0.0, limit - held.gpus), 2),
            "all_clusters_left": None if everywhere is None else round(max(0.0, everywhere - held.gpus), 2),
            # What a non-preemptible run may still count on: the guarantee across all clusters.
            "guaranteed_all_clusters": selectors.guaranteed_left_lines(p, inputs),
        })
    return {"rows": rows, "any_all_clusters": any(r["all_clusters_left"] is not None for r in rows),
            "any_guaranteed_all_clusters": any(r["guaranteed_all_clusters"] for r in rows)}


@register.inclusion_tag("portal/estimated_start.html")
def estimated_start(job: Any) -> dict[str, Any]:
    """The estimated start of a queued job (portal.selectors.estimate_start)."""
    if job is None:
        return {"estimate": None}
    return {"estimate": selectors.estimate_start(job)}


@register.filter
def duration_words(value: Any) -> str:
    """A timedelta (or seconds) as people say it: "45 s", "12 min", "3 h 5 min", "2 days"."""
    seconds = int(value.total_seconds() if hasattr(value, "total_seconds") else value or 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        h, m = divmod(seconds // 60, 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d = seconds // 86400
    return f"{d} day{'s' if d != 1 else ''}"
