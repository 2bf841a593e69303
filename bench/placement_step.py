"""The global queue's placement step at scale (issue 16): ``placement_run`` on PostgreSQL.

"A global queue multiplies what each cycle costs": every placement step reads a snapshot of
every open cluster and probes each floating job on each of them before the clusters' own
cycles run. This measures the product path (``scheduling.services.placement.placement_run``,
the Celery task's body) next to one cluster's ``cycle_run`` on the same rows.

Setup: two simulated clusters synced through ``inventory_sync`` — ``a`` with ``--nodes``
nodes of 8 A100s, ``b`` with as many nodes of 8 H100s — and 20 tenants × 10 projects with
guaranteed/limit quotas (as ``bench/service_cycle.py``). ``--alloc`` % of each cluster's
nodes are held whole by running jobs (rows as the service writes them). Pending: N floating
jobs (``cluster`` NULL, any cluster), written in bulk with the rows ``job_submit`` writes; 1–8
GPUs each, a fifth asking for A100 only and a fifth for H100 only, four priority classes.

Per N, each run starts from the same rows (every job floating and unbound again, what the
step and the cycle wrote undone, audit events excepted) and reports the medians of:

* ``step s``: the wall time of one ``placement_run`` (at most ``PLACEMENT_BATCH`` = 500 jobs);
* ``queries``: the SQL statements it ran;
* ``placed``/``waiting``: what it decided (a step goes on with the next batch of 500 while
  ``PLACEMENT_BUDGET_S`` lasts; ``--budget`` sets it, 0 for one batch a step);
* ``cycle s``: then ``cycle_run`` of cluster ``a`` (the jobs the step bound there) —
  ``ratio`` is step ÷ cycle.

``--profile`` writes a cProfile of one step to ``bench/results/placement_step_<label>.prof``
and prints its top functions.

    .venv/bin/python -m bench.placement_step --pending 500,2000,5000 --runs 5
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.service_cycle import (
    PRIORITY_CLASSES,
    PROJECTS_PER_TENANT,
    TENANTS,
    _setup_django,
    tenants_and_projects,
)

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/camp_bench_px"
MODELS = {"a": ("A100-80G", 81920), "b": ("H100-80G", 81920)}


def _inventory(model: str, memory: int, nodes: int) -> str:
    return (f"start_delay_seconds: 3\ndefault_duration_seconds: 3600\nnodes:\n"
            f"  - name: n-{{i}}\n    count: {nodes}\n    cpu_cores: 128\n    ram_gib: 1024\n"
            f"    gpus: {{model: {model}, count: 8, memory_mib: {memory}}}\n")


def _world(nodes: int) -> tuple[Any, list[Any], list[Any]]:
    from scheduling import services
    from scheduling.models import Cluster
    from tenants.models import User

    admin, _ = User.objects.get_or_create(username="bench-admin",
                                          defaults={"is_platform_admin": True, "is_superuser": True})
    clusters = []
    for name, (model, mem) in MODELS.items():
        c = Cluster.objects.filter(name=name).first()
        if c is None:
            c = services.cluster_create(actor=admin, name=name, backend="simulated",
                                        inventory=_inventory(model, mem, nodes))
            services.inventory_sync(cluster=c)
        clusters.append(c)
    per_project = 2 * nodes * 8 / (TENANTS * PROJECTS_PER_TENANT)
    return admin, clusters, tenants_and_projects(per_project, limit_factor=4)


def _specs(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        models = [MODELS["a"][0]] if r < 0.2 else [MODELS["b"][0]] if r < 0.4 else []
        out.append({"project": rng.randrange(TENANTS * PROJECTS_PER_TENANT),
                    "priority_class": rng.choice(PRIORITY_CLASSES),
                    "group": {"name": "worker", "gpu_count": rng.choice([1, 1, 1, 2, 2, 4, 8]),
                              "cpu_millicores": 4000, "ram_mib": 16384, "gpu_models": models},
                    "duration": rng.choice([None, 600, 3600])})
    return out


def _bulk(admin: Any, projects: list[Any], specs: list[dict[str, Any]], prefix: str,
          cluster: Any = None, state: str = "queued") -> list[Any]:
    """Jobs with the rows ``job_submit`` writes (job, group, decision, audit), in bulk;
    floating (any cluster) when ``cluster`` is None."""
    from django.db import transaction
    from django.utils import timezone

    from scheduling.models import PRIORITY_VALUES, DecisionKind, Job, PodGroup, SchedulingDecision
    from scheduling.services import GROUP_FIELDS, JOB_FIELDS, _audit_job
    from tenants.audit import audit_batch, snapshot

    now = timezone.now()
    jobs, groups = [], []
    for i, s in enumerate(specs):
        project = projects[s["project"]]
        pc = s["priority_class"]
        jobs.append(Job(tenant=project.tenant, project=project, owner=admin, cluster=cluster,
                        floating=cluster is None, cluster_choice={}, name=f"{prefix}-{i}", kind="batch",
                        priority_class=pc, priority=PRIORITY_VALUES[pc], preemptible=pc == "batch",
                        gang=True, duration_seconds=s.get("duration"), state=state))
        groups.append(PodGroup(replicas=1, **s["group"]))
    with transaction.atomic(), audit_batch():
        Job.objects.bulk_create(jobs, batch_size=2000)
        for i, job in enumerate(jobs):  # submission order = list order
            job.submitted_at = now - dt.timedelta(seconds=len(jobs) - i)
        Job.objects.bulk_update(jobs, ["submitted_at"], batch_size=2000)
        for job, g in zip(jobs, groups, strict=True):
            g.job = job
        PodGroup.objects.bulk_create(groups, batch_size=2000)
        SchedulingDecision.objects.bulk_create(
            [SchedulingDecision(job=j, cluster=cluster, kind=DecisionKind.SUBMITTED, reason="Queued")
             for j in jobs], batch_size=2000)
        for job, g in zip(jobs, groups, strict=True):
            _audit_job("job.submitted", job, actor=admin, after={
                **snapshot(job, JOB_FIELDS), "groups": [snapshot(g, GROUP_FIELDS)]})
    return jobs


def _fill(admin: Any, cluster: Any, projects: list[Any], percent: int) -> list[int]:
    """Running jobs holding ``percent`` % of the cluster's nodes whole (8 GPUs each)."""
    from django.db import transaction
    from django.utils import timezone

    from scheduling import selectors
    from scheduling.backends.naming import pod_name
    from scheduling.engine import ClusterState, Placer, default_policy, pod
    from scheduling.models import Allocation, GpuSlice, Job, JobState, PodGroup

    Job.objects.filter(cluster=cluster, name__startswith=f"run-{cluster.name}-").delete()
    inputs = selectors.cycle_inputs(cluster)
    n = len(inputs.snapshot.nodes) * percent // 100
    if not n:
        return []
    placer = Placer(ClusterState(inputs.snapshot), default_policy(None))
    whole = pod("x", gpu_count=8, cpu_millicores=4000, ram_mib=16384)
    placements = [pp for pp in (placer.place_pod(whole) for _ in range(n)) if pp is not None]
    n = len(placements)
    group = {"name": "worker", "gpu_count": 8, "cpu_millicores": 4000, "ram_mib": 16384}
    specs = [{"project": i % len(projects), "priority_class": PRIORITY_CLASSES[i % len(PRIORITY_CLASSES)],
              "group": group, "duration": 7200} for i in range(n)]
    jobs = _bulk(admin, projects, specs, f"run-{cluster.name}", cluster, JobState.RUNNING)
    now = timezone.now()
    with transaction.atomic():
        Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
            admitted_at=now - dt.timedelta(hours=1), started_at=now - dt.timedelta(hours=1),
            reason="Running", attempts=1)
        groups = {g.job_id: g for g in PodGroup.objects.filter(job__in=jobs)}
        allocs = [Allocation(cluster=cluster, job=j, group=groups[j.pk], replica=0,
                             pod_name=pod_name(j.name, j.pk, "worker", 0), node_id=inputs.nodes[pp.node],
                             cpu_millicores=pp.cpu_millicores, ram_mib=pp.ram_mib, phase="running")
                  for j, pp in zip(jobs, placements, strict=True)]
        Allocation.objects.bulk_create(allocs, batch_size=2000)
        GpuSlice.objects.bulk_create(
            [GpuSlice(allocation=a, gpu_id=inputs.gpus[(pp.node, g.index)].pk, container=g.container,
                      memory_mib=g.gpu_memory_mib, cores_percent=g.gpu_cores_percent, exclusive=g.exclusive)
             for a, pp in zip(allocs, placements, strict=True) for g in pp.gpus],
            batch_size=2000)
    from bench.service_cycle import _recount_gpus

    _recount_gpus(cluster)
    return [j.pk for j in jobs]


