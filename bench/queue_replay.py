"""Queueing on the openb trace: FIFO+BestFit versus Camp (queueing + placement).

``openb_pod_list_default`` is replayed in creation-time order; each pod runs for its trace duration
(deletion − creation) from the moment it starts. On the full openb cluster nothing would ever
queue (the trace never holds more than 66 GPUs at once), so the replay runs on a slice of the
openb cluster: every ``--stride``-th GPU node. Pods are spread round-robin over 8 projects in 2
tenants; each project is guaranteed 1/8 of the slice and limited to 1/2 of it. Priorities follow
the trace's QoS: LS 2, Burstable/Guaranteed 1, BE 0 (only BE is preemptible; an evicted pod is
requeued and restarts).

* FIFO+BestFit — one queue in creation order, strict FIFO (the head blocks the queue), BestFit.
* Camp — ``QueueCycle``: priority, hierarchical fair share, quotas, borrowing, preemption
  (minimum runtime ``--min-runtime``), backfill, with Camp's fragmentation-aware placement.

A cycle runs after every batch of events at one timestamp. Reported: time-averaged GPU
allocation, median and p95 queueing delay (creation → start, over pods that started), pods never
started, preemptions, and project-seconds during which a project with waiting work sat below its
guaranteed GPUs while its first waiting pod would have fitted within them.

    .venv/bin/python -m bench.queue_replay             # stride 130, both schedulers
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.openb import DATA, load_nodes, load_pods
from scheduling.engine import (
    BestFitPolicy,
    ClusterSnapshot,
    ClusterState,
    FragmentationPolicy,
    Job,
    Placer,
    PodGroup,
    WorkloadProfile,
)
from scheduling.engine.cycle import CycleConfig, Kind, QueueCycle
from scheduling.engine.model import Admit, Preempt
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    Aging,
    ProjectQueue,
    QueueTree,
    Quota,
    RunningJob,
    TenantQueue,
    placement_usage,
)

RESULTS = Path(__file__).resolve().parent / "results"
PROJECTS = [f"t{t}/p{p}" for t in range(2) for p in range(4)]
PRIORITY = {"LS": 2, "Burstable": 1, "Guaranteed": 1, "BE": 0}


@dataclass
class Sim:
    jobs: dict[str, Job]
    duration: dict[str, float]
    created: dict[str, float]
    qos: dict[str, str]
    capacity: int
    guaranteed_milli: int
    waited: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    alloc_area: float = 0.0
    below_guarantee: float = 0.0
    series: list[tuple[float, float]] = field(default_factory=list)


def load(stride: int) -> tuple[ClusterSnapshot, Sim]:
    base = load_nodes()
    nodes = tuple(n for i, n in enumerate(base.nodes) if i % stride == 0)
    snap = ClusterSnapshot(nodes=nodes)
    capacity = sum(len(n.gpus) for n in nodes)
    import csv

    rows = list(csv.DictReader((DATA / "openb_pod_list_default.csv").open()))
    pods = load_pods("default")
    jobs: dict[str, Job] = {}
    duration: dict[str, float] = {}
    created: dict[str, float] = {}
    qos: dict[str, str] = {}
    order = sorted(range(len(rows)), key=lambda i: (int(rows[i]["creation_time"]), i))
    for k, i in enumerate(order):
        row, tp = rows[i], pods[i]
        name = row["name"]
        prio = PRIORITY.get(row["qos"], 1)
        c = float(row["creation_time"])
        jobs[name] = Job(
            name=name,
            groups=(PodGroup("p", tp.request, 1),),
            queue=PROJECTS[k % len(PROJECTS)],
            priority=prio,
            preemptible=prio == 0,
            submit_time=c,
        )
        duration[name] = max(1.0, float(row["deletion_time"]) - c)
        created[name] = c
        qos[name] = row["qos"]
    sim = Sim(jobs, duration, created, qos, capacity, capacity * 1000 // len(PROJECTS))
    return snap, sim


def tree_for(sim: Sim) -> QueueTree:
    g = sim.capacity / len(PROJECTS)
    return QueueTree(
        tenants=tuple(
            TenantQueue(
                f"t{t}",
                Quota(gpus_guaranteed=4 * g),
                tuple(
                    ProjectQueue(f"t{t}/p{p}", Quota(gpus_guaranteed=g, gpus_limit=4 * g))
                    for p in range(4)
                ),
            )
            for t in range(2)
        )
    )


def replay(
    snap: ClusterSnapshot, sim: Sim, scheduler: str, min_runtime: float, heads: int | None = 4
) -> dict[str, object]:
    profile = WorkloadProfile.from_pods([j.groups[0].template for j in sim.jobs.values()])
    state = ClusterState(snap)
    policy = BestFitPolicy() if scheduler == "fifo" else FragmentationPolicy(profile)
    placer = Placer(state, policy)
    card = {n.name: [g.memory_mib for g in n.gpus] for n in snap.nodes}
    tree = tree_for(sim)
    config = CycleConfig(
        aging=Aging(max_wait_s=6 * 3600),
        preemption=PreemptionConfig(min_runtime_s=min_runtime),
        heads_per_queue=heads,
    )
    events: list[tuple[float, int, str, str]] = []  # (time, kind 0=end 1=arrive, job, token)
    for name, c in sim.created.items():
        heapq.heappush(events, (c, 1, name, ""))
    pending: dict[str, Job] = {}
    pending_since: dict[str, float] = {}
    running: dict[str, RunningJob] = {}
    gpus_of: dict[str, float] = {}
    token: dict[str, str] = {}
    allocated = 0.0
    last_t: float | None = None
    never: set[str] = set()
    t0 = time.perf_counter()
    cycles = 0
    starved_now: float = 0.0
    while events:
        t = events[0][0]
        if last_t is not None:
            sim.alloc_area += allocated * (t - last_t)
            sim.below_guarantee += starved_now * (t - last_t)
        last_t = t
        while events and events[0][0] == t:
            _, kind, name, tok = heapq.heappop(events)
            if kind == 1:
                pending[name] = sim.jobs[name]
                pending_since[name] = t
            elif token.get(name) == tok and name in running:
                for pp in running.pop(name).pods:
                    state.unreserve(pp)
                allocated -= gpus_of.pop(name)
        cycles += 1
        admitted: list[tuple[str, tuple[object, ...]]] = []
        waiting_heads: dict[str, str] = {}
        if scheduler == "fifo":
            for name in sorted(pending, key=lambda n: (sim.created[n], n)):
                d = placer.place_job(pending[name])
                if isinstance(d, Admit):
                    admitted.append((name, d.placement.pods))
                    continue
                if d.__class__.__name__ == "Reject":
                    never.add(name)
                    continue
                waiting_heads.setdefault(pending[name].queue, name)
                break
            for name in never:
                pending.pop(name, None)
        else:
            cyc = QueueCycle(tree, placer, list(running.values()), now=t, config=config)
            res = cyc.run(list(pending.values()))
            for d in res.decisions:
                if isinstance(d, Admit | Preempt):
                    admitted.append((d.job, d.placement.pods))
                if isinstance(d, Preempt):
                    for v in d.victims:
                        sim.preemptions += 1
                        rj = running.pop(v)
                        allocated -= gpus_of.pop(v)
                        token[v] = ""
                        pending[v] = sim.jobs[v]
                        pending_since[v] = t
            for s in res.statuses.values():
                if s.kind in (Kind.NEVER_FITS, Kind.OVER_LIMIT, Kind.UNKNOWN_QUEUE):
                    never.add(s.job)
                    pending.pop(s.job, None)
                elif s.kind in (Kind.CAPACITY, Kind.QUOTA, Kind.BEHIND) and s.position == 1:
                    waiting_heads[s.queue] = s.job
        for name, pods in admitted:
            job = pending.pop(name)
            sim.waited[name] = sim.waited.get(name, 0.0) + (t - pending_since.pop(name))
            sim.started.setdefault(name, t)
            rj = RunningJob(name, tuple(pods), job.queue, job.priority, job.preemptible,  # type: ignore[arg-type]
                            False, t, None)
            running[name] = rj
            g = placement_usage(rj.pods, card)[0] / 1000
            gpus_of[name] = g
            allocated += g
            tok = f"{name}@{t}"
            token[name] = tok
            heapq.heappush(events, (t + sim.duration[name], 0, name, tok))
        # Guarantee check: a project with waiting work below its guaranteed GPUs while its first
        # waiting pod would fit within them.
        usage: dict[str, int] = {}
        for name, rj in running.items():
            usage[rj.queue] = usage.get(rj.queue, 0) + int(gpus_of[name] * 1000)
        starved_now = 0.0
        for q in PROJECTS:
            head = waiting_heads.get(q)
            if head is None and scheduler == "fifo":
                head = next((n for n in pending if pending[n].queue == q), None)
            if head is None:
                continue
            ask = int(sim.jobs[head].groups[0].template.gpu_count and 1000 * _gpus(sim.jobs[head]))
            if usage.get(q, 0) + ask <= sim.guaranteed_milli:
                starved_now += 1.0
    wall = time.perf_counter() - t0
    delays = sorted(sim.waited[n] for n in sim.waited)
    span = (last_t or 0.0) - min(sim.created.values())
    return {
        "scheduler": scheduler,
        "pods": len(sim.jobs),
        "started": len(sim.started),
        "never_fit": len(never),
        "avg_gpu_alloc_pct": 100 * sim.alloc_area / (span * sim.capacity),
        "median_delay_s": statistics.median(delays),
        "p95_delay_s": delays[int(0.95 * (len(delays) - 1))],
        "mean_delay_s": statistics.fmean(delays),
        "preemptions": sim.preemptions,
        "below_guarantee_project_hours": sim.below_guarantee / 3600,
        "cycles": cycles,
        "wall_s": wall,
    }


def _gpus(job: Job) -> float:
    c = job.groups[0].template.containers
    if not c:
        return 0.0
    r = c[0]
    return r.gpu_count * (1.0 if r.whole_cards else r.gpu_cores_percent / 100)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=130)
    ap.add_argument("--min-runtime", type=float, default=600.0)
    ap.add_argument("--schedulers", nargs="+", default=["fifo", "camp"])
    ap.add_argument("--heads", type=int, default=4, help="Camp: jobs tried per project queue and cycle")
    args = ap.parse_args()
    rows = []
    gpus = 0
    for s in args.schedulers:
        snap, sim = load(args.stride)
        gpus = sim.capacity
        rows.append(replay(snap, sim, s, args.min_runtime, args.heads))
    print(f"openb default, {len(snap.nodes)} nodes / {gpus} GPUs (every {args.stride}th openb node)")
    hdr = (f"{'scheduler':<14} {'started':>8} {'never':>6} {'GPU alloc %':>11} {'median s':>9} "
           f"{'p95 s':>9} {'preempt':>8} {'below-guar. proj-h':>18} {'wall s':>7}")
    print(hdr)
    for r in rows:
        print(f"{r['scheduler']:<14} {r['started']:>8} {r['never_fit']:>6} {r['avg_gpu_alloc_pct']:>11.1f} "
              f"{r['median_delay_s']:>9.0f} {r['p95_delay_s']:>9.0f} {r['preemptions']:>8} "
              f"{r['below_guarantee_project_hours']:>18.1f} {r['wall_s']:>7.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "queue_replay.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
