"""Issue 11's lifecycle and isolation bugs on the real kube-apiserver (harness.py: kubelet and
HAMi device-plugin stand-ins): registration checks (8), namespaces (1), lost gang pods (2),
redundant dispatches (3), per-job objects (5), the watcher (7). Bug 6 (dead clusters) and the
SIGKILLed worker are in tests/integration/scheduling/test_worker_faults.py (real Celery
workers; a dead server needs no apiserver)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from django.core.management import call_command
from kubernetes import client as k8s

from scheduling import services
from scheduling.models import Cluster, Job, JobState
from tests.conftest import client_for

from .harness import hami_devices, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _register(world: Any, **body: Any) -> Any:
    return client_for(world.admin).post("/api/v1/clusters/", {
        "name": "prod", "backend": "kubernetes", **body}, format="json")


# --- bug 8: registration checks reachability, credentials and RBAC ---------------------------


def _service_account_token(kube: Any, name: str) -> str:
    """A real bound ServiceAccount token (TokenRequest API), as a platform team makes for Camp."""
    core = kube.core
    core.create_namespaced_service_account("kube-system", {"metadata": {"name": name}})
    req = core.create_namespaced_service_account_token(
        name, "kube-system", {"spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"],
                                       "expirationSeconds": 3600}})
    return str(req.status.token)


def _grant_camp_role(kube: Any, sa: str) -> None:
    """The camp-agent chart's cluster-wide ClusterRole, bound to ``sa`` as the chart binds it."""
    from .harness import AGENT_RELEASE

    rbac = k8s.RbacAuthorizationV1Api(kube.server.client())
    rbac.create_cluster_role_binding({
        "metadata": {"name": f"{sa}-binding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": f"{AGENT_RELEASE}-camp-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}]})


def _cleanup_rbac(kube: Any, sa: str) -> None:
    rbac = k8s.RbacAuthorizationV1Api(kube.server.client())
    try:
        rbac.delete_cluster_role_binding(f"{sa}-binding")
    except k8s.ApiException:
        pass
    try:
        kube.core.delete_namespaced_service_account(sa, "kube-system")
    except k8s.ApiException:
        pass


def test_registering_a_dead_server_is_a_400_on_api_server(world: Any, kube: Any) -> None:
    r = _register(world, api_server=f"https://127.0.0.1:{_free_port()}", token="t")
    assert r.status_code == 400 and list(r.json()) == ["api_server"], r.content
    assert "does not answer (connection refused)" in r.json()["api_server"][0]
    assert not Cluster.objects.filter(name="prod").exists()


def test_registering_with_a_wrong_or_missing_token_is_a_400_on_credentials(world: Any, kube: Any) -> None:
    ca = kube.server.ca_pem
    wrong = _register(world, api_server=kube.server.host, token="not-the-token", ca_cert=ca)
    assert wrong.status_code == 400 and list(wrong.json()) == ["credentials"], wrong.content
    assert "refused the credentials (401 Unauthorized)" in wrong.json()["credentials"][0]
    missing = _register(world, api_server=kube.server.host, ca_cert=ca)
    assert missing.status_code == 400 and "No credentials" in missing.json()["credentials"][0]
    no_ca = _register(world, api_server=kube.server.host, token=kube.server.agent_token)
    assert no_ca.status_code == 400 and "TLS certificate" in no_ca.json()["api_server"][0]


def test_registration_names_the_missing_permissions_then_accepts_camps_role(
        world: Any, kube: Any) -> None:
    sa = "camp-check"
    try:
        token = _service_account_token(kube, sa)
        r = _register(world, api_server=kube.server.host, token=token, ca_cert=kube.server.ca_pem)
        assert r.status_code == 400 and list(r.json()) == ["credentials"], r.content
        message = r.json()["credentials"][0]
        assert message.startswith("These credentials may not get nodes, list nodes")
        assert "bind clusterroles/camp-agent-workloads" in message and "camp-agent chart" in message
        _grant_camp_role(kube, sa)
        r = wait_until(lambda: (lambda x: x if x.status_code == 201 else None)(_register(
            world, api_server=kube.server.host, token=token, ca_cert=kube.server.ca_pem)),
            "RBAC to allow Camp", timeout=15, interval=0.5)
        assert r.json()["has_credentials"] is True
    finally:
        _cleanup_rbac(kube, sa)


def test_the_console_says_in_words_what_is_wrong(world: Any, kube: Any) -> None:
    from django.test import Client

    browser = Client()
    browser.force_login(world.admin)
    page = browser.post("/scheduling/clusters/new/", {
        "name": "prod", "enabled": "on", "backend": "kubernetes",
        "api_server": kube.server.host, "namespace_prefix": "camp", "placement_policy": "fragmentation",
        "token": "wrong", "ca_cert": kube.server.ca_pem, "inventory": ""})
    assert page.status_code == 200
    assert "the token is wrong or has expired" in page.content.decode()
    assert not Cluster.objects.filter(name="prod").exists()


# --- bugs 1, 2, 3, 5, 7 on a real cluster ------------------------------------------------------


def _running_gang(world: Any, kube: Any, replicas: int = 2, **kw: Any) -> tuple[Any, Job]:
    kube.node("gpu-a", devices=hami_devices(4))
    kube.node("gpu-b", devices=hami_devices(4, prefix="GPU-B"))
    cluster = kube.register(world)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name="ddp", kind="pytorch",
                              groups=[{"name": "worker", "replicas": replicas, "gpu_count": 1,
                                       "gpu_memory_mib": 20000, "gpu_cores_percent": 50}], **kw)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created"

    def running() -> bool:
        services.cluster_reconcile(cluster=cluster)
        return Job.objects.get(pk=job.pk).state == JobState.RUNNING

    wait_until(running, "the gang to run")
    job.refresh_from_db()
    return cluster, job


def test_a_projects_pods_and_objects_live_in_its_own_labelled_namespace(world: Any, kube: Any) -> None:
    cluster, job = _running_gang(world, kube)
    ns = kube.core.read_namespace(job.namespace)
    assert job.namespace == f"camp-p{world.a.project.pk}-{world.a.project.name}"
    assert ns.metadata.labels["camp.io/project-id"] == str(world.a.project.pk)
    # Another project's job may not take that namespace over, whatever its names.
    from scheduling.backends import backend_for
    from scheduling.backends.base import BackendError, NamespaceSpec

    with pytest.raises(BackendError, match="belongs to another project"):
        backend_for(cluster).ensure_namespace(NamespaceSpec(
            name=job.namespace, labels={"camp.io/project-id": str(world.b.project.pk)}, quota={}))


def test_a_deleted_gang_pod_restarts_the_gang_and_its_objects_go(world: Any, kube: Any) -> None:
    cluster, job = _running_gang(world, kube, checkpoint_capable=True)
    ns, owner = job.namespace, f"ddp-{job.pk}"
    assert kube.core.read_namespaced_config_map(owner, ns) and kube.core.read_namespaced_service(owner, ns)
    lost = job.allocations.order_by("replica").last().pod_name
    kube.core.delete_namespaced_pod(lost, ns, grace_period_seconds=0)  # kubectl delete --force
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and f"pod {lost} was lost" in job.reason
    services.job_stop(job_id=job.pk)

    def released() -> bool:  # no kubelet finalises a graceful delete here: reconcile forces it
        for p in kube.core.list_namespaced_pod(ns).items:
            kube.core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
        services.cluster_reconcile(cluster=cluster)
        return Job.objects.get(pk=job.pk).state == JobState.QUEUED

    wait_until(released, "the gang to be requeued")
    job.refresh_from_db()
    assert job.reason.startswith(f"Requeued: pod {lost} was lost") and "checkpoint" in job.reason
    assert not job.allocations.exists()
    # Its ConfigMap and headless Service went with it (no garbage collector runs here).
    assert [c.metadata.name for c in kube.core.list_namespaced_config_map(ns).items
            if c.metadata.name == owner] == []
    assert [s.metadata.name for s in kube.core.list_namespaced_service(ns).items] == []


def test_a_redundant_dispatch_of_a_running_gang_changes_nothing(world: Any, kube: Any) -> None:
    cluster, job = _running_gang(world, kube)
    before = {p.metadata.name: p.metadata.uid for p in kube.core.list_namespaced_pod(job.namespace).items}
    assert services.job_dispatch(job_id=job.pk) == "skipped"
    # The same dispatch started while the job was STARTING finds it RUNNING at the end.
    Job.objects.filter(pk=job.pk).update(state=JobState.STARTING)
    real = services.dispatch.backend_for

    class WatchMarksRunning:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def create_pod(self, spec: Any) -> Any:
            Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
            return self.inner.create_pod(spec)

    services.dispatch.backend_for = lambda c: WatchMarksRunning(real(c))  # type: ignore[assignment]
    try:
        assert services.job_dispatch(job_id=job.pk) == "running"
    finally:
        services.dispatch.backend_for = real
    after = {p.metadata.name: p.metadata.uid for p in kube.core.list_namespaced_pod(job.namespace).items}
    assert after == before and Job.objects.get(pk=job.pk).state == JobState.RUNNING


def test_the_watcher_applies_a_pod_deletion_to_the_gang(world: Any, kube: Any) -> None:
    cluster, job = _running_gang(world, kube)
    import threading

    from django.db import connection

    lost = job.allocations.order_by("replica").first().pod_name

    def watch() -> None:
        try:
            call_command("camp_watch", cluster=cluster.name, duration=6, window=5)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    wait_until(lambda: Cluster.objects.get(pk=cluster.pk).watch_last_event_at, "the watch to start")
    kube.core.delete_namespaced_pod(lost, job.namespace, grace_period_seconds=0)
    watcher.join(timeout=30)
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING and lost in job.reason
    cluster.refresh_from_db()
    assert cluster.watch_last_event_at is not None and not cluster.watch_failing
