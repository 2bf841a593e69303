"""The vendor table on a real API round trip: an Ascend 910B node registered the way HAMi's
Ascend device plugin registers it, and a pod annotated the way HAMi's scheduler would
(kmock over HTTP, official client; namespace and owner uid canned as in test_kubernetes)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduling import services
from scheduling.models import GpuDevice

from .conftest import gpu_group, project_ns
from .kmockserver import kmock_server, stored
from .test_kubernetes import _node, _serve_namespace, _serve_owner_uid

pytestmark = pytest.mark.django_db
NPUS = [{"index": i, "id": f"Ascend910B-{i}", "count": 4, "devmem": 65536, "devcore": 20,
         "type": "Ascend910B", "health": True} for i in range(2)]


def test_ascend_910b_inventory_and_pod_annotations(world: Any) -> None:
    with kmock_server() as k:
        cfg = k8s.Configuration()
        cfg.host = str(k.url).rstrip("/")
        core = k8s.CoreV1Api(k8s.ApiClient(cfg))
        core.create_node(_node("npu-0", annotations={
            "hami.io/node-register-Ascend910B": json.dumps(NPUS)}))
        cluster = services.cluster_create(actor=world.admin, name="npu", backend="kubernetes",
                                          api_server=cfg.host, credentials={"token": "t"},
                                          verify=False)  # kmock: no RBAC to check
        services.inventory_sync(cluster=cluster)
        npu = GpuDevice.objects.get(index=0)
        assert (npu.vendor, npu.model, npu.memory_mib, npu.sharing, npu.max_sharers) == (
            "Ascend", "Ascend910B", 65536, "templates", 4)
        assert [t["name"] for t in npu.templates] == ["vir05_1c_16g", "vir10_3c_32g", "full"]

        ns = project_ns(world)
        _serve_namespace(k, ns)
        job = services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                                  name="npu", groups=[gpu_group(gpu_memory_mib=10000)])
        _serve_owner_uid(k, ns, f"npu-{job.pk}")
        services.cycle_run(cluster=cluster)
        assert services.job_dispatch(job_id=job.pk) == "created"
        pod = stored(k, "pods", ns, job.allocations.get().pod_name)
        uuid = job.allocations.get().slices.get().gpu.uuid
        # 10000 MiB is aligned up to the smallest template (vir05_1c_16g: 16 GiB, 5 of 20 cores)
        assert pod["metadata"]["annotations"]["hami.io/Ascend910B-devices-to-allocate"] == (
            f"{uuid},Ascend910B,16384,25:;")
        assert pod["metadata"]["annotations"]["hami.io/vgpu-node"] == "npu-0"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == {
            "cpu": "1000m", "memory": "1024Mi", "huawei.com/Ascend910B": "1",
            "huawei.com/Ascend910B-memory": "16384"}
