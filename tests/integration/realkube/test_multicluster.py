"""One pool across clusters (issue 16) with the real kube-apiserver beside a simulated cluster:
a job submitted for any cluster goes to the real cluster when only it can start it, and its
pods are created there (bound through HAMi's handshake, run by the kubelet stand-in)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, SimulatedPod
from scheduling.services import placement
from tests.integration.scheduling.conftest import race_cycles

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


# --- the rest of the done-when on the real apiserver beside a simulated cluster -------

ARM_LAB = {"kubernetes.io/arch": "arm64"}


def _x86_image(world: Any) -> str:
    from registry import services as registry_services

    ref = "registry.example/x86-only:1"
    registry_services.image_create(actor=world.admin, name="x86-only", variant="training", reference=ref,
                                   architectures=["linux/amd64"])
    return ref


def _floating(world: Any, name: str, gpus: int = 1, **group: Any) -> Job:
    spec = {"name": "worker", "gpu_count": gpus, "cpu_millicores": 1000, "ram_mib": 1024, **group}
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=None,
                               cluster_choice={"prefer": {"region": "lab"}}, name=name, kind="pytorch",
                               groups=[spec])


def test_an_image_without_the_real_clusters_arch_never_goes_there(world: Any, kube: Any) -> None:
    """The real cluster's nodes are arm64 (the kubelet's ``kubernetes.io/arch`` label, read by
    the inventory sync): an amd64-only image goes to the simulated amd64 cluster even though
    the job prefers the real one's region, and waits rather than go there once that is full."""
    kube.node("arm-0", devices=hami_devices(4), labels=ARM_LAB)
    real = kube.register(world, labels={"region": "lab"})
    sim = services.cluster_create(actor=world.admin, name="sim", backend="simulated", inventory=SMALL,
                                  labels={"region": "cloud"})
    services.inventory_sync(cluster=sim)
    ref = _x86_image(world)
    first = _floating(world, "x86-first", image=ref)
    placement.placement_run()
    first.refresh_from_db()
    assert first.cluster == sim, first.reason
    services.cycle_run(cluster=sim)
    first.refresh_from_db()
    assert first.state == JobState.STARTING
    # The simulated cluster's one GPU is taken: the second waits there (or in the global
    # queue), never on the real cluster's free arm64 GPUs, and says why per cluster.
    second = _floating(world, "x86-second", image=ref)
    for _ in range(2):
        placement.placement_run()
        services.cycle_run(cluster=real)
        services.cycle_run(cluster=sim)
    second.refresh_from_db()
    assert second.cluster_id != real.pk and second.state == JobState.QUEUED
    assert "cluster real: the image has no arm64 variant" in (second.why_across_clusters or second.reason)
    assert camp_pods(kube.core) == []  # nothing was ever created on the real cluster
    # An image built for both goes to the real cluster (the preferred region, room there).
    both = _floating(world, "multi-arch")
    placement.placement_run()
    services.cycle_run(cluster=real)
    both.refresh_from_db()
    assert both.cluster == real and both.state == JobState.STARTING
    assert services.job_dispatch(job_id=both.pk) == "created"
    assert [p.metadata.labels["camp.io/job-id"] for p in camp_pods(kube.core)] == [str(both.pk)]


