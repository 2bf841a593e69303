"""Submit → running on a live cluster while two other clusters' API servers are dead (issue 11
bug 6; issue 27 finding 6).

A real Celery worker (prefork, 2 processes), PostgreSQL and Redis, as in the integration tests;
this script plays beat: every periodic task of ``CELERY_BEAT_SCHEDULE`` that calls a cluster or
fans out to one (``scheduler_tick`` every ``--tick`` s, ``inventory_tick`` and
``services_sweep`` every 60 s, ``utilization_tick`` and ``workspaces_tick`` every 30 s, all of
them at each run's start; ``--every-tick``: all of them every tick, the worst case). Per run a
one-GPU job is submitted to a live simulated cluster and timed until it is RUNNING, with no
other cluster and with two dead Kubernetes clusters beside it: one hung (accepts TCP, never
answers) and one refusing connections. The two settings alternate run by run (the machine's
load moves); each run with the dead clusters starts them fresh (never seen failing: every
periodic task meets them for the first time; ``--steady``: only before the first run, then
they back off as they would). Medians over ``--runs``.

    .venv/bin/python -m bench.dead_clusters --runs 7
    .venv/bin/python -m bench.dead_clusters --runs 7 --steady
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PERIODS = {"inventory": 60.0, "sweep": 60.0, "utilization": 30.0, "workspaces": 30.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tick", type=float, default=3.0)
    parser.add_argument("--every-tick", action="store_true",
                        help="send every periodic task every tick (not at its own period)")
    parser.add_argument("--steady", action="store_true",
                        help="the dead clusters start fresh only before the first run (then they "
                             "back off as they would), not before every run")
    parser.add_argument("--out", default="dead_clusters.json")
    args = parser.parse_args()

    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings.test"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    db = connection.creation.create_test_db(verbosity=0, keepdb=False)
    try:
        results = _run(args)
    finally:
        connection.creation.destroy_test_db(db, verbosity=0)
    load = os.getloadavg()
    print(f"{'dead clusters':>22} | {'median s':>8} | runs")
    for mode, times in results["runs"].items():
        print(f"{mode:>22} | {statistics.median(times):8.1f} | {', '.join(f'{t:.1f}' for t in times)}")
    print(f"connections to the hung server: {results['hung_connections']}; "
          f"load average: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(
        {**results, "tick_s": args.tick, "every_tick": args.every_tick, "steady": args.steady,
         "loadavg": load}, indent=2))


def _run(args: argparse.Namespace) -> dict[str, Any]:
    from scheduling import services, tasks
    from scheduling.models import Cluster, Job, JobState
    from tenants.models import User
    from tests.conftest import _tenant_world
    from tests.integration.realkube.dead import hung_api_server, refusing_api_server
    from tests.integration.scheduling.conftest import SMALL_INVENTORY
    from tests.integration.scheduling.test_concurrency import celery_worker
    from workspaces import tasks as wtasks

    admin = User.objects.create(username="bench-admin", is_platform_admin=True)
    world = _tenant_world(admin, "acme")
    live = services.cluster_create(actor=admin, name="live", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=live)
    modes = ("0", "2 (1 hung, 1 refusing)")
    out: dict[str, list[float]] = {m: [] for m in modes}
    n = 0
    with hung_api_server() as (hung_url, connections), refusing_api_server() as refused_url:
        dead = [services.cluster_create(actor=admin, name=name, backend="kubernetes", api_server=url,
                                        credentials={"token": "t"}, verify=False, enabled=False)
                for name, url in (("hung", hung_url), ("refusing", refused_url))]
        ids = [c.pk for c in dead]
        with celery_worker():
            for _ in range(args.runs):
                for mode in modes:
                    Cluster.objects.filter(pk__in=ids).update(enabled=mode != "0")
                    if not args.steady or n == 0:  # fresh: never seen failing
                        Cluster.objects.filter(pk__in=ids).update(
                            failures=0, retry_at=None, unreachable_since=None, last_error="")
                    services.cycle_request_taken(live.pk)
                    n += 1
                    start = time.monotonic()
                    sent = {k: -1e9 for k in PERIODS}
                    job = services.job_submit(actor=world.member, project=world.project, cluster=live,
                                              name=f"j{n}", groups=[{"name": "w", "gpu_count": 1,
                                                                     "cpu_millicores": 1000,
                                                                     "ram_mib": 1024}])
                    next_tick = start
                    while Job.objects.get(pk=job.pk).state != JobState.RUNNING:
                        now = time.monotonic()
                        if now >= next_tick:
                            tasks.scheduler_tick.delay()
                            next_tick += args.tick
                            for kind, period in PERIODS.items():
                                if args.every_tick or now - sent[kind] >= period:
                                    sent[kind] = now
                                    {"inventory": tasks.inventory_tick, "sweep": wtasks.services_sweep,
                                     "utilization": tasks.utilization_tick,
                                     "workspaces": wtasks.workspaces_tick}[kind].delay()
                        time.sleep(0.05)
                        if now - start > 600:
                            raise SystemExit(f"not running after 600 s ({mode} dead clusters)")
                    out[mode].append(round(time.monotonic() - start, 2))
                    print(f"run {n}: {mode} dead: {out[mode][-1]:.1f} s", flush=True)
                    services.job_cancel(actor=admin, job=job)
                    time.sleep(args.tick)
    return {"runs": out, "hung_connections": connections[0]}


if __name__ == "__main__":
    main()
