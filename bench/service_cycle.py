"""The scheduler *service* at scale (issue 13): ``scheduling.services.cycle_run`` on PostgreSQL.

Setup: the openb cluster (1,213 nodes, 6,212 GPUs) as a simulated inventory synced through
``inventory_sync``; 20 tenants × 10 projects with guaranteed/limit quotas as in
``bench/queue_cycle.py``; running jobs placed by the engine and written as rows (allocations,
slices, GPU counters) until ``--alloc`` % of the GPUs are held; pending jobs drawn from
``openb_pod_list_default`` (2 % of them 2–4-pod gangs, four priority classes), written in bulk
with the same rows ``job_submit`` writes (job, pod group, "submitted" decision, audit event).

Per cell (pending × allocation), each run starts from the same rows (everything the cycle
wrote is undone afterwards, except audit events, which are append-only) and reports:

* ``cycle s``: the wall time of ``cycle_run`` (snapshot, engine, persistence, commit and the
  after-commit dispatch enqueues; Celery's broker is in-memory so nothing leaves the process);
* ``cpu s``: the CPU time this process spent in it (less sensitive than wall time to a
  loaded machine; PostgreSQL's own time is not in it);
* ``queries``: the SQL statements it ran;
* ``engine s``: ``run_cycle`` alone on a snapshot of the same rows, in the same run;
* ``snapshot s``: ``selectors.cycle_inputs`` alone.

``--drain`` also measures the time until every job that fits is admitted: cycles run back to
back (as the Celery task does while a cycle admits) until one admits nothing.

Heads of queues: the service's own rule (``services.cycle_config``): at least
``SCHEDULER_HEADS_PER_QUEUE`` (8 here) per project queue, more on a cluster with room (as many
as the queue's share of the free room asks for) unless ``SCHEDULER_HEADS_FILL=0``; ``engine s``
uses the same configuration.

    .venv/bin/python -m bench.service_cycle --db postgres://postgres@127.0.0.1:5432/bench_i13 \\
      --pending 2000 --alloc 0 --runs 1   # quick (--db, else BENCH_DATABASE_URL, else bench_i13)
    .venv/bin/python -m bench.service_cycle --pending 2000,10000,20000 --alloc 0,50,90 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TENANTS = 20
PROJECTS_PER_TENANT = 10
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/bench_i13"
# Fractional openb pods ask for a share of a card; in Camp's API that is MiB per GPU. A
# 15,000 MiB reference card keeps every share placeable on the smallest openb card (T4).
REFERENCE_CARD_MIB = 15_000
PRIORITY_CLASSES = ("batch", "normal", "normal", "high", "inference")


def _setup_django(db_url: str) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")
    os.environ["DATABASE_URL"] = db_url
    os.environ["REDIS_URL"] = ""  # local-memory cache (cycle request coalescing)
    os.environ["CELERY_BROKER_URL"] = "memory://"  # dispatch enqueues stay in this process
    os.environ.setdefault("SCHEDULER_HEADS_PER_QUEUE", "8")
    # One process, one connection at a time: as a prefork Celery worker runs a cycle (Celery
    # closes a pool around each task) and as the base commits before the pool was the default.
    os.environ.setdefault("DB_POOL_MAX_SIZE", "0")
    import psycopg

    base, _, name = db_url.rpartition("/")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _inventory_yaml() -> str:
    from bench.openb import GPU_MEMORY_MIB, load_nodes

    lines = ["start_delay_seconds: 3", "default_duration_seconds: 3600", "nodes:"]
    for n in load_nodes().nodes:
        model = n.gpus[0].model if n.gpus else "none"
        lines.append(
            f"  - {{name: {n.name}, cpu_cores: {n.cpu_millicores / 1000}, "
            f"ram_gib: {n.ram_mib / 1024}, max_pods: 1000, gpus: {{model: {model}, "
            f"count: {len(n.gpus)}, memory_mib: {GPU_MEMORY_MIB.get(model, 32_000)}, max_sharers: 64}}}}"
        )
    return "\n".join(lines) + "\n"


def _world() -> tuple[Any, Any, list[Any]]:
    """The admin, the cluster (inventory synced) and the 200 projects with quotas."""
    from scheduling import services
    from scheduling.models import Cluster, GpuDevice
    from tenants.models import User

    admin, _ = User.objects.get_or_create(username="bench-admin",
                                          defaults={"is_platform_admin": True, "is_superuser": True})
    cluster = Cluster.objects.filter(name="openb").first()
    if cluster is None:
        cluster = services.cluster_create(actor=admin, name="openb", backend="simulated",
                                          inventory=_inventory_yaml())
        t0 = time.perf_counter()
        services.inventory_sync(cluster=cluster)
        print(f"inventory_sync of 1,213 nodes (first): {time.perf_counter() - t0:.2f} s")
    capacity = GpuDevice.objects.filter(node__cluster=cluster).count()
    per_project = capacity / (TENANTS * PROJECTS_PER_TENANT)
    return admin, cluster, tenants_and_projects(per_project, limit_factor=2)


def tenants_and_projects(per_project: float, *, limit_factor: float) -> list[Any]:
    """TENANTS tenants of PROJECTS_PER_TENANT projects each (created once, then reused), each
    project guaranteed ``per_project`` GPUs and limited to ``limit_factor`` times that."""
    from tenants.models import Project, Quota, QuotaScope, Tenant

    zero = {"gpu_memory_mib_guaranteed": 0, "cpu_cores_guaranteed": 0, "ram_mib_guaranteed": 0}
    projects = []
    for t in range(TENANTS):
        tenant, created = Tenant.objects.get_or_create(name=f"t{t:02d}")
        if created:
            Quota.objects.create(scope=QuotaScope.TENANT, tenant=tenant,
                                 gpus_guaranteed=round(per_project * PROJECTS_PER_TENANT, 2), **zero)
        for p in range(PROJECTS_PER_TENANT):
            project, created = Project.objects.get_or_create(tenant=tenant, name=f"p{p:02d}")
            if created:
                Quota.objects.create(scope=QuotaScope.PROJECT, tenant=tenant, project=project,
                                     gpus_guaranteed=round(per_project, 2),
                                     gpus_limit=round(limit_factor * per_project, 2), **zero)
            projects.append(project)
    return projects


def _group_fields(tp: Any) -> dict[str, Any]:
    req = tp.request
    g: dict[str, Any] = {"name": "worker", "cpu_millicores": req.cpu_millicores,
                         "ram_mib": max(1, req.ram_mib), "gpu_models": sorted(req.gpu_models)}
    if req.containers:
        c = req.containers[0]
        g["gpu_count"] = c.gpu_count
        if c.gpu_memory_percent:
            g["gpu_memory_mib"] = c.gpu_memory_percent * REFERENCE_CARD_MIB // 100
            g["gpu_cores_percent"] = c.gpu_cores_percent
    return g


def _bulk_jobs(admin: Any, cluster: Any, projects: list[Any], specs: list[dict[str, Any]],
               state: str, prefix: str) -> list[Any]:
    """Jobs with the rows ``job_submit`` writes (job, groups, decision, audit), in bulk.
    ``cluster`` is one cluster for every job, or a spec's own ``cluster`` (None: floating, in
    the global queue) when it is None."""
    import datetime as dt

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
        where = cluster if cluster is not None else s.get("cluster")
        job = Job(tenant=project.tenant, project=project, owner=admin, cluster=where,
                  floating=where is None,
                  name=f"{prefix}-{i}", kind="batch", priority_class=pc,
                  priority=PRIORITY_VALUES[pc], preemptible=pc == "batch",
                  checkpoint_capable=s.get("checkpoint", False), gang=True,
                  duration_seconds=s.get("duration"), state=state)
        jobs.append(job)
        groups.append(PodGroup(replicas=s.get("replicas", 1), **s["group"]))
    with transaction.atomic(), audit_batch():
        Job.objects.bulk_create(jobs, batch_size=2000)
        # submitted_at is auto_now_add: spread it so the queue order is the list order
        for i, job in enumerate(jobs):
            job.submitted_at = now - dt.timedelta(seconds=len(jobs) - i)
        Job.objects.bulk_update(jobs, ["submitted_at"], batch_size=2000)
        for job, g in zip(jobs, groups, strict=True):
            g.job = job
        PodGroup.objects.bulk_create(groups, batch_size=2000)
        SchedulingDecision.objects.bulk_create(
            [SchedulingDecision(job=j, cluster_id=j.cluster_id, kind=DecisionKind.SUBMITTED,
                                reason="Queued; waiting for the next scheduling cycle")
             for j in jobs], batch_size=2000)
        for job, g in zip(jobs, groups, strict=True):
            _audit_job("job.submitted", job, actor=admin, after={
                **snapshot(job, JOB_FIELDS), "groups": [snapshot(g, GROUP_FIELDS)]})
    return jobs


def _pending_specs(n: int, seed: int) -> list[dict[str, Any]]:
    from bench.openb import load_pods

    rng = random.Random(seed)
    pods = load_pods("default")
    out = []
    for _ in range(n):
        tp = pods[rng.randrange(len(pods))]
        replicas = rng.choice([2, 4]) if rng.random() < 0.02 and tp.gpus >= 1 else 1
        out.append({"project": rng.randrange(TENANTS * PROJECTS_PER_TENANT),
                    "priority_class": rng.choice(PRIORITY_CLASSES), "replicas": replicas,
                    "group": _group_fields(tp), "duration": rng.choice([None, 600, 3600])})
    return out


def _set_running(admin: Any, cluster: Any, projects: list[Any], percent: int, seed: int) -> int:
    """Replace the running jobs with engine-placed ones holding ``percent`` % of the GPUs."""
    import datetime as dt

    from django.db import connection, transaction
    from django.utils import timezone

    from bench.openb import load_pods
    from scheduling import selectors
    from scheduling.backends.naming import pod_name
    from scheduling.engine import ClusterState, FragmentationPolicy, Placer, WorkloadProfile, pod
    from scheduling.models import Allocation, GpuSlice, Job, JobState

    Job.objects.filter(cluster=cluster, name__startswith="run-").delete()
    _recount_gpus(cluster)
    if percent <= 0:
        return 0
    rng = random.Random(seed)
    pods = load_pods("default")
    gpu_pods = [p for p in pods if p.gpus > 0]
    inputs = selectors.cycle_inputs(cluster)
    capacity = sum(len(n.gpus) for n in inputs.snapshot.nodes)
    placer = Placer(ClusterState(inputs.snapshot),
                    FragmentationPolicy(WorkloadProfile.from_pods([p.request for p in pods])))
    specs, placements = [], []
    used, misses = 0.0, 0
    while used < capacity * percent / 100 and misses < 2000:
        tp = gpu_pods[rng.randrange(len(gpu_pods))]
        group = _group_fields(tp)
        req = pod(  # the request as the service builds it
            "x", gpu_count=group.get("gpu_count", 0), gpu_memory_mib=group.get("gpu_memory_mib", 0),
            gpu_cores_percent=group.get("gpu_cores_percent", 0), cpu_millicores=group["cpu_millicores"],
            ram_mib=group["ram_mib"], gpu_models=frozenset(group["gpu_models"]))
        pp = placer.place_pod(req)
        if pp is None:
            misses += 1
            continue
        pc = rng.choice(PRIORITY_CLASSES)
        specs.append({"project": rng.randrange(len(projects)), "priority_class": pc, "group": group,
                      "checkpoint": rng.random() < 0.3, "duration": rng.choice([None, 7200])})
        placements.append(pp)
        used += tp.gpus
    jobs = _bulk_jobs(admin, cluster, projects, specs, JobState.RUNNING, "run")
    now = timezone.now()
    with transaction.atomic():
        Job.objects.filter(pk__in=[j.pk for j in jobs]).update(
            admitted_at=now - dt.timedelta(hours=1), started_at=now - dt.timedelta(hours=1),
            reason="Running", attempts=1)
        groups = {g.job_id: g for g in selectors.PodGroup.objects.filter(job__in=jobs)}
        allocs, slices = [], []
        for job, pp in zip(jobs, placements, strict=True):
            g = groups[job.pk]
            allocs.append(Allocation(cluster=cluster, job=job, group=g, replica=0,
                                     pod_name=pod_name(job.name, job.pk, g.name, 0),
                                     node_id=inputs.nodes[pp.node], cpu_millicores=pp.cpu_millicores,
                                     ram_mib=pp.ram_mib, phase="running"))
        Allocation.objects.bulk_create(allocs, batch_size=2000)
        for a, pp in zip(allocs, placements, strict=True):
            for gg in pp.gpus:
                slices.append(GpuSlice(allocation=a, gpu_id=inputs.gpus[(pp.node, gg.index)].pk,
                                       container=gg.container, memory_mib=gg.gpu_memory_mib,
                                       cores_percent=gg.gpu_cores_percent, exclusive=gg.exclusive))
        GpuSlice.objects.bulk_create(slices, batch_size=2000)
        _recount_gpus(cluster)
    with connection.cursor() as c:
        c.execute("ANALYZE")
    return len(jobs)


def _recount_gpus(cluster: Any) -> None:
    """GPU counters = the sum of their slices (what the service maintains incrementally)."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("""
            UPDATE scheduling_gpudevice g
            SET (memory_allocated_mib, cores_allocated, sharers, exclusive_held) = (
                SELECT COALESCE(SUM(s.memory_mib), 0), COALESCE(SUM(s.cores_percent), 0), COUNT(*),
                       COALESCE(BOOL_OR(s.exclusive), false)
                FROM scheduling_gpuslice s WHERE s.gpu_id = g.id)
            WHERE g.node_id IN (SELECT id FROM scheduling_node WHERE cluster_id = %s)""",
                  [cluster.pk])


def _reset(cluster: Any, pending_ids: list[int], running_ids: list[int], decision_mark: int) -> None:
    """Undo what a cycle wrote (audit events stay: the log is append-only)."""
    from django.db import transaction

    from scheduling.models import Allocation, Job, JobState, SchedulingDecision

    with transaction.atomic():
        Allocation.objects.filter(job_id__in=pending_ids).delete()
        _recount_gpus(cluster)
        Job.objects.filter(pk__in=pending_ids).update(
            state=JobState.QUEUED, reason="", reason_kind="", queue_position=None,
            queue_length=None, admitted_at=None, attempts=0, finished_at=None, preempted_by=None)
        Job.objects.filter(pk__in=running_ids).exclude(state=JobState.RUNNING).update(
            state=JobState.RUNNING, reason="Running", preempted_by=None)
        SchedulingDecision.objects.filter(pk__gt=decision_mark).delete()


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (Linux), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    return float("nan")


def _reset_peak_rss() -> float:
    """Reset this process's peak RSS (VmHWM) to its current RSS (Linux ≥ 4.0: writing 5 to
    /proc/self/clear_refs), so the VmHWM read after the cycle is the peak *during* it, as a
    worker that runs cycles would see it. Returns the RSS before the cycle."""
    gc.collect()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return _status_mib("VmRSS")


def _measure(cluster: Any, *, drain: bool) -> dict[str, Any]:
    from django.db import connection
    from django.utils import timezone

    from scheduling import selectors, services
    from scheduling.engine.cycle import run_cycle

    t0 = time.perf_counter()
    inputs = selectors.cycle_inputs(cluster)
    snap_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if inputs.pending:
        run_cycle(inputs.snapshot, inputs.pending, inputs.tree, now=timezone.now().timestamp(),
                  running=inputs.running,
                  config=services.cycle_config(),
                  policy=services.engine_policy(cluster.placement_policy))
    engine_s = time.perf_counter() - t0
    del inputs
    queries = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal queries
        queries += 1
        return execute(sql, params, many, context)

    rss_before_mib = _reset_peak_rss()
    with connection.execute_wrapper(count):
        t0, c0 = time.perf_counter(), time.process_time()
        summary = services.cycle_run(cluster=cluster)
        cycle_s, cycle_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    rss_peak_mib = _status_mib("VmHWM")
    assert summary is not None
    # What the audit_seal task does after a cycle (Celery's broker is in memory here, so the
    # task the cycle queued does not run): sealing the cycle's audit events, timed apart.
    from tenants.audit import seal

    t0 = time.perf_counter()
    sealed = seal(wait=True)
    seal_s = time.perf_counter() - t0
    out = {"cycle_s": cycle_s, "cycle_cpu_s": cycle_cpu_s, "queries": queries, "engine_s": engine_s,
           "rss_before_mib": rss_before_mib, "rss_peak_mib": rss_peak_mib,
           "seal_s": seal_s, "sealed": sealed,
           "snapshot_s": snap_s, "admitted": len(summary.admitted), "waiting": len(summary.waiting),
           "preempting": len(summary.preempting), "rejected": len(summary.rejected),
           "conflicts": len(summary.conflicts)}
    if drain:
        total, admitted, cycles = cycle_s, len(summary.admitted), 1
        # Each cycle of the drain: wall s, admitted, preempting, conflicts (what the tail is).
        steps = [[round(cycle_s, 3), len(summary.admitted), len(summary.preempting), len(summary.conflicts)]]
        while summary is not None and summary.admitted:
            t0 = time.perf_counter()
            summary = services.cycle_run(cluster=cluster)
            took = time.perf_counter() - t0
            total += took
            cycles += 1
            admitted += len(summary.admitted) if summary else 0
            if summary is not None:
                steps.append([round(took, 3), len(summary.admitted), len(summary.preempting),
                              len(summary.conflicts)])
        out.update(drain_s=total, drain_admitted=admitted, drain_cycles=cycles, drain_steps=steps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pending", default="2000,10000,20000",
                    help="comma-separated sizes (0: an idle tick, nothing pending)")
    ap.add_argument("--alloc", default="0,50,90", help="comma-separated GPU allocation %%")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--drain", action="store_true", help="also time cycles until nothing fits")
    ap.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB))
    ap.add_argument("--label", default="", help="suffix of the JSON result file")
    args = ap.parse_args()
    sizes = [int(s) for s in args.pending.split(",")]
    allocs = [int(a) for a in args.alloc.split(",")]
    _setup_django(args.db)

    from scheduling.models import Job, JobState, SchedulingDecision

    admin, cluster, projects = _world()
    pool = list(Job.objects.filter(cluster=cluster, name__startswith="pend-").order_by(
        "submitted_at", "id").values_list("pk", flat=True))
    if len(pool) < max(sizes):
        Job.objects.filter(pk__in=pool).delete()
        _bulk_jobs(admin, cluster, projects, _pending_specs(max(sizes), 11), JobState.QUEUED, "pend")
        pool = list(Job.objects.filter(cluster=cluster, name__startswith="pend-").order_by(
            "submitted_at", "id").values_list("pk", flat=True))
    rows = []
    print(f"{'pending':>8} {'alloc %':>7} {'running':>8} {'admitted':>8} {'waiting':>8} "
          f"{'queries':>8} {'cycle s':>8} {'cpu s':>6} {'engine s':>8} {'snap s':>7} {'ratio':>6}"
          + ("  drain s (cycles, admitted)" if args.drain else ""))
    for pct in allocs:
        running_n = _set_running(admin, cluster, projects, pct, seed=5)
        running_ids = list(Job.objects.filter(cluster=cluster, name__startswith="run-")
                           .values_list("pk", flat=True))
        for n in sizes:
            ids = pool[:n]
            Job.objects.filter(pk__in=pool[n:]).update(state=JobState.CANCELLED)
            mark = SchedulingDecision.objects.order_by("-id").values_list("pk", flat=True).first() or 0
            _reset(cluster, ids, running_ids, mark)
            runs = []
            for _ in range(args.runs):
                runs.append(_measure(cluster, drain=args.drain))
                _reset(cluster, ids, running_ids, mark)
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "drain_steps"}
            row = {"pending": n, "alloc_percent": pct, "running": running_n, "median": med,
                   "runs": runs}
            rows.append(row)
            print(f"{n:>8} {pct:>7} {running_n:>8} {med['admitted']:>8.0f} {med['waiting']:>8.0f} "
                  f"{med['queries']:>8.0f} {med['cycle_s']:>8.2f} {med['cycle_cpu_s']:>6.2f} "
                  f"{med['engine_s']:>8.2f} "
                  f"{med['snapshot_s']:>7.2f} {med['cycle_s'] / max(med['engine_s'], 1e-9):>6.1f}"
                  + (f"  {med['drain_s']:.2f} ({med['drain_cycles']:.0f}, {med['drain_admitted']:.0f})"
                     if args.drain else ""), flush=True)
            print("   runs (cycle s):", ", ".join(f"{r['cycle_s']:.3f}" for r in runs),
                  "| seal after (s):", ", ".join(f"{r['seal_s']:.3f}" for r in runs),
                  "| RSS before → peak during the cycle (MiB):",
                  ", ".join(f"{r['rss_before_mib']:.0f} → {r['rss_peak_mib']:.0f}" for r in runs), flush=True)
    Job.objects.filter(pk__in=pool).update(state=JobState.CANCELLED)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"service_cycle{'_' + args.label if args.label else ''}.json"
    import resource

    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    out.write_text(json.dumps({"load_average": os.getloadavg(), "peak_rss_mib": peak_mib,
                               "rows": rows}, indent=1))
    print(f"peak RSS of this process: {peak_mib:.0f} MiB")
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()), "→", out, file=sys.stderr)


if __name__ == "__main__":
    main()
