"""Where one API or portal request spends its time (issue 13): statements, SQL time, the rest.

One request at a time, in process (Django's test client through the full middleware stack,
``camp.settings.production`` less the TLS redirect), against the database of
``bench/api_load.py`` (seeded there). For each endpoint: the median wall time of ``--repeat``
requests and the median CPU time of this process (``time.process_time``: Django, DRF, the ORM
and the client; PostgreSQL's own CPU is not in it, and the machine's load does not inflate it
the way it does wall time), the statements one request runs and their total time, and the slowest statements
(``--sql`` prints them; ``--explain`` runs EXPLAIN ANALYZE on the slowest one); for a write,
how long the audit chain's lock was held by the seal after its commit (from acquiring it to
the seal's commit; writers themselves no longer take it, round 3). A job's
"why" is its ``reason`` and queue position, part of the one-job answer. ``GC`` is the mean
CPU per request spent in CPython's cyclic collector (most requests collect nothing, the one
that sets off a full collection pays it all), and ``mean`` the mean CPU, which counts those
collections; the startup heap is frozen as the server freezes it (``camp.heap``) unless
``--no-freeze``.

    .venv/bin/python -m bench.api_profile --db postgres://postgres@127.0.0.1:5432/bench_r3i13b
    .venv/bin/python -m bench.api_profile --only submit --profile 40   # cProfile, 40 costliest
    # … and who calls the functions matching a pattern:
    PROFILE_CALLERS='identity|_order_by_pairs' .venv/bin/python -m bench.api_profile --profile 1
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import secrets
import statistics
import sys
import time
from typing import Any

from bench import service_cycle as sc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", sc.DEFAULT_DB))
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--sql", action="store_true", help="print every statement of one request")
    ap.add_argument("--explain", action="store_true", help="EXPLAIN ANALYZE the slowest statement")
    ap.add_argument("--only", default="", help="run the endpoints whose label contains this")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="cProfile the counted requests; print the N costliest functions (cumulative)")
    ap.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"],
                    help="the order of --profile's functions")
    ap.add_argument("--json", default="", help="write the figures to this file")
    ap.add_argument("--connections", choices=["persistent", "per-request", "pool"], default="persistent",
                    help="persistent: one connection for the run (no connect cost); per-request: "
                         "each request opens and closes its own (DB_CONN_MAX_AGE=0, DB_POOL_MAX_SIZE=0); "
                         "pool: DB_POOL_MAX_SIZE=4, each request takes one and gives it back")
    ap.add_argument("--no-freeze", action="store_true",
                    help="leave the startup heap to the collector (the server freezes it: camp.heap)")
    args = ap.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings.production"
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")  # production refuses an empty one
    # persistent: one connection for the whole run, no connect cost
    os.environ["DB_CONN_MAX_AGE"] = "60" if args.connections == "persistent" else "0"
    os.environ["DB_POOL_MAX_SIZE"] = "4" if args.connections == "pool" else "0"
    sc._setup_django(args.db)
    import logging

    logging.disable(logging.INFO)  # the access log's line per request is not what is measured

    from django.conf import settings
    from django.db import connection, transaction
    from django.test import Client

    from bench import api_load

    settings.ALLOWED_HOSTS = ["*"]
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = False
    # no collectstatic here: templates name static files as they are
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
    token, tenant_id, job_ids, project_id = api_load._seed(0)
    job_id = job_ids[len(job_ids) // 2]
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_ACCEPT="application/json")
    portal = Client()
    portal.force_login(api_load._owner())
    # Deep pages (issue 13, round 3): the tenant's last page by page number (OFFSET)
    # and by cursor, and the same for a platform admin's all-jobs view at row 50,000.
    from camp.pagination import _encode, _keyset
    from scheduling import selectors
    from tenants.models import User

    admin_user = User.objects.filter(is_platform_admin=True).order_by("id").first()
    admin = Client(HTTP_ACCEPT="application/json")
    admin.force_login(admin_user)

    def cursor_at(user: Any, row: int) -> str:
        qs = selectors.job_list(user=user)
        keyset = _keyset(qs)
        assert keyset is not None
        return _encode(keyset, qs[min(row, qs.count()) - 50], forward=True)

    from scheduling.models import Cluster

    tenant_pages = -(-selectors.job_list(user=api_load._owner()).count() // 50)

    cluster_id = Cluster.objects.get(name="openb").pk
    tenant_cursor, admin_cursor = cursor_at(api_load._owner(), 10**9), cursor_at(admin_user, 50000)
    group = {"name": "worker", "gpu_count": 1, "gpu_memory_mib": 2000, "gpu_cores_percent": 10}
    run = secrets.token_hex(3)
    counter = iter(range(10**9))
    endpoints: list[tuple[str, Any]] = [
        ("jobs list (project, state)",
         lambda: api.get(f"/api/v1/jobs/?project={project_id}&state=succeeded")),
        ("jobs list (project, state, page_size=500)",
         lambda: api.get(f"/api/v1/jobs/?project={project_id}&state=succeeded&page_size=500")),
        ("jobs list (tenant, no filter)", lambda: api.get("/api/v1/jobs/")),
        ("jobs list (tenant, state=running)", lambda: api.get("/api/v1/jobs/?state=running")),
        ("jobs list (tenant) last page by number", lambda: api.get(f"/api/v1/jobs/?page={tenant_pages}")),
        ("jobs list (tenant) last page by cursor", lambda: api.get(f"/api/v1/jobs/?cursor={tenant_cursor}")),
        ("all jobs (admin) page 1", lambda: admin.get("/api/v1/jobs/")),
        ("all jobs (admin) page 1000 by number", lambda: admin.get("/api/v1/jobs/?page=1000")),
        ("all jobs (admin) row 50,000 by cursor", lambda: admin.get(f"/api/v1/jobs/?cursor={admin_cursor}")),
        ("all jobs (admin) one cluster",
         lambda: admin.get(f"/api/v1/jobs/?cluster={cluster_id}&state=running")),
        ("audit list (tenant) page 100 by number",
         lambda: api.get(f"/api/v1/audit-events/?tenant={tenant_id}&page=100")),
        ("one job", lambda: api.get(f"/api/v1/jobs/{job_id}/")),
        ("its decisions", lambda: api.get(f"/api/v1/jobs/{job_id}/decisions/")),
        ("audit list (tenant)", lambda: api.get(f"/api/v1/audit-events/?tenant={tenant_id}")),
        ("portal jobs page", lambda: portal.get("/scheduling/jobs/")),
        ("portal dashboard", lambda: portal.get("/dashboard/")),
        ("submit one job", lambda: api.post(
            "/api/v1/jobs/", {"project": project_id, "cluster": "openb",
                              "name": f"p{run}-{next(counter)}", "groups": [group]},
            content_type="application/json")),
        ("bulk submit ×100", lambda: api.post(
            "/api/v1/jobs/bulk/", {"jobs": [
                {"project": project_id, "cluster": "openb", "name": f"p{run}-{next(counter)}",
                 "groups": [group]} for _ in range(100)]}, content_type="application/json")),
    ]
    gc_spent = [0.0, 0, 0]  # CPU seconds in the collector, collections, of them of generation 2
    gc_started = [0.0]

    def gc_clock(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_started[0] = time.process_time()
        else:
            gc_spent[0] += time.process_time() - gc_started[0]
            gc_spent[1] += 1
            gc_spent[2] += info["generation"] == 2

    gc.callbacks.append(gc_clock)
    if not args.no_freeze:  # as camp.asgi does once the app is loaded
        from camp.heap import freeze_web_app

        freeze_web_app()
    results: dict[str, Any] = {"load_average": os.getloadavg(),
                               "jobs": selectors.job_list(user=admin_user).count()}
    for label, call in endpoints:
        if args.only and args.only not in label:
            continue
        timings: list[float] = []
        cpu: list[float] = []
        gc_cpu: list[float] = []
        full_before = gc_spent[2]
        profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not wall
        holds: list[float] = []
        statements: list[tuple[float, str, Any]] = []
        status = 0
        for i in range(args.repeat + 1):  # the first one warms caches and is not counted
            log: list[tuple[float, str, Any]] = []

            def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any,
                        log: list[tuple[float, str, Any]] = log, holds: list[float] = holds) -> Any:
                t = time.perf_counter()
                try:
                    return execute(sql, params, many, context)
                finally:
                    log.append((time.perf_counter() - t, sql, params))
                    if "advisory_xact_lock" in sql:  # the audit chain's (sealer's) lock: held until commit
                        locked = time.perf_counter()
                        transaction.on_commit(lambda: holds.append(time.perf_counter() - locked))

            with connection.execute_wrapper(wrapper):
                if profiler is not None and i:
                    profiler.enable()
                t0, c0, g0 = time.perf_counter(), time.process_time(), gc_spent[0]
                response = call()
                if hasattr(response, "streaming_content"):
                    b"".join(response.streaming_content)
                if args.connections != "persistent":
                    connection.close()  # what request_finished does (the test client skips it)
                elapsed, spent = time.perf_counter() - t0, time.process_time() - c0
                if profiler is not None and i:
                    profiler.disable()
            status = response.status_code
            if i:
                timings.append(elapsed)
                cpu.append(spent)
                gc_cpu.append(gc_spent[0] - g0)
                statements = log
        sql_ms = sum(t for t, _, _ in statements) * 1000
        wall = statistics.median(timings) * 1000
        hold = f"  chain lock held {statistics.median(holds) * 1000:.1f} ms" if holds else ""
        cpu_ms = statistics.median(cpu) * 1000
        cpu_mean_ms = statistics.mean(cpu) * 1000  # what throughput pays, the rare collections too
        gc_ms = statistics.mean(gc_cpu) * 1000  # a mean: most requests collect nothing
        full = int(gc_spent[2] - full_before)  # full collections in this endpoint's requests
        results[label] = {"status": status, "wall_ms": wall, "cpu_ms": cpu_ms,
                          "statements": len(statements), "sql_ms": sql_ms, "cpu_ms_mean": cpu_mean_ms,
                          "gc_ms_mean": gc_ms, "full_collections": full}
        print(f"{label:<44} {status} {wall:>8.1f} ms  {cpu_ms:>7.1f} ms CPU (mean {cpu_mean_ms:5.1f})"
              f"  {len(statements):>3} statements {sql_ms:>7.1f} ms SQL  {wall - sql_ms:>7.1f} ms other"
              f"  {gc_ms:>5.1f} ms GC ({full} full){hold}", flush=True)
        if profiler is not None:
            stats = pstats.Stats(profiler)
            stats.sort_stats(args.sort).print_stats(args.profile)
            if os.environ.get("PROFILE_CALLERS"):
                stats.print_callers(os.environ["PROFILE_CALLERS"])
        if args.sql:
            for t, sql, _ in statements:
                print(f"    {t * 1000:>7.2f} ms  {sql[:int(os.environ.get('SQL_WIDTH', '220'))]}")
        if args.explain and statements:
            t, sql, params = max(statements)
            if sql.lstrip().upper().startswith("SELECT"):
                with connection.cursor() as cur:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                    print("\n".join("      " + r[0] for r in cur.fetchall()))
    results["load_average_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
