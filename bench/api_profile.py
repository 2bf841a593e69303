"""Where one API or portal request spends its time (issue 13): statements, SQL time, the rest.

One request at a time, in process (Django's test client through the full middleware stack,
``camp.settings.production`` less the TLS redirect), against the database of
``bench/api_load.py`` (seeded there). For each endpoint: the median wall time of ``--repeat``
requests, the statements one request runs and their total time, and the slowest statements
(``--sql`` prints them; ``--explain`` runs EXPLAIN ANALYZE on the slowest one); for a write,
how long the audit chain's lock was held (from acquiring it to the commit). A job's
"why" is its ``reason`` and queue position, part of the one-job answer.

    .venv/bin/python -m bench.api_profile --db postgres://postgres@127.0.0.1:5432/bench_r3i13b
"""

from __future__ import annotations

import argparse
import os
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
    args = ap.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings.production"
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    os.environ["DB_CONN_MAX_AGE"] = "60"  # one connection for the whole run: no connect cost
    sc._setup_django(args.db)

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
    group = {"name": "worker", "gpu_count": 1, "gpu_memory_mib": 2000, "gpu_cores_percent": 10}
    run = secrets.token_hex(3)
    counter = iter(range(10**9))
    endpoints: list[tuple[str, Any]] = [
        ("jobs list (project, state)",
         lambda: api.get(f"/api/v1/jobs/?project={project_id}&state=succeeded")),
        ("jobs list (project, state, page_size=500)",
         lambda: api.get(f"/api/v1/jobs/?project={project_id}&state=succeeded&page_size=500")),
        ("jobs list (tenant, no filter)", lambda: api.get("/api/v1/jobs/")),
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
    for label, call in endpoints:
        if args.only and args.only not in label:
            continue
        timings: list[float] = []
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
                    if "pg_advisory_xact_lock" in sql:  # the audit chain's lock: held until commit
                        locked = time.perf_counter()
                        transaction.on_commit(lambda: holds.append(time.perf_counter() - locked))

            with connection.execute_wrapper(wrapper):
                t0 = time.perf_counter()
                response = call()
                if hasattr(response, "streaming_content"):
                    b"".join(response.streaming_content)
                elapsed = time.perf_counter() - t0
            status = response.status_code
            if i:
                timings.append(elapsed)
                statements = log
        sql_ms = sum(t for t, _, _ in statements) * 1000
        wall = statistics.median(timings) * 1000
        hold = f"  chain lock held {statistics.median(holds) * 1000:.1f} ms" if holds else ""
        print(f"{label:<44} {status} {wall:>8.1f} ms  {len(statements):>3} statements "
              f"{sql_ms:>7.1f} ms SQL  {wall - sql_ms:>7.1f} ms other{hold}", flush=True)
        if args.sql:
            for t, sql, _ in statements:
                print(f"    {t * 1000:>7.2f} ms  {sql[:220]}")
        if args.explain and statements:
            t, sql, params = max(statements)
            if sql.lstrip().upper().startswith("SELECT"):
                with connection.cursor() as cur:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                    print("\n".join("      " + r[0] for r in cur.fetchall()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
