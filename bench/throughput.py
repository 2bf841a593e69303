"""Placement throughput: pods placed per second, one core, pure Python.

Clusters: the openb cluster (1,213 nodes, 6,212 GPUs) and a synthetic 10,000-node / 80,000-GPU
cluster. Streams (from an empty cluster): fractional pods and single-GPU pods sampled from the
openb ``default`` list, and gangs of two 8-GPU pods. Each stream is placed with Camp's default
policy (profiled on the openb ``default`` list) and, in the same run, with plain binpack as the
baseline; the table shows medians over ``--repeats`` runs and the ratio between the two.

    .venv/bin/python -m bench.throughput
    .venv/bin/python -m bench.throughput --repeats 5 --pods 3000
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.openb import load_nodes, load_pods
from bench.placement_quality import workload
from scheduling.engine import (
    Admit,
    ClusterSnapshot,
    ClusterState,
    GpuDevice,
    Job,
    Node,
    Placer,
    PodGroup,
    PodRequest,
    Policy,
    ResourcePolicy,
    WorkloadProfile,
    default_policy,
    pod,
)

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic_cluster(nodes: int = 10_000, gpus_per_node: int = 8) -> ClusterSnapshot:
    """``nodes`` 8-GPU machines: 70 % A100-80GB, 30 % H100, 128 cores, 1 TiB RAM."""
    out = []
    for i in range(nodes):
        model, mem = ("H100", 81_900) if i % 10 >= 7 else ("A100-80GB", 81_900)
        name = f"syn-{i:05d}"
        out.append(
            Node(
                name=name,
                cpu_millicores=128_000,
                ram_mib=1_048_576,
                gpus=tuple(
                    GpuDevice(
                        index=g,
                        uuid=f"GPU-{name}-{g}",
                        model=model,
                        memory_mib=mem,
                        numa_node=g // 4,
                    )
                    for g in range(gpus_per_node)
                ),
            )
        )
    return ClusterSnapshot(nodes=tuple(out))


def streams(n: int, seed: int, snapshot: ClusterSnapshot, mix: int) -> dict[str, list[Job]]:
    """Job streams: each fractional or single-GPU pod is its own job; gangs are 2 × 8 GPUs.

    ``trace mix`` is the openb ``default`` list as the quality benchmark replays it (shuffled and
    inflated to 130 % of the openb cluster's GPUs, so the cluster ends full and pods fail), or, on
    another cluster, ``mix`` pods sampled from it with model constraints dropped."""
    trace = load_pods("default")
    rng = random.Random(seed)
    frac = [p.request for p in trace if 0 < p.gpus < 1]
    single = [p.request for p in trace if p.gpus == 1 and p.request.gpu_count == 1]

    def one(kind: str, reqs: list[PodRequest]) -> list[Job]:
        return [Job(f"{kind}{i}", (PodGroup("p", rng.choice(reqs)),), gang=False) for i in range(n)]

    gang_pod = pod("w", gpu_count=8, cpu_millicores=32_000, ram_mib=65_536)
    gangs = [Job(f"gang{i}", (PodGroup("w", gang_pod, 2),), gang=True) for i in range(n // 2)]
    if any(n.name.startswith("openb") for n in snapshot.nodes[:1]):
        cap = float(sum(len(nd.gpus) for nd in snapshot.nodes))
        mixed = [p.request for p in workload(trace, cap, seed)]
    else:
        mixed = [replace(rng.choice(trace).request, gpu_models=frozenset()) for _ in range(mix)]
    return {
        "fractional": one("f", frac),
        "single-GPU": one("s", single),
        "8-GPU gang": gangs,
        "trace mix": [Job(f"m{i}", (PodGroup("p", r),), gang=False) for i, r in enumerate(mixed)],
    }


def run(snapshot: ClusterSnapshot, policy: Policy, jobs: list[Job]) -> dict[str, float]:
    """Place every job from an empty cluster; time only the placement."""
    state = ClusterState(snapshot)
    placer = Placer(state, policy)
    gc.collect()
    gc.disable()
    t0 = time.perf_counter()
    pods = placed = 0
    for j in jobs:
        d = placer.place_job(j)
        pods += sum(g.replicas for g in j.groups)
        if isinstance(d, Admit):
            placed += len(d.placement.pods)
    dt = time.perf_counter() - t0
    gc.enable()
    return {"pods": pods, "placed": placed, "seconds": dt, "pods_per_s": pods / dt}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pods", type=int, default=2000, help="pods per stream")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mix", type=int, default=30_000, help="trace-mix pods on the large cluster")
    ap.add_argument("--out", type=Path, default=RESULTS / "throughput.json")
    a = ap.parse_args(argv)

    profile = WorkloadProfile.from_pods([p.request for p in load_pods("default")])
    camp = default_policy(profile)
    base = ResourcePolicy("binpack", "binpack")
    clusters = {
        "openb (1,213 nodes)": load_nodes(),
        "synthetic (10,000 nodes)": synthetic_cluster(),
    }
    rows = []
    for cname, snap in clusters.items():
        t0 = time.perf_counter()
        ClusterState(snap)
        build = time.perf_counter() - t0
        for sname, jobs in streams(a.pods, 42, snap, a.mix).items():
            res: dict[str, list[dict[str, float]]] = {"camp": [], "binpack": []}
            for _ in range(a.repeats):
                res["camp"].append(run(snap, camp, jobs))
                res["binpack"].append(run(snap, base, jobs))
            med = {k: statistics.median(r["pods_per_s"] for r in v) for k, v in res.items()}
            rows.append(
                {
                    "cluster": cname,
                    "stream": sname,
                    "pods": res["camp"][0]["pods"],
                    "placed_camp": res["camp"][0]["placed"],
                    "camp_pods_per_s": med["camp"],
                    "binpack_pods_per_s": med["binpack"],
                    "ratio": med["camp"] / med["binpack"],
                    "state_build_s": build,
                    "runs": res,
                }
            )
            r = rows[-1]
            print(
                f"{cname:<26} {sname:<11} pods {r['pods']:>5} placed {r['placed_camp']:>5}  "
                f"camp {r['camp_pods_per_s']:>8.0f}/s  binpack {r['binpack_pods_per_s']:>8.0f}/s"
                f"  ratio {r['ratio']:.2f}  (state build {build:.2f} s)",
                flush=True,
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"repeats": a.repeats, "rows": rows}, indent=1))
    print(f"JSON: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
