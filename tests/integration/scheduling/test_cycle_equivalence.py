"""The scheduling cycle's outcome on a fixed scenario, pinned (issue 13).

``cycle_golden.json`` was written by the row-by-row cycle (before the bulk persistence) with
``CAMP_WRITE_GOLDEN=1``; the bulk cycle must give every job the same state, reason, reason
kind, queue position and length, the same placements and the same decision history, over
four cycles: admissions, a rejection, waits in two tenants' queues, a preemption, arrivals
that move positions, and an idle repeat (which must write nothing)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from scheduling import services
from scheduling.models import Allocation, Job, SchedulingDecision
from tenants.models import AuditEvent

from .conftest import gpu_group, submit

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).with_name("cycle_golden.json")


def _names(cluster: Any) -> dict[int, str]:
    return dict((pk, name) for pk, name in Job.objects.filter(cluster=cluster).values_list("pk", "name"))


def _norm(text: str, names: dict[int, str]) -> str:
    """Job ids differ between runs; name them."""
    return re.sub(r"#(\d+)", lambda m: "#" + names.get(int(m.group(1)), "?"), text)


def _state(cluster: Any) -> dict[str, Any]:
    names = _names(cluster)
    jobs = {
        j.name: [j.state, _norm(j.reason, names), j.reason_kind, j.queue_position, j.queue_length,
                 names.get(j.preempted_by_id or 0)]
        for j in Job.objects.filter(cluster=cluster).order_by("name")
    }
    allocs = sorted(
        [names[a.job_id], a.pod_name.rsplit("-", 2)[-2:], a.node.name,
         sorted([s.gpu.index, s.memory_mib, s.cores_percent, s.exclusive] for s in a.slices.all())]
        for a in Allocation.objects.filter(cluster=cluster).select_related("node")
        .prefetch_related("slices__gpu"))
    decisions = sorted(
        [names[d.job_id], d.kind, _norm(d.reason, names), d.queue_position,
         sorted(names[v] for v in d.victims)]
        for d in SchedulingDecision.objects.filter(cluster=cluster))
    audit = sorted(AuditEvent.objects.filter(action__startswith="job.").values_list(
        "action", flat=True))
    return {"jobs": jobs, "allocations": allocs, "decisions": decisions, "audit": audit}


def test_cycle_outcome_matches_the_row_by_row_cycle(world: Any, sim_cluster: Any) -> None:
    seen = []
    # Cycle 1: batch jobs fill the A100s; a slice and a CPU-only job; a never-fitting job.
    for i in range(2):
        submit(world, sim_cluster, f"a-batch-{i}", priority_class="batch",
               group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    submit(world, sim_cluster, "b-half", side="b", group={"gpu_memory_mib": 10000, "gpu_cores_percent": 50})
    submit(world, sim_cluster, "a-cpu", groups=[{"name": "worker", "cpu_millicores": 2000}])
    submit(world, sim_cluster, "b-huge", side="b", group={"gpu_count": 16})
    services.cycle_run(cluster=sim_cluster)
    seen.append(_state(sim_cluster))
    # Cycle 2: queues in two tenants (whole cards, gangs, a model list); a high-priority job
    # that fits only by preempting a batch job.
    for i in range(3):
        submit(world, sim_cluster, f"a-whole-{i}", group={"gpu_count": 2})
        submit(world, sim_cluster, f"b-wait-{i}", side="b", group={"gpu_count": 4})
    submit(world, sim_cluster, "a-gang", groups=[gpu_group(replicas=2, gpu_count=4)])
    submit(world, sim_cluster, "b-l4", side="b", group={"gpu_count": 1, "gpu_models": ["L4"]})
    submit(world, sim_cluster, "b-urgent", side="b", priority_class="high",
           group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=sim_cluster)
    seen.append(_state(sim_cluster))
    # Cycle 3: more arrivals; positions move.
    submit(world, sim_cluster, "a-late", group={"gpu_count": 1})
    submit(world, sim_cluster, "b-late", side="b", priority_class="high", group={"gpu_count": 1})
    services.cycle_run(cluster=sim_cluster)
    seen.append(_state(sim_cluster))
    # Cycle 4: nothing changed: nothing written.
    services.cycle_run(cluster=sim_cluster)
    seen.append(_state(sim_cluster))
    assert seen[3] == seen[2]
    if os.environ.get("CAMP_WRITE_GOLDEN"):
        GOLDEN.write_text(json.dumps(seen, indent=1) + "\n")
    expected = json.loads(GOLDEN.read_text())
    for n, (got, want) in enumerate(zip(seen, expected, strict=True), start=1):
        for part in ("jobs", "allocations", "decisions", "audit"):
            assert got[part] == want[part], f"cycle {n}: {part} differ"
