"""Faulty hardware end to end: a node that goes NotReady or a GPU reported unhealthy is
quarantined (no new placements, shown in the API and console) and the workloads on it are
rescheduled; checkpoint-capable ones resume from their latest checkpoint.

Both backends: the simulated one (faults come from its YAML inventory, edited as an admin
would) and Kubernetes through the official client against kmock over HTTP (faults come
from the node's Ready condition and HAMi's device registration annotation).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from scheduling import services
from scheduling.models import GpuDevice, Job, JobState, Node, SimulatedPod
from tests.conftest import client_for

from .conftest import gpu_group, project_ns, submit
from .test_kubernetes import HAMI_GPUS, _serve_namespace, _serve_owner_uid

pytestmark = pytest.mark.django_db

INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: a100-0
    cpu_cores: 64
    ram_gib: 512
    ready: {ready0}
    gpus: {{model: A100-80G, count: 2, memory_mib: 81920, unhealthy: {bad0}}}
  - name: a100-1
    cpu_cores: 64
    ram_gib: 512
    gpus: {{model: A100-80G, count: 2, memory_mib: 81920}}
"""


def _inventory(*, ready0: bool = True, bad0: tuple[int, ...] = ()) -> str:
    return INVENTORY.format(ready0=str(ready0).lower(), bad0=list(bad0))


@pytest.fixture
def cluster(world: Any) -> Any:
    c = services.cluster_create(actor=world.admin, name="sim", inventory=_inventory())
    services.inventory_sync(cluster=c)
    return c


def _run(cluster: Any, job: Job) -> Job:
    services.cycle_run(cluster=cluster)
    services.job_dispatch(job_id=job.pk)
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    return job


def _node(job: Job) -> str:
    (name,) = set(job.allocations.values_list("node__name", flat=True))
    return name


def _env(job: Job) -> dict[str, str]:
    pod = SimulatedPod.objects.get(name=job.allocations.get().pod_name, deleted_at__isnull=True)
    return dict(pod.annotations["camp.io/env"])


def test_not_ready_node_reschedules_its_jobs_and_checkpointed_ones_resume(
        world: Any, cluster: Any) -> None:
    ck = submit(world, cluster, "ck", checkpoint_capable=True, group={"gpu_count": 2})
    ck = _run(cluster, ck)
    assert ck.state == JobState.RUNNING
    node = _node(ck)
    services.job_checkpoint_record(job=ck, path="s3://ckpt/ck/step-300")
    # the admin's copy of the inventory now says the node is NotReady
    inv = _inventory(ready0=False)
    if node == "a100-1":
        inv = inv.replace("a100-0", "tmp").replace("a100-1", "a100-0").replace("tmp", "a100-1")
    services.cluster_update(actor=world.admin, cluster=cluster, inventory=inv)
    # Kubernetes' rule: a node merely NotReady keeps its pods for the toleration (300 s by
    # default); it takes no new work meanwhile.
    result = services.inventory_sync(cluster=cluster)
    assert result.quarantined == [node] and result.evicted_jobs == []
    assert Job.objects.get(pk=ck.pk).state == JobState.RUNNING
    with override_settings(CAMP_NODE_NOT_READY_TOLERATION_SECONDS=0):
        result = services.inventory_sync(cluster=cluster)
    assert result.evicted_jobs == [ck.pk]

    # the API and the console show the quarantine and why
    rows = client_for(world.a.member).get("/api/v1/nodes/?quarantined=true").json()["results"]
    assert [(r["name"], r["quarantine_reason"], r["schedulable"]) for r in rows] == [
        (node, "auto: node NotReady", False)]
    page = client_for(world.a.member).get("/scheduling/clusters/sim/nodes/").content.decode()
    assert "quarantined" in page and "NotReady" in page

    ck.refresh_from_db()
    assert ck.state == JobState.PREEMPTING and f"node {node} is NotReady" in ck.reason
    assert services.job_stop(job_id=ck.pk) == "released"
    ck.refresh_from_db()
    assert ck.state == JobState.QUEUED and "resumes from its latest checkpoint" in ck.reason
    ck = _run(cluster, ck)
    other = "a100-1" if node == "a100-0" else "a100-0"
    assert ck.state == JobState.RUNNING and _node(ck) == other and ck.attempts == 2
    assert _env(ck)["CAMP_RESUME_FROM"] == "s3://ckpt/ck/step-300"
    history = list(ck.decisions.order_by("id").values_list("kind", flat=True))
    assert history[-4:] == ["preempted", "requeued", "admitted", "started"]

    # repaired: the node leaves its automatic quarantine and takes work again
    services.cluster_update(actor=world.admin, cluster=cluster, inventory=_inventory())
    services.inventory_sync(cluster=cluster)
    assert not Node.objects.filter(quarantined=True).exists()


