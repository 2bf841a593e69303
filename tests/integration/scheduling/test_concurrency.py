"""Concurrency and crash safety with a real Celery worker (prefork, 2 processes) on real
PostgreSQL and Redis. Nothing is mocked: submits and cancels come from threads in this
process, cycles, dispatches and stops run in the worker on the simulated backend."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections

from scheduling import services
from scheduling.models import Allocation, GpuDevice, GpuSlice, Job, JobState

from .conftest import SMALL_INVENTORY, gpu_group

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def celery_worker() -> Iterator[subprocess.Popen[bytes]]:
    """A real worker in its own process group, always killed in ``finally``."""
    from camp.celery import app

    app.control.purge()
    db = settings.DATABASES["default"]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           # this run's queue and cache keys (camp/settings/test.py)
           "CAMP_TEST_RUN_ID": settings.TEST_RUN_ID}
    name = f"test-{os.getpid()}@localhost"
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "camp", "worker", "--pool=prefork", "--concurrency=2",
         "--loglevel=WARNING", "--without-gossip", "--without-mingle", "-n", name],
        env=env, start_new_session=True, cwd=settings.BASE_DIR,
    )
    try:
        deadline = time.monotonic() + 30
        while not app.control.ping(destination=[name], timeout=0.5):
            assert proc.poll() is None, "the worker died at start"
            assert time.monotonic() < deadline, "the worker did not start"
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _wait_quiet(cluster: Any, timeout: float = 60) -> None:
    """Until every job is settled: admitted, waiting with a reason, or final and released."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        unsettled = (
            Job.objects.filter(cluster=cluster, state=JobState.QUEUED, reason_kind="").count()
            + Job.objects.filter(cluster=cluster, state__in=["cancelled", "preempting"],
                                 allocations__isnull=False).distinct().count()
            + Job.objects.filter(cluster=cluster, state="starting",
                                 allocations__phase="pending").distinct().count()
        )
        if unsettled == 0:
            return
        services.request_cycle(cluster.pk)
        time.sleep(0.5)
    raise AssertionError(f"not settled after {timeout}s")


def assert_consistent(cluster: Any, *, settled: bool = True) -> None:
    """No GPU over-allocated; totals equal the slice rows; holders are exactly the admitted."""
    used: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for s in GpuSlice.objects.filter(allocation__cluster=cluster):
        used[s.gpu_id][0] += s.memory_mib
        used[s.gpu_id][1] += s.cores_percent
        used[s.gpu_id][2] += 1
    for gpu in GpuDevice.objects.filter(node__cluster=cluster):
        mem, cores, n = used.get(gpu.pk, [0, 0, 0])
        assert (gpu.memory_allocated_mib, gpu.cores_allocated, gpu.sharers) == (mem, cores, n), gpu
        assert mem <= gpu.memory_mib and cores <= 100
    holders = set(Allocation.objects.filter(cluster=cluster).values_list("job__state", flat=True))
    assert holders <= {JobState.STARTING, JobState.RUNNING}
    for job in Job.objects.filter(cluster=cluster, state__in=[JobState.STARTING, JobState.RUNNING]):
        expected = sum(g.replicas for g in job.groups.all())
        assert job.allocations.count() == expected, job
    if settled:
        assert not Job.objects.filter(cluster=cluster, state=JobState.QUEUED, reason="").exists()


def _submit_many(world: Any, cluster: Any, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)

    def one(i: int) -> int:
        try:
            priority = rng.choice(["batch", "normal", "high"])
            job = services.job_submit(  # "high" is for project admins and above (issue 30)
                actor=world.a.project_admin if priority == "high" else world.a.member,
                project=world.a.project, cluster=cluster, name=f"j{seed}-{i}",
                priority_class=priority,
                groups=[gpu_group(gpu_count=rng.choice([1, 1, 2]),
                                  gpu_memory_mib=rng.choice([5000, 10000, 20000, 40000]),
                                  gpu_cores_percent=rng.choice([10, 25, 50]))])
            if i % 3 == 0:
                time.sleep(rng.random() * 0.05)
                services.job_cancel(actor=world.a.project_admin, job=job)
            return job.pk
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=6) as pool:
        return list(pool.map(one, range(n)))


