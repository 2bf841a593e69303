"""Live pages: job changes pushed to open browsers over Channels (DESIGN.md §2 step 6).

After a Job row changes and the transaction commits, its new state is sent to the
channel-layer group of its project (and the platform-wide group). A model service rides the
same push: when one of its replica jobs changes, or the service itself (the autoscaler's
desired count, its status), its replica counts follow (``service_payload``). A browser's
WebSocket joins the groups of the projects its user may see. Without Redis (the
demo) the layer is in-memory and cannot cross from the worker to the web process,
so pages also refresh by polling the REST API (static/live.js).
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

ALL_GROUP = "live.all"


def project_group(project_id: int) -> str:
    return f"live.project.{project_id}"


def as_of_words(job: Any) -> str:
    """When a waiting job's reason was computed, in the words its pages show beside it
    (``templates/workspaces/reason_as_of.html`` over ``scheduling.selectors.reason_as_of``);
    "" once it no longer waits."""
    from django.template.loader import render_to_string
    from django.utils.html import strip_tags

    from scheduling.selectors import reason_as_of

    as_of, stale = reason_as_of(job)
    if as_of is None and not stale:
        return ""
    html = render_to_string("workspaces/reason_as_of.html", {"why": {"as_of": as_of, "stale": stale}})
    return " ".join(strip_tags(html).split())


def job_payload(job: Any) -> dict[str, Any]:
    from workspaces.selectors import page_reason

    return {
        "id": job.pk,
        "state": job.state,
        "state_display": job.get_state_display(),
        "reason": page_reason(job),  # as the pages show it (no advice the page cannot follow)
        "as_of": as_of_words(job),  # when that reason was computed (issue 29)
        "queue_position": job.queue_position,
        "queue_length": job.queue_length,
    }


def service_payload(svc: Any) -> dict[str, Any]:
    """What a services page shows live: status, replicas ready now (``ready_now``, as the
    pages count them: ``selectors.with_ready_now``) and wanted, and the autoscaler's bounds."""
    return {
        "id": svc.pk,
        "status": svc.status,
        "status_display": svc.get_status_display(),
        "ready": svc.ready_now,
        "desired": svc.desired_replicas,
        "min": svc.min_replicas,
        "max": svc.max_replicas,
    }


class _Push:
    """One on-commit push for the jobs and services a transaction changed (``job_changed``,
    ``service_changed``)."""

    def __init__(self) -> None:
        self.job_ids: set[int] = set()
        self.service_ids: set[int] = set()
        self.sent = False  # a test's captured callbacks stay listed after they ran

    def __call__(self) -> None:
        self.sent = True
        push_jobs(sorted(self.job_ids), service_ids=sorted(self.service_ids))


def _pending_push() -> _Push:
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        for _sids, func, _robust in reversed(connection.run_on_commit):
            if isinstance(func, _Push) and not func.sent:
                return func
    push = _Push()
    transaction.on_commit(push)
    return push


def service_changed(service_id: int) -> None:
    """Push a model service's replica counts and status once the transaction commits, joined
    with the transaction's job push (``job_changed``)."""
    _pending_push().service_ids.add(service_id)


def job_changed(job_id: int) -> None:
    """Push ``job``'s committed state to live pages once the current transaction commits.

    A submit saves its job and then records its decision (two signals): the second joins
    the push the first registered, so a transaction pushes each job once, in one query and
    one hand-off to the channel layer. Joining any pending push loses nothing: Django drops
    a callback only when a savepoint it was registered under rolls back, and every such
    savepoint still open is one ours is registered under too (a released one cannot roll
    back alone). A job whose own change rolled back is pushed as it is, which is harmless."""
    _pending_push().job_ids.add(job_id)


def jobs_changed(job_ids: list[int]) -> None:
    """``job_changed`` for many jobs (after a bulk write, e.g. a scheduling cycle): one
    task queued on commit pushes them all (``push_jobs``), so the writer — a cycle holding
    its cluster's lock — does not wait on the channel layer."""
    ids = sorted(set(job_ids))
    if ids:
        from .tasks import live_push_jobs

        live_push_jobs.delay_on_commit(ids)


def push_jobs(job_ids: list[int], service_ids: list[int] | tuple[int, ...] = ()) -> int:
    """Send the committed state of ``job_ids`` to live pages: one query, one event loop
    for every message (``async_to_sync`` per message costs a thread hand-off each). The model
    services of those jobs that are replicas, and ``service_ids``, are sent too (their
    ready count follows their replicas' state)."""
    from scheduling.models import Job
    from scheduling.services import SERVICE_JOB_KIND
    from workspaces.models import ModelService, ServiceReplica
    from workspaces.selectors import with_ready_now

    layer = get_channel_layer()
    if layer is None:
        return 0
    jobs = list(Job.objects.filter(pk__in=job_ids).select_related("cluster").only(
        # every field job_payload reads (page_reason: floating, cluster; as_of_words: when its
        # cluster last cycled), read here: a deferred one would be a query per job
        "pk", "project_id", "state", "reason", "kind", "queue_position", "queue_length", "floating",
        "updated_at", "cluster__last_cycle_at", "cluster__enabled", "cluster__unreachable_since"))
    payloads = [(job.project_id, job_payload(job)) for job in jobs]
    svc_ids = set(service_ids)
    replicas = [j.pk for j in jobs if j.kind == SERVICE_JOB_KIND]  # only services run replicas
    if replicas:
        svc_ids.update(ServiceReplica.objects.filter(job_id__in=replicas)
                       .values_list("service_id", flat=True))
    svcs = list(with_ready_now(ModelService.objects.filter(pk__in=svc_ids)).only(
        "pk", "project_id", "status", "desired_replicas", "min_replicas", "max_replicas")) if svc_ids else []

    async def send_all() -> None:
        for project_id, payload in payloads:
            message = {"type": "job.update", "job": payload, "project_id": project_id}
            for group in (project_group(project_id), ALL_GROUP):
                await layer.group_send(group, message)
        for svc in svcs:
            update = {"type": "service.update", "service": service_payload(svc), "project_id": svc.project_id}
            for group in (project_group(svc.project_id), ALL_GROUP):
                await layer.group_send(group, update)

    try:
        async_to_sync(send_all)()
    except Exception:  # a live page is a convenience: never fail because of it
        logger.warning("could not push job updates to live pages", exc_info=True)
    return len(jobs)
