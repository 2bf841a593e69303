"""A data scientist launches a training job for "any cluster" in real Chromium (issue 16): two
simulated clusters, east full and west free; the page says it waits for a cluster, then, once
the placement step has run, where Camp put it and why not the other cluster."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.services import placement
from tests.conftest import World
from tests.e2e.conftest import login, shot
from tests.integration.scheduling.test_multicluster import fill, two
from tests.integration.workspaces.conftest import advance
from workspaces.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["two"]  # the fixture, imported for pytest


def test_member_launches_a_training_job_for_any_cluster(world: World, two: Any, live_server: Any,
                                                        page: Any) -> None:
    east, west = two
    fill(world, east)
    base = live_server.url
    login(page, base, "acme-member")
    page.goto(f"{base}/workspaces/training/new/")
    assert page.locator("#id_cluster option:checked").inner_text().startswith("Any cluster")
    page.fill("#id_name", "anywhere")
    page.fill("#id_workers", "2")
    page.fill("#id_command", "torchrun train.py")
    shot(page, "training-any-cluster-form")
    page.click("button.primary-launch")
    page.wait_for_url(f"{base}/workspaces/training/*/")
    text = page.locator("main").inner_text()
    assert "Waiting for a cluster:" in text and "in the global queue" in text
    t = TrainingJob.objects.get(name="anywhere")
    assert t.cluster is None and t.job is not None and t.job.cluster_id is None
    assert placement.placement_run() is not None
    advance(west)
    page.reload()
    text = page.locator("main").inner_text()
    assert "on cluster west (chosen by Camp)" in text and "Other clusters: cluster east:" in text
    shot(page, "training-any-cluster-placed")
