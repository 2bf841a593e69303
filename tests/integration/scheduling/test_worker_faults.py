"""Worker faults with real Celery worker processes on real PostgreSQL and Redis (issue 11,
bugs 3 and 6). The test plays beat: it sends ``scheduler_tick`` every second, as
``celery beat`` does every ``SCHEDULER_TICK_SECONDS``.

* A worker SIGKILLed in the middle of a dispatch: its message stays unacknowledged in Redis
  until the one-hour visibility timeout, so it is the reconcile sweep that finds the job
  stuck STARTING with no dispatch running and asks for the dispatch again; a late copy of
  the lost message (what Redis redelivers an hour later) then changes nothing.
* Two hung API servers (they accept connections and never answer) beside a live cluster:
  each is probed once per backoff step, never once per tick with retries, and the live
  cluster's job runs.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from scheduling import services, tasks
from scheduling.models import Cluster, Job, JobState, SimulatedPod

from .conftest import SMALL_INVENTORY, gpu_group
from .test_concurrency import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_INVENTORY = SMALL_INVENTORY.replace("start_delay_seconds: 0",
                                         "start_delay_seconds: 0\ncreate_delay_seconds: 1.5")


def _live(job: Job) -> list[str]:
    return sorted(SimulatedPod.objects.filter(labels__contains={"camp.io/job-id": str(job.pk)},
                                              deleted_at__isnull=True).values_list("name", flat=True))


def _beat_until(predicate: Any, timeout: float) -> float:
    """Send scheduler_tick every second until ``predicate()``; the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        tasks.scheduler_tick.delay()
        time.sleep(1.0)
    raise AssertionError(f"not done after {timeout}s")


def test_a_dispatch_lost_with_a_killed_worker_comes_back_in_seconds(world: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SLOW_INVENTORY)
    services.inventory_sync(cluster=cluster)
    services.cycle_request_taken(cluster.pk)  # its cycle request is purged with the queue
    with celery_worker() as worker:
        job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                                  name="ddp", groups=[gpu_group(replicas=4)])
        deadline = time.monotonic() + 60
        ticked = 0.0
        while not _live(job):  # the dispatch is creating its pods, 1.5 s each
            assert time.monotonic() < deadline, "the dispatch did not start"
            if time.monotonic() - ticked > 1:
                tasks.scheduler_tick.delay()
                ticked = time.monotonic()
            time.sleep(0.1)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    job.refresh_from_db()
    assert job.state == JobState.STARTING and 1 <= len(_live(job)) < 4  # killed mid-way

    with celery_worker():
        took = _beat_until(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60)
        print(f"\nlost dispatch recovered, job running {took:.1f} s after the new worker started")
        pods = _live(job)
        assert len(pods) == 4
        # The lost message redelivered late (Redis restores it after its visibility
        # timeout): the job is running, so it is a no-op.
        assert services.job_dispatch(job_id=job.pk) == "skipped"
        tasks.job_dispatch.delay(job.pk)
        time.sleep(3)
        job.refresh_from_db()
        assert job.state == JobState.RUNNING and _live(job) == pods
        assert not job.decisions.filter(kind__in=["requeued", "failed", "preempted"]).exists()


@contextmanager
def _hung_api_server() -> Iterator[tuple[str, list[int]]]:
    """A TCP server that accepts connections and never answers (a hung API server, or a
    half-dead load balancer in front of one); counts the connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    count = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            count[0] += 1
            held.append(conn)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", count
    finally:
        stop.set()
        t.join(timeout=5)
        for c in held:
            c.close()
        server.close()


def test_two_hung_clusters_do_not_hold_up_a_live_one(world: Any) -> None:
    live = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=live)
    services.cycle_request_taken(live.pk)  # its cycle request is purged with the queue
    with _hung_api_server() as (url1, conns1), _hung_api_server() as (url2, conns2):
        dead = [services.cluster_create(actor=world.admin, name=f"dead{i}", backend="kubernetes",
                                        api_server=url, credentials={"token": "t"}, verify=False)
                for i, url in enumerate((url1, url2))]
        with celery_worker():  # 2 processes, as in production's smallest deployment
            tasks.scheduler_tick.delay()
            time.sleep(4)  # the dead clusters' first reconciles are under way
            job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=live,
                                      name="train", groups=[gpu_group(gpu_count=1)])
            took = _beat_until(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60)
            window_end = time.monotonic() + 8
            while time.monotonic() < window_end:  # eight more ticks
                tasks.scheduler_tick.delay()
                time.sleep(1.0)
        print(f"\nsubmit→running on the live cluster with two hung ones: {took:.1f} s; "
              f"connections to the hung servers: {conns1[0]}, {conns2[0]}")
    for cluster, conns in zip(dead, (conns1, conns2), strict=True):
        cluster.refresh_from_db()
        # Shown as unreachable, backing off (the next try later), not retried every tick:
        # one probe per backoff step (2, 4, 8 s ...) in the ~20 s of ticks.
        assert cluster.unreachable_since is not None and cluster.retry_at is not None
        assert 1 <= cluster.failures <= 5, cluster.failures
        assert conns[0] <= cluster.failures + 1, (conns[0], cluster.failures)
        assert "unreachable" in cluster.last_error
    assert Cluster.objects.get(pk=live.pk).unreachable_since is None
    from tenants.models import AuditEvent

    assert AuditEvent.objects.filter(action="cluster.unreachable").count() == 2