def test_hundreds_of_concurrent_submits_and_cancels(world: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    with celery_worker():
        ids = _submit_many(world, cluster, 240, seed=1)
        _wait_quiet(cluster)
        assert_consistent(cluster)
    assert len(ids) == len(set(ids)) == Job.objects.filter(cluster=cluster).count() == 240
    states = dict.fromkeys(JobState.values, 0)
    for s in Job.objects.filter(cluster=cluster).values_list("state", flat=True):
        states[s] += 1
    assert states["cancelled"] == 80
    assert states["starting"] + states["running"] > 0 and states["queued"] > 0


def _cycle_in_progress() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [services._CYCLE_LOCK_CLASS])
        row = cursor.fetchone()
    return bool(row and row[0])


def test_worker_killed_mid_cycle_recovers_consistently(world: Any) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    from django.core.cache import cache

    for i in range(150):  # queued while no worker runs
        services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                            name=f"c{i}", groups=[gpu_group(gpu_memory_mib=10000, gpu_cores_percent=10)])
    killed_mid_cycle = False
    with celery_worker() as proc:
        cache.delete(f"camp:cycle-queued:{cluster.pk}")
        services.request_cycle(cluster.pk)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if _cycle_in_progress():
                os.killpg(proc.pid, signal.SIGKILL)
                killed_mid_cycle = True
                break
            time.sleep(0.005)
    assert killed_mid_cycle, "no cycle was seen running"
    # The killed cycle's transaction rolled back with its connection: all or nothing.
    time.sleep(0.5)
    assert not _cycle_in_progress()
    assert_consistent(cluster, settled=False)
    with celery_worker():
        from scheduling.tasks import scheduler_tick

        cache.delete(f"camp:cycle-queued:{cluster.pk}")
        scheduler_tick.delay()
        _wait_quiet(cluster)
        assert_consistent(cluster)
    assert Job.objects.filter(cluster=cluster).count() == 150
    assert Job.objects.filter(cluster=cluster, state=JobState.STARTING).exists()


def test_two_workers_racing_cycles_never_over_allocate_nor_admit_a_cancelled_job(world: Any) -> None:
    """Two scheduler loops (two threads, each its own connection) run cycles on one cluster
    back to back, beside a real Celery worker that runs the cycles the submits ask for and
    the stops, while users submit and cancel: whichever wins the cluster's lock, no GPU is
    over-allocated, the totals equal the slice rows, and no job is admitted after its cancel
    (a cancelled job's allocation is released)."""
    import threading

    from scheduling.models import DecisionKind, SchedulingDecision

    cluster = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    stop = threading.Event()
    ran = [0, 0]

    def worker(w: int) -> None:
        try:
            while not stop.is_set():
                if services.cycle_run(cluster=cluster) is not None:
                    ran[w] += 1
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
    with celery_worker():
        for t in threads:
            t.start()
        try:
            ids = _submit_many(world, cluster, 90, seed=7)
            # mid-race too: no card over-allocated, totals equal the slice rows (stops of
            # cancelled and preempted jobs may still be on their way to the worker)
            # — one statement, so counters and slices are read from one snapshot.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT g.id FROM scheduling_gpudevice g JOIN scheduling_node n ON n.id = g.node_id"
                    " LEFT JOIN (SELECT gpu_id, SUM(memory_mib) AS m, SUM(cores_percent) AS c"
                    "            FROM scheduling_gpuslice GROUP BY gpu_id) s ON s.gpu_id = g.id"
                    " WHERE n.cluster_id = %s AND (g.memory_allocated_mib <> COALESCE(s.m, 0)"
                    "   OR g.cores_allocated <> COALESCE(s.c, 0) OR COALESCE(s.m, 0) > g.memory_mib"
                    "   OR COALESCE(s.c, 0) > 100)", [cluster.pk])
                assert cursor.fetchall() == []
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        _wait_quiet(cluster)
        assert_consistent(cluster)
    assert sum(ran) > 2, ran
    cancelled = Job.objects.filter(pk__in=ids, state=JobState.CANCELLED)
    assert cancelled.count() == 30
    assert not Allocation.objects.filter(job__in=cancelled).exists()
    for job in cancelled:
        admitted_after_cancel = SchedulingDecision.objects.filter(
            job=job, kind=DecisionKind.ADMITTED, created_at__gt=job.finished_at)
        assert not admitted_after_cancel.exists(), job