def test_unhealthy_gpu_reschedules_only_the_jobs_on_it(world: Any, cluster: Any) -> None:
    jobs = [_run(cluster, submit(world, cluster, f"j{i}", group={"gpu_count": 1}))
            for i in range(4)]
    on_a0 = sorted((j.allocations.get().slices.get().gpu.index, j) for j in jobs
                   if _node(j) == "a100-0")
    assert len(on_a0) == 2
    (bad_index, hit), (_, spared) = on_a0
    plain = submit(world, cluster, "plain", group={"gpu_count": 1})  # not checkpoint-capable
    services.cluster_update(actor=world.admin, cluster=cluster, inventory=_inventory(bad0=(bad_index,)))
    result = services.inventory_sync(cluster=cluster)
    assert result.evicted_jobs == [hit.pk]
    gpu = GpuDevice.objects.get(node__name="a100-0", index=bad_index)
    assert gpu.quarantined and not gpu.healthy
    node = Node.objects.get(name="a100-0")
    assert node.quarantined and node.quarantine_reason == f"auto: unhealthy GPU {bad_index}"
    services.job_stop(job_id=hit.pk)
    hit.refresh_from_db()
    spared.refresh_from_db()
    assert spared.state == JobState.RUNNING  # the healthy neighbour keeps its GPU
    # a job that is not checkpoint-capable is requeued too, and starts from scratch
    assert hit.state == JobState.QUEUED and "checkpoint" not in hit.reason
    assert f"GPU {bad_index} of node a100-0 is unhealthy" in hit.decisions.get(kind="preempted").reason
    # no new placements on the quarantined node: with a100-1 full, the requeued job waits
    services.cycle_run(cluster=cluster)
    hit.refresh_from_db()
    plain.refresh_from_db()
    assert hit.state == plain.state == JobState.QUEUED
    assert _node(spared) == "a100-0" and spared.attempts == 1


# --- Kubernetes (kmock) -------------------------------------------------------------------


def _ready(core: Any, name: str, ready: bool) -> None:
    core.patch_node_status(name, {"status": {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}})


def _pod_env(core: Any, ns: str, name: str) -> dict[str, str]:
    pod = core.read_namespaced_pod(name, ns)
    return {e.name: e.value for e in pod.spec.containers[0].env}


def _kmock_core(k: Any) -> tuple[str, Any]:
    """The kmock server's URL and a CoreV1Api client for it."""
    from kubernetes import client as k8s

    url = str(k.url).rstrip("/")
    cfg = k8s.Configuration()
    cfg.host = url
    return url, k8s.CoreV1Api(k8s.ApiClient(cfg))


def _kmock_cluster(world: Any, url: str) -> Any:
    """A Kubernetes cluster registered on the kmock server (no RBAC there to check)."""
    return services.cluster_create(actor=world.admin, name="kube", backend="kubernetes",
                                   api_server=url, credentials={"token": "t"}, verify=False)


