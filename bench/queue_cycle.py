"""One full queueing cycle at scale: 20,000 pending jobs, 200 projects in 20 tenants, on openb.

The openb cluster (1,213 nodes, 6,212 GPUs) starts half full: trace pods placed with Camp's policy
and charged to random projects, with priorities and start times. 20,000 pending jobs are drawn
from the ``default`` pod list (with 2 % of them 2–4-pod gangs), spread over the projects, with
four priority classes. Each project is guaranteed its fair slice of the cluster and limited to
twice that. One full cycle = snapshot → ClusterState → order → quota → place → preempt →
backfill → reasons and positions for every waiting job. Median of ``--runs`` runs.

    .venv/bin/python -m bench.queue_cycle            # 3 runs
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from bench.openb import load_nodes, load_pods
from scheduling.engine import (
    Allocation,
    ClusterSnapshot,
    ClusterState,
    FragmentationPolicy,
    Job,
    Placer,
    PodGroup,
    WorkloadProfile,
)
from scheduling.engine.cycle import CycleConfig, Kind, QueueCycle
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    Aging,
    ProjectQueue,
    QueueTree,
    Quota,
    RunningJob,
    TenantQueue,
)

RESULTS = Path(__file__).resolve().parent / "results"
TENANTS = 20
PROJECTS_PER_TENANT = 10


def build(
    seed: int, pending_n: int
) -> tuple[ClusterSnapshot, list[RunningJob], list[Job], QueueTree, WorkloadProfile]:
    rng = random.Random(seed)
    base = load_nodes()
    pods = load_pods("default")
    gpu_pods = [p for p in pods if p.gpus > 0]
    profile = WorkloadProfile.from_pods([p.request for p in pods])
    capacity = sum(len(n.gpus) for n in base.nodes)
    queues = [f"t{t:02d}/p{p:02d}" for t in range(TENANTS) for p in range(PROJECTS_PER_TENANT)]
    per_project = capacity / len(queues)
    tree = QueueTree(
        tenants=tuple(
            TenantQueue(
                f"t{t:02d}",
                Quota(gpus_guaranteed=round(per_project * PROJECTS_PER_TENANT, 2)),
                tuple(
                    ProjectQueue(
                        f"t{t:02d}/p{p:02d}",
                        Quota(
                            gpus_guaranteed=round(per_project, 2),
                            gpus_limit=round(2 * per_project, 2),
                        ),
                    )
                    for p in range(PROJECTS_PER_TENANT)
                ),
            )
            for t in range(TENANTS)
        )
    )
    # Half-full cluster.
    state = ClusterState(base)
    placer = Placer(state, FragmentationPolicy(profile))
    allocs: list[Allocation] = []
    running: list[RunningJob] = []
    used = 0.0
    i = 0
    while used < capacity / 2:
        tp = gpu_pods[rng.randrange(len(gpu_pods))]
        pp = placer.place_pod(tp.request)
        if pp is None:
            continue
        i += 1
        name = f"run-{i}"
        q = rng.choice(queues)
        prio = rng.choice([0, 0, 1, 2])
        start = rng.uniform(0, 3600)
        allocs.append(Allocation(name, pp, q, prio, prio < 2, start))
        running.append(
            RunningJob(
                name,
                (pp,),
                q,
                prio,
                prio < 2,
                rng.random() < 0.3,
                start,
                rng.choice([None, 7200.0]),
            )
        )
        used += tp.gpus
    snap = ClusterSnapshot(nodes=base.nodes, allocations=tuple(allocs))
    pending = []
    for k in range(pending_n):
        tp = pods[rng.randrange(len(pods))]
        replicas = rng.choice([2, 4]) if rng.random() < 0.02 and tp.gpus >= 1 else 1
        prio = rng.choice([0, 0, 1, 2, 3])
        pending.append(
            Job(
                name=f"job-{k}",
                groups=(PodGroup("w", tp.request, replicas),),
                queue=rng.choice(queues),
                priority=prio,
                preemptible=prio < 2,
                submit_time=rng.uniform(0, 3600),
                runtime_estimate_s=rng.choice([None, 600.0, 3600.0]),
            )
        )
    return snap, running, pending, tree, profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pending", type=int, default=20_000)
    ap.add_argument("--heads", type=int, default=1,
                    help="jobs tried per project queue and cycle (-1: all, as CycleConfig() does)")
    args = ap.parse_args()
    snap, running, pending, tree, profile = build(7, args.pending)
    config = CycleConfig(
        aging=Aging(max_wait_s=3000),
        preemption=PreemptionConfig(min_runtime_s=600),
        heads_per_queue=None if args.heads < 0 else args.heads,
    )
    times = []
    kinds: dict[str, int] = {}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        state = ClusterState(snap)
        placer = Placer(state, FragmentationPolicy(profile))
        res = QueueCycle(tree, placer, running, now=3600.0, config=config).run(pending)
        times.append(time.perf_counter() - t0)
        kinds = {}
        for s in res.statuses.values():
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
    med = statistics.median(times)
    gpus = sum(len(n.gpus) for n in snap.nodes)
    print(
        f"{'nodes':>6} {'GPUs':>6} {'running':>8} {'pending':>8} {'projects':>8} "
        f"{'admitted':>8} {'preempting':>10} {'waiting':>8} {'rejected':>8} {'cycle s (median)':>17}"
    )
    waiting_kinds = (Kind.QUOTA, Kind.GUARANTEE, Kind.CAPACITY, Kind.BEHIND)
    waiting = sum(kinds.get(k, 0) for k in waiting_kinds)
    rejected = sum(
        v for k, v in kinds.items() if k not in (Kind.ADMITTED, Kind.PREEMPTING, *waiting_kinds)
    )
    projects = TENANTS * PROJECTS_PER_TENANT
    print(
        f"{len(snap.nodes):>6} {gpus:>6} {len(running):>8} {len(pending):>8} {projects:>8} "
        f"{kinds.get(Kind.ADMITTED, 0):>8} {kinds.get(Kind.PREEMPTING, 0):>10} "
        f"{waiting:>8} {rejected:>8} {med:>17.2f}"
    )
    print("runs (s):", ", ".join(f"{t:.2f}" for t in times), "| kinds:", kinds)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"queue_cycle{'' if args.heads == 1 else f'_heads{args.heads}'}.json").write_text(
        json.dumps(
            {
                "runs_s": times,
                "median_s": med,
                "kinds": kinds,
                "nodes": len(snap.nodes),
                "gpus": gpus,
                "running": len(running),
                "pending": len(pending),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
