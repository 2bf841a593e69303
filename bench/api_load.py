"""API latency and submit throughput under load (issue 13), against uvicorn on loopback.

Setup (in the database of ``bench/service_cycle.py``, default ``bench_i13``): the openb
cluster and 200 projects of that benchmark, at least ``--jobs`` job rows (finished ones
written in bulk with the rows ``job_submit`` writes, audit events included) and about
1,000 running ones. The server is ``uvicorn camp.asgi:application --workers 2`` on
127.0.0.1 with ``camp.settings.production`` (DEBUG off; TLS redirect off since loopback is
plain HTTP; static files collected once into a temporary directory; Celery's broker in
memory, so cycles requested by submits are not run; ``DB_CONN_MAX_AGE=0``). ``--app-dir``
runs the server from another checkout (a ``git archive`` of an older commit) to compare.

Clients: ``--clients`` asyncio/aiohttp tasks for ``--seconds`` per scenario, all requests
counted (errors too). API scenarios use a tenant owner's API token; the portal ones the
same user's session, logged in once through the login form (CSRF token and cookie, as a
browser does). Each client sends its next request as soon as the last one is answered
(a closed loop: latency then grows with the clients until the CPU is saturated), or
``--think`` seconds later. The largest number of PostgreSQL connections seen during each
scenario (``pg_stat_activity``, sampled every 0.5 s) is reported.

Scenarios: read mix (jobs list filtered by project and state, one job, its decisions,
audit events of the tenant); each of them alone; the portal's jobs page and dashboard;
single submits (``POST /jobs/``); bulk submits of ``--batch`` jobs (``POST /jobs/bulk/``).

    .venv/bin/python -m bench.api_load --db postgres://postgres@127.0.0.1:5439/bench_api \
        --jobs 100000 --clients 50 --seconds 60
    .venv/bin/python -m bench.api_load --jobs 20000 --clients 20 --seconds 10   # quick

50 clients hold up to ~60 server connections: run it against a PostgreSQL of its own (the
commands in docs/BENCHMARKS.md §6), not a shared one.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import service_cycle as sc

RESULTS = Path(__file__).resolve().parent / "results"
OWNER_PASSWORD = secrets.token_urlsafe(24)  # set on the bench owner by each run (_seed)


def _seed(min_jobs: int) -> tuple[str, int, list[int], int]:
    """A tenant owner's token, their tenant id, some job ids of theirs, a project id."""
    from scheduling.models import Job, JobState
    from tenants import services as tenant_services
    from tenants.models import Membership, Role, User

    admin, cluster, projects = sc._world()
    have = Job.objects.filter(cluster=cluster).count()
    if have < min_jobs:
        specs = sc._pending_specs(min_jobs - have, seed=have)
        for i in range(0, len(specs), 10_000):
            jobs = sc._bulk_jobs(admin, cluster, projects, specs[i:i + 10_000], JobState.SUCCEEDED,
                                 f"done{have + i}")
            Job.objects.filter(pk__in=[j.pk for j in jobs]).update(reason="All pods succeeded")
    if Job.objects.filter(cluster=cluster, state=JobState.RUNNING).count() < 900:
        sc._set_running(admin, cluster, projects, 15, seed=9)
    tenant = projects[0].tenant
    owner, _ = User.objects.get_or_create(username="bench-owner")
    owner.set_password(OWNER_PASSWORD)
    owner.save(update_fields=["password"])
    Membership.objects.get_or_create(user=owner, tenant=tenant, project=None,
                                     defaults={"role": Role.TENANT_OWNER})
    _, token = tenant_services.token_create(actor=owner, name=f"bench-{secrets.token_hex(4)}")
    ids = list(Job.objects.filter(tenant=tenant).order_by("-id").values_list("pk", flat=True)[:200])
    return token, tenant.pk, ids, projects[0].pk


