"""Dead clusters beside a live one (issue 27, finding 6): one hung API server (accepts TCP, never
answers) used to make ``services_sweep`` take 153 s a run, both worker processes sat in sweeps
and a job on the healthy cluster stayed starting for minutes. Every periodic task that calls a
cluster goes through one gate (``services.cluster_periodic``): a cheap probe, then skipped until
it answers, and a time budget per cluster per run. Asserted on calls and outcomes (what reached
each dead server, what the cluster records), never on how long something took."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from scheduling import services, tasks
from scheduling.models import Cluster, Job, JobState
from scheduling.services import clusters
from workspaces import tasks as wtasks

from .dead import FakeClock, HalfDeadApiServer, hung_api_server, refusing_api_server
from .harness import hami_devices
from .steps import submit

pytestmark = pytest.mark.django_db(transaction=True)

# Every periodic task that calls one cluster's API server (the beat's ticks fan out to these).
PERIODIC = {"reconcile": tasks.cluster_reconcile, "inventory": tasks.cluster_inventory_sync,
            "services-sweep": wtasks.cluster_services_sweep}


def _dead(world: Any, name: str, url: str) -> Cluster:
    return services.cluster_create(actor=world.admin, name=name, backend="kubernetes", api_server=url,
                                   credentials={"token": "t"}, verify=False)


def _due_now(cluster: Cluster) -> None:
    """Its backoff step has passed (as time would pass)."""
    Cluster.objects.filter(pk=cluster.pk).update(retry_at=None)


def _step_outlasts_test(cluster: Cluster) -> None:
    """Its backoff step (2, 4 … s) lasts beyond the test's next calls, however loaded the
    machine: what is asserted is that nothing calls it before its retry time."""
    from django.utils import timezone

    Cluster.objects.filter(pk=cluster.pk).update(retry_at=timezone.now() + dt.timedelta(hours=1))


@pytest.mark.parametrize("first", sorted(PERIODIC))
def test_a_dead_cluster_is_probed_once_by_whichever_task_comes_first_then_skipped_by_all(
        world: Any, first: str) -> None:
    with hung_api_server() as (hung_url, connections), refusing_api_server() as refused_url:
        hung, refused = _dead(world, "hung", hung_url), _dead(world, "refused", refused_url)
        for cluster in (hung, refused):
            # One probe, no retries, no call after it: the cluster is unreachable and backs off.
            assert PERIODIC[first](cluster.pk) == "unreachable"
            cluster.refresh_from_db()
            assert cluster.unreachable_since is not None and cluster.failures == 1
            assert "Kubernetes API unreachable" in cluster.last_error
            _step_outlasts_test(cluster)
            # Every periodic task now skips it without a call until its retry time.
            for kind, task in PERIODIC.items():
                assert task(cluster.pk) == "backing-off", kind
        assert connections[0] == 1  # the hung server saw the probe and nothing else
        # The ticks queue nothing for a cluster backing off.
        assert wtasks.services_sweep() == 0 and tasks.inventory_tick() == 0
        # Its next backoff step: probed once again (by one task), then skipped again.
        for cluster in (hung, refused):
            _due_now(cluster)
            assert PERIODIC[first](cluster.pk) == "unreachable"
            assert Cluster.objects.get(pk=cluster.pk).failures == 2
            _step_outlasts_test(cluster)
            assert all(task(cluster.pk) == "backing-off" for task in PERIODIC.values())
        assert connections[0] == 2


def test_while_one_task_probes_a_hung_cluster_the_others_skip_it(world: Any) -> None:
    """Fresh (never seen failing) and met by every periodic task at once, as at a tick: one
    probe, not one per task."""
    import threading

    from django.db import connection

    with hung_api_server() as (hung_url, connections):
        hung = _dead(world, "hung", hung_url)
        outcome: list[Any] = []

        def reconcile() -> None:
            try:
                outcome.append(tasks.cluster_reconcile(hung.pk))
            finally:
                connection.close()

        first = threading.Thread(target=reconcile)
        first.start()
        deadline = time.monotonic() + 60
        while connections[0] == 0:  # its probe is on the wire (the probe lock is held before)
            assert time.monotonic() < deadline and first.is_alive(), "the probe never came"
            time.sleep(0.01)
        for kind in ("inventory", "services-sweep"):
            # "busy" while the probe runs; "backing-off" if it has already failed (load).
            assert PERIODIC[kind](hung.pk) in ("busy", "backing-off"), kind
        first.join(timeout=60)
        assert outcome == ["unreachable"]
        assert connections[0] == 1


def test_a_server_that_hangs_after_the_probe_costs_one_call_within_the_budget(
        world: Any, settings: Any) -> None:
    """``/version`` answers (an API server whose etcd hangs): the run makes one call, with its read
    timeout capped by the cluster's budget, and no retry."""
    settings.CAMP_CLUSTER_RUN_SECONDS = 2
    with HalfDeadApiServer(hang=True) as server:
        cluster = _dead(world, "etcd-down", server.url)
        for kind, task in PERIODIC.items():
            _due_now(cluster)
            before = len(server.calls())
            assert task(cluster.pk) == "unreachable", kind
            assert len(server.calls()) == before + 1, (kind, server.calls())  # no retry
        cluster.refresh_from_db()
        assert cluster.unreachable_since is not None and cluster.failures == len(PERIODIC)
        assert "timed out" in cluster.last_error


