"""Who may report a job's checkpoint, and that every report is audited (issue 30, item 11).

The reported path decides what a preempted job resumes from: the job's owner, platform
admins and Camp itself report it; a project admin or tenant owner may not on a member's job.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied

from scheduling import services
from tenants.models import AuditEvent

from .conftest import submit

pytestmark = pytest.mark.django_db


def _events(job: Any) -> list[Any]:
    return list(AuditEvent.objects.filter(action="job.checkpointed", target_id=str(job.pk))
                .order_by("pk").values_list("actor_username", "after"))


def test_only_the_owner_and_the_platform_report_a_checkpoint(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "train", checkpoint_capable=True)
    for who in (world.a.project_admin, world.a.owner):
        with pytest.raises(PermissionDenied):
            services.job_checkpoint_record(job=job, path="/elsewhere/evil", actor=who)
    job.refresh_from_db()
    assert job.last_checkpoint == "" and _events(job) == []

    services.job_checkpoint_record(job=job, path="/ckpt/step-100", actor=world.a.member)
    services.job_checkpoint_record(job=job, path="/ckpt/step-200")  # Camp itself
    services.job_checkpoint_record(job=job, path="/ckpt/step-300", actor=world.admin)
    job.refresh_from_db()
    assert job.last_checkpoint == "/ckpt/step-300"
    events = _events(job)
    assert (events[0][0], events[2][0]) == (world.a.member.username, world.admin.username)
    assert [e[1]["checkpoint"] for e in events] == ["/ckpt/step-100", "/ckpt/step-200", "/ckpt/step-300"]