def _owner() -> Any:
    """The tenant owner whose token and session the clients use."""
    from tenants.models import User

    return User.objects.get(username="bench-owner")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(db: str, static_root: str) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production", "DATABASE_URL": db,
            "SECRET_KEY": secrets.token_urlsafe(50), "SECURE_SSL_REDIRECT": "0", "REDIS_URL": "",
            "ALLOWED_HOSTS": "127.0.0.1",  # production refuses an empty one
            "CELERY_BROKER_URL": "memory://", "STATIC_ROOT": static_root,
            # 0: under ASGI each request runs in its own thread, and kept connections pile up
            "DB_CONN_MAX_AGE": "0"}


def _server(db: str, port: int, app_dir: Path, static_root: str) -> subprocess.Popen[bytes]:
    env = _env(db, static_root)
    # The portal's pages name static files through the production manifest.
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                   env=env, cwd=app_dir, check=True)
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "camp.asgi:application", "--host", "127.0.0.1", "--port",
         str(port), "--workers", "2", "--log-level", "warning", "--no-access-log"],
        env=env, start_new_session=True, cwd=app_dir)


async def _login(base: str) -> str:
    """A session cookie for the bench owner, through the login form as a browser gets it."""
    import aiohttp

    # Production cookies are Secure; on plain-HTTP loopback they are carried by hand.
    async with aiohttp.ClientSession(base, cookie_jar=aiohttp.DummyCookieJar()) as session:
        async with session.get("/login/") as r:
            page = await r.text()
            csrf_cookie = r.cookies["csrftoken"].value
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert match, "no CSRF token on the login page"
        async with session.post(
                "/login/", data={"username": "bench-owner", "password": OWNER_PASSWORD,
                                 "csrfmiddlewaretoken": match.group(1)},
                headers={"Cookie": f"csrftoken={csrf_cookie}", "Referer": f"{base}/login/"},
                allow_redirects=False) as r:
            assert r.status == 302 and "sessionid" in r.cookies, f"login failed: {r.status}"
            return f"sessionid={r.cookies['sessionid'].value}; csrftoken={csrf_cookie}"


class _Connections(threading.Thread):
    """The largest ``count(*) FROM pg_stat_activity`` seen while it runs (every 0.5 s), and
    the mean number of sessions then waiting for an advisory lock (the audit chain's)."""

    def __init__(self, db: str) -> None:
        super().__init__(daemon=True)
        self.db, self.peak, self.stop = db, 0, threading.Event()
        self.lock_waits: list[int] = []

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.db, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute("SELECT count(*), count(*) FILTER (WHERE wait_event = 'advisory') "
                                   "FROM pg_stat_activity").fetchone()
                if row:
                    self.peak = max(self.peak, int(row[0]))
                    self.lock_waits.append(int(row[1]))
                self.stop.wait(0.5)


