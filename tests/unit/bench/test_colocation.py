"""The co-location benchmark's bookkeeping (bench/colocation.py) on the smallest openb slice:
what it reports must be physically possible, whatever the scheduler decides."""

from __future__ import annotations

import pytest

from bench.colocation import DAY, Day, Scenario
from bench.openb import DATA

pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"the openb trace is not at {DATA}")


@pytest.fixture(scope="module")
def colocated() -> tuple[Day, dict[str, object]]:
    day = Day(Scenario(stride=130, warmup=1800.0), "colocated-noreserve")
    return day, day.run()


def test_allocation_never_exceeds_the_slice(colocated: tuple[Day, dict[str, object]]) -> None:
    """A victim's pods are released once (by the cycle that evicts it): counting them twice once
    showed 104 % of the GPUs allocated."""
    day, r = colocated
    hourly = r["hourly_alloc_pct"]
    assert isinstance(hourly, list) and len(hourly) == 24
    assert max(hourly) <= 100.0 + 1e-6
    pool = day.pools[0]
    assert sum(pool.gpus_of.values()) <= pool.capacity + 1e-6


def test_training_keeps_no_more_than_the_gpu_time_it_held(colocated: tuple[Day, dict[str, object]]) -> None:
    day, r = colocated
    held_gpu_h = day.alloc_area["training"] / 3600
    assert 0 < float(r["training_gpu_h"]) + float(r["training_lost_gpu_h"]) <= held_gpu_h + 1e-6  # type: ignore[arg-type]


def test_inference_follows_the_day_and_is_never_preempted(colocated: tuple[Day, dict[str, object]]) -> None:
    """Replicas scale with the curve (fewer at 04:00 than at 16:00), each ready one start delay
    after its decision at the earliest, and no victim is an inference replica."""
    day, r = colocated
    inference = r["hourly_inference_pct"]
    assert isinstance(inference, list) and inference[4] < inference[16]
    assert float(r["scaleup_p95_s"]) >= day.sc.start_delay  # type: ignore[arg-type]
    assert day.victims["inference"] == 0
    assert day.t == DAY


def test_a_replica_that_preempts_is_ready_after_the_victims_grace_period(
        colocated: tuple[Day, dict[str, object]]) -> None:
    day, r = colocated
    assert day.preemptions > 0  # this day's scale-ups do preempt training
    assert float(r["scaleup_max_s"]) >= day.sc.start_delay + day.sc.preempt_grace  # type: ignore[arg-type]


def test_the_copied_product_values_match_the_product() -> None:
    """The benchmark runs the engine without Django, so it copies two values; they must not drift."""
    import bench.colocation as bench
    from scheduling.models import PRIORITY_VALUES
    from workspaces.services.serving import REPLICA_DURATION_SECONDS

    assert bench.PRIORITY_VALUES == {k: PRIORITY_VALUES[k] for k in bench.PRIORITY_VALUES}
    assert bench.REPLICA_DURATION_SECONDS == REPLICA_DURATION_SECONDS
