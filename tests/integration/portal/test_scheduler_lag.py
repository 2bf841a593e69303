"""The admin home says when the scheduler is lagging (issue 32, finding 2): a worker that
fell behind showed nothing anywhere while jobs took minutes to be placed. The figure is the
age of the oldest scheduler tick: how long the last one waited in the workers' queue (read
from the expiry the beat stamps on it), or the time since one last ran."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import Client

from scheduling import services, tasks
from tests.integration.scheduling.test_concurrency import celery_worker
from tests.integration.workspaces.conftest import sim_cluster  # noqa: F401 (fixture)


def _admin_home(world: Any) -> str:
    c = Client()
    c.force_login(world.admin)
    r = c.get("/")
    assert r.status_code == 200
    return r.content.decode()


@pytest.mark.django_db
def test_a_tick_that_waited_long_says_the_scheduler_is_lagging(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    cache.delete(services.clusters.SCHEDULER_TICK_KEY)
    assert "scheduler-lag" not in _admin_home(world)  # no tick recorded yet: nothing claimed
    now = time.time()
    services.scheduler_tick_ran(sent_at=now - 0.4, now=now)
    page = _admin_home(world)
    assert "Scheduler keeping up: the last tick waited 0 s" in page
    assert "The scheduler is lagging" not in page
    services.scheduler_tick_ran(sent_at=time.time() - 25)
    page = _admin_home(world)
    assert "The scheduler is lagging:</strong> the oldest scheduler tick has waited 25 s" in page
    assert "run more worker processes" in page
    # Not the member's business.
    c = Client()
    c.force_login(world.a.member)
    assert "scheduler-lag" not in c.get("/").content.decode()


@pytest.mark.django_db
def test_no_tick_for_long_is_lagging_too(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    """Ticks that waited past their expiry are dropped, so none runs: the time since the last
    one ran (less a period) is how long the next one has waited at least."""
    services.scheduler_tick_ran(sent_at=None, now=time.time() - 120)
    page = _admin_home(world)
    assert "The scheduler is lagging:</strong> the oldest scheduler tick has waited 1 min" in page


@pytest.mark.django_db
def test_a_periodic_run_queued_long_ago_is_named(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    cache.delete(services.clusters.SCHEDULER_TICK_KEY)
    services.periodic_request_taken("reconcile", sim_cluster.pk)
    assert services.periodic_request("reconcile", sim_cluster.pk)
    key = f"camp:periodic:reconcile:{sim_cluster.pk}"
    cache.set(key, time.time() - 50, timeout=60)  # queued 50 s ago, still not finished
    page = _admin_home(world)
    assert f"the reconcile of {sim_cluster.name} was queued 50 s ago and has not finished" in page
    services.periodic_request_taken("reconcile", sim_cluster.pk)
    assert "The scheduler is lagging" not in _admin_home(world)


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_records_how_long_the_beats_tick_waited(world: Any, sim_cluster: Any) -> None:  # noqa: F811
    """The beat stamps each tick with an expiry (camp/settings/tasks.py); a real worker reads it
    back to know when the tick was sent. A tick sent as if 15 s ago (its expiry 15 s nearer)
    makes the admin home say so."""
    cache.delete(services.clusters.SCHEDULER_TICK_KEY)
    relative = settings.CELERY_BEAT_SCHEDULE["scheduler-tick"]["options"]["expires"]  # type: ignore[index]
    assert relative >= 20  # the test's 15 s old tick must not be dropped as expired
    with celery_worker():
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=relative - 15)
        tasks.scheduler_tick.apply_async(expires=at)
        deadline = time.monotonic() + 60
        while cache.get(services.clusters.SCHEDULER_TICK_KEY) is None:
            assert time.monotonic() < deadline, "the worker did not run the tick"
            time.sleep(0.2)
    waited = cache.get(services.clusters.SCHEDULER_TICK_KEY)["waited"]
    assert 15 <= waited < 60
    assert "The scheduler is lagging:</strong> the oldest scheduler tick has waited" in _admin_home(world)
