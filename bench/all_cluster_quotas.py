"""What quotas across all clusters (issue 16's platform level) cost a cluster's cycle.

Real PostgreSQL (a database of its own, ``camp_bench_gq2``, dropped after). Two simulated
clusters of ``--nodes`` 8-GPU A100 nodes each, both full of non-preemptible jobs of 4 projects
in 2 tenants (4 GPUs each); then ``--pending`` one-GPU preemptible jobs queued on the first
cluster, which all wait (no room, nothing they may preempt), so each cycle decides the same
thing and can be repeated. The cycle (``cycle_run``: snapshot, engine, writes) is timed
``--repeats`` times without any quota across all clusters, then with every project and tenant
holding a GPU guarantee (split into per-cluster parts each cycle), a GPU limit and an A100 GPU
memory limit across all clusters (none of them binding: the same decisions). Medians.

    .venv/bin/python -m bench.all_cluster_quotas --nodes 32 --pending 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 36000
nodes:
  - name: {cluster}-{{i}}
    count: {nodes}
    cpu_cores: 128
    ram_gib: 1024
    gpus: {{model: A100-80G, count: 8, memory_mib: 81920}}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--pending", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", default="camp_bench_gq2", help="the bench's own database (dropped after)")
    args = parser.parse_args()

    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings.test"
    os.environ["DB_CONN_MAX_AGE"] = "0"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    connection.settings_dict["TEST"]["NAME"] = args.db
    db = connection.creation.create_test_db(verbosity=0, keepdb=False)
    try:
        result = _run(args)
    finally:
        connection.creation.destroy_test_db(db, verbosity=0)
    result["loadavg"] = os.getloadavg()
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "all_cluster_quotas.json").write_text(json.dumps(result, indent=2))


def _run(args: argparse.Namespace) -> dict[str, object]:
    from scheduling import services
    from scheduling.models import Job, JobState
    from tenants import services as tenant_services
    from tenants.models import User
    from tests.conftest import _tenant_world

    admin = User.objects.create(username="bench-admin", is_platform_admin=True)
    worlds = [_tenant_world(admin, "acme"), _tenant_world(admin, "globex")]
    projects = [(w, p) for w in worlds for p in (w.project, w.other_project)]

    def submit(jobs: list[dict[str, object]]) -> None:
        for w in worlds:
            mine = [j for j in jobs if j["project"].tenant_id == w.tenant.pk]  # type: ignore[attr-defined]
            if mine:
                services.job_submit_many(actor=w.owner, jobs=mine)

    clusters = []
    for name in ("east", "west"):
        c = services.cluster_create(actor=admin, name=name, backend="simulated",
                                    inventory=INVENTORY.format(cluster=name, nodes=args.nodes))
        services.inventory_sync(cluster=c)
        clusters.append(c)
    group = {"name": "w", "replicas": 1, "cpu_millicores": 1000, "ram_mib": 1024}
    for c in clusters:  # fill: 2 jobs of 4 GPUs per node, non-preemptible, projects in turn
        fill = [{"project": projects[i % 4][1], "cluster": c, "name": f"fill-{c.name}-{i}",
                 "groups": [{**group, "gpu_count": 4}]} for i in range(args.nodes * 2)]
        submit(fill)
        for _ in range(50):
            services.cycle_run(cluster=c)
            if not Job.objects.filter(cluster=c, state=JobState.QUEUED).exists():
                break
    for start in range(0, args.pending, 500):
        batch = [{"project": projects[i % 4][1], "cluster": clusters[0], "name": f"wait-{i}",
                  "groups": [{**group, "gpu_count": 1}], "preemptible": True}
                 for i in range(start, min(args.pending, start + 500))]
        submit(batch)
    gpus = args.nodes * 8 * 2

    def timed() -> list[float]:
        out = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            summary = services.cycle_run(cluster=clusters[0])
            out.append(time.perf_counter() - t)
            assert summary is not None and not summary.admitted and not summary.preempting
        return out

    timed()  # warm-up
    without = timed()
    for w in worlds:
        tenant_services.quota_set(actor=admin, scope="tenant", tenant=w.tenant, values={
            "gpus_guaranteed_all_clusters": Decimal(gpus), "gpus_limit_all_clusters": Decimal(gpus),
            "gpu_memory_mib_limits_all_clusters": {"A100-80G": gpus * 81920}})
        for p in (w.project, w.other_project):
            tenant_services.quota_set(actor=admin, scope="project", project=p, values={
                "gpus_guaranteed_all_clusters": Decimal(gpus // 2), "gpus_limit_all_clusters": Decimal(gpus),
                "gpu_memory_mib_limits_all_clusters": {"A100-80G": gpus * 81920}})
    with_quotas = timed()
    # The guarantee's own share of the snapshot: the book (its queries) and the split.
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling import selectors
    from scheduling.services import all_clusters

    use_s, split_s, queries = [], [], 0
    for _ in range(args.repeats):
        t = time.perf_counter()
        limits = selectors.all_cluster_limits()
        use = selectors.all_cluster_use(limits.tenant_ids)
        use_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        with CaptureQueriesContext(connection) as q:
            all_clusters.guarantees(limits, use, names=True)
        split_s.append(time.perf_counter() - t)
        queries = len(q.captured_queries)
    queued = Job.objects.filter(cluster=clusters[0], state=JobState.QUEUED).count()
    return {"nodes_per_cluster": args.nodes, "gpus": gpus, "pending": queued,
            "cycle_s_without": without, "cycle_s_with": with_quotas,
            "median_without": statistics.median(without), "median_with": statistics.median(with_quotas),
            "limits_and_use_s": use_s, "median_limits_and_use": statistics.median(use_s),
            "guarantee_split_s": split_s, "median_guarantee_split": statistics.median(split_s),
            "guarantee_split_queries": queries}


if __name__ == "__main__":
    main()
