"""Submit → running on a live cluster while other clusters' API servers are dead (issue 11, bug 6).

A real Celery worker (prefork, 2 processes), PostgreSQL and Redis, as in the integration
tests; this script plays beat (``scheduler_tick`` every ``--tick`` seconds). Per run: a
one-GPU job is submitted to a live simulated cluster and timed until it is RUNNING, with
0 and with ``--dead`` hung Kubernetes API servers registered beside it (they accept
connections and never answer: the worst kind of dead). Medians over ``--runs``.

    .venv/bin/python -m bench.dead_clusters --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dead", type=int, default=2)
    parser.add_argument("--tick", type=float, default=3.0)
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
    print(f"{'dead clusters':>14} | {'median s':>8} | runs")
    for dead, times in results.items():
        print(f"{dead:>14} | {statistics.median(times):8.1f} | {', '.join(f'{t:.1f}' for t in times)}")
    print("load average:", os.getloadavg())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "dead_clusters.json").write_text(json.dumps(
        {"runs": {str(k): v for k, v in results.items()}, "tick_s": args.tick,
         "loadavg": os.getloadavg()}, indent=2))


def _run(args: argparse.Namespace) -> dict[int, list[float]]:
    from contextlib import ExitStack

    from scheduling import services, tasks
    from scheduling.models import Cluster, Job, JobState
    from tenants.models import User
    from tests.conftest import _tenant_world
    from tests.integration.scheduling.conftest import SMALL_INVENTORY
    from tests.integration.scheduling.test_concurrency import celery_worker
    from tests.integration.scheduling.test_worker_faults import _hung_api_server

    admin = User.objects.create(username="bench-admin", is_platform_admin=True)
    world = _tenant_world(admin, "acme")
    live = services.cluster_create(actor=admin, name="live", inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=live)
    out: dict[int, list[float]] = {0: [], args.dead: []}
    n = 0
    for dead in (0, args.dead):
        with ExitStack() as stack:
            urls = [stack.enter_context(_hung_api_server())[0] for _ in range(dead)]
            for i, url in enumerate(urls):
                services.cluster_create(actor=admin, name=f"dead{i}", backend="kubernetes",
                                        api_server=url, credentials={"token": "t"}, verify=False)
            with celery_worker():
                for _ in range(args.runs):
                    services.cycle_request_taken(live.pk)
                    n += 1
                    start = time.monotonic()
                    job = services.job_submit(actor=world.member, project=world.project,
                                              cluster=live, name=f"j{n}",
                                              groups=[{"name": "w", "gpu_count": 1,
                                                       "cpu_millicores": 1000, "ram_mib": 1024}])
                    next_tick = start
                    while Job.objects.get(pk=job.pk).state != JobState.RUNNING:
                        if time.monotonic() >= next_tick:
                            tasks.scheduler_tick.delay()
                            next_tick += args.tick
                        time.sleep(0.05)
                        if time.monotonic() - start > 300:
                            raise SystemExit("not running after 300 s")
                    out[dead].append(time.monotonic() - start)
                    services.job_cancel(actor=admin, job=job)
                    time.sleep(args.tick)
            Cluster.objects.filter(name__startswith="dead").update(enabled=False)
    return out


if __name__ == "__main__":
    main()