def _reset(clusters: list[Any], ids: list[int], decision_mark: int) -> None:
    """Every pending job floating, unbound and queued again; what a step or cycle wrote undone."""
    from django.db import connection, transaction

    from bench.service_cycle import _recount_gpus
    from scheduling.models import Allocation, Job, JobState, SchedulingDecision

    with transaction.atomic():
        Allocation.objects.filter(job_id__in=ids).delete()
        for c in clusters:
            _recount_gpus(c)
        Job.objects.filter(pk__in=ids).update(
            cluster=None, cluster_choice={}, state=JobState.QUEUED, reason="", reason_kind="",
            placement_note="", queue_position=None, queue_length=None, admitted_at=None, attempts=0,
            finished_at=None, preempted_by=None)
        SchedulingDecision.objects.filter(pk__gt=decision_mark).delete()
    from django.core.cache import cache

    cache.clear()  # the coalesced "placement/cycle requested" markers (local memory)
    with connection.cursor() as cur:
        cur.execute("ANALYZE scheduling_job")


def _counting() -> Any:
    from django.db import connection

    box = {"n": 0}

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        box["n"] += 1
        return execute(sql, params, many, context)

    return connection.execute_wrapper(count), box


def _measure(cluster_a: Any, profile: cProfile.Profile | None = None) -> dict[str, Any]:
    from scheduling import services
    from scheduling.services import placement

    wrapper, box = _counting()
    with wrapper:
        t0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        summary = placement.placement_run()
        if profile is not None:
            profile.disable()
        step_s = time.perf_counter() - t0
    step_q = box["n"]
    assert summary is not None
    # What the audit_seal task does after the step (Celery's broker is in memory here, so
    # the task the step queued does not run): sealing its audit events, timed apart. Before
    # the step wrote in one transaction, each bind's commit sealed inline (inside step s).
    from tenants.audit import seal

    t0 = time.perf_counter()
    sealed = seal(wait=True)
    seal_s = time.perf_counter() - t0
    wrapper, box = _counting()
    with wrapper:
        t0 = time.perf_counter()
        cycle = services.cycle_run(cluster=cluster_a)
        cycle_s = time.perf_counter() - t0
    assert cycle is not None
    return {"step_s": step_s, "queries": step_q, "seal_s": seal_s, "sealed": sealed,
            "load_average_1m": os.getloadavg()[0], "placed": len(summary.placed),
            "waiting": len(summary.waiting), "rejected": len(summary.rejected), "cycle_s": cycle_s,
            "cycle_queries": box["n"], "cycle_admitted": len(cycle.admitted)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending", default="500,2000,5000", help="comma-separated numbers of floating jobs")
    ap.add_argument("--nodes", type=int, default=250, help="nodes (8 GPUs each) per cluster")
    ap.add_argument("--alloc", type=int, default=50, help="%% of each cluster's nodes held by running jobs")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile one step at the largest size")
    ap.add_argument("--budget", type=float, default=None,
                    help="PLACEMENT_BUDGET_S for the run (default: the service's; 0: one batch a step)")
    ap.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    ap.add_argument("--label", default="", help="suffix of the result files")
    args = ap.parse_args()
    os.environ["DB_CONN_MAX_AGE"] = "0"
    sizes = [int(s) for s in args.pending.split(",")]
    _setup_django(args.db)

    from scheduling.models import Job, JobState, SchedulingDecision
    from scheduling.services import placement

    if args.budget is not None:
        placement.PLACEMENT_BUDGET_S = args.budget
    print(f"PLACEMENT_BATCH {placement.PLACEMENT_BATCH}, PLACEMENT_BUDGET_S {placement.PLACEMENT_BUDGET_S}")

    admin, clusters, projects = _world(args.nodes)
    for c in clusters:
        _fill(admin, c, projects, args.alloc)
    pool = list(Job.objects.filter(floating=True, name__startswith="float-").order_by("submitted_at", "id")
                .values_list("pk", flat=True))
    if len(pool) < max(sizes):
        Job.objects.filter(pk__in=pool).delete()
        _bulk(admin, projects, _specs(max(sizes), 16), "float")
        pool = list(Job.objects.filter(floating=True, name__startswith="float-")
                    .order_by("submitted_at", "id").values_list("pk", flat=True))
    label = f"_{args.label}" if args.label else ""
    rows = []
    print(f"{'pending':>8} {'placed':>7} {'waiting':>8} {'queries':>8} {'step s':>7} "
          f"{'cycle s':>8} {'cyc q':>6} {'ratio':>6}")
    for n in sizes:
        ids = pool[:n]
        Job.objects.filter(pk__in=pool[n:]).update(state=JobState.CANCELLED)
        mark = SchedulingDecision.objects.order_by("-id").values_list("pk", flat=True).first() or 0
        _reset(clusters, ids, mark)
        runs = []
        for _ in range(args.runs):
            runs.append(_measure(clusters[0]))
            _reset(clusters, ids, mark)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append({"pending": n, "median": med, "runs": runs})
        print(f"{n:>8} {med['placed']:>7.0f} {med['waiting']:>8.0f} {med['queries']:>8.0f} "
              f"{med['step_s']:>7.3f} {med['cycle_s']:>8.3f} {med['cycle_queries']:>6.0f} "
              f"{med['step_s'] / max(med['cycle_s'], 1e-9):>6.2f}", flush=True)
        print("   runs (step s):", ", ".join(f"{r['step_s']:.3f}" for r in runs),
              "| seal after (s):", ", ".join(f"{r['seal_s']:.3f}" for r in runs),
              "| load 1 min:", ", ".join(f"{r['load_average_1m']:.1f}" for r in runs), flush=True)
    if args.profile:
        n = max(sizes)
        ids = pool[:n]
        Job.objects.filter(pk__in=pool[:n]).update(state=JobState.QUEUED)
        mark = SchedulingDecision.objects.order_by("-id").values_list("pk", flat=True).first() or 0
        _reset(clusters, ids, mark)
        prof = cProfile.Profile()
        _measure(clusters[0], prof)
        _reset(clusters, ids, mark)
        RESULTS.mkdir(exist_ok=True)
        prof.dump_stats(str(RESULTS / f"placement_step{label}.prof"))
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(40)
        print(out.getvalue())
    Job.objects.filter(pk__in=pool).update(state=JobState.CANCELLED)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"placement_step{label}.json"
    path.write_text(json.dumps({"load_average": os.getloadavg(), "nodes_per_cluster": args.nodes,
                                "alloc_percent": args.alloc, "budget_s": placement.PLACEMENT_BUDGET_S,
                                "rows": rows}, indent=1))
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()), "→", path, file=sys.stderr)


if __name__ == "__main__":
    main()
