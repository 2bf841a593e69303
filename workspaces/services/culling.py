"""Idle culling and maximum lifetime of dev environments (warn, then stop)."""

from __future__ import annotations

import datetime as dt
import json
import logging

from django.db import transaction
from django.utils import timezone

from scheduling import services as scheduling
from scheduling.backends import backend_for
from scheduling.backends.base import BackendError
from scheduling.models import (
    JobState,
)

from ..models import (
    DevEnvironment,
    EnvKind,
    WorkspacePolicy,
)
from ..pods import SERVER
from ..selectors import environment_path, policy_for
from .access import ACCESS_FIELDS, _retire_access
from .common import CULLER, _audit

log = logging.getLogger(__name__)

# --- idle culling ---------------------------------------------------------------------------


def _jupyter_time(value: object) -> dt.datetime | None:
    try:
        t = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def jupyter_activity(env: DevEnvironment, *, now: dt.datetime) -> dt.datetime | None:
    """When the notebook server itself last saw activity, read as JupyterHub's idle culler
    reads a single-user server: ``/api/status`` ``last_activity`` (Jupyter's own clock of
    API and kernel traffic, which ``/api/status`` itself does not move) and every kernel of
    ``/api/kernels`` (asked with ``no_track_activity``, so reading is no activity): a kernel
    whose ``execution_state`` is ``busy`` is active *now* (a long computation with the
    browser closed), otherwise its ``last_activity`` counts. Read
    through the API server's pod proxy; None when the server does not answer (the request-
    based activity then stands alone)."""
    job = env.job
    if env.kind != EnvKind.JUPYTER or job is None or job.placed_cluster is None:
        return None
    alloc = job.allocations.order_by("group_id", "replica").first()
    if alloc is None:
        return None
    backend = backend_for(job.placed_cluster)
    ns = scheduling.namespace_spec(job, job.placed_cluster).name
    port = int(str(SERVER[EnvKind.JUPYTER]["port"]))
    base = environment_path(env)
    seen: list[dt.datetime] = []
    try:
        status = backend.pod_http_get(ns, alloc.pod_name, port, f"{base}api/status")
        kernels = backend.pod_http_get(ns, alloc.pod_name, port, f"{base}api/kernels?no_track_activity=1")
    except BackendError as exc:
        log.info("environment %s: Jupyter activity not readable (%s)", env.pk, exc)
        return None
    try:
        if status is not None:
            t = _jupyter_time(json.loads(status).get("last_activity"))
            if t is not None:
                seen.append(t)
        for k in json.loads(kernels) if kernels is not None else []:
            if k.get("execution_state") == "busy":
                seen.append(now)
            t = _jupyter_time(k.get("last_activity"))
            if t is not None:
                seen.append(t)
    except (ValueError, AttributeError, TypeError):
        return None  # not Jupyter's API: no activity to read
    return max(seen, default=None)


def _refresh_activity(env: DevEnvironment, now: dt.datetime) -> bool:
    """Take Jupyter's own activity into account; True when it moved the idle clock."""
    seen = jupyter_activity(env, now=now)
    if seen is None or (env.last_activity_at is not None and seen <= env.last_activity_at):
        return False
    seen = min(seen, now)
    DevEnvironment.objects.filter(pk=env.pk).update(last_activity_at=seen)
    env.last_activity_at = seen
    return True


def _cull_deadline(env: DevEnvironment, policy: WorkspacePolicy) -> tuple[dt.datetime | None, str]:
    job = env.job
    assert job is not None
    started = job.started_at or job.admitted_at or job.submitted_at
    deadlines: list[tuple[dt.datetime, str]] = []
    if policy.idle_minutes:
        since = max(filter(None, [env.last_activity_at, started]))
        deadlines.append(
            (
                since + dt.timedelta(minutes=policy.idle_minutes),
                f"no activity for {policy.idle_minutes} minutes",
            )
        )
    if policy.max_lifetime_hours:
        deadlines.append(
            (
                started + dt.timedelta(hours=policy.max_lifetime_hours),
                f"its maximum lifetime of {policy.max_lifetime_hours} h",
            )
        )
    if not deadlines:
        return None, ""
    return min(deadlines)


def environments_cull(*, now: dt.datetime | None = None) -> dict[str, list[int]]:
    """One culling pass. Rule: a running environment past its policy's idle or lifetime
    deadline is stopped — but only after its owner has been warned for ``warning_minutes``
    (the warning shows on its page and in the API). It keeps its home volume."""
    now = now or timezone.now()
    warned: list[int] = []
    culled: list[int] = []
    running = DevEnvironment.objects.filter(job__state=JobState.RUNNING).select_related(
        "job", "tenant", "project"
    )
    for env in running:
        policy = policy_for(env.project)
        due, why = _cull_deadline(env, policy)
        if due is None:
            continue
        warn_from = due - dt.timedelta(minutes=policy.warning_minutes)
        if now >= warn_from and policy.idle_minutes and _refresh_activity(env, now):
            # Only environments about to be warned or culled are asked (one or two reads
            # each, through their cluster's API server), as JupyterHub's culler asks.
            due, why = _cull_deadline(env, policy)
            assert due is not None
            warn_from = due - dt.timedelta(minutes=policy.warning_minutes)
        if now < warn_from:
            if env.cull_warning:
                DevEnvironment.objects.filter(pk=env.pk).update(cull_warning="", cull_at=None)
            continue
        with transaction.atomic():
            env = (
                DevEnvironment.objects.select_for_update(of=("self",))
                .select_related("job", "tenant", "project")
                .get(pk=env.pk)
            )
            if env.job is None or env.job.state != JobState.RUNNING:
                continue
            if not env.cull_warning or env.cull_at is None:
                # Warn first; never stop sooner than warning_minutes after the warning.
                cull_at = max(due, now + dt.timedelta(minutes=policy.warning_minutes))
                env.cull_at = cull_at
                env.cull_warning = (
                    f"This environment will be stopped at {cull_at:%Y-%m-%d %H:%M} UTC "
                    f"({why}) unless it is used. Its home volume is kept."
                )
                env.save(update_fields=["cull_at", "cull_warning", "updated_at"])
                _audit("environment.cull_warned", env, after={"cull_at": cull_at.isoformat(), "why": why})
                warned.append(env.pk)
            elif now >= env.cull_at:
                reason = f"Stopped by idle culling: {why}"
                scheduling.job_terminate(job_id=env.job.pk, reason=reason, by=CULLER)
                env.stop_reason = reason
                env.cull_warning, env.cull_at = "", None
                _retire_access(env)
                env.save(update_fields=["stop_reason", "cull_warning", "cull_at", *ACCESS_FIELDS,
                                        "updated_at"])
                _audit("environment.culled", env, after={"reason": reason})
                culled.append(env.pk)
    return {"warned": warned, "culled": culled}
