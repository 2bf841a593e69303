"""One pool across clusters (issue 16) with the real kube-apiserver beside a simulated cluster:
a job submitted for any cluster goes to the real cluster when only it can start it, and its
pods are created there (bound through HAMi's handshake, run by the kubelet stand-in)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, SimulatedPod
from scheduling.services import placement

from .harness import camp_pods, hami_devices
from .steps import wait_running

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: sim-l4-0
    cpu_cores: 16
    ram_gib: 64
    gpus: {model: L4, count: 1, memory_mib: 23034}
"""


def test_an_any_cluster_job_lands_on_the_real_cluster_when_only_it_fits(world: Any, kube: Any) -> None:
    kube.node("gpu-0", devices=hami_devices(2))
    real = kube.register(world, labels={"region": "lab"})
    sim = services.cluster_create(actor=world.admin, name="sim", backend="simulated", inventory=SMALL,
                                  labels={"region": "cloud"})
    services.inventory_sync(cluster=sim)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=None, name="two-gpus",
                              kind="pytorch", groups=[{"name": "worker", "gpu_count": 2,
                                                       "cpu_millicores": 1000, "ram_mib": 1024}])
    assert job.cluster_id is None
    summary = placement.placement_run()
    assert summary is not None and summary.placed == [job.pk]
    job.refresh_from_db()
    assert job.cluster == real
    assert "cluster sim: can never run there" in job.placement_note
    services.cycle_run(cluster=real)
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.reason
    assert services.job_dispatch(job_id=job.pk) == "created"
    pods = camp_pods(kube.core)
    assert [p.spec.node_name for p in pods] == ["gpu-0"]
    assert pods[0].metadata.labels["camp.io/job-id"] == str(job.pk)
    assert wait_running(real, job).state == JobState.RUNNING
    assert not SimulatedPod.objects.exists()  # nothing went to the simulated cluster
    assert Job.objects.get(pk=job.pk).cluster == real
