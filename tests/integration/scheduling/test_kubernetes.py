"""The Kubernetes backend through the official client against kmock over real HTTP.

What is not real here, and why: kmock 0.8's path parser reads ``/api/v1/namespaces/<x>``
as "namespace x" rather than the namespace object (POST answers 500, GET 404), so the
project namespace is served by a canned kmock reaction (GET returns it labelled for the
project, as Camp created it; the labels Camp creates it with are checked on the real
apiserver, tests/integration/realkube/test_lifecycle_bugs.py). kmock has
no scheduler, kubelet or HAMi device plugin: pod phases are set by the test through
the status subresource, as a kubelet would. Everything else — nodes, pods, config
maps, services, quotas, 409 on duplicates, injected 500s, the watch stream and its
410 Gone — goes over HTTP to the official client.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduling import services
from scheduling.backends.kubernetes import KubernetesBackend, parse_hami_register
from scheduling.models import GpuDevice, Job, JobState, Node, installation_id

from .conftest import gpu_group, project_ns
from .kmockserver import kmock_server, stored

pytestmark = pytest.mark.django_db

HAMI_GPUS = [
    {"id": f"GPU-aaaa000{i}", "index": i, "count": 10, "devmem": 81920, "devcore": 100,
     "type": "NVIDIA-A100-SXM4-80GB", "numa": i // 2, "mode": "hami-core", "health": True}
    for i in range(4)
]


def _node(name: str, *, annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
          gpus: int = 0, ready: bool = True) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


@pytest.fixture
def kube(world: Any) -> Any:
    with kmock_server() as k:
        url = str(k.url).rstrip("/")
        cfg = k8s.Configuration()
        cfg.host = url
        core = k8s.CoreV1Api(k8s.ApiClient(cfg))
        core.create_node(_node("gpu-a", annotations={
            "hami.io/node-nvidia-register": json.dumps(HAMI_GPUS)}))
        core.create_node(_node("gpu-b", gpus=2, labels={
            "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.memory": "15360"}))
        cluster = services.cluster_create(actor=world.admin, name="kube", backend="kubernetes",
                                          api_server=url, credentials={"token": "test-token"},
                                          verify=False)  # kmock: no RBAC to check
        yield k, core, cluster


def test_legacy_hami_register_format() -> None:
    gpus = parse_hami_register("GPU-1,10,24576,100,NVIDIA-L4,0,true:GPU-2,10,24576,100,NVIDIA-L4,1,false:")
    assert [(g.uuid, g.memory_mib, g.numa_node, g.healthy) for g in gpus] == [
        ("GPU-1", 24576, 0, True), ("GPU-2", 24576, 1, False)]


def test_inventory_from_hami_annotation_and_gfd_labels(kube: Any) -> None:
    _, _, cluster = kube
    result = services.inventory_sync(cluster=cluster)
    assert (result.nodes, result.gpus) == (2, 6)
    a = Node.objects.get(cluster=cluster, name="gpu-a")
    assert a.cpu_millicores == 64000 and a.ram_mib == 512 * 1024
    gpus = list(a.gpus.order_by("index"))
    assert [g.uuid for g in gpus] == [f"GPU-aaaa000{i}" for i in range(4)]
    assert {(g.model, g.memory_mib, g.sharing) for g in gpus} == {
        ("NVIDIA-A100-SXM4-80GB", 81920, "shareable")}
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    t4 = list(GpuDevice.objects.filter(node__name="gpu-b"))
    assert {(g.model, g.memory_mib, g.sharing) for g in t4} == {("Tesla-T4", 15360, "exclusive-only")}


def test_not_ready_node_is_quarantined(kube: Any) -> None:
    k, core, cluster = kube
    core.create_node(_node("gpu-c", gpus=1, ready=False))
    result = services.inventory_sync(cluster=cluster)
    assert result.quarantined == ["gpu-c"]
    assert Node.objects.get(name="gpu-c").quarantine_reason.startswith("auto: node NotReady")


def _serve_namespace(k: Any, ns: str, project_id: int | None = None) -> None:
    """kmock 0.8 cannot store namespaces (see module doc): a canned GET, the namespace as
    Camp created it for the project ``project_id`` (by default the one ``ns`` names)."""
    pid = project_id if project_id is not None else int(ns.split("-p", 1)[1].split("-", 1)[0])
    body = {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"camp.io/project-id": str(pid)}}}
    k[f"get /api/v1/namespaces/{ns}"] << body


def _serve_owner_uid(k: Any, ns: str, name: str) -> None:
    """kmock assigns no uids; owner references need one, so the owner ConfigMap's read
    answers with one (the created object is still the one kmock stores)."""
    k[f"get /api/v1/namespaces/{ns}/configmaps/{name}"] << {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns,
                                                              "uid": f"uid-{name}"}}


def _dispatched(world: Any, kube: Any, **job: Any) -> tuple[Job, str]:
    k, core, cluster = kube
    services.inventory_sync(cluster=cluster)
    ns = project_ns(world)
    _serve_namespace(k, ns)
    j = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                            name="ddp", kind="pytorch", **job)
    _serve_owner_uid(k, ns, f"ddp-{j.pk}")
    summary = services.cycle_run(cluster=cluster)
    assert summary is not None and summary.admitted == [j.pk]
    assert services.job_dispatch(job_id=j.pk) == "created"
    j.refresh_from_db()
    return j, ns


def test_dispatch_creates_bound_annotated_pods(world: Any, kube: Any) -> None:
    k, core, _ = kube
    job, ns = _dispatched(world, kube, groups=[gpu_group(
        replicas=2, gpu_count=2, gpu_memory_mib=20000, gpu_cores_percent=30, image="pytorch:2")])
    mine = {"camp.io/installation": installation_id(), "camp.io/registration": str(job.cluster_id)}
    assert not list(k[f"patch /api/v1/namespaces/{ns}"])  # Camp never relabels a namespace
    owner = f"ddp-{job.pk}"
    cm = stored(k, "configmaps", ns, owner)
    assert cm["data"] == {"job": "ddp", "job-id": str(job.pk)}
    svc = stored(k, "services", ns, owner)
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"camp.io/job-id": str(job.pk)}
    allocs = list(job.allocations.order_by("replica").prefetch_related("slices__gpu"))
    assert len(allocs) == 2
    for rank, a in enumerate(allocs):
        pod = stored(k, "pods", ns, a.pod_name)
        assert a.pod_name == f"ddp-{job.pk}-worker-{rank}"
        assert pod["spec"]["nodeName"] == a.node.name == "gpu-a"  # T4s are whole-card only
        ann = pod["metadata"]["annotations"]
        devices = "".join(f"{s.gpu.uuid},NVIDIA,20000,30:"
                          for s in sorted(a.slices.all(), key=lambda s: s.gpu.index)) + ";"
        # HAMi's contract: both encodings, Camp's scheduler name, bound through pods/binding
        # (kmock's stand-in sets nodeName from the Binding) and answered by the device plugin.
        assert ann["hami.io/vgpu-devices-to-allocate"] == devices
        assert ann["hami.io/vgpu-devices-allocated"] == devices
        assert pod["spec"]["schedulerName"] == "camp-scheduler"
        assert ann["hami.io/vgpu-node"] == "gpu-a" and ann["hami.io/bind-phase"] == "success"
        assert ann["hami.io/bind-time"].isdigit()
        assert ann["hami.io/vgpu-time"].isdigit()
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"cpu": "1000m", "memory": "1024Mi", "nvidia.com/gpu": "2",
                          "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"}
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["WORLD_SIZE"] == "2" and env["RANK"] == str(rank) and env["NODE_RANK"] == str(rank)
        assert env["MASTER_ADDR"] == f"ddp-{job.pk}-worker-0.{owner}.{ns}.svc"
        assert env["MASTER_PORT"] == "29500" and env["LOCAL_WORLD_SIZE"] == "2"
        assert pod["metadata"]["labels"] == {
            "app.kubernetes.io/managed-by": "camp", "camp.io/tenant": "acme", "camp.io/project": "acme-p1",
            "camp.io/job": "ddp", "camp.io/job-id": str(job.pk), "camp.io/role": "worker",
            "camp.io/replica": str(rank), "camp.io/attempt": "1", **mine}
        ref = pod["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "ConfigMap", owner, f"uid-{owner}", True)
        assert pod["spec"]["subdomain"] == owner and pod["spec"]["hostname"] == a.pod_name
    # Dispatching again is idempotent: every create answers 409, which means done.
    assert services.job_dispatch(job_id=job.pk) == "created"


def test_transient_500s_are_retried(world: Any, kube: Any) -> None:
    k, _, _ = kube
    k["post"][:2] << 500  # the next two writes fail as a flaky API server would
    job, ns = _dispatched(world, kube, groups=[gpu_group(gpu_count=1)])
    assert job.state == JobState.STARTING
    stored(k, "pods", ns, job.allocations.get().pod_name)


def test_persistent_error_removes_the_gang_and_requeues(world: Any, kube: Any) -> None:
    k, core, cluster = kube
    services.inventory_sync(cluster=cluster)
    ns = project_ns(world)
    _serve_namespace(k, ns)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name="gang", groups=[gpu_group(replicas=2)])
    services.cycle_run(cluster=cluster)
    k[f"post /api/v1/namespaces/{ns}/pods"][1:] << 403  # the second pod is refused
    assert services.job_dispatch(job_id=job.pk) == "failed"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and "403" in job.reason
    assert not job.allocations.exists()
    pods = core.list_namespaced_pod(ns).items
    assert pods == []  # all or nothing: the first pod was removed again


def test_phases_from_the_cluster_drive_job_states(world: Any, kube: Any) -> None:
    k, core, cluster = kube
    job, ns = _dispatched(world, kube, duration_seconds=60, groups=[gpu_group(gpu_count=1)])
    name = job.allocations.get().pod_name
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}})
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Failed", "message": "OOMKilled"}})
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and "OOMKilled" in job.reason
    services.job_stop(job_id=job.pk)
    assert not job.allocations.exists()
    assert core.list_namespaced_pod(ns).items == []


def test_orphan_pods_are_deleted_and_lost_dispatch_recreated(world: Any, kube: Any) -> None:
    k, core, cluster = kube
    job, ns = _dispatched(world, kube, groups=[gpu_group(gpu_count=1)])
    core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "stray", "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "camp"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]}})
    name = job.allocations.get().pod_name
    core.delete_namespaced_pod(name, ns)  # lost (e.g. deleted by hand) before it ever ran
    result = services.cluster_reconcile(cluster=cluster)
    assert result.orphans_deleted == ["stray"]
    names = [p.metadata.name for p in core.list_namespaced_pod(ns).items]
    assert "stray" not in names


def test_watch_relists_on_410_gone(world: Any, kube: Any) -> None:
    k, core, cluster = kube
    job, ns = _dispatched(world, kube, groups=[gpu_group(gpu_count=1)])
    backend = KubernetesBackend.for_cluster(cluster)
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                       "message": "too old resource version"}}
    # The official client sends ``watch=True``; kmock 0.8 only streams for ``watch=true``, so
    # the watch is served by a reaction: first an expired-resourceVersion error (410 Gone).
    k["get /api/v1/pods?watch=True"][:1] << (gone,)
    events = []
    for event in backend.watch_pods(timeout_seconds=2):
        events.append(event)
        if len(events) >= 2:
            break
    # one pod from the initial list, the same pod again from the relist after 410 Gone
    assert [e.pod.name for e in events] == [job.allocations.get().pod_name] * 2
    lists = [r for r in k["get /api/v1/pods"] if "watch" not in r.params]
    assert len(lists) >= 2


def test_per_job_objects_are_deleted_when_the_job_ends(world: Any, kube: Any) -> None:
    """No garbage collector deletes a finished job's ConfigMap and headless Service (none
    runs on a bare API server, and owner references cascade only through one): Camp does,
    and reconcile deletes leftovers. Objects of other jobs and the project's are kept."""
    k, core, cluster = kube
    job, ns = _dispatched(world, kube, groups=[gpu_group(replicas=2, gpu_count=1)])
    owner = f"ddp-{job.pk}"
    assert stored(k, "configmaps", ns, owner) and stored(k, "services", ns, owner)
    keep = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": "ws-1", "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "camp"}},
        "spec": {"ports": [{"port": 80}]}}
    core.create_namespaced_service(ns, keep)  # an environment's Service: outlives runs
    for a in job.allocations.all():
        core.patch_namespaced_pod_status(a.pod_name, ns, {"status": {"phase": "Succeeded"}})
    services.cluster_reconcile(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED
    assert services.job_stop(job_id=job.pk) == "released"
    assert [c.metadata.name for c in core.list_namespaced_config_map(ns).items] == []
    assert [s.metadata.name for s in core.list_namespaced_service(ns).items] == ["ws-1"]


def test_reconcile_deletes_leftover_job_objects(world: Any, kube: Any) -> None:
    from django.core.cache import cache

    k, core, cluster = kube
    job, ns = _dispatched(world, kube, groups=[gpu_group(replicas=2, gpu_count=1)])
    owner = f"ddp-{job.pk}"
    # The job ended while the API server was away: its objects were left behind.
    services.job_cancel(actor=world.a.member, job=job)
    for a in job.allocations.all():
        core.delete_namespaced_pod(a.pod_name, ns, grace_period_seconds=0)
    services._pods_gone(job.pk)  # released; suppose its object deletion failed
    core.create_namespaced_config_map(ns, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": owner, "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "camp",
                                                   "camp.io/job-id": str(job.pk)}}})
    core.create_namespaced_service(ns, {"apiVersion": "v1", "kind": "Service", "metadata": {
        "name": owner, "namespace": ns, "labels": {"app.kubernetes.io/managed-by": "camp",
                                                   "camp.io/job-id": str(job.pk)}},
        "spec": {"clusterIP": "None", "ports": [{"port": 29500}]}})
    cache.delete(f"camp:objects-swept:{cluster.pk}")
    result = services.cluster_reconcile(cluster=cluster)
    assert result.objects_deleted == [owner]
    assert core.list_namespaced_config_map(ns).items == []
    assert core.list_namespaced_service(ns).items == []
    # A second pass finds nothing to do (idempotent) and waits its minute anyway.
    assert services.cluster_reconcile(cluster=cluster).objects_deleted == []