async def _run(base: str, headers: dict[str, str], clients: int, seconds: float, think: float,
               request: Any) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    errors: dict[str, int] = {}
    items = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(base, headers=headers, cookie_jar=aiohttp.DummyCookieJar(),
                                     connector=aiohttp.TCPConnector(limit=clients)) as session:
        counter = itertools.count()

        async def client() -> None:
            nonlocal items
            while time.monotonic() < deadline:
                method, path, body, n = request(next(counter))
                t0 = time.perf_counter()
                try:
                    async with session.request(method, path, json=body) as r:
                        await r.read()
                        ok = r.status < 400
                        key = str(r.status)
                except aiohttp.ClientError as exc:
                    ok, key = False, type(exc).__name__
                latencies.append(time.perf_counter() - t0)
                if ok:
                    items += n
                else:
                    errors[key] = errors.get(key, 0) + 1
                if think:
                    await asyncio.sleep(think)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {"requests": len(latencies), "errors": errors, "items_per_s": items / wall,
            "req_per_s": len(latencies) / wall, "p50_ms": q[49] * 1000, "p95_ms": q[94] * 1000,
            "p99_ms": q[98] * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=100_000, help="job rows at least")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds each client waits between requests (0: a closed loop)")
    ap.add_argument("--batch", type=int, default=100, help="jobs per bulk submit")
    ap.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", sc.DEFAULT_DB))
    ap.add_argument("--app-dir", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout whose code the server runs (default: this one)")
    ap.add_argument("--only", default="", help="comma-separated words: run the scenarios naming one")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    sc._setup_django(args.db)
    token, tenant_id, job_ids, project_id = _seed(args.jobs)
    from django.db import connections

    from scheduling.models import Job

    rows = Job.objects.count()
    connections.close_all()
    port = _free_port()
    static_root = tempfile.mkdtemp(prefix="camp-bench-static-")
    server = _server(args.db, port, args.app_dir, static_root)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):  # until uvicorn listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        time.sleep(2)  # both workers up
        api = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        portal = {"Cookie": asyncio.run(_login(base)), "Accept": "text/html"}
        rng = random.Random(1)
        reads = [
            lambda i: ("GET", f"/api/v1/jobs/?project={project_id}&state=succeeded", None, 1),
            lambda i: ("GET", f"/api/v1/jobs/{rng.choice(job_ids)}/", None, 1),
            lambda i: ("GET", f"/api/v1/jobs/{rng.choice(job_ids)}/decisions/", None, 1),
            lambda i: ("GET", f"/api/v1/audit-events/?tenant={tenant_id}", None, 1),
        ]
        run_id = secrets.token_hex(3)
        group = {"name": "worker", "gpu_count": 1, "gpu_memory_mib": 2000, "gpu_cores_percent": 10}

        def single(i: int) -> tuple[str, str, Any, int]:
            return ("POST", "/api/v1/jobs/", {"project": project_id, "cluster": "openb",
                                              "name": f"s{run_id}-{i}", "groups": [group]}, 1)

        def bulk(i: int) -> tuple[str, str, Any, int]:
            return ("POST", "/api/v1/jobs/bulk/", {"jobs": [
                {"project": project_id, "cluster": "openb", "name": f"b{run_id}-{i}-{k}",
                 "groups": [group]} for k in range(args.batch)]}, args.batch)

        scenarios: list[tuple[str, dict[str, str], Any]] = [
            ("read mix", api, lambda i: reads[i % len(reads)](i)),
            *[(f"read: {p}", api, r) for p, r in zip(
                ["jobs list (project, state)", "one job", "decisions", "audit list"], reads, strict=True)],
            ("portal: jobs page", portal, lambda i: ("GET", "/scheduling/jobs/", None, 1)),
            ("portal: dashboard", portal, lambda i: ("GET", "/dashboard/", None, 1)),
            ("submit single", api, single),
            (f"submit bulk ×{args.batch}", api, bulk),
        ]
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        out: dict[str, Any] = {"rows": rows, "clients": args.clients, "seconds": args.seconds,
                               "think": args.think, "app_dir": str(args.app_dir)}
        for name, headers, req in scenarios:
            if wanted and not any(w in name for w in wanted):
                continue
            watch = _Connections(args.db)
            watch.start()
            res = asyncio.run(_run(base, headers, args.clients, args.seconds, args.think, req))
            watch.stop.set()
            watch.join()
            res["db_connections_peak"] = watch.peak
            res["advisory_lock_waiters_mean"] = statistics.fmean(watch.lock_waits or [0])
            res["load_average"] = os.getloadavg()
            out[name] = res
            print(f"{name:<32} {res['requests']:>7} req {res['req_per_s']:>7.1f}/s "
                  f"{res['items_per_s']:>8.1f} items/s  p50 {res['p50_ms']:>7.1f} ms  "
                  f"p95 {res['p95_ms']:>7.1f} ms  p99 {res['p99_ms']:>7.1f} ms  errors {res['errors']}  "
                  f"db conns ≤ {watch.peak} (lock waits {res['advisory_lock_waiters_mean']:.1f})  "
                  f"load {res['load_average'][0]:.1f}", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        shutil.rmtree(static_root, ignore_errors=True)
    out["load_average"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"api_load{'_' + args.label if args.label else ''}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"{rows} job rows; load average", " ".join(f"{x:.2f}" for x in os.getloadavg()), "→", path)


if __name__ == "__main__":
    main()