def test_kubernetes_not_ready_node_waits_the_toleration_then_deletes_gracefully(world: Any) -> None:
    """Kubernetes' rule (issue 28 finding 6): a node merely NotReady keeps its pods for the
    toleration (the taint manager's 300 s); then they are deleted gracefully — never with
    grace 0, which is for pods of nodes that no longer exist — and, as a ReplicaSet's pods
    after an eviction, no longer waited for (the kmock server answers graceful deletes
    without removing the pod, as a NotReady node's kubelet never confirms them): the job
    is requeued and resumes elsewhere."""
    from .kmockserver import kmock_server
    from .test_kubernetes import _node as kube_node

    with kmock_server() as k:
        url, core = _kmock_core(k)
        for name in ("gpu-a", "gpu-b"):
            core.create_node(kube_node(name, annotations={
                "hami.io/node-nvidia-register": json.dumps(HAMI_GPUS)}))
        cluster = _kmock_cluster(world, url)
        services.inventory_sync(cluster=cluster)
        ns = project_ns(world)
        _serve_namespace(k, ns)
        job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                                  name="train", checkpoint_capable=True,
                                  groups=[gpu_group(gpu_memory_mib=20000, gpu_cores_percent=50)])
        _serve_owner_uid(k, ns, f"train-{job.pk}")
        services.cycle_run(cluster=cluster)
        assert services.job_dispatch(job_id=job.pk) == "created"
        pod = job.allocations.get().pod_name
        first = job.allocations.get().node.name
        core.patch_namespaced_pod_status(pod, ns, {"status": {"phase": "Running"}})
        services.cluster_reconcile(cluster=cluster)
        services.job_checkpoint_record(job=job, path="/ckpt/train/step-1200")

        k[f"delete /api/v1/namespaces/{ns}/pods/{pod}?gracePeriodSeconds=30"] << {
            "kind": "Status", "apiVersion": "v1", "status": "Success"}
        _ready(core, first, False)
        result = services.inventory_sync(cluster=cluster)
        # Within the toleration: quarantined (no new work), its job untouched, nothing deleted.
        assert result.quarantined == [first] and result.evicted_jobs == []
        services.cluster_reconcile(cluster=cluster)
        assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
        assert not list(k[f"delete /api/v1/namespaces/{ns}/pods/{pod}"])
        with override_settings(CAMP_NODE_NOT_READY_TOLERATION_SECONDS=0):
            result = services.inventory_sync(cluster=cluster)
            assert result.evicted_jobs == [job.pk]
            assert services.job_stop(job_id=job.pk) == "released"
        deletes = list(k[f"delete /api/v1/namespaces/{ns}/pods/{pod}"])
        assert deletes and all(r.params.get("gracePeriodSeconds") == "30" for r in deletes)
        job.refresh_from_db()
        assert job.state == JobState.QUEUED

        services.cycle_run(cluster=cluster)
        outcome = services.job_dispatch(job_id=job.pk)
        job.refresh_from_db()
        assert outcome == "created", job.reason
        second = job.allocations.get().node.name
        assert second != first
        body = core.read_namespaced_pod(pod, ns)
        assert body.spec.node_name == second
        assert body.metadata.annotations["hami.io/vgpu-node"] == second
        assert _pod_env(core, ns, pod)["CAMP_RESUME_FROM"] == "/ckpt/train/step-1200"
        assert _pod_env(core, ns, pod)["CAMP_ATTEMPT"] == "2"


def test_kubernetes_unhealthy_gpu_from_hami_registration(world: Any) -> None:
    from .kmockserver import kmock_server
    from .test_kubernetes import _node as kube_node

    with kmock_server() as k:
        url, core = _kmock_core(k)
        core.create_node(kube_node("gpu-a", annotations={
            "hami.io/node-nvidia-register": json.dumps(HAMI_GPUS)}))
        cluster = _kmock_cluster(world, url)
        services.inventory_sync(cluster=cluster)
        ns = project_ns(world)
        _serve_namespace(k, ns)
        job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                                  name="inf", groups=[gpu_group(gpu_memory_mib=20000)])
        _serve_owner_uid(k, ns, f"inf-{job.pk}")
        services.cycle_run(cluster=cluster)
        services.job_dispatch(job_id=job.pk)
        index = job.allocations.get().slices.get().gpu.index
        devices = [dict(d, health=d["index"] != index) for d in HAMI_GPUS]
        core.patch_node("gpu-a", {"metadata": {"annotations": {
            "hami.io/node-nvidia-register": json.dumps(devices)}}})
        result = services.inventory_sync(cluster=cluster)
        assert result.evicted_jobs == [job.pk]
        assert list(GpuDevice.objects.filter(quarantined=True).values_list("index", flat=True)) == [index]
        services.job_stop(job_id=job.pk)
        job.refresh_from_db()
        assert job.state == JobState.QUEUED
        assert core.list_namespaced_pod(ns).items == []
        node = client_for(world.a.member).get("/api/v1/nodes/").json()["results"][0]
        assert [g["healthy"] for g in node["gpus"]] == [i != index for i in range(4)]


