"""What single statements of the hot paths cost the web or worker process, side by side with
the alternatives they replaced (issue 35, docs/BENCHMARKS.md §15 "Round 21").

Each figure is the median CPU time (``time.process_time``) of this process over ``--repeat``
calls after 20 unmeasured, against the database of ``bench/api_load.py`` (seeded there):
the ORM's compile of a statement is CPU here, PostgreSQL's work is not. Both sides of each
pair run in this one process, alternately, so load moves them together:

- ``seal``: one sealing pass after a single audit write (``tenants.audit.seal``), and the
  statements it reads with: the hand-written rows-with-tail statement against the ORM's
  unsealed rows plus chain tail (two statements), and against one ORM statement carrying the
  tail as two ``Subquery`` annotations;
- ``latest``: a page of 50 jobs' latest decisions: ``selectors.with_latest_decisions`` (one
  grouped statement) against Django's sliced prefetch (a window function);
- ``push``: the live push of one job after a submit's commit (``portal.live.push_jobs``: its
  read, its payload, the hand-off to the channel layer), and the hand-off alone;
- ``backend``: making a simulated cluster's backend from a freshly read row, first and
  later times (``--db`` of ``bench/scale_out.py`` for an openb-sized cluster).

    .venv/bin/python -m bench.hot_statements --db postgres://postgres@127.0.0.1:5432/bench_seq
    .venv/bin/python -m bench.hot_statements --only backend --db …/bench_scale_8c_s1_50000p_20f
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

from bench import service_cycle as sc


def _cpu(fn: Callable[[], Any], repeat: int, before: Callable[[], Any] | None = None,
         warm: int = 20) -> float:
    """Median CPU ms of ``fn`` over ``repeat`` calls after ``warm`` (``before`` runs
    unmeasured ahead of each call)."""
    out: list[float] = []
    for i in range(repeat + warm):
        if before is not None:
            before()
        t = time.process_time()
        fn()
        if i >= warm:
            out.append((time.process_time() - t) * 1000)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.environ.get("BENCH_DATABASE_URL", sc.DEFAULT_DB))
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--only", default="seal,latest,push,backend")
    args = ap.parse_args()
    os.environ["DJANGO_SETTINGS_MODULE"] = "camp.settings.production"
    os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    os.environ.setdefault("ALLOWED_HOSTS", "testserver")
    os.environ["DB_CONN_MAX_AGE"], os.environ["DB_POOL_MAX_SIZE"] = "60", "0"
    sc._setup_django(args.db)
    import logging

    logging.disable(logging.INFO)
    only = set(args.only.split(","))
    n = args.repeat
    if "seal" in only:
        from django.db import transaction
        from django.db.models import Subquery

        from tenants import audit
        from tenants.models import AuditEvent

        counter = iter(range(10**9))

        def write() -> None:
            # one committed, unsealed event: its writer's own seal after commit is held back
            # (the pass timed below is that seal)
            with mock.patch.object(audit, "_seal_after_commit", lambda count: None), \
                    transaction.atomic():
                audit.audit_record(actor=None, action="bench.seal", after={"i": next(counter)})

        audit.seal()
        tail = AuditEvent.objects.filter(chain_seq__isnull=False).order_by("-chain_seq")
        unsealed = audit._unsealed().order_by("id")

        def subquery_tail() -> list[Any]:
            return list(unsealed.annotate(tail_seq=Subquery(tail.values("chain_seq")[:1]),
                                          tail_hash=Subquery(tail.values("hash")[:1]))[:1000])

        cases: list[tuple[str, Callable[[], Any], Callable[[], Any] | None]] = [
            ("seal: one pass after one write", lambda: audit.seal(wait=False, passes=1), write),
            ("  rows with tail, hand-written (now)",
             lambda: audit._unsealed_with_tail(1000), None),  # type: ignore[attr-defined]
            ("  ORM rows + ORM chain tail (before)",
             lambda: (list(unsealed[:1000]), audit._chain_tail()), None),
            ("  ORM rows with Subquery tail", subquery_tail, None),
        ]
        if not hasattr(audit, "_unsealed_with_tail"):  # a tree before round 21: its seal pass only
            cases = cases[:1]
        for i, (label, fn, before) in enumerate(cases):
            if i == 1:
                write()  # the reads find one unsealed row, as a single write's seal does
            print(f"{label:46s} {_cpu(fn, n, before):9.3f} ms")
        audit.seal()
    from scheduling import selectors as _selectors
    from scheduling.backends import simulated as _simulated

    if "latest" in only and hasattr(_selectors, "with_latest_decisions"):  # not in older trees
        from django.db.models import Prefetch, prefetch_related_objects

        from scheduling import selectors
        from scheduling.models import Job, SchedulingDecision

        page = list(Job.objects.order_by("-id")[:50])

        def sliced() -> None:
            for job in page:
                job.__dict__.pop("latest_decisions", None)
                getattr(job, "_prefetched_objects_cache", {}).clear()
            prefetch_related_objects(page, Prefetch(
                "decisions", queryset=SchedulingDecision.objects.order_by("-id")[:1],
                to_attr="latest_decisions"))

        grouped = _cpu(lambda: selectors.with_latest_decisions(page), n)
        print(f"{'latest decisions of 50 jobs, grouped (now)':46s} {grouped:9.3f} ms")
        print(f"{'  sliced prefetch (before)':46s} {_cpu(sliced, n):9.3f} ms")
    if "push" in only:
        from asgiref.sync import async_to_sync
        from channels.layers import get_channel_layer

        from portal import live
        from scheduling.models import Job

        job_id = Job.objects.order_by("-id").values_list("pk", flat=True).first()
        layer = get_channel_layer()

        async def two_sends() -> None:  # what a job's push sends: its project's group and all
            await layer.group_send(live.ALL_GROUP, {"type": "job.update"})
            await layer.group_send(live.project_group(0), {"type": "job.update"})

        print(f"{'live push of one job (read, payload, send)':46s} "
              f"{_cpu(lambda: live.push_jobs([job_id]), n):9.3f} ms")
        print(f"{'  its hand-off to the event loop (two sends)':46s} "
              f"{_cpu(lambda: async_to_sync(two_sends)(), n):9.3f} ms")
    if "backend" in only and hasattr(_simulated, "_parsed"):
        from scheduling.backends import backend_for
        from scheduling.backends.simulated import _parsed
        from scheduling.models import Backend, Cluster

        cluster = Cluster.objects.filter(backend=Backend.SIMULATED).order_by("id").first()
        assert cluster is not None
        fresh = lambda: backend_for(Cluster.objects.get(pk=cluster.pk))  # noqa: E731
        reps = max(3, n // 100)
        print(f"backend of {cluster.name} ({len(cluster.inventory):,} bytes of inventory):")
        first = _cpu(fresh, reps, _parsed.cache_clear, warm=1)
        print(f"{'  first (parsed)':46s} {first:9.3f} ms")
        print(f"{'  later (kept; the row read in both)':46s} {_cpu(fresh, reps * 10, warm=1):9.3f} ms")


if __name__ == "__main__":
    main()
