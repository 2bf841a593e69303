"""A data scientist launches a training job for "any cluster" in real Chromium (issue 16): two
simulated clusters, east full and west free; the page says it waits for a cluster, then, once
the placement step has run, where Camp put it and why not the other cluster."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from registry import services as registry_services
from scheduling.services import placement
from tests.conftest import World
from tests.e2e.conftest import login, shot
from tests.integration.scheduling.test_multicluster import fill, two
from tests.integration.workspaces.conftest import advance
from workspaces.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["two"]  # the fixture, imported for pytest


def test_member_launches_a_training_job_for_any_cluster(world: World, two: Any, asgi_server: str,
                                                        page: Any) -> None:
    east, west = two
    fill(world, east)
    # An image built for both architectures (the catalog's first image may be amd64-only,
    # which would rightly keep the job off west's arm64 nodes).
    image = registry_services.image_create(
        actor=world.admin, name="pytorch-multiarch", variant="training", reference="registry.example/pt:2",
        architectures=["linux/amd64", "linux/arm64"])
    base = asgi_server
    login(page, base, "acme-member")
    page.goto(f"{base}/workspaces/training/new/")
    assert page.locator("#id_cluster option:checked").inner_text().startswith("Any cluster")
    page.fill("#id_name", "anywhere")
    page.select_option("#id_image", str(image.pk))
    page.fill("#id_workers", "2")
    page.fill("#id_command", "torchrun train.py")
    shot(page, "training-any-cluster-form")
    page.click("button.primary-launch")
    page.wait_for_url(f"{base}/workspaces/training/*/")
    text = page.locator("main").inner_text()
    assert "Waiting for a cluster:" in text and "in the global queue" in text
    t = TrainingJob.objects.get(name="anywhere")
    assert t.cluster is None and t.job is not None and t.job.cluster_id is None
    # The worker's part, in another thread (as the worker would in another process): this
    # thread runs Playwright's event loop, where the live push's async_to_sync may not run.
    def worker() -> object:
        try:
            summary = placement.placement_run()
            advance(west)
            return summary
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(worker).result() is not None
    page.reload()
    text = page.locator("main").inner_text()
    assert "on cluster west (chosen by Camp)" in text and "Other clusters: cluster east:" in text, text
    shot(page, "training-any-cluster-placed")