def _hami_pod(core: Any, name: str, uuid: str, *, labels: dict[str, str], scheduler: str) -> None:
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": {
            "hami.io/vgpu-node": "gpu-a", "hami.io/vgpu-devices-allocated": f"{uuid},NVIDIA,20000,30:;"}},
        "spec": {"nodeName": "gpu-a", "schedulerName": scheduler,
                 "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Running"}})


def test_camps_pods_are_those_of_its_live_jobs_whatever_the_scheduler_name(
        world: Any, kube: Any, settings: Any) -> None:
    """A pod is Camp's when it carries Camp's label and the id of a job holding an allocation in
    this cluster, not because of a scheduler name: renaming CAMP_SCHEDULER_NAME leaves Camp's
    running pods Camp's (their GPUs are not counted twice), and a pod naming Camp's scheduler
    and label that no live job of this cluster owns holds its GPUs like any other pod."""
    _, core, cluster = kube
    services.inventory_sync(cluster=cluster)
    job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                              name="inf", groups=[gpu_group(gpu_memory_mib=20000, gpu_cores_percent=30)])
    services.cycle_run(cluster=cluster)
    live = job.allocations.get().slices.get().gpu
    stray = GpuDevice.objects.exclude(pk=live.pk).filter(node__name="gpu-a").order_by("index").first()
    assert stray is not None
    camp = {"app.kubernetes.io/managed-by": "camp"}
    _hami_pod(core, "inf-live", live.uuid, labels={**camp, "camp.io/job-id": str(job.pk)},
              scheduler="camp-scheduler")
    _hami_pod(core, "not-camps", stray.uuid, labels={**camp, "camp.io/job-id": "987654"},
              scheduler="camp-scheduler")
    for name in ("camp-scheduler", "camp-renamed"):
        settings.CAMP_SCHEDULER_NAME = name
        services.inventory_sync(cluster=cluster)
        live.refresh_from_db()
        stray.refresh_from_db()
        assert (live.foreign_memory_mib, live.foreign_pods) == (0, []), name
        assert (stray.foreign_memory_mib, stray.foreign_cores, stray.foreign_pods) == (
            20000, 30, ["default/not-camps"]), name


def test_the_retry_ladder_comes_from_the_settings(settings: Any) -> None:
    """An operator sets how often and after how long a call to an unreachable API server is
    retried (CAMP_KUBE_API_RETRIES, CAMP_KUBE_API_BACKOFF_MS, doubled each try); the error
    then names the server."""
    from scheduling.backends.base import BackendError

    settings.CAMP_KUBE_API_RETRIES = 2
    settings.CAMP_KUBE_API_BACKOFF_MS = 50
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:9"  # nothing listens: connection refused
    waits: list[float] = []
    backend = KubernetesBackend(k8s.ApiClient(cfg), sleep=waits.append)
    with pytest.raises(BackendError, match=r"unreachable at http://127\.0\.0\.1:9"):
        backend.list_pods()
    assert waits == [0.05, 0.1]