def test_inventory_sync_writes_only_what_changed(world: Any, cluster: Any) -> None:
    """Bulk upsert: an unchanged inventory writes no node and no GPU row; a node turning
    NotReady writes that node alone (and none of its GPUs)."""
    from django.db import connection

    writes: list[str] = []

    def spy(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE")):
            writes.append(sql.split(" SET ")[0].split("(")[0])
        return execute(sql, params, many, context)

    stamps = dict(Node.objects.values_list("name", "updated_at"))
    with connection.execute_wrapper(spy):
        services.inventory_sync(cluster=cluster)
    assert not [w for w in writes if "scheduling_gpudevice" in w or "INSERT" in w], writes
    assert dict(Node.objects.values_list("name", "updated_at")) == stamps  # no node row touched
    services.cluster_update(actor=world.admin, cluster=cluster, inventory=_inventory(ready0=False))
    writes.clear()
    with connection.execute_wrapper(spy):
        result = services.inventory_sync(cluster=cluster)
    assert result.quarantined == ["a100-0"] and result.nodes == 2 and result.gpus == 4
    assert not [w for w in writes if "scheduling_gpudevice" in w or "INSERT" in w], writes
    after = dict(Node.objects.values_list("name", "updated_at"))
    assert after["a100-1"] == stamps["a100-1"] and after["a100-0"] > stamps["a100-0"]
    a0 = Node.objects.get(name="a100-0")
    assert a0.quarantined and not a0.ready and a0.quarantine_reason == "auto: node NotReady"


@pytest.mark.parametrize("status", [500, 404])
def test_kubernetes_pod_list_failure_keeps_foreign_figures_and_still_quarantines(
        world: Any, status: int) -> None:
    """The inventory sync lists every pod to see GPUs other schedulers' pods hold. When that
    list fails, the nodes are still synced (a NotReady node is quarantined) and the cards keep
    the foreign figures of the last good sync: never "nothing held", never no sync at all."""
    from .kmockserver import kmock_server
    from .test_kubernetes import _node as kube_node

    with kmock_server() as k:
        url, core = _kmock_core(k)
        for name in ("gpu-a", "gpu-b"):
            core.create_node(kube_node(name, annotations={
                "hami.io/node-nvidia-register": json.dumps(HAMI_GPUS)}))
        core.create_namespaced_pod("default", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "other", "namespace": "default", "annotations": {
                "hami.io/vgpu-node": "gpu-a",
                "hami.io/vgpu-devices-allocated": "GPU-aaaa0001,NVIDIA,30000,40:;"}},
            "spec": {"nodeName": "gpu-a", "schedulerName": "hami-scheduler",
                     "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Running"}})
        cluster = _kmock_cluster(world, url)
        services.inventory_sync(cluster=cluster)
        card = GpuDevice.objects.get(node__name="gpu-a", index=1)
        assert (card.foreign_memory_mib, card.foreign_cores, card.foreign_pods) == (
            30000, 40, ["default/other"])

        k["get /api/v1/pods"] << status  # the pod list fails, every retry (404: not "no pods")
        _ready(core, "gpu-b", False)
        result = services.inventory_sync(cluster=cluster)
        assert result.quarantined == ["gpu-b"]
        card.refresh_from_db()
        assert (card.foreign_memory_mib, card.foreign_cores, card.foreign_pods) == (
            30000, 40, ["default/other"])
