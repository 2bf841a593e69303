"""A stop racing a dispatch (real PostgreSQL, two connections, the simulated backend).

The race: ``job_dispatch`` reads the job as STARTING and starts creating its pods; a
cancel commits and its ``job_stop``, finding no pods yet, would release the job's GPUs;
the dispatch then creates pods on GPUs the database shows free. The stop here runs in
another thread (its own connection, as another worker would) exactly between the
dispatch's read and its first pod creation, by wrapping the backend."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from scheduling import services
from scheduling.models import Allocation, GpuDevice, Job, JobState, SimulatedPod

from .conftest import submit

pytestmark = pytest.mark.django_db(transaction=True)


class _StopBeforeFirstPod:
    """The real backend, but the first ``create_pod`` first lets ``race`` run to its end
    in another thread (with its own database connection)."""

    def __init__(self, inner: Any, race: Any) -> None:
        self.inner, self.race, self.fired = inner, race, False
        self.outcome: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def create_pod(self, spec: Any) -> Any:
        if not self.fired:
            self.fired = True

            def run() -> None:
                try:
                    self.outcome["stop"] = self.race()
                finally:
                    connection.close()

            t = threading.Thread(target=run)
            t.start()
            t.join(timeout=30)
            assert not t.is_alive(), "the racing stop blocked"
        return self.inner.create_pod(spec)


def _live_pods(job: Job) -> list[str]:
    return list(SimulatedPod.objects.filter(labels__contains={"camp.io/job-id": str(job.pk)},
                                            deleted_at__isnull=True).values_list("name", flat=True))


def test_cancel_during_dispatch_never_leaves_pods_on_free_gpus(world: Any, sim_cluster: Any,
                                                                monkeypatch: Any) -> None:
    job = submit(world, sim_cluster, "racer", group={"gpu_count": 2})
    summary = services.cycle_run(cluster=sim_cluster)
    assert summary is not None and summary.admitted == [job.pk]
    held = {g.pk for g in GpuDevice.objects.filter(sharers__gt=0)}
    assert len(held) == 2

    def cancel_and_stop() -> str:
        fresh = Job.objects.get(pk=job.pk)
        services.job_cancel(actor=world.a.member, job=fresh)
        result = services.job_stop(job_id=job.pk)
        # What another worker could now see: were the GPUs free while pods were coming?
        wrapper.outcome["held_after_stop"] = Allocation.objects.filter(job_id=job.pk).exists()
        return result

    real_backend_for = services.dispatch.backend_for
    wrapper: _StopBeforeFirstPod | None = None

    def backend_for(cluster: Any) -> Any:
        nonlocal wrapper
        if threading.current_thread() is not threading.main_thread():
            return real_backend_for(cluster)
        if wrapper is None:
            wrapper = _StopBeforeFirstPod(real_backend_for(cluster), cancel_and_stop)
            return wrapper
        return real_backend_for(cluster)

    monkeypatch.setattr(services.dispatch, "backend_for", backend_for)
    outcome = services.job_dispatch(job_id=job.pk)

    assert wrapper is not None and wrapper.fired
    # The stop that raced the dispatch kept the GPUs: a dispatch was creating pods on them.
    assert wrapper.outcome == {"stop": "waiting", "held_after_stop": True}
    # The dispatch saw the cancel once its pods existed, and stopped the job itself.
    assert outcome == "aborted"
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert _live_pods(job) == []
    assert not Allocation.objects.filter(job_id=job.pk).exists()
    assert not GpuDevice.objects.filter(sharers__gt=0).exists()


def test_dispatch_after_a_finished_stop_creates_nothing(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "late")
    services.cycle_run(cluster=sim_cluster)
    services.job_cancel(actor=world.a.member, job=job)
    assert services.job_stop(job_id=job.pk) == "released"
    assert services.job_dispatch(job_id=job.pk) == "skipped"
    assert _live_pods(job) == []


def test_a_normal_dispatch_still_creates_and_marks_its_pods(world: Any, sim_cluster: Any) -> None:
    job = submit(world, sim_cluster, "plain")
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"
    assert len(_live_pods(job)) == 1
    assert set(Allocation.objects.filter(job_id=job.pk).values_list("phase", flat=True)) == {"created"}
    # the dispatch's lock is gone: a later stop releases at once
    services.job_cancel(actor=world.a.member, job=job)
    assert services.job_stop(job_id=job.pk) == "released"
