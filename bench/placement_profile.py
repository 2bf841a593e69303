"""Profile the placement step on a copy of any database (issue 35 target 4, BENCHMARKS §14b).

``bench/placement_step.py`` profiles a step on its own two-cluster setup; this one takes the
rows a real run left (e.g. ``bench.scale_out``'s ``<seed>_run`` database, stopped mid-run),
copies them (``CREATE DATABASE … TEMPLATE``, so the run's rows are untouched) and runs
``placement_run`` there ``--steps`` times under cProfile, printing wall and CPU seconds, what
each step decided, its statements and its top functions.

    .venv/bin/python -m bench.placement_profile bench_scale_8c_s1_50000p_20f_run --steps 2
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time

from bench.scale_out import SERVER, _psql


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db", help="the database to copy (left as it is)")
    ap.add_argument("--copy", default="bench_placement_profile")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--top", type=int, default=35)
    args = ap.parse_args()
    _psql(f'DROP DATABASE IF EXISTS "{args.copy}" WITH (FORCE)')
    _psql(f'CREATE DATABASE "{args.copy}" TEMPLATE "{args.db}"')
    os.environ.update(DJANGO_SETTINGS_MODULE="camp.settings", DATABASE_URL=f"{SERVER}/{args.copy}",
                      REDIS_URL="", CELERY_BROKER_URL="memory://")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduling.services import placement

    for i in range(args.steps):
        prof = cProfile.Profile()
        wall, cpu = time.perf_counter(), time.process_time()
        with CaptureQueriesContext(connection) as queries:
            prof.enable()
            s = placement.placement_run()
            prof.disable()
        assert s is not None
        print(f"step {i}: {time.perf_counter() - wall:.2f} s wall, {time.process_time() - cpu:.2f} s CPU, "
              f"placed {len(s.placed)}, moved {len(s.moved)}, waiting {len(s.waiting)}, "
              f"statements {len(queries)}")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
