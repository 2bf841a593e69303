"""Model services co-located with training on a slice of the openb cluster (issue 15).

One simulated day on every ``--stride``-th openb GPU node (the slice of docs/BENCHMARKS.md §4),
two ways:

* **static** — inference on dedicated nodes sized for its peak, training on the rest (two pools,
  each with its own Camp queue and cycle);
* **co-located** — one pool: inference replicas (priority ``inference``, non-preemptible, within
  their project's guarantee) and training (priority ``batch``, preemptible, checkpoint-capable,
  borrowing what inference leaves) share every node and every card.

Both run Camp's engine as the service does (``QueueCycle`` with the default ``CycleConfig``:
fair order, quotas, the non-preemptible-within-guarantee rule, preemption, backfill reservations,
the fragmentation-aware placement profiled on the workload), driven the way the §4 replay drives
it: one ``ClusterState`` and ``Placer`` kept across cycles, a cycle run only when something
changed and repeated at the same instant while it admits or preempts. As in the product, jobs
carry runtime estimates (the service passes ``Job.duration_seconds``): a training run its start
delay plus the work it has left, a replica ``REPLICA_DURATION_SECONDS`` (30 days). The
``-noest`` setups drop every estimate; ``-noreserve`` turns the cycle's backfill reservations off
(neither is a setting of the service): on this workload they decide much of the outcome
(docs/BENCHMARKS.md).

**Inference** — one model service per spec (GPU share, CPU, RAM) of the trace's latency-sensitive
(LS) one-GPU pods, the ``--services`` with the most GPU-seconds. Each service's peak follows its
share of those GPU-seconds; together the services' peak replicas take ``--peak-share`` of the
slice's GPUs. Load (in replica capacities) follows a diurnal curve — a cosine from ``--trough`` ×
peak at 04:00 to the peak at 16:00, each service shifted by up to ±1.5 h, times per-minute noise
(σ 5 %). *Demand* is the replicas the load needs at full capacity (``ceil(load)``); the
autoscaler is the model services' own rule (``workspaces.serving_load.recommend``, every 15 s as
Kubernetes' HPA): ``ceil(load / --target-util)`` replicas (headroom for the start delay), up at
once, down only to the highest recommendation of the last ``--stabilisation`` seconds. A new
replica is a Camp job asked for at the decision; it is ready ``--start-delay`` seconds after Camp
admits it, plus ``--preempt-grace`` when it had to preempt (its victims' pods go first). Removing
a replica removes a waiting one first, then the youngest. ``--bursts F`` adds the product's
simulated bursts (``serving_load.simulated_load``: F × the peak for 6 minutes in every 90).

**Training** — the trace's other GPU pods (BE, Burstable and 7 Guaranteed) that were scheduled
(pods the trace lists as Pending never ran; Failed ones ran until they failed), in creation order,
each a job with its shape and its trace duration as work (GPU-hours = duration × GPUs); a backlog of
``--backlog`` jobs always waits. A run makes progress ``--train-start`` seconds after it starts
(container start, resume), checkpoints every ``--checkpoint`` seconds of progress, and on
preemption loses the progress since its last checkpoint (Camp's "GPU time lost") and is requeued
with its original submit time.

Reported over the day after a ``--warmup``: average GPU allocation and its hourly series;
training GPU-hours completed (progress kept: finished, checkpointed, or still running at the end)
and lost to preemption; inference replica-minutes short of demand (demand above ready replicas);
scale-up latency p95 (decision → ready, start delay included); preemptions. Results and method in
docs/BENCHMARKS.md ("Model services co-located with training").

    .venv/bin/python -m bench.colocation              # stride 40 (147 GPUs), four setups (~2–3 min)
    .venv/bin/python -m bench.colocation --stride 130 --seed 16 --setups static colocated
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import heapq
import json
import math
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.openb import DATA, load_nodes, load_pods
from bench.queue_replay import _pct
from scheduling.engine import (
    ClusterSnapshot,
    ClusterState,
    FragmentationPolicy,
    Job,
    Node,
    Placer,
    PodGroup,
    PodRequest,
    WorkloadProfile,
)
from scheduling.engine.cycle import CycleConfig, Kind, QueueCycle
from scheduling.engine.model import Admit, Preempt
from scheduling.engine.queueing import (
    ProjectQueue,
    QueueTree,
    Quota,
    RunningJob,
    TenantQueue,
    placement_usage,
)
from workspaces.serving_load import recommend, simulated_load

RESULTS = Path(__file__).resolve().parent / "results"
DAY = 86_400.0
SERVE, TRAIN = "serving/inference", "research/training"
# Copies of the product's values (the engine runs without Django here); tests/unit/bench asserts
# they equal scheduling.models.PRIORITY_VALUES and workspaces.services.serving.REPLICA_DURATION_SECONDS.
PRIORITY_VALUES = {"inference": 1000, "batch": 10}
REPLICA_DURATION_SECONDS = 30 * 24 * 3600
"""A replica job's ``duration_seconds``, which the scheduler service passes to the engine as its
runtime estimate (scheduling/selectors.py), like a training job's expected run time."""
SETUPS = ("static", "colocated", "static-noest", "colocated-noest", "static-noreserve",
          "colocated-noreserve")