def test_a_project_limit_across_clusters_holds_under_racing_cycles(world: Any, kube: Any) -> None:
    """Two cycles, the real cluster's and the simulated one's, admit at the same moment; the
    project's GPU limit across all clusters (2) lets only one side's jobs through, and only
    the admitted job's pods reach the real apiserver."""
    from decimal import Decimal

    from scheduling.models import GpuSlice
    from tenants import services as tenant_services

    kube.node("gpu-0", devices=hami_devices(2))
    real = kube.register(world, labels={"region": "lab"})
    sim_inventory = SMALL.replace("count: 1", "count: 2")
    sim = services.cluster_create(actor=world.admin, name="sim", backend="simulated", inventory=sim_inventory)
    services.inventory_sync(cluster=sim)
    tenant_services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                              values={"gpus_limit_all_clusters": Decimal(2)})
    jobs = [services.job_submit(actor=world.a.member, project=world.a.project, cluster=c,
                                name=f"race-{c.name}", kind="pytorch", preemptible=True,
                                groups=[{"name": "worker", "gpu_count": 2, "cpu_millicores": 1000,
                                         "ram_mib": 1024}])
            for c in (real, sim)]
    race_cycles((real, sim))
    for j in jobs:
        j.refresh_from_db()
    started = [j for j in jobs if j.state == JobState.STARTING]
    waiting = [j for j in jobs if j.state == JobState.QUEUED]
    assert len(started) == 1 and len(waiting) == 1
    assert GpuSlice.objects.filter(allocation__job__project=world.a.project).count() == 2
    assert "gpu limit across all clusters: 2 of 2 in use" in waiting[0].reason.lower()
    for j in started:
        assert services.job_dispatch(job_id=j.pk) == "created"
    on_real = [p.metadata.labels["camp.io/job-id"] for p in camp_pods(kube.core)]
    assert on_real == ([str(started[0].pk)] if started[0].cluster == real else [])
    # Later cycles see the other cluster's use and keep the second job waiting.
    for c in (real, sim):
        services.cycle_run(cluster=c)
    assert Job.objects.get(pk=waiting[0].pk).state == JobState.QUEUED


def test_a_job_fails_over_when_the_real_apiserver_refuses_its_pods(world: Any, kube: Any) -> None:
    """The job goes to the real cluster (preferred region); its project's namespace there is
    stuck terminating (deleted, its finalizer never run), so the real apiserver's namespace
    lifecycle admission refuses every object in it. The dispatch fails, the job goes back to
    the global queue and runs on the simulated cluster instead."""
    from scheduling.services import dispatch as dispatch_mod

    kube.node("gpu-0", devices=hami_devices(2))
    real = kube.register(world, labels={"region": "lab"})
    sim = services.cluster_create(actor=world.admin, name="sim", backend="simulated", inventory=SMALL,
                                  labels={"region": "cloud"})
    services.inventory_sync(cluster=sim)
    job = _floating(world, "failover")
    placement.placement_run()
    services.cycle_run(cluster=real)
    job.refresh_from_db()
    assert job.cluster == real and job.state == JobState.STARTING
    ns, _, _ = dispatch_mod.job_specs(job, real)
    kube.core.create_namespace({"apiVersion": "v1", "kind": "Namespace",
                                "metadata": {"name": ns.name, "labels": dict(ns.labels)}})
    kube.core.delete_namespace(ns.name)  # Terminating for good: no namespace controller runs here
    try:
        assert kube.core.read_namespace(ns.name).status.phase == "Terminating"
        assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "failed"
        job.refresh_from_db()
        assert job.cluster_id is None and job.state == JobState.QUEUED, job.reason
        assert job.reason == "Back in the global queue: its pods could not be created on real"
        assert camp_pods(kube.core) == []
        placement.placement_run()
        job.refresh_from_db()
        assert job.cluster == sim, job.reason  # the real cluster is avoided for a while
        # Why not the real cluster: the apiserver's own refusal, as the user reads it.
        assert "cluster real: its pods could not be created there:" in job.placement_note
        assert "being terminated" in job.placement_note, job.placement_note
        services.cycle_run(cluster=sim)
        job.refresh_from_db()
        assert job.state == JobState.STARTING
        assert services.job_dispatch(job_id=job.pk) == "created"
        assert SimulatedPod.objects.filter(cluster=sim).exists()
        kinds = list(job.decisions.order_by("id").values_list("kind", "cluster__name"))
        assert ("unplaced", "real") in kinds and ("placed", "sim") in kinds
    finally:
        # What the namespace controller would do: empty the finalizers, so the apiserver
        # removes the namespace and later tests start clean.
        body = kube.core.read_namespace(ns.name)
        body.spec.finalizers = []
        kube.core.replace_namespace_finalize(ns.name, body)
