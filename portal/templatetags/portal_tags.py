"""Template tags: the quota left in each of the user's projects, for launch forms."""

from __future__ import annotations

from typing import Any

from django import template

from camp.units import mib_words
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
    from scheduling.models import Cluster

    projects = list(restrict(Project.objects.select_related("tenant"), user))
    inputs = selectors.quota_left_inputs(projects)
    clusters = list(restrict(Cluster.objects.filter(enabled=True), user).order_by("name"))
    lefts = selectors.projects_left(projects, clusters, inputs)
    rows = []
    for p in projects:
        pl = lefts[p.pk]
        # The one "quota left" (``selectors.projects_left``): per cluster, the project's and
        # its tenant's limits there; across all clusters, those limits.
        rows.append({
            "project": p,
            "used": pl.used,
            "guaranteed_left": pl.guaranteed_left,
            "limit_left": pl.left,
            "where": pl.best if len(pl.clusters) > 1 else None,
            "all_clusters_left": pl.all_clusters_left,
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


@register.filter
def page_reason(job: Any) -> str:
    """A job's reason as the pages show it (``workspaces.selectors.page_reason``: never empty
    while it waits, no advice the page cannot follow)."""
    from workspaces.selectors import page_reason as reason

    return reason(job) if job is not None else ""


@register.inclusion_tag("workspaces/reason_as_of.html")
def reason_as_of(job: Any) -> dict[str, Any]:
    """When a waiting job's reason was computed, or that it may be out of date (issue 29:
    every waiting reason a list shows carries it, as the job's page does;
    ``scheduling.selectors.reason_as_of``)."""
    from scheduling.selectors import reason_as_of as when

    as_of, stale = when(job) if job is not None else (None, False)
    return {"why": {"as_of": as_of, "stale": stale}}


@register.filter
def pod_phase(allocation: Any, job: Any) -> str:
    """A pod's phase as its job's page shows it: once the job is stopping or ended, a pod not
    yet deleted is "Stopping" (its resources are held until it is gone), never "Running"."""
    from scheduling.models import FINAL_STATES, JobState, PodPhase

    live = (PodPhase.PENDING, PodPhase.CREATED, PodPhase.RUNNING)
    if job is not None and allocation.phase in live and (
            job.state == JobState.PREEMPTING or job.state in FINAL_STATES):
        return "Stopping"
    return str(allocation.get_phase_display())


@register.filter
def mib(value: Any) -> str:
    """Memory given in MiB as people read it (``camp.units.mib_words``, the one definition)."""
    return mib_words(value)


@register.filter
def pct(value: float | int | None) -> int:
    """A percentage as a whole number 0..100, for the width classes ``w-N``/``l-N`` of camp.css.

    The bars set their widths by class, not by a ``style`` attribute, so the
    Content-Security-Policy needs no ``'unsafe-inline'`` for styles (camp/settings/base.py).
    """
    try:
        number = float(value or 0)
    except (TypeError, ValueError):
        return 0
    if number != number:  # NaN
        return 0
    # A sliver stays visible: anything above zero is at least 1 %.
    return max(1 if number > 0 else 0, min(100, round(number)))
