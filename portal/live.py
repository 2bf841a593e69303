"""Live pages: job changes pushed to open browsers over Channels (DESIGN.md §2 step 6).

After a Job row changes and the transaction commits, its new state is sent to the
channel-layer group of its project (and the platform-wide group). A browser's
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


def job_payload(job: Any) -> dict[str, Any]:
    return {
        "id": job.pk,
        "state": job.state,
        "state_display": job.get_state_display(),
        "reason": job.reason,
        "queue_position": job.queue_position,
        "queue_length": job.queue_length,
    }


class _Push:
    """One on-commit push for the jobs a transaction changed (``job_changed``)."""

    def __init__(self) -> None:
        self.job_ids: set[int] = set()
        self.sent = False  # a test's captured callbacks stay listed after they ran

    def __call__(self) -> None:
        self.sent = True
        push_jobs(sorted(self.job_ids))


def job_changed(job_id: int) -> None:
    """Push ``job``'s committed state to live pages once the current transaction commits.

    A submit saves its job and then records its decision (two signals): the second joins
    the push the first registered, so a transaction pushes each job once, in one query and
    one hand-off to the channel layer. Joining any pending push loses nothing: Django drops
    a callback only when a savepoint it was registered under rolls back, and every such
    savepoint still open is one ours is registered under too (a released one cannot roll
    back alone). A job whose own change rolled back is pushed as it is, which is harmless."""
    connection = transaction.get_connection()
    if connection.in_atomic_block:
        for _sids, func, _robust in reversed(connection.run_on_commit):
            if isinstance(func, _Push) and not func.sent:
                func.job_ids.add(job_id)
                return
    push = _Push()
    push.job_ids.add(job_id)
    transaction.on_commit(push)


def jobs_changed(job_ids: list[int]) -> None:
    """``job_changed`` for many jobs (after a bulk write, e.g. a scheduling cycle): one
    task queued on commit pushes them all (``push_jobs``), so the writer — a cycle holding
    its cluster's lock — does not wait on the channel layer."""
    ids = sorted(set(job_ids))
    if ids:
        from .tasks import live_push_jobs

        live_push_jobs.delay_on_commit(ids)


def push_jobs(job_ids: list[int]) -> int:
    """Send the committed state of ``job_ids`` to live pages: one query, one event loop
    for every message (``async_to_sync`` per message costs a thread hand-off each)."""
    from scheduling.models import Job

    layer = get_channel_layer()
    if layer is None:
        return 0
    jobs = list(Job.objects.filter(pk__in=job_ids).only(
        "pk", "project_id", "state", "reason", "queue_position", "queue_length"))

    async def send_all() -> None:
        for job in jobs:
            message = {"type": "job.update", "job": job_payload(job), "project_id": job.project_id}
            for group in (project_group(job.project_id), ALL_GROUP):
                await layer.group_send(group, message)

    try:
        async_to_sync(send_all)()
    except Exception:  # a live page is a convenience: never fail because of it
        logger.warning("could not push job updates to live pages", exc_info=True)
    return len(jobs)
