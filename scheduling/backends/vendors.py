"""The one vendor table: resource names, HAMi annotations and slice templates per vendor.

NVIDIA's entries are verified against HAMi's sources (pkg/device/nvidia and
pkg/util: ``hami.io/node-nvidia-register`` as a JSON array of DeviceInfo, and the
container device encoding ``UUID,Type,Usedmem,Usedcores:`` with containers joined
by ``;``). The other vendors follow the same scheme with their own resource names
and fixed slice templates (MIG-like), which the engine aligns requests to.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Vendor:
    name: str
    """The ``type`` HAMi writes in device annotations (NVIDIA, Ascend, ...)."""
    count_resource: str
    memory_resource: str
    cores_resource: str
    register_annotation: str
    allocate_annotation: str
    allocated_annotation: str
    sharing: str = "shareable"
    templates: tuple[tuple[str, int, int], ...] = ()
    """(name, memory MiB, cores %) for vendors that only hand out fixed slices."""


VENDORS: dict[str, Vendor] = {
    "NVIDIA": Vendor(
        name="NVIDIA",
        count_resource="nvidia.com/gpu",
        memory_resource="nvidia.com/gpumem",
        cores_resource="nvidia.com/gpucores",
        register_annotation="hami.io/node-nvidia-register",
        allocate_annotation="hami.io/vgpu-devices-to-allocate",
        allocated_annotation="hami.io/vgpu-devices-allocated",
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
        templates=(("vir05", 16384, 25), ("vir10", 32768, 50), ("full", 65536, 100)),
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
