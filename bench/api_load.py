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

``--sequential N`` replaces the scenarios with one request at a time per kind (``/healthz``,
a 404 through every middleware, the reads, both portal pages, a submit), N of each after 10
unmeasured. It reports the server's CPU per request from ``/proc``, so an ASGI-path change
can be compared with a base run beside it (``--workers 1 --app-dir``).

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


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process, its reaped children and its live descendants (``/proc``:
    utime + stime, cutime + cstime; uvicorn's workers, PostgreSQL's backends)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(x) for x in fields[11:15]) / tick
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, IndexError, ValueError):  # it ended meanwhile
        return total
    return total + sum(_tree_cpu(int(c)) for c in children)


def _postmaster(db: str) -> int | None:
    """The PostgreSQL server's process on this machine, if it is here (its CPU is counted)."""
    import psycopg

    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    try:
        return int((Path(row[0]) / "postmaster.pid").read_text().split()[0]) if row else None
    except (OSError, ValueError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(db: str, static_root: str, pool: int = 0) -> dict[str, str]:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.production", "DATABASE_URL": db,
            "DB_POOL_MAX_SIZE": str(pool),
            "SECRET_KEY": secrets.token_urlsafe(50), "SECURE_SSL_REDIRECT": "0", "REDIS_URL": "",
            "ALLOWED_HOSTS": "127.0.0.1",  # production refuses an empty one
            "CELERY_BROKER_URL": "memory://", "STATIC_ROOT": static_root,
            # 0: under ASGI each request runs in its own thread, and kept connections pile up
            "DB_CONN_MAX_AGE": "0"}


def _server(db: str, port: int, app_dir: Path, static_root: str, pool: int = 0, workers: int = 2
            ) -> subprocess.Popen[bytes]:
    env = _env(db, static_root, pool)
    # The portal's pages name static files through the production manifest.
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
                   env=env, cwd=app_dir, check=True)
    # uvicorn with TCP_NODELAY on its connections (bench/uvicorn_nodelay.py: with --workers,
    # uvicorn's own socket left Nagle on and each keep-alive request waited ~40 ms).
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent / "uvicorn_nodelay.py"), "camp.asgi:application",
         "--app-dir", str(app_dir), "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
         "--log-level", "warning", "--no-access-log"],
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


async def _open_loop(base: str, mix: list[tuple[str, dict[str, str], Any]], rate: float,
                     seconds: float, counter: Any, seed: int = 1) -> dict[str, Any]:
    """An open loop: requests arrive as a Poisson process of ``rate`` a second whatever the
    server's answers (the mix's kinds in a shuffled round-robin), and each latency runs from
    the request's *scheduled* arrival, so a server (or a client) that falls behind shows as
    latency rather than as fewer requests sent (no coordinated omission)."""
    import aiohttp

    rng = random.Random(seed)
    latencies: dict[str, list[float]] = {name: [] for name, _, _ in mix}
    errors: dict[str, int] = {}
    samples: dict[str, str] = {}
    tasks: list[asyncio.Task[None]] = []
    async with aiohttp.ClientSession(base, cookie_jar=aiohttp.DummyCookieJar(),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(name: str, headers: dict[str, str], request: Any, due: float) -> None:
            method, path, body, _ = request(next(counter))
            try:
                async with session.request(method, path, json=body, headers=headers) as r:
                    text = await r.read()
                    ok, key = r.status < 400, f"{name}: {r.status}"
                    if not ok:
                        samples.setdefault(key, text[:300].decode(errors="replace"))
            except aiohttp.ClientError as exc:
                ok, key = False, f"{name}: {type(exc).__name__}"
            latencies[name].append(time.perf_counter() - due)
            if not ok:
                errors[key] = errors.get(key, 0) + 1

        order: list[tuple[str, dict[str, str], Any]] = []
        start = time.perf_counter()
        due = start
        while due < start + seconds:
            if not order:
                order = list(mix)
                rng.shuffle(order)
            name, headers, request = order.pop()
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(name, headers, request, due)))
            due += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start

    def pct(values: list[float]) -> dict[str, float]:
        q = statistics.quantiles(values, n=100) if len(values) > 1 else [values[0] if values else 0.0] * 99
        return {"n": len(values), "p50_ms": q[49] * 1000, "p95_ms": q[94] * 1000, "p99_ms": q[98] * 1000}

    every = [v for vs in latencies.values() for v in vs]
    return {"offered_per_s": rate, "requests": len(every), "answered_per_s": len(every) / wall,
            "errors": errors, "error_samples": samples, **pct(every),
            "by_kind": {k: pct(v) for k, v in latencies.items()}}


