"""Live pages hear of a job's change once per transaction (issue 13): a submit saves its job
and records its decision, and used to push the job twice (a query and a channel-layer
hand-off each); a push is still never lost when a savepoint rolls back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from portal.live import job_changed, project_group
from scheduling import services

from .conftest import gpu_group

pytestmark = pytest.mark.django_db


def _listen(project_id: int) -> tuple[Any, str]:
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(project_group(project_id), channel)
    return layer, channel


def _received(layer: Any, channel: str) -> list[int]:
    """The job ids pushed to ``channel`` until it stays quiet for half a second."""

    async def drain() -> list[int]:
        ids: list[int] = []
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), 0.5)
            except TimeoutError:
                return ids
            ids.append(message["job"]["id"])

    return async_to_sync(drain)()


def test_a_submit_pushes_its_job_once(world: Any, sim_cluster: Any,
                                      django_capture_on_commit_callbacks: Any) -> None:
    layer, channel = _listen(world.a.project.pk)
    with django_capture_on_commit_callbacks(execute=True):
        job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                                  name="once", groups=[gpu_group()])
    assert _received(layer, channel) == [job.pk]


def test_a_rolled_back_savepoint_loses_no_push(world: Any, sim_cluster: Any,
                                               django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):  # their own pushes, before we listen
        jobs = [services.job_submit(actor=world.a.member, project=world.a.project,
                                    cluster=sim_cluster, name=f"j{i}", groups=[gpu_group()])
                for i in range(3)]
    layer, channel = _listen(world.a.project.pk)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        with transaction.atomic():  # released: its push is joined by the changes after it
            job_changed(jobs[0].pk)
        job_changed(jobs[1].pk)
        try:
            with transaction.atomic():  # rolled back: what it changed may be pushed or not
                job_changed(jobs[2].pk)
                raise RuntimeError
        except RuntimeError:
            pass
    received = _received(layer, channel)
    assert {jobs[0].pk, jobs[1].pk} <= set(received)
    assert len(received) == len(set(received))  # each job once