DEFAULT_SETUPS = ("static", "colocated", "static-noest", "colocated-noest")
DAY0 = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)  # any midnight: the burst rule needs a date
NEVER = (Kind.NEVER_FITS, Kind.OVER_LIMIT, Kind.UNKNOWN_QUEUE, Kind.OVER_GUARANTEE)


@dataclass(frozen=True)
class Scenario:
    stride: int = 40
    services: int = 12
    peak_share: float = 0.5
    trough: float = 0.25
    target_util: float = 0.7
    period: float = 15.0
    stabilisation: float = 300.0
    start_delay: float = 60.0
    train_start: float = 60.0
    checkpoint: float = 600.0
    backlog: int = 64
    heads: int = 8
    warmup: float = 2 * 3600.0
    seed: int = 15
    preempt_grace: float = 30.0
    bursts: float = 0.0


# --------------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------------


@dataclass
class Service:
    name: str
    request: PodRequest
    gpus: float
    """GPUs one replica holds (a share of one card for fractional replicas)."""
    peak_load: float
    phase_h: float
    noise: list[float]
    trough: float = 0.25
    max_replicas: int = 0
    number: int = 0
    bursts: float = 0.0

    def load(self, t: float) -> float:
        """Load in replica capacities at ``t`` (seconds from midnight of the measured day); with
        ``bursts``, plus the product's simulated bursts (``serving_load.simulated_load``: this
        fraction of the peak for 6 minutes in every 90, at an offset drawn per service)."""
        h = (t / 3600.0 + self.phase_h) % 24.0
        load = self.peak_load * _curve(h, self.trough) * self.noise[int(t // 60) % len(self.noise)]
        if self.bursts:
            at = DAY0 + dt.timedelta(seconds=t)
            profile = {"base": 0.0, "peak": self.peak_load, "burst": self.bursts}
            load += simulated_load(self.number, profile, at) - simulated_load(
                self.number, {**profile, "burst": 0.0}, at)
        return load


def _curve(h: float, trough: float) -> float:
    """Diurnal curve: ``trough`` at 04:00, 1 at 16:00 (a cosine)."""
    return trough + (1 - trough) * (1 - math.cos(2 * math.pi * (h - 4.0) / 24.0)) / 2


@dataclass
class TrainJob:
    job: Job
    gpus: float
    work: float
    """Seconds of progress left."""


def _spec(row: dict[str, str]) -> tuple[str, ...]:
    return (row["num_gpu"], row["gpu_milli"], row["cpu_milli"], row["memory_mib"], row["gpu_spec"])


def workload(sc: Scenario, capacity: int) -> tuple[list[Service], list[TrainJob]]:
    """Services from the trace's LS pods, training from its other GPU pods (creation order)."""
    rows = list(csv.DictReader((DATA / "openb_pod_list_default.csv").open()))
    pods = load_pods("default")
    ls_weight: Counter[tuple[str, ...]] = Counter()
    ls_req: dict[tuple[str, ...], tuple[PodRequest, float]] = {}
    train: list[tuple[float, int, TrainJob]] = []
    for i, (row, tp) in enumerate(zip(rows, pods, strict=True)):
        if tp.gpus <= 0:
            continue
        dur = max(1.0, float(row["deletion_time"]) - float(row["creation_time"]))
        if row["qos"] == "LS":
            if int(row["num_gpu"]) == 1:  # one card or a share of one per replica
                ls_weight[_spec(row)] += dur * tp.gpus
                ls_req[_spec(row)] = (tp.request, tp.gpus)
            continue
        if row["pod_phase"] == "Pending":  # never scheduled in the trace: no run time to replay
            continue
        job = Job(name=f"train-{row['name']}", groups=(PodGroup("w", tp.request, 1),), queue=TRAIN,
                  priority=PRIORITY_VALUES["batch"], priority_class="batch", preemptible=True,
                  checkpointable=True)
        train.append((float(row["creation_time"]), i, TrainJob(job, tp.gpus, dur)))
    train.sort(key=lambda x: (x[0], x[1]))
    top = [k for k, _ in ls_weight.most_common(sc.services)]
    total = sum(ls_weight[k] for k in top)
    rng = random.Random(sc.seed)
    services = []
    for k, spec in enumerate(top):
        req, g = ls_req[spec]
        peak_gpus = sc.peak_share * capacity * ls_weight[spec] / total
        # replicas wished at the peak: ceil(peak_load / target) ≈ peak_gpus / g
        peak_load = max(1.0, round(peak_gpus / g)) * sc.target_util
        svc = Service(
            name=f"svc{k:02d}", request=PodRequest(name=f"svc{k:02d}", cpu_millicores=req.cpu_millicores,
                                                   ram_mib=req.ram_mib, containers=req.containers,
                                                   gpu_models=req.gpu_models),
            gpus=g, peak_load=peak_load, phase_h=rng.uniform(-1.5, 1.5),
            noise=[max(0.5, rng.gauss(1.0, 0.05)) for _ in range(3 * 1440)], trough=sc.trough,
            number=k + 1, bursts=sc.bursts,
        )
        services.append(svc)
    # Scale the loads so that the replicas wished at each service's peak (headroom and noise
    # included) take --peak-share of the slice: the size of the static split's inference pool.
    for _ in range(2):
        for svc in services:
            svc.max_replicas = max(math.ceil(svc.load(t) / sc.target_util - 1e-9)
                                   for t in range(int(-sc.warmup), int(DAY), 60))
        f = sc.peak_share * capacity / sum(s.max_replicas * s.gpus for s in services)
        for svc in services:
            svc.peak_load *= f
    for svc in services:
        svc.max_replicas = max(math.ceil(svc.load(t) / sc.target_util - 1e-9)
                               for t in range(int(-sc.warmup), int(DAY), 60))
    return services, [tj for _, _, tj in train]


# --------------------------------------------------------------------------------------------------
# One pool: a set of nodes, its queue tree, Camp's cycle on it
# --------------------------------------------------------------------------------------------------


@dataclass
class Pool:
    name: str
    nodes: tuple[Node, ...]
    tree: QueueTree
    placer: Placer
    card: dict[str, list[int]]
    capacity: int
    pending: dict[str, Job] = field(default_factory=dict)
    running: dict[str, RunningJob] = field(default_factory=dict)
    gpus_of: dict[str, float] = field(default_factory=dict)
    dirty: bool = False


def make_pool(name: str, nodes: tuple[Node, ...], guarantees: dict[str, float],
              profile: WorkloadProfile) -> Pool:
    capacity = sum(len(n.gpus) for n in nodes)
    tree = QueueTree(tenants=(
        TenantQueue("serving", Quota(gpus_guaranteed=guarantees.get(SERVE, 0.0)),
                    (ProjectQueue(SERVE, Quota(gpus_guaranteed=guarantees.get(SERVE, 0.0))),)),
        TenantQueue("research", Quota(gpus_guaranteed=guarantees.get(TRAIN, 0.0)),
                    (ProjectQueue(TRAIN, Quota(gpus_guaranteed=guarantees.get(TRAIN, 0.0),
                                               gpus_limit=capacity)),)),
    ))
    state = ClusterState(ClusterSnapshot(nodes=nodes))
    return Pool(name, nodes, tree, Placer(state, FragmentationPolicy(profile)),
                {n.name: [g.memory_mib for g in n.gpus] for n in nodes}, capacity)


def _holds_peak(nodes: tuple[Node, ...], services: list[Service], profile: WorkloadProfile) -> bool:
    """Camp's placer puts every service's peak replicas on ``nodes``."""
    placer = Placer(ClusterState(ClusterSnapshot(nodes=nodes)), FragmentationPolicy(profile))
    for s in services:
        for r in range(s.max_replicas):
            d = placer.place_job(Job(name=f"{s.name}-{r}", groups=(PodGroup("r", s.request, 1),)))
            if not isinstance(d, Admit):
                return False
    return True


def dedicated_nodes(nodes: tuple[Node, ...], services: list[Service],
                    profile: WorkloadProfile) -> tuple[Node, ...]:
    """The static split's inference pool: the fewest GPUs among the slice's nodes (some of its
    largest nodes, topped up with smaller ones, in slice order) on which every service's peak
    replicas fit, as Camp's placer puts them."""
    most = max(len(n.gpus) for n in nodes)
    big = [n for n in nodes if len(n.gpus) == most]
    small = sorted((n for n in nodes if len(n.gpus) < most), key=lambda n: -len(n.gpus))
    best: tuple[Node, ...] | None = None
    for kb in range(len(big) + 1):
        for ks in range(len(small) + 1):
            cand = tuple(big[:kb] + small[:ks])
            gpus = sum(len(n.gpus) for n in cand)
            if best is not None and gpus >= sum(len(n.gpus) for n in best):
                continue
            if cand and _holds_peak(cand, services, profile):
                best = cand
                break
    if best is None:
        raise SystemExit("the slice cannot hold the services' peak")
    return best


# --------------------------------------------------------------------------------------------------
# The day
# --------------------------------------------------------------------------------------------------


@dataclass
class Replica:
    service: int
    decided: float
    started: float | None = None
    ready_at: float | None = None
    is_ready: bool = False


class Day:
    """One simulated day of one setup (``static`` or ``colocated``)."""

    def __init__(self, sc: Scenario, setup: str) -> None:
        self.sc = sc
        self.setup = setup
        base = load_nodes()
        nodes = tuple(n for i, n in enumerate(base.nodes) if i % sc.stride == 0)
        self.nodes = nodes
        self.capacity = sum(len(n.gpus) for n in nodes)
        self.services, train = workload(sc, self.capacity)
        self.train_feed = iter(train)
        self.train: dict[str, TrainJob] = {}
        profile = WorkloadProfile.from_pods([s.request for s in self.services] +
                                            [tj.job.groups[0].template for tj in train])
        self.serve_peak_gpus = sum(s.max_replicas * s.gpus for s in self.services)
        self.dedicated = dedicated_nodes(nodes, self.services, profile)
        if setup not in SETUPS:
            raise SystemExit(f"unknown setup {setup!r}")
        if setup.startswith("static"):
            inf = self.dedicated
            rest = tuple(n for n in nodes if n not in inf)
            self.serve_pool = make_pool("inference", inf, {SERVE: sum(len(n.gpus) for n in inf)}, profile)
            self.train_pool = make_pool("training", rest, {TRAIN: sum(len(n.gpus) for n in rest)}, profile)
            self.pools = [self.serve_pool, self.train_pool]
        else:
            g = math.ceil(self.serve_peak_gpus)
            pool = make_pool("shared", nodes, {SERVE: g, TRAIN: self.capacity - g}, profile)
            self.serve_pool = self.train_pool = pool
            self.pools = [pool]
        # the service's defaults (heads are handed in below); "-noreserve" turns the backfill
        # reservations off, to show what they cost here (the service cannot)
        self.config = CycleConfig(backfill=not setup.endswith("-noreserve"))
        # "-noest": neither training jobs nor replicas carry a runtime estimate
        self.estimates = not setup.endswith("-noest")
        self.events: list[tuple[float, int, str, str]] = []
        self.token: dict[str, str] = {}
        self.replicas: dict[str, Replica] = {}
        self.by_service: list[list[str]] = [[] for _ in self.services]
        self.wish: list[list[list[float]]] = [[] for _ in self.services]
        self.seq = 0
        self.t = -sc.warmup
        # metrics (from t = 0)
        self.alloc = {"inference": 0.0, "training": 0.0}
        self.alloc_area = {"inference": 0.0, "training": 0.0}
        self.hourly = [[0.0, 0.0] for _ in range(24)]
        self.short_rate = 0.0
        self.short_area = 0.0
        self.demand = [0] * len(self.services)
        self.ready = [0] * len(self.services)
        self.scaleup: list[float] = []
        self.preemptions = 0
        self.victims: Counter[str] = Counter()
        self.train_done = 0.0
        self.train_lost = 0.0
        self.train_finished = 0
        self.run_start: dict[str, float] = {}
        self.cycles = 0
        self.rejected: list[str] = []

    # -- event queue ---------------------------------------------------------------------------
    def push(self, t: float, kind: int, name: str = "", tok: str = "") -> None:
        heapq.heappush(self.events, (t, kind, name, tok))

    def advance(self, t: float) -> None:
        """Integrate the metrics from the last event to ``t`` (only the measured day counts)."""
        a, b = max(self.t, 0.0), min(t, DAY)
        if b > a:
            for k, v in self.alloc.items():
                self.alloc_area[k] += v * (b - a)
            self.short_area += self.short_rate * (b - a)
            h0 = int(a // 3600)
            while a < b:
                h_end = min(b, (h0 + 1) * 3600.0)
                self.hourly[h0][0] += self.alloc["inference"] * (h_end - a)
                self.hourly[h0][1] += self.alloc["training"] * (h_end - a)
                a, h0 = h_end, h0 + 1
        self.t = t

    def _short(self) -> None:
        self.short_rate = sum(max(0, d - r) for d, r in zip(self.demand, self.ready, strict=True))

    # -- inference -----------------------------------------------------------------------------
    def autoscale(self, t: float) -> None:
        sc = self.sc
        for i, s in enumerate(self.services):
            have = self.by_service[i]
            rec = recommend(metric="concurrency", target=sc.target_util, load=s.load(t),
                            ready=self.ready[i], current=len(have), min_replicas=1,
                            max_replicas=s.max_replicas, window=self.wish[i],
                            window_seconds=int(sc.stabilisation), now=t, idle_for=None,
                            scale_to_zero_seconds=None)
            self.wish[i] = rec.window
            want = rec.desired
            while len(have) < want:
                self.seq += 1
                name = f"{s.name}-r{self.seq}"
                self.replicas[name] = Replica(i, t)
                have.append(name)
                job = Job(name=name, groups=(PodGroup("r", s.request, 1),), queue=SERVE,
                          priority=PRIORITY_VALUES["inference"], priority_class="inference",
                          preemptible=False, submit_time=t,
                          runtime_estimate_s=REPLICA_DURATION_SECONDS if self.estimates else None)
                self.serve_pool.pending[name] = job
                self.serve_pool.dirty = True
            while len(have) > want:
                # a waiting replica first, then the youngest
                waiting = [n for n in have if self.replicas[n].started is None]
                name = waiting[-1] if waiting else have[-1]
                have.remove(name)
                self.remove_replica(name)

    def remove_replica(self, name: str) -> None:
        rep = self.replicas.pop(name)
        pool = self.serve_pool
        if name in pool.pending:
            del pool.pending[name]
            return
        self.release(pool, name, "inference")
        self.token[name] = ""
        if rep.is_ready:
            self.ready[rep.service] -= 1
            self._short()

    def set_demand(self, t: float) -> None:
        for i, s in enumerate(self.services):
            self.demand[i] = math.ceil(s.load(t) - 1e-9)
        self._short()

    # -- training ------------------------------------------------------------------------------
    def feed(self, t: float) -> None:
        pool = self.train_pool
        waiting = sum(1 for n in pool.pending if n in self.train)
        while waiting < self.sc.backlog:
            tj = next(self.train_feed, None)
            if tj is None:
                return
            tj.job = replace(tj.job, submit_time=t, runtime_estimate_s=self._estimate(tj))
            self.train[tj.job.name] = tj
            pool.pending[tj.job.name] = tj.job
            pool.dirty = True
            waiting += 1

    def _estimate(self, tj: TrainJob) -> float | None:
        """A training run's estimate as the product has it: the job's expected run time
        (``duration_seconds``; on the simulated backend exactly how long it runs) — here the
        start delay plus the work left. None in the ``-noest`` setups."""
        return self.sc.train_start + tj.work if self.estimates else None

    def train_progress(self, name: str, end: float, finished: bool) -> float:
        """Progress kept from the run that ends at ``end`` (whole run when finished, else up to
        its last checkpoint); counts what falls in the measured day."""
        tj = self.train[name]
        a = self.run_start.pop(name) + self.sc.train_start
        made = max(0.0, end - a)
        kept = made if finished else math.floor(made / self.sc.checkpoint) * self.sc.checkpoint
        lo, hi = max(a, 0.0), min(a + kept, DAY)
        self.train_done += max(0.0, hi - lo) * tj.gpus
        lost_lo, lost_hi = max(a + kept, 0.0), min(a + made, DAY)
        self.train_lost += max(0.0, lost_hi - lost_lo) * tj.gpus
        tj.work -= kept
        return kept

    # -- the pools -----------------------------------------------------------------------------
    def release(self, pool: Pool, name: str, kind: str, *, evicted: bool = False) -> None:
        """A job leaves ``pool`` (a preemption victim's pods were already taken off the
        cluster state by the cycle that evicted it)."""
        rj = pool.running.pop(name)
        if not evicted:
            for pp in rj.pods:
                pool.placer.state.unreserve(pp)
        self.alloc[kind] -= pool.gpus_of.pop(name)
        pool.dirty = True

    def run_cycles(self, pool: Pool, t: float) -> None:
        rounds = 0
        while pool.dirty and rounds < 1000:
            rounds += 1
            pool.dirty = False
            serve = [j for n, j in pool.pending.items() if n in self.replicas]
            train = sorted((j for n, j in pool.pending.items() if n in self.train),
                           key=lambda j: (j.submit_time, j.name))
            # the service's heads rule before issue 35 (kept so §8's figures stay comparable):
            # at least each queue's share of the free GPUs, counted in jobs
            free = pool.capacity - sum(pool.gpus_of.values())
            heads = max(self.sc.heads, math.ceil(free / max(1, bool(serve) + bool(train))))
            batch = serve + train[:heads]
            if not batch:
                return
            self.cycles += 1
            res = QueueCycle(pool.tree, pool.placer, list(pool.running.values()), now=t,
                             config=self.config).run(batch)
            for d in res.decisions:
                if isinstance(d, Preempt):
                    for v in d.victims:
                        self.preemptions += 1
                        self.victims["inference" if v in self.replicas else "training"] += 1
                        self.train_progress(v, t, finished=False)
                        self.release(pool, v, "training", evicted=True)
                        self.token[v] = ""
                        tj = self.train[v]
                        tj.job = replace(tj.job, runtime_estimate_s=self._estimate(tj))
                        pool.pending[v] = tj.job
                if isinstance(d, Admit | Preempt):
                    pool.dirty = True
                    job = pool.pending.pop(d.job)
                    rj = RunningJob(d.job, d.placement.pods, job.queue, job.priority, job.preemptible,
                                    job.checkpointable, t, job.runtime_estimate_s)
                    pool.running[d.job] = rj
                    g = placement_usage(rj.pods, pool.card)[0] / 1000
                    pool.gpus_of[d.job] = g
                    tok = f"{d.job}@{t}"
                    self.token[d.job] = tok
                    if d.job in self.replicas:
                        self.alloc["inference"] += g
                        rep = self.replicas[d.job]
                        rep.started = t
                        # a preemptor starts once its victims' pods are gone (their grace period)
                        grace = self.sc.preempt_grace if isinstance(d, Preempt) else 0.0
                        rep.ready_at = t + grace + self.sc.start_delay
                        self.push(rep.ready_at, 1, d.job, tok)
                    else:
                        self.alloc["training"] += g
                        self.run_start[d.job] = t
                        tj = self.train[d.job]
                        self.push(t + self.sc.train_start + tj.work, 0, d.job, tok)
            for s in res.statuses.values():
                if s.kind in NEVER and s.job in pool.pending:
                    self.rejected.append(s.job)
                    del pool.pending[s.job]
                    pool.dirty = True
            if pool is self.train_pool:
                before = len(pool.pending)
                self.feed(t)
                pool.dirty = pool.dirty or len(pool.pending) != before

    def run(self) -> dict[str, object]:
        sc = self.sc
        t0 = time.perf_counter()
        k = 0
        while -sc.warmup + k * sc.period < DAY:
            self.push(-sc.warmup + k * sc.period, 3)  # autoscaler ticks
            k += 1
        for m in range(int(-sc.warmup // 60), int(DAY // 60) + 1):
            self.push(m * 60.0, 2)  # the load changes each minute
        self.feed(self.t)
        while self.events:
            t = self.events[0][0]
            if t > DAY:
                break
            self.advance(t)
            while self.events and self.events[0][0] == t:
                _, kind, name, tok = heapq.heappop(self.events)
                if kind == 0 and self.token.get(name) == tok:  # a training job finished
                    self.train_progress(name, t, finished=True)
                    self.release(self.train_pool, name, "training")
                    self.train_finished += 1
                    self.feed(t)
                elif kind == 1 and self.token.get(name) == tok and name in self.replicas:
                    rep = self.replicas[name]
                    rep.is_ready = True
                    self.ready[rep.service] += 1
                    if rep.decided >= 0:
                        self.scaleup.append(t - rep.decided)
                    self._short()
                elif kind == 2:
                    self.set_demand(t)
                elif kind == 3:
                    self.autoscale(t)
            for pool in self.pools:
                self.run_cycles(pool, t)
        self.advance(DAY)
        for name in list(self.run_start):  # runs still going at the end: progress made counts
            self.train_progress(name, DAY, finished=True)
        return self.result(time.perf_counter() - t0)

    def result(self, wall: float) -> dict[str, object]:
        cap_s = self.capacity * DAY
        lat = sorted(self.scaleup)
        return {
            "setup": self.setup,
            "gpus": self.capacity,
            "services": len(self.services),
            "serve_peak_gpus": round(self.serve_peak_gpus, 2),
            "slice_nodes": len(self.nodes),
            "dedicated_nodes": len(self.dedicated),
            "dedicated_gpus": sum(len(n.gpus) for n in self.dedicated),
            "avg_alloc_pct": 100 * sum(self.alloc_area.values()) / cap_s,
            "inference_alloc_pct": 100 * self.alloc_area["inference"] / cap_s,
            "training_alloc_pct": 100 * self.alloc_area["training"] / cap_s,
            "hourly_alloc_pct": [round(100 * (a + b) / (self.capacity * 3600), 1) for a, b in self.hourly],
            "hourly_inference_pct": [round(100 * a / (self.capacity * 3600), 1) for a, _ in self.hourly],
            "training_gpu_h": self.train_done / 3600,
            "training_lost_gpu_h": self.train_lost / 3600,
            "training_finished": self.train_finished,
            "replica_min_short": self.short_area / 60,
            "scaleups": len(lat),
            "scaleup_p95_s": _pct(lat, 0.95),
            "scaleup_median_s": statistics.median(lat) if lat else 0.0,
            "scaleup_max_s": lat[-1] if lat else 0.0,
            "scaleups_not_ready_at_end": sum(1 for r in self.replicas.values()
                                             if r.decided >= 0 and not r.is_ready),
            "preemptions": self.preemptions,
            "rejected": len(self.rejected),
            "cycles": self.cycles,
            "wall_s": wall,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    d = Scenario()
    for f in d.__dataclass_fields__:
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(getattr(d, f)), default=getattr(d, f))
    ap.add_argument("--setups", nargs="+", default=list(DEFAULT_SETUPS), choices=SETUPS)
    ap.add_argument("--out", default=str(RESULTS / "colocation.json"))
    args = ap.parse_args()
    sc = Scenario(**{f: getattr(args, f) for f in d.__dataclass_fields__})
    rows = []
    for setup in args.setups:
        row = Day(sc, setup).run()
        rows.append(row)
        print(json.dumps(row), flush=True)
    by = {r["setup"]: r for r in rows}
    for tail in ("", "-noest", "-noreserve"):
        if "static" + tail in by and "colocated" + tail in by:
            s, c = by["static" + tail], by["colocated" + tail]
            gain = 100 * (float(c["training_gpu_h"]) / float(s["training_gpu_h"]) - 1)  # type: ignore[arg-type]
            c["training_gain_pct"] = gain
            print(f"colocated{tail}: training GPU-h {c['training_gpu_h']:.1f} "
                  f"vs static {s['training_gpu_h']:.1f} "
                  f"({gain:+.1f} %); allocation {c['avg_alloc_pct']:.1f} % vs {s['avg_alloc_pct']:.1f} %; "
                  f"replica-min short {c['replica_min_short']:.1f} vs {s['replica_min_short']:.1f}; "
                  f"scale-up p95 {c['scaleup_p95_s']:.0f} s; preemptions {c['preemptions']}")
    Path(args.out).parent.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps({"scenario": vars(sc), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
