"""The watch consumer (``manage.py camp_watch``), 422 answers and the MPI hostfile — the
Kubernetes backend through the official client against kmock over real HTTP.

Stand-ins (see test_kubernetes.py): kmock 0.8 streams watches only for ``watch=true``
while the official client sends ``watch=True``, so each watch request is answered by a
kmock reaction carrying the events (first an expired-resourceVersion 410, then the pod's
MODIFIED event built from the pod kmock stores); the namespace and the owner ConfigMap's
uid are canned. Lists, creates, status patches and deletes are kmock's own.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from django.core.management import call_command

from scheduling import services
from scheduling.models import Job, JobState

from . import test_kubernetes
from .conftest import gpu_group, project_ns
from .kmockserver import stored
from .test_kubernetes import _serve_namespace, _serve_owner_uid

pytestmark = pytest.mark.django_db
kube = test_kubernetes.kube  # the same kmock-backed cluster fixture
NS = ""  # the project's namespace, set per test (ids differ between tests)


@pytest.fixture(autouse=True)
def _project_namespace(world: Any) -> None:
    global NS
    NS = project_ns(world)


def _admit(world: Any, kube: Any, name: str, kind: str, groups: list[dict[str, Any]]) -> Job:
    k, _, cluster = kube
    services.inventory_sync(cluster=cluster)
    _serve_namespace(k, NS)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name=name, kind=kind, groups=groups)
    _serve_owner_uid(k, NS, f"{name}-{job.pk}")
    summary = services.cycle_run(cluster=cluster)
    assert summary is not None and summary.admitted == [job.pk]
    return job


def test_watch_consumer_applies_phases_and_relists_on_410(world: Any, kube: Any) -> None:
    k, core, cluster = kube
    job = _admit(world, kube, "train", "pytorch", [gpu_group(gpu_count=1)])
    assert services.job_dispatch(job_id=job.pk) == "created"
    pod = job.allocations.get().pod_name
    core.patch_namespaced_pod_status(pod, NS, {"status": {"phase": "Running"}})
    finished = stored(k, "pods", NS, pod)
    finished["status"] = {"phase": "Succeeded"}
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}
    k["get /api/v1/pods?watch=True"][:1] << (gone,)
    k["get /api/v1/pods?watch=True"] << ({"type": "MODIFIED", "object": finished},)

    # 1: the initial list (Running) starts the job; 2: the relist after 410 Gone;
    # 3: the streamed MODIFIED event (Succeeded) finishes it.
    call_command("camp_watch", cluster="kube", max_events=3, window=5)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and job.reason == "All pods succeeded"
    kinds = list(job.decisions.order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == ["started", "finished"]
    # (the inventory sync's list of other schedulers' pods, by fieldSelector, is not the watch's)
    lists = [r for r in k["get /api/v1/pods"] if "watch" not in r.params and "fieldSelector" not in r.params]
    assert len(lists) == 2  # listed, then relisted after the 410


def test_watch_consumer_deletes_orphans(world: Any, kube: Any) -> None:
    k, core, _ = kube
    _serve_namespace(k, NS)
    core.create_namespaced_pod(NS, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "stray", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "camp"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    k["get /api/v1/pods?watch=True"] << ()
    before = signal.getsignal(signal.SIGTERM)
    call_command("camp_watch", cluster="kube", max_events=1, window=2)
    assert core.list_namespaced_pod(NS).items == []
    # Run in-process, the watcher puts the SIGTERM handler back: a later SIGTERM (a test
    # runner's timeout) must not raise the watcher's stop in unrelated code.
    assert signal.getsignal(signal.SIGTERM) is before


def test_422_is_a_clear_job_error_without_retries(world: Any, kube: Any) -> None:
    k, core, _ = kube
    job = _admit(world, kube, "bad", "batch", [gpu_group(gpu_count=1)])
    k[f"post /api/v1/namespaces/{NS}/pods"] << 422  # e.g. an admission webhook refuses it
    assert services.job_dispatch(job_id=job.pk, final_attempt=False) == "failed"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert job.reason.startswith("Could not create its pods: Kubernetes API answered 422")
    assert len(list(k[f"post /api/v1/namespaces/{NS}/pods"])) == 1  # not retried
    assert not job.allocations.exists() and core.list_namespaced_pod(NS).items == []


def test_mpi_job_gets_a_hostfile_of_its_workers(world: Any, kube: Any) -> None:
    k, core, _ = kube
    job = _admit(world, kube, "mpi", "mpi", [
        gpu_group(name="launcher", gpu_count=0), gpu_group(name="worker", replicas=2, gpu_count=2,
                                                            gpu_memory_mib=10000)])
    assert services.job_dispatch(job_id=job.pk) == "created"
    owner = f"mpi-{job.pk}"
    hostfile = stored(k, "configmaps", NS, owner)["data"]["hostfile"]
    assert hostfile == (f"mpi-{job.pk}-worker-0.{owner}.{NS}.svc slots=2\n"
                        f"mpi-{job.pk}-worker-1.{owner}.{NS}.svc slots=2\n")
    launcher = core.read_namespaced_pod(f"mpi-{job.pk}-launcher-0", NS)
    mounts = {m.name: m.mount_path for m in launcher.spec.containers[0].volume_mounts}
    assert mounts["camp"] == "/etc/camp"  # the hostfile is at /etc/camp/hostfile
    assert stored(k, "services", NS, owner)["spec"]["clusterIP"] == "None"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_watch_during_an_outage_backs_off_quietly_and_reports_its_health(
        world: Any, caplog: Any) -> None:
    """An API server that does not answer: the watcher writes one line (not one per retry
    of every request), keeps trying with backoff, and the cluster page and /metrics say so."""
    import logging

    from django.test import Client

    from tests.integration.portal.test_portal import _metrics

    cluster = services.cluster_create(actor=world.admin, name="dead", backend="kubernetes",
                                      api_server=f"http://127.0.0.1:{_free_port()}",
                                      credentials={"token": "t"}, verify=False)
    caplog.set_level(logging.DEBUG)
    call_command("camp_watch", cluster="dead", duration=6)
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO]
    # the start line (issue 33: the watcher says what it watches), then the outage, once
    assert noisy[0].getMessage().startswith("camp_watch of dead starting")
    noisy = noisy[1:]
    assert len(noisy) == 1, [r.getMessage() for r in noisy]
    assert noisy[0].getMessage().startswith("watch of dead: Kubernetes API unreachable")
    cluster.refresh_from_db()
    assert cluster.watch_failing and cluster.watch_error_since is not None
    assert "unreachable" in cluster.watch_error
    client = Client()
    client.force_login(world.admin)
    page = client.get("/scheduling/clusters/").content.decode()
    assert "Pod watcher:" in page and "failing since" in page and "unreachable" in page
    m = _metrics(Client())
    assert m["camp_watch_healthy"][(("cluster", "dead"),)] == 0.0


def test_watch_survives_a_bad_event_and_records_it(world: Any, kube: Any, monkeypatch: Any) -> None:
    k, core, cluster = kube
    job = _admit(world, kube, "train", "pytorch", [gpu_group(gpu_count=1)])
    assert services.job_dispatch(job_id=job.pk) == "created"
    pod = job.allocations.get().pod_name
    core.patch_namespaced_pod_status(pod, NS, {"status": {"phase": "Running"}})
    running = stored(k, "pods", NS, pod)
    k["get /api/v1/pods?watch=True"] << ({"type": "MODIFIED", "object": running},)
    real = services.pod_event_watch_apply
    calls = {"n": 0}

    def first_one_breaks(**kw: Any) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a malformed event")
        return real(**kw)

    monkeypatch.setattr(services, "pod_event_watch_apply", first_one_breaks)
    # 1: the initial list's event fails to apply; 2: the streamed one starts the job.
    call_command("camp_watch", cluster="kube", max_events=1, window=5)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    cluster.refresh_from_db()
    assert "a malformed event" in cluster.watch_error and not cluster.watch_failing
    assert cluster.watch_last_event_at is not None


def test_a_watch_that_recovers_ends_the_reconcile_backoff(world: Any) -> None:
    """After a long outage the reconcile's next try may be minutes away (its backoff grew
    with every failure); the watcher reconnecting proves the server answers again, so the
    cluster is marked reachable at once and the next tick reconciles it."""
    import datetime as dt

    from django.utils import timezone

    from scheduling.management.commands.camp_watch import Health
    from scheduling.models import Cluster
    from tenants.models import AuditEvent

    cluster = services.cluster_create(actor=world.admin, name="back", backend="kubernetes",
                                      api_server="https://127.0.0.1:1", credentials={"token": "t"},
                                      verify=False)
    for _ in range(8):  # eight failed reconciles: the next one 256 s away
        services.cluster_reachability_record(cluster_id=cluster.pk, error="connection refused")
    cluster.refresh_from_db()
    assert cluster.retry_at is not None and cluster.retry_at > timezone.now() + dt.timedelta(seconds=200)
    assert not services.cluster_due(cluster)
    health = Health(cluster.pk, cluster.name)
    health.failed("Kubernetes API unreachable (connection refused)")
    health.event()  # the watch is back: an event arrived
    cluster = Cluster.objects.get(pk=cluster.pk)
    assert services.cluster_due(cluster) and cluster.reachable and cluster.failures == 0
    assert not cluster.watch_failing
    assert list(AuditEvent.objects.filter(action__startswith="cluster.").exclude(
        action="cluster.created").order_by("id").values_list("action", flat=True)) == [
        "cluster.unreachable", "cluster.reachable"]