def test_a_run_stops_when_its_time_for_the_cluster_is_spent_without_marking_it_unreachable(
        world: Any, monkeypatch: Any) -> None:
    """Each answer "takes" 40 s on a clock the test turns (more than the 30-s budget): the run
    makes its first call and stops before the next; the cluster answered, so it stays open."""
    clock = FakeClock()
    monkeypatch.setattr(clusters, "_clock", clock)
    with HalfDeadApiServer(hang=False, clock=clock, cost=40) as server:
        cluster = _dead(world, "slow", server.url)
        assert wtasks.cluster_services_sweep(cluster.pk) == "budget-spent"
        assert len(server.calls()) == 1, server.calls()  # the Services list; not the Ingresses'
        cluster.refresh_from_db()
        assert cluster.unreachable_since is None and cluster.failures == 0
        assert wtasks.services_sweep() == 1  # the next round goes on


def test_the_checkpoint_scan_of_a_running_training_job_probes_a_hung_cluster_once(
        world: Any, kube: Any) -> None:
    """``workspaces_tick`` reads each running training job's rank-0 log for checkpoints every
    30 s: the periodic log fetch goes through the same gate (it once waited 5 × 30 s a pod)."""
    from registry.models import Image
    from workspaces import services as workloads

    from .steps import wait_running

    kube.node("gpu-a", devices=hami_devices(2))
    real = kube.register(world)
    t = workloads.training_submit(
        actor=world.a.member, project=world.a.project, cluster=real, name="ckpt", framework="pytorch",
        image=Image.objects.get(name="pytorch-training"), workers=2, gpu_count=1, gpu_memory_mib=10000,
        gpu_cores_percent=20, cpu_millicores=1000, ram_mib=1024, checkpoint_dir="/ckpt")
    assert t.job is not None
    services.cycle_run(cluster=real)
    assert services.job_dispatch(job_id=t.job.pk) == "created"
    wait_running(real, t.job)
    assert wtasks.training_sync(t.pk) == "running"  # read through the gate while it answers
    with hung_api_server() as (hung_url, connections):
        Cluster.objects.filter(pk=real.pk).update(api_server=hung_url)  # the server hangs
        assert wtasks.training_sync(t.pk) == "running"
        assert connections[0] == 1  # the probe: no log read, no retry
        real.refresh_from_db()
        assert real.unreachable_since is not None and real.failures == 1
        _step_outlasts_test(real)
        for _ in range(3):
            assert wtasks.training_sync(t.pk) == "running"
        assert connections[0] == 1  # skipped while it backs off
        Cluster.objects.filter(pk=real.pk).update(api_server=kube.server.host)


def test_autoscale_steps_do_not_pile_up_behind_a_slow_one(world: Any) -> None:
    """The autoscaler reads each model service's load from its cluster's Prometheus (10 s
    timeout a read): while one step runs (here: its request is held, as a running step holds
    it), the beat's next ones skip instead of running beside it on every worker."""
    assert services.periodic_request("services-autoscale", 0)  # a step is running
    assert wtasks.services_autoscale() == {"skipped": 1}
    services.periodic_request_taken("services-autoscale", 0)  # it ended
    assert wtasks.services_autoscale() == {"services": 0, "failed": 0, "gone": 0}


def _play_beat() -> None:
    """What ``celery beat`` sends (camp/settings/tasks.py), every tick here rather than at each
    task's own period: the worst case for the dead clusters."""
    tasks.scheduler_tick.delay()
    tasks.inventory_tick.delay()
    tasks.utilization_tick.delay()
    wtasks.services_sweep.delay()
    wtasks.services_autoscale.delay()
    wtasks.workspaces_tick.delay()


def _wind_down(dead: list[Cluster], connections: list[int]) -> None:
    """As an operator stops beat before the workers: nothing more queued, the dead ones' next
    step far off, and a probe still on the wire (a hung server answers only at its timeout)
    recorded before the worker is killed, so every connection can be matched to its record."""
    from camp.celery import app

    app.control.purge()
    deadline = time.monotonic() + 120
    while True:
        seen = connections[0]
        for cluster in dead:
            _step_outlasts_test(cluster)
        while Cluster.objects.get(name="hung").failures < connections[0]:
            assert time.monotonic() < deadline, "a probe of the hung server was never recorded"
            time.sleep(0.2)
        for cluster in dead:  # the probe's record set a near retry time: far off again
            _step_outlasts_test(cluster)
        if connections[0] == seen:
            return


def test_a_job_on_the_healthy_cluster_runs_while_a_hung_and_a_refusing_cluster_are_registered(
        world: Any, kube: Any) -> None:
    from tests.integration.scheduling.test_concurrency import celery_worker

    kube.node("gpu-a", devices=hami_devices(2))
    real = kube.register(world)
    with hung_api_server() as (hung_url, connections), refusing_api_server() as refused_url:
        dead = [_dead(world, "hung", hung_url), _dead(world, "refused", refused_url)]
        with celery_worker():  # 2 processes, as the smallest deployment
            _play_beat()
            job = submit(world, real, "train", gpu_memory_mib=20000, gpu_cores_percent=25)
            deadline = time.monotonic() + 120  # load-proof; before the gate, minutes of sweeps
            while Job.objects.get(pk=job.pk).state != JobState.RUNNING:
                assert time.monotonic() < deadline, Job.objects.get(pk=job.pk).reason
                _play_beat()
                time.sleep(1.0)
            for _ in range(5):  # more rounds with the job running: the dead ones stay skipped
                _play_beat()
                time.sleep(1.0)
            _wind_down(dead, connections)
    for cluster in dead:
        cluster.refresh_from_db()
        assert cluster.unreachable_since is not None and cluster.failures >= 1, cluster.name
    # Every connection the hung server saw was a probe that failed and was recorded: no task
    # called it after a failed probe, none retried, none ran while it backed off.
    assert 1 <= connections[0] <= Cluster.objects.get(name="hung").failures
