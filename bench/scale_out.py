"""Scale out on Celery (issue 35, target 4): many clusters' cycles and the placement step spread
over worker processes, end to end through the product's own tasks.

Setup (once, in a *seed* database): ``--clusters`` simulated clusters, each the openb inventory
(1,213 nodes, 6,212 GPUs; ``--stride k`` keeps every k-th node for a quick run), synced by
``inventory_sync``; the 20 × 10 projects of ``bench/service_cycle.py`` with quotas scaled to the
whole estate; ``--pending`` jobs drawn as in that bench, ``--floating`` of them in the global
queue (the placement step chooses their cluster), the rest pinned round-robin to the clusters.

Per run: a fresh database copied from the seed (``CREATE DATABASE … TEMPLATE``: every run starts
from the same rows), an emptied Redis database, then a real ``celery beat`` (the product's
schedule: a scheduler tick every ``SCHEDULER_TICK_SECONDS``) and one real ``celery worker``
with ``--concurrency W`` prefork processes; nothing else drives it. The run ends when no job
was admitted for ``--quiet`` seconds. Reported per W: time from the beat's start to the last
admission (``max(admitted_at)``), jobs admitted, cycles that admitted something, CPU seconds of
the worker and beat processes (``RUSAGE_CHILDREN``; PostgreSQL's own time is not in it).

    .venv/bin/python -m bench.scale_out --clusters 2 --stride 8 --pending 4000 --workers 1,2
    .venv/bin/python -m bench.scale_out --clusters 8 --pending 50000 --workers 1,2,4 --runs 2

(PostgreSQL at ``--db``'s server, default the local one; Redis at ``--redis``, default
redis://127.0.0.1:6379/13, flushed per run.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.service_cycle import (
    PROJECTS_PER_TENANT,
    RESULTS,
    TENANTS,
    _bulk_jobs,
    _inventory_yaml,
    _pending_specs,
    tenants_and_projects,
)

ROOT = Path(__file__).resolve().parent.parent
SERVER = "postgres://postgres@127.0.0.1:5432"


def _psql(sql: str, *, db: str = "postgres", params: tuple[Any, ...] = ()) -> Any:
    import psycopg

    with psycopg.connect(f"{SERVER}/{db}", autocommit=True) as conn:
        cur = conn.execute(sql.encode(), params)  # type: ignore[call-overload]
        return cur.fetchall() if cur.description else None


def _stride_inventory(stride: int) -> str:
    if stride <= 1:
        return _inventory_yaml()
    head, _, body = _inventory_yaml().partition("nodes:\n")
    nodes = [line for line in body.splitlines() if line.strip()]
    return head + "nodes:\n" + "\n".join(nodes[::stride]) + "\n"


def _close_pools(connections: Any) -> None:
    """Every alias's connections closed, pooled ones too: each run copies the seed database as
    a template, which PostgreSQL refuses while anyone is connected to it."""
    for conn in connections.all():
        conn.close()
        if getattr(conn, "pool", None) is not None:
            conn.close_pool()


def _seed(name: str, clusters: int, stride: int, pending: int, floating: float) -> dict[str, Any]:
    """The seed database (made once; reused while its shape matches)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings"
    os.environ["DATABASE_URL"] = f"{SERVER}/{name}"
    os.environ["REDIS_URL"] = ""
    os.environ["CELERY_BROKER_URL"] = "memory://"  # seeding sends nothing anywhere
    if not _psql("SELECT 1 FROM pg_database WHERE datname = %s", params=(name,)):
        _psql(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    from scheduling import services
    from scheduling.models import Cluster, GpuDevice, Job, JobState
    from tenants.models import User

    call_command("migrate", verbosity=0)
    if Job.objects.count() == pending and Cluster.objects.count() == clusters:
        gpus = GpuDevice.objects.count()
        _close_pools(connections)
        return {"gpus": gpus, "reused": True}
    admin, _ = User.objects.get_or_create(username="bench-admin",
                                          defaults={"is_platform_admin": True, "is_superuser": True})
    inventory = _stride_inventory(stride)
    made = []
    for i in range(clusters):
        cluster = services.cluster_create(actor=admin, name=f"so-{i:02d}", backend="simulated",
                                          inventory=inventory)
        t0 = time.perf_counter()
        services.inventory_sync(cluster=cluster)
        print(f"seed: cluster {cluster.name} synced in {time.perf_counter() - t0:.1f} s", flush=True)
        made.append(cluster)
    gpus = GpuDevice.objects.count()
    projects = tenants_and_projects(gpus / (TENANTS * PROJECTS_PER_TENANT), limit_factor=2)
    rng = random.Random(7)
    specs = _pending_specs(pending, 11)
    for i, spec in enumerate(specs):
        spec["cluster"] = None if rng.random() < floating else made[i % clusters]
    for start in range(0, len(specs), 10_000):
        _bulk_jobs(admin, None, projects, specs[start:start + 10_000], JobState.QUEUED, f"so{start}")
        print(f"seed: {min(start + 10_000, len(specs))} jobs written", flush=True)
    with connection.cursor() as c:
        c.execute("ANALYZE")
    _close_pools(connections)
    return {"gpus": gpus, "reused": False}


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "camp", *args], env=env,
                            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def task_metrics(redis_url: str) -> dict[str, dict[str, float]]:
    """Per task: how many ran and the seconds the worker spent in them, from the counters every
    worker process keeps in Redis (``camp.taskmetrics``; what /metrics reports)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    out: dict[str, dict[str, float]] = {}
    for key in client.scan_iter(match="*:celery:tasks"):
        for field, count in client.hgetall(key).items():
            name = _text(field).partition("\t")[0]
            out.setdefault(name, {"runs": 0, "seconds": 0.0})["runs"] += int(count)
    for key in client.scan_iter(match="*:celery:runtime"):
        for field, seconds in client.hgetall(key).items():
            out.setdefault(_text(field), {"runs": 0, "seconds": 0.0})["seconds"] += float(seconds)
    for figures in out.values():
        figures["seconds"] = round(figures["seconds"], 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def _run(seed: str, workers: int, redis_url: str, quiet: float, timeout: float) -> dict[str, Any]:
    import redis

    run_db = f"{seed}_run"
    _psql(f'DROP DATABASE IF EXISTS "{run_db}" WITH (FORCE)')
    _psql(f'CREATE DATABASE "{run_db}" TEMPLATE "{seed}"')
    redis.Redis.from_url(redis_url).flushdb()
    tmp = Path(tempfile.mkdtemp(prefix="camp-scale-out-"))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings",
           "DATABASE_URL": f"{SERVER}/{run_db}", "REDIS_URL": redis_url,
           "CELERY_BROKER_URL": redis_url, "CAMP_LIVENESS_DIR": str(tmp)}
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker = _start(["worker", "--pool=prefork", f"--concurrency={workers}", "--loglevel=WARNING",
                     "--without-gossip", "--without-mingle", "-n", f"scale-{workers}@localhost"],
                    env, tmp / "worker.log")
    # The worker first (its boot is not the scheduler's time), then the beat starts the clock.
    deadline = time.monotonic() + 60
    while "ready" not in (tmp / "worker.log").read_text(errors="replace") and time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker died: {(tmp / 'worker.log').read_text()[-2000:]}")
        time.sleep(0.5)
    t0 = time.time()
    beat = _start(["beat", "--loglevel=WARNING", "-s", str(tmp / "beat-schedule")], env,
                  tmp / "beat.log")
    # Done when nothing was admitted for ``quiet`` s *and* every cluster has finished two more
    # cycles since the last admission (its ``last_cycle_at`` moved twice): a long cycle still
    # running on a loaded machine is not mistaken for the end.
    last_n, last_change = -1, time.monotonic()
    seen: dict[str, set[Any]] = {}
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            time.sleep(1)
            n = _psql("SELECT count(*) FROM scheduling_job WHERE admitted_at IS NOT NULL",
                      db=run_db)[0][0]
            marks = _psql("SELECT name, last_cycle_at FROM scheduling_cluster", db=run_db)
            if n != last_n:
                last_n, last_change = n, time.monotonic()
                seen = {name: {at} for name, at in marks}
                print(f"  W={workers}: {n} admitted at +{time.time() - t0:.0f} s", flush=True)
                continue
            for name, at in marks:
                seen.setdefault(name, set()).add(at)
            if (n > 0 and time.monotonic() - last_change >= quiet
                    and all(len(v) >= 3 for v in seen.values())):
                break
    finally:
        _stop(beat)
        _stop(worker)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    (admitted, first, last), = _psql(
        "SELECT count(*), min(admitted_at), max(admitted_at) FROM scheduling_job "
        "WHERE admitted_at IS NOT NULL", db=run_db)
    cycles = _psql("SELECT count(DISTINCT (cluster_id, date_trunc('second', created_at))) "
                   "FROM scheduling_schedulingdecision WHERE kind = 'admitted'", db=run_db)[0][0]
    per_cluster = _psql(
        "SELECT c.name, count(j.id), extract(epoch FROM max(j.admitted_at)) FROM scheduling_job j "
        "JOIN scheduling_cluster c ON c.id = j.cluster_id WHERE j.admitted_at IS NOT NULL "
        "GROUP BY c.name ORDER BY c.name", db=run_db)
    # what was never admitted (their state and reason), and what each task cost the worker
    left = _psql("SELECT id, state, cluster_id IS NULL, left(reason, 200) FROM scheduling_job "
                 "WHERE admitted_at IS NULL ORDER BY id LIMIT 5", db=run_db)
    return {"workers": workers, "admitted": admitted,
            "not_admitted": [{"id": i, "state": st, "unbound": u, "reason": r} for i, st, u, r in left],
            "tasks": task_metrics(redis_url),
            "to_first_s": first.timestamp() - t0 if first else None,
            "to_last_s": last.timestamp() - t0 if last else None,
            "admitting_cycles": cycles,
            "cpu_s": (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
            "per_cluster": {name: {"admitted": k, "last_s": round(float(t) - t0, 1)}
                            for name, k, t in per_cluster},
            "timed_out": time.monotonic() >= end}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", type=int, default=8)
    ap.add_argument("--stride", type=int, default=1, help="keep every k-th node of openb")
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--floating", type=float, default=0.2, help="share of jobs in the global queue")
    ap.add_argument("--workers", default="1,2,4", help="comma-separated worker process counts")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--quiet", type=float, default=20.0, help="s without an admission that end a run")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    # A SIGTERM (a timeout) ends the run through its ``finally``: beat and worker stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = f"bench_scale_{args.clusters}c_s{args.stride}_{args.pending}p_{round(args.floating * 100)}f"
    info = _seed(seed, args.clusters, args.stride, args.pending, args.floating)
    print(f"seed {seed}: {info['gpus']} GPUs, {args.pending} pending "
          f"({'reused' if info['reused'] else 'made'})", flush=True)
    rows: list[dict[str, Any]] = []
    for w in [int(x) for x in args.workers.split(",")]:
        runs = [_run(seed, w, args.redis, args.quiet, args.timeout) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs if r[k] is not None)
               for k in ("admitted", "to_first_s", "to_last_s", "admitting_cycles", "cpu_s")}
        rows.append({"workers": w, "median": med, "runs": runs})
        print(f"W={w}: admitted {med['admitted']:.0f}, first +{med['to_first_s']:.1f} s, "
              f"last +{med['to_last_s']:.1f} s, admitting cycles {med['admitting_cycles']:.0f}, "
              f"worker CPU {med['cpu_s']:.1f} s  (runs, last s: "
              + ", ".join(f"{r['to_last_s']:.1f}" for r in runs if r["to_last_s"] is not None)
              + ")", flush=True)
    base = rows[0]["median"]["to_last_s"]
    for r in rows[1:]:
        print(f"speed-up W={r['workers']} vs W={rows[0]['workers']}: "
              f"{base / r['median']['to_last_s']:.2f}x")
    load = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"scale_out{'_' + args.label if args.label else ''}.json"
    out.write_text(json.dumps({"args": vars(args), "gpus": info["gpus"], "load_average": load,
                               "rows": rows}, indent=1, default=str))
    print("load average:", " ".join(f"{x:.2f}" for x in load), "→", out, file=sys.stderr)


if __name__ == "__main__":
    main()
