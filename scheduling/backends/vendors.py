"""The one vendor table: resource names, HAMi annotations and slice templates per vendor.

Verified against HAMi's sources:

* NVIDIA (pkg/device/nvidia, pkg/util): ``hami.io/node-nvidia-register`` as a JSON array
  of DeviceInfo; the container device encoding ``UUID,Type,Usedmem,Usedcores:`` with
  containers joined by ``;``.
* Ascend (pkg/device/ascend and Project-HAMi/ascend-device-plugin): per chip "common
  word" (910B3 → ``Ascend910B``), node annotation ``hami.io/node-register-<word>``, pod
  annotations ``hami.io/<word>-devices-to-allocate`` / ``-devices-allocated``, resources
  ``huawei.com/<word>`` and ``huawei.com/<word>-memory`` (MiB; compute follows memory, no
  cores resource), fixed templates from HAMi's default device config (910B3: 64 GiB, 20 AI
  cores; vir05_1c_16g = 5 cores, vir10_3c_32g = 10 cores).

Cambricon MLU and Kunlunxin XPU follow the same naming scheme but are NOT verified
against a HAMi release yet (docs/ARCHITECTURE.md, "Scheduler service").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Vendor:
    name: str
    """Camp's vendor name (``GpuDevice.vendor``)."""
    count_resource: str
    memory_resource: str
    cores_resource: str
    register_annotation: str
    allocate_annotation: str
    allocated_annotation: str
    sharing: str = "shareable"
    templates: tuple[tuple[str, int, int], ...] = ()
    """(name, memory MiB, cores %) for vendors that only hand out fixed slices."""
    device_type: str = ""
    """The ``Type`` HAMi writes in the pod device encoding (default: ``name``)."""
    verified: bool = False
    """Checked against HAMi's sources (see the module docstring)."""
    handshake_annotation: str = ""
    """The node annotation HAMi's device plugin keeps alive (pkg/device/*: ``HandshakeAnnos``);
    default ``hami.io/node-handshake-<type>``, NVIDIA's is plain ``hami.io/node-handshake``."""

    @property
    def handshake(self) -> str:
        return self.handshake_annotation or f"hami.io/node-handshake-{self.hami_type}"

    @property
    def hami_type(self) -> str:
        return self.device_type or self.name


VENDORS: dict[str, Vendor] = {
    "NVIDIA": Vendor(
        name="NVIDIA",
        count_resource="nvidia.com/gpu",
        memory_resource="nvidia.com/gpumem",
        cores_resource="nvidia.com/gpucores",
        register_annotation="hami.io/node-nvidia-register",
        allocate_annotation="hami.io/vgpu-devices-to-allocate",
        allocated_annotation="hami.io/vgpu-devices-allocated",
        verified=True,
        handshake_annotation="hami.io/node-handshake",
    ),
    "Ascend": Vendor(
        name="Ascend",
        count_resource="huawei.com/Ascend910B",
        memory_resource="huawei.com/Ascend910B-memory",
        cores_resource="",
        register_annotation="hami.io/node-register-Ascend910B",
        allocate_annotation="hami.io/Ascend910B-devices-to-allocate",
        allocated_annotation="hami.io/Ascend910B-devices-allocated",
        sharing="templates",
        # 910B3 in HAMi's default device config: 20 AI cores, so 5 cores = 25 %.
        templates=(("vir05_1c_16g", 16384, 25), ("vir10_3c_32g", 32768, 50), ("full", 65536, 100)),
        device_type="Ascend910B",
        verified=True,
    ),
    "MLU": Vendor(
        name="MLU",
        count_resource="cambricon.com/vmlu",
        memory_resource="cambricon.com/mlu.smlu.vmemory",
        cores_resource="cambricon.com/mlu.smlu.vcore",
        register_annotation="hami.io/node-cambricon-register",
        allocate_annotation="hami.io/cambricon-mlu-devices-to-allocate",
        allocated_annotation="hami.io/cambricon-mlu-devices-allocated",
    ),
    "XPU": Vendor(
        name="XPU",
        count_resource="kunlunxin.com/xpu",
        memory_resource="kunlunxin.com/xpu-memory",
        cores_resource="",
        register_annotation="hami.io/node-register-xpu",
        allocate_annotation="hami.io/xpu-devices-to-allocate",
        allocated_annotation="hami.io/xpu-devices-allocated",
        sharing="templates",
        templates=(("quarter", 24576, 25), ("half", 49152, 50), ("full", 98304, 100)),
    ),
}


def vendor(name: str) -> Vendor:
    return VENDORS.get(name) or VENDORS["NVIDIA"]


def template_dicts(v: Vendor) -> list[dict[str, object]]:
    return [{"name": n, "memory_mib": m, "cores": c} for n, m, c in v.templates]
