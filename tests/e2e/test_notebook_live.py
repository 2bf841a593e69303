"""A data scientist launches a notebook in the browser and watches it turn Running
without reloading; a job that can never start shows its reason.

Camp runs under uvicorn in a thread (WebSockets work); the scheduler's steps that the
Celery worker would take run in another thread (tests/integration/workspaces
conftest.advance), so the page can only learn of them through /ws/live/ (its polling
fallback is 15 s with Redis, longer than the waits here).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import expect

from scheduling import services
from tenants import services as tenant_services
from tests.conftest import World
from tests.e2e.conftest import login, shot
from tests.e2e.test_live import asgi_server  # noqa: F401  (fixture)
from tests.integration.scheduling.conftest import SMALL_INVENTORY, submit
from tests.integration.workspaces.conftest import advance

pytestmark = pytest.mark.django_db(transaction=True)


def test_launch_notebook_and_watch_it_run(world: World, asgi_server: str, page: Any) -> None:  # noqa: F811
    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(8)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(2), "gpus_limit": Decimal(4)})
    base = asgi_server
    login(page, base, "acme-member")
    page.goto(f"{base}/workspaces/environments/new/")
    # the launch form shows what is left before submitting
    assert "GPU quota left in your projects" in page.inner_text("main")
    shot(page, "launch-notebook")
    page.select_option("#id_project", label=str(world.a.project))
    page.select_option("#id_cluster", value="sim")
    page.fill("#id_name", "my-notebook")
    page.select_option("#id_kind", value="jupyter")
    # a JupyterLab image by name: the catalog also lists inference servers since model services
    jupyter = page.locator("#id_image option", has_text="PyTorch · JupyterLab").get_attribute("value")
    page.select_option("#id_image", value=jupyter)
    page.check("#preset-custom")  # no preset: the shape is set under Advanced
    page.click("details.advanced summary")
    page.fill("#id_gpu_count", "1")
    page.fill("#id_gpu_memory_mib", "20000")
    page.fill("#id_gpu_cores_percent", "25")
    page.click("main form button.primary-launch")
    page.wait_for_url(f"{base}/workspaces/environments/*/")
    state = page.locator("h1 [data-live-field=state]")
    assert state.inner_text() == "Queued"
    assert page.locator("form[data-live-show=running]").is_hidden()
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)  # the WebSocket connects
    with ThreadPoolExecutor(1) as pool:  # the worker's part, elsewhere
        pool.submit(advance, cluster).result()
    expect(page.locator("h1 [data-live-field=state]")).to_have_text("Running", timeout=8000)
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("form[data-live-show=running]").is_visible()  # "Open" appeared
    shot(page, "notebook-running")


def test_pending_job_explains_why(world: World, asgi_server: str, page: Any) -> None:  # noqa: F811
    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    for i in range(2):  # fill both A100 nodes
        submit(world, cluster, f"big-{i}", side="b", group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
        services.cycle_run(cluster=cluster)
    job = submit(world, cluster, "waits", group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=cluster)
    base = asgi_server
    login(page, base, "acme-member")
    page.goto(f"{base}/scheduling/jobs/{job.pk}/")
    reason = page.locator("[data-live-field=reason]").inner_text()
    assert page.locator("h1 [data-live-field=state]").inner_text() == "Queued"
    assert "GPU" in reason and "1st of 1" in reason, reason
    shot(page, "pending-reason")
