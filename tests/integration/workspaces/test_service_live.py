"""Live services pages (issue 19): a model service's replica counts and status reach open
pages over the live push of the jobs pages — when a replica job changes state and when the
autoscaler changes the wanted count — and its polling fallback shows the same, to readers of
the project only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client

from portal.live import _Push, project_group, push_jobs
from workspaces.models import ModelService
from workspaces.services import serving

from .conftest import advance

pytestmark = pytest.mark.django_db


def _listen(project_id: int) -> tuple[Any, str]:
    """A new channel in the project's group (channels_redis binds a channel's receive buffer
    to the event loop of its first receive: one channel per ``_services_received``)."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(project_group(project_id), channel)
    return layer, channel


def _services_received(layer: Any, channel: str) -> list[dict[str, Any]]:
    """The service payloads pushed to ``channel`` until it stays quiet for half a second."""

    async def drain() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(channel), 0.5)
            except TimeoutError:
                return got
            if message["type"] == "service.update":
                got.append(message["service"])

    return async_to_sync(drain)()


def _service(world: Any, cluster: Any, **kw: Any) -> ModelService:
    return serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="chat",
        image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-7B-Instruct",
        gpu_memory_mib=20480, gpu_cores_percent=30, cpu_millicores=2000, ram_mib=8192, **kw)


def test_replica_state_and_autoscaler_changes_push_the_services_counts(
        world: Any, sim_cluster: Any, django_capture_on_commit_callbacks: Any) -> None:
    layer, channel = _listen(world.a.project.pk)
    with django_capture_on_commit_callbacks(execute=True):
        svc = _service(world, sim_cluster, min_replicas=1, max_replicas=3)
    created = _services_received(layer, channel)
    assert created and created[-1] == {"id": svc.pk, "status": "pending",
                                       "status_display": "Pending (no replica ready)",
                                       "ready": 0, "desired": 1, "min": 1, "max": 3}

    layer, channel = _listen(world.a.project.pk)
    with django_capture_on_commit_callbacks() as callbacks:
        advance(sim_cluster)  # the replica starts, runs and its pod turns Ready
    # what the commits run: the pushes of the jobs saved one by one (a cycle's bulk push is a
    # Celery task, portal.tasks.live_push_jobs, which calls push_jobs as below)
    for callback in callbacks:
        if isinstance(callback, _Push):
            callback()
    after_run = _services_received(layer, channel)
    assert after_run and (after_run[-1]["ready"], after_run[-1]["desired"]) == (1, 1)

    layer, channel = _listen(world.a.project.pk)
    assert push_jobs([svc.replicas.get().job_id]) == 1  # a replica's job brings its service along
    assert [(p["id"], p["ready"]) for p in _services_received(layer, channel)] == [(svc.pk, 1)]

    # more replicas wanted: the open pages hear the new count at once
    layer, channel = _listen(world.a.project.pk)
    with django_capture_on_commit_callbacks(execute=True):
        serving.model_service_scale(actor=world.a.owner, service=svc, min_replicas=3, max_replicas=3)
    scaled = _services_received(layer, channel)
    assert scaled and (scaled[-1]["ready"], scaled[-1]["desired"], scaled[-1]["min"]) == (1, 3, 3)
    assert scaled[-1]["status"] != "ready"


def test_another_tenants_project_hears_nothing_and_polls_nothing(
        world: Any, sim_cluster: Any, django_capture_on_commit_callbacks: Any) -> None:
    layer, channel = _listen(world.b.project.pk)
    with django_capture_on_commit_callbacks(execute=True):
        svc = _service(world, sim_cluster)
    assert _services_received(layer, channel) == []

    outsider, member = Client(), Client()
    outsider.force_login(world.b.member)
    member.force_login(world.a.member)
    url = f"/workspaces/services/live/?ids={svc.pk},abc"
    assert outsider.get(url).json() == {"services": []}
    body = member.get(url).json()
    assert [(s["id"], s["ready"], s["desired"]) for s in body["services"]] == [(svc.pk, 0, 1)]

