"""Live pages in a real browser: a job page changes state without a reload.

Camp runs under uvicorn (the ASGI server of production, so WebSockets work) in a
thread, against the test database; Chromium opens a job page; the scheduler moves
the job on; the page must show it through the /ws/live/ WebSocket, well before its
polling fallback (15 s with Redis) would.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from playwright.sync_api import expect

from scheduling import services
from tests.conftest import World
from tests.e2e.conftest import login, shot
from tests.integration.scheduling.conftest import SMALL_INVENTORY, submit
from tests.integration.scheduling.test_concurrency import celery_worker

# A badge once the job is admitted. The pages run under a CSP without 'unsafe-eval', so waits
# use Playwright's locator assertions, never a string evaluated in the page.
STARTED = re.compile(r"^(Starting|Running)$")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def asgi_server(transactional_db: Any) -> Iterator[str]:
    import uvicorn

    from camp.asgi import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from django.db import connection

    def backends() -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {row[0] for row in cursor.fetchall()}

    before = backends()
    # One channel layer per server: channels_redis lets one event loop receive at a time, and
    # a consumer of the last test's server (its loop gone) may still count as receiving on
    # the process-wide layer. Production runs one server, one loop, one layer.
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        # Connections the server's worker threads opened outlive them; end exactly those,
        # so the test database can be dropped (other fixtures' connections are untouched).
        opened = backends() - before
        if opened:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE pid = ANY(%s)", [list(opened)])


def test_job_page_turns_starting_without_reload(world: World, asgi_server: str, page: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    job = submit(world, cluster, "live-one", group={"gpu_count": 1})
    login(page, asgi_server, "acme-member")
    page.goto(f"{asgi_server}/scheduling/jobs/{job.pk}/")
    state = page.locator("h1 [data-live-field=state]")
    assert state.inner_text() == "Queued"
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)  # let the WebSocket connect
    # The scheduler acts in another thread (as the worker would in another process); a cycle's
    # bulk writes reach live pages through a Celery task (portal.tasks.live_push_jobs), run by a
    # real worker, which may also dispatch the job (so Starting, or already Running).
    with celery_worker():
        with ThreadPoolExecutor(1) as pool:
            summary = pool.submit(lambda: services.cycle_run(cluster=cluster)).result()
        assert summary is not None and summary.admitted
        expect(page.locator("h1 [data-live-field=state]")).to_have_text(STARTED, timeout=15000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    assert page.locator("[data-live-field=reason]").inner_text() != ""
    shot(page, "job-live")


def test_jobs_list_badge_and_counts_change_without_reload(world: World, asgi_server: str,
                                                         page: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    job = submit(world, cluster, "live-row", group={"gpu_count": 1})
    submit(world, cluster, "other-row", group={"gpu_count": 1})
    login(page, asgi_server, "acme-member")
    page.goto(f"{asgi_server}/scheduling/jobs/")
    badge = f'[data-live-job="{job.pk}"] [data-live-field=state]'
    assert page.locator(badge).inner_text() == "Queued"
    assert page.locator('[data-live-count="queued"] strong').inner_text() == "2"
    assert page.locator('[data-live-count="running"]').is_hidden()
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)  # let the WebSocket connect
    with celery_worker():  # the cycle's push goes through portal.tasks.live_push_jobs
        with ThreadPoolExecutor(1) as pool:
            summary = pool.submit(lambda: services.cycle_run(cluster=cluster)).result()
        assert summary is not None and len(summary.admitted) == 2
        # well before the 15 s polling fallback: the push moved the badge ...
        expect(page.locator(badge)).to_have_text(STARTED, timeout=10000)
        # ... and asked for the counts, which no longer list anything as waiting
        expect(page.locator('[data-live-count="queued"]')).to_be_hidden(timeout=10000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    assert "state-queued" not in (page.locator(badge).get_attribute("class") or "")
    assert page.locator(f"#pick-{job.pk}").is_visible()  # still running: still stoppable
    job.refresh_from_db()
    with ThreadPoolExecutor(1) as pool:  # stopped elsewhere: its bulk-stop box goes away
        pool.submit(lambda: services.job_cancel(actor=world.a.member, job=job)).result()
    expect(page.locator(f"#pick-{job.pk}")).to_be_hidden(timeout=10000)
    shot(page, "jobs-live")


def test_websocket_refuses_anonymous(asgi_server: str, page: Any) -> None:
    page.goto(f"{asgi_server}/login/")
    closed = page.evaluate("""() => new Promise(resolve => {
        const ws = new WebSocket(location.origin.replace('http', 'ws') + '/ws/live/');
        ws.onopen = () => resolve('open');
        ws.onclose = (e) => resolve('closed');
    })""")
    assert closed == "closed"


def test_removed_member_stops_receiving_updates(world: World, asgi_server: str, page: Any) -> None:
    from tenants import services as tenant_services
    from tenants.models import Membership

    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    job = submit(world, cluster, "secret-one", group={"gpu_count": 1})
    login(page, asgi_server, "acme-member")
    page.goto(f"{asgi_server}/scheduling/jobs/{job.pk}/")
    page.wait_for_timeout(500)
    membership = Membership.objects.get(user=world.a.member, project=world.a.project)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(lambda: tenant_services.membership_delete(actor=world.a.owner,
                                                              membership=membership)).result()
        pool.submit(lambda: services.cycle_run(cluster=cluster)).result()
    page.wait_for_timeout(2500)
    assert page.locator("h1 [data-live-field=state]").inner_text() == "Queued"  # nothing leaked


def test_services_ready_count_changes_without_reload(world: World, asgi_server: str, page: Any) -> None:
    """A model service's list row and page show its replica coming up (ready 0 → 1) and a new
    wanted count through the same /ws/live/ push as the jobs pages."""
    from tests.integration.workspaces.conftest import advance
    from workspaces.services import serving

    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    svc = serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="chat",
        image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-7B-Instruct",
        gpu_memory_mib=20480, gpu_cores_percent=30, cpu_millicores=2000, ram_mib=8192, max_replicas=3)
    login(page, asgi_server, "acme-member")
    page.goto(f"{asgi_server}/workspaces/services/")
    row = f'[data-live-service="{svc.pk}"]'
    assert page.locator(f"{row} [data-live-field=ready]").inner_text() == "0"
    assert page.locator(f"{row} [data-live-field=desired]").inner_text() == "1"
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)  # let the WebSocket connect
    with celery_worker():  # a cycle's bulk push goes through portal.tasks.live_push_jobs
        with ThreadPoolExecutor(1) as pool:  # the worker's part, in another thread
            pool.submit(lambda: advance(cluster)).result()
        # well before the 15 s polling fallback
        expect(page.locator(f"{row} [data-live-field=ready]")).to_have_text("1", timeout=10000)
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    shot(page, "services-live")

    page.goto(f"{asgi_server}/workspaces/services/{svc.pk}/")
    ready = "p.replicas [data-live-field=ready]"
    assert page.locator(ready).inner_text() == "1"
    page.evaluate("window.__sameDocument = true")
    page.wait_for_timeout(500)
    svc.refresh_from_db()
    with ThreadPoolExecutor(1) as pool:  # wanted by someone else: the page hears it at once
        pool.submit(lambda: serving.model_service_scale(actor=world.a.owner, service=svc,
                                                        replicas=2)).result()
    expect(page.locator("p.replicas [data-live-field=desired]")).to_have_text("2", timeout=10000)
    assert page.locator(ready).inner_text() == "1"  # the second replica is still waiting
    assert page.evaluate("window.__sameDocument") is True
    shot(page, "service-live")