async def _sequential(base: str, mix: list[tuple[str, dict[str, str], Any]], n: int, server_pid: int,
                      warm: int = 10) -> dict[str, Any]:
    """One request at a time on one kept-alive connection, ``warm`` unmeasured then ``n`` per
    kind: the server's CPU per request (``/proc``, all its processes and threads) and the
    latency's median. No queueing, so this is what one request costs the server over HTTP."""
    import aiohttp

    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(base, cookie_jar=aiohttp.DummyCookieJar(),
                                     connector=aiohttp.TCPConnector(limit=1)) as session:
        counter = itertools.count()
        for name, headers, request in mix:
            latencies: list[float] = []
            statuses: dict[int, int] = {}
            for i in range(warm + n):
                if i == warm:
                    cpu0 = _tree_cpu(server_pid)
                method, path, body, _ = request(next(counter))
                t0 = time.perf_counter()
                async with session.request(method, path, json=body, headers=headers) as r:
                    await r.read()
                    if i >= warm:
                        statuses[r.status] = statuses.get(r.status, 0) + 1
                if i >= warm:
                    latencies.append(time.perf_counter() - t0)
            out[name] = {"n": n, "server_cpu_ms": (_tree_cpu(server_pid) - cpu0) * 1000 / n,
                         "p50_ms": statistics.median(latencies) * 1000, "statuses": statuses}
            print(f"  {name:<34} server CPU {out[name]['server_cpu_ms']:>6.2f} ms/request  "
                  f"p50 {out[name]['p50_ms']:>6.2f} ms  {statuses}", flush=True)
    return out


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
    ap.add_argument("--pool", type=int, default=8,
                    help="DB_POOL_MAX_SIZE for the server (a psycopg pool of this many per worker; "
                         "8, the product's default; 0: none, a connection per request)")
    ap.add_argument("--rate", default="",
                    help="comma-separated requests/s: run the open-loop mix at each rate for --seconds "
                         "instead of the closed-loop scenarios")
    ap.add_argument("--sequential", type=int, default=0,
                    help="N: instead of the scenarios, send each kind N times one at a time and report "
                         "the server's CPU per request (after 10 unmeasured); best with --workers 1")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    args = ap.parse_args()
    sc._setup_django(args.db)
    token, tenant_id, job_ids, project_id = _seed(args.jobs)
    from django.db import connections

    from scheduling.models import Job

    rows = Job.objects.count()
    connections.close_all()
    port = _free_port()
    static_root = tempfile.mkdtemp(prefix="camp-bench-static-")
    server = _server(args.db, port, args.app_dir, static_root, args.pool, args.workers)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):  # until uvicorn listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.3)
        time.sleep(2)  # every worker up
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
        out: dict[str, Any] = {"rows": rows, "clients": args.clients, "seconds": args.seconds,
                               "think": args.think, "app_dir": str(args.app_dir)}
        if args.sequential:
            probes: list[tuple[str, dict[str, str], Any]] = [
                ("/healthz (first middleware)", {}, lambda i: ("GET", "/healthz", None, 1)),
                ("404 under /api/v1/ (no view)", api, lambda i: ("GET", "/api/v1/no-such-thing/", None, 1)),
                *[(name, headers, req) for name, headers, req in scenarios
                  if name.startswith(("read: ", "portal: ")) or name == "submit single"]]
            out["sequential"] = asyncio.run(_sequential(base, probes, args.sequential, server.pid))
            out["sequential_workers"] = args.workers
            scenarios = []
        if args.rate:
            # The open-loop mix: each read of the read mix, both portal pages and a single
            # submit, in equal shares (bulk submits left out: one request is 100 jobs).
            mix = [(name, headers, req) for name, headers, req in scenarios
                   if name.startswith(("read: ", "portal: ")) or name == "submit single"]
            out["open_loop"] = []
            numbers = itertools.count()  # across rates: a submit's name is never used twice
            pg = _postmaster(args.db)
            for rate in [float(r) for r in args.rate.split(",") if r.strip()]:
                watch = _Connections(args.db)
                watch.start()
                cpu0 = (_tree_cpu(server.pid), _tree_cpu(pg) if pg else 0.0, time.process_time())
                res = asyncio.run(_open_loop(base, mix, rate, args.seconds, numbers))
                n = max(1, res["requests"])
                res["cpu_ms_per_request"] = {
                    "server": (_tree_cpu(server.pid) - cpu0[0]) * 1000 / n,
                    "postgresql": (_tree_cpu(pg) - cpu0[1]) * 1000 / n if pg else None,
                    "load_generator": (time.process_time() - cpu0[2]) * 1000 / n}
                watch.stop.set()
                watch.join()
                res["db_connections_peak"] = watch.peak
                res["load_average"] = os.getloadavg()
                out["open_loop"].append(res)
                print(f"open loop {rate:>6.1f}/s offered: {res['answered_per_s']:>6.1f}/s answered "
                      f"p50 {res['p50_ms']:>7.1f} ms  p95 {res['p95_ms']:>7.1f} ms  "
                      f"p99 {res['p99_ms']:>7.1f} ms  errors {res['errors']}  db conns ≤ {watch.peak}  "
                      f"load {res['load_average'][0]:.1f}; CPU ms per request: " + ", ".join(
                          f"{k} {v:.1f}" for k, v in res["cpu_ms_per_request"].items() if v is not None),
                      flush=True)
                for kind, q in res["by_kind"].items():
                    print(f"    {kind:<34} {q['n']:>6}  p50 {q['p50_ms']:>7.1f}  p95 {q['p95_ms']:>7.1f}  "
                          f"p99 {q['p99_ms']:>7.1f}", flush=True)
            scenarios = []
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
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
