"""Idle culling and maximum lifetime of dev environments (warn, then stop)."""

from __future__ import annotations

import datetime as dt

from django.db import transaction
from django.utils import timezone

from scheduling import services as scheduling
from scheduling.models import (
    JobState,
)

from ..models import (
    DevEnvironment,
    WorkspacePolicy,
)
from ..selectors import policy_for
from .access import ACCESS_FIELDS, _retire_access
from .common import CULLER, _audit

# --- idle culling ---------------------------------------------------------------------------


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
