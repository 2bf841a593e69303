"""Load the openb trace (Alibaba cluster-trace-gpu-v2023) into engine types.

Data lives in ``../shared/data/openb`` relative to the repository root. ``gpu_milli`` is the
share of each requested card (1000 = a whole card); it is mapped to the same share of the card's
memory and compute (``gpu_memory_percent`` = ``gpu_cores_percent`` = milli / 10; every value in
the trace is a multiple of 10). Per-model memory sizes are multiples of 100 MiB so that shares
add up exactly.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from scheduling.engine import ClusterSnapshot, GpuDevice, GpuRequest, Node, PodRequest

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "openb"

# Undisclosed models G1–G3 get plausible sizes; only shares matter for this benchmark.
GPU_MEMORY_MIB = {
    "P100": 16_300,
    "T4": 15_100,
    "V100M16": 16_100,
    "V100M32": 32_500,
    "A10": 22_700,
    "G1": 24_000,
    "G2": 32_000,
    "G3": 80_000,
}

POD_LISTS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare100",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
"""The 17 pod lists with published results."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """A trace pod and its engine request."""

    request: PodRequest
    gpus: float
    """GPUs requested (num_gpu × gpu_milli / 1000)."""


def load_nodes(path: Path | None = None) -> ClusterSnapshot:
    """The 1,213 GPU nodes (6,212 GPUs) as a snapshot."""
    path = path or DATA / "openb_node_list_gpu_node.csv"
    nodes = []
    with path.open() as f:
        for row in csv.DictReader(f):
            model = row["model"]
            n = int(row["gpu"])
            name = row["sn"]
            gpus = tuple(
                GpuDevice(
                    index=i,
                    uuid=f"GPU-{name}-{i}",
                    model=model,
                    memory_mib=GPU_MEMORY_MIB.get(model, 32_000),
                    max_sharers=64,
                )
                for i in range(n)
            )
            nodes.append(
                Node(
                    name=name,
                    cpu_millicores=int(row["cpu_milli"]),
                    ram_mib=int(row["memory_mib"]),
                    gpus=gpus,
                    max_pods=1_000,
                )
            )
    return ClusterSnapshot(nodes=tuple(nodes))


def load_pods(pod_list: str) -> list[TracePod]:
    """One pod list (e.g. ``default``) as engine requests, in file order."""
    out = []
    with (DATA / f"openb_pod_list_{pod_list}.csv").open() as f:
        for row in csv.DictReader(f):
            num_gpu = int(row["num_gpu"])
            milli = int(row["gpu_milli"])
            spec = row.get("gpu_spec") or ""
            containers: tuple[GpuRequest, ...] = ()
            if num_gpu > 0 and milli > 0:
                if milli >= 1000:
                    containers = (GpuRequest(num_gpu),)
                else:
                    if milli % 10:
                        raise ValueError(f"gpu_milli {milli} is not a whole percent")
                    pct = milli // 10
                    containers = (GpuRequest(num_gpu, gpu_memory_percent=pct, gpu_cores_percent=pct),)
            req = PodRequest(
                name=row["name"],
                cpu_millicores=int(row["cpu_milli"]),
                ram_mib=int(row["memory_mib"]),
                containers=containers,
                gpu_models=frozenset(s for s in spec.split("|") if s),
            )
            out.append(TracePod(req, num_gpu * min(milli, 1000) / 1000.0 if containers else 0.0))
    return out


def load_published() -> dict[tuple[str, str], tuple[float, float]]:
    """Published (FGD paper) allocation ratios: (pod list, policy) → (alloc@100%, alloc@130%)."""
    out = {}
    with (DATA / "summary_alloc_by_workload_policy.csv").open() as f:
        for row in csv.DictReader(f):
            wl = row["workload"].removeprefix("openb_pod_list_")
            pol = row["sc_policy"].split("-", 1)[1]
            out[(wl, pol)] = (float(row["alloc100_mean"]), float(row["alloc130_mean"]))
    return out
