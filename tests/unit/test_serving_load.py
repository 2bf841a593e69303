"""The autoscaler's pure parts (workspaces/serving_load.py): the simulated daily load and the
HorizontalPodAutoscaler-like recommendation."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from workspaces.serving_load import recommend, simulated_load

DAY = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)


def _rec(**kw: Any) -> Any:
    base: dict[str, Any] = {"metric": "concurrency", "target": 8.0, "load": 0.0, "ready": 1, "current": 1,
                            "min_replicas": 1, "max_replicas": 10, "window": [], "window_seconds": 300,
                            "now": 1000.0, "idle_for": None, "scale_to_zero_seconds": None}
    base.update(kw)
    return recommend(**base)


def test_the_day_peaks_at_peak_hour_and_is_quiet_twelve_hours_later() -> None:
    profile = {"base": 2, "peak": 30, "peak_hour": 14, "burst": 0}
    loads = {h: simulated_load(7, profile, DAY.replace(hour=h)) for h in range(24)}
    assert max(loads, key=loads.__getitem__) == 14 and loads[14] == 30
    assert min(loads, key=loads.__getitem__) == 2 and loads[2] == 2
    assert loads[8] == loads[20]  # symmetric around the peak


def test_bursts_are_deterministic_per_service_and_add_to_the_curve() -> None:
    profile = {"base": 10, "peak": 10, "burst": 1.0, "burst_every_minutes": 60, "burst_minutes": 5}
    minutes = [DAY + dt.timedelta(minutes=m) for m in range(24 * 60)]
    a = [simulated_load(1, profile, t) for t in minutes]
    assert a == [simulated_load(1, profile, t) for t in minutes]  # same service, same day
    assert set(a) == {10, 20} and a.count(20) == 24 * 5  # one 5-minute burst an hour
    b = [simulated_load(2, profile, t) for t in minutes]
    assert a != b  # another service bursts at other times


@pytest.mark.parametrize(("kw", "desired"), [
    ({"load": 24}, 3),  # ceil(24 / 8)
    ({"load": 25}, 4),
    ({"load": 24, "max_replicas": 2}, 2),
    ({"load": 0}, 1),  # floor: min_replicas, at least 1
    ({"load": 0, "min_replicas": 0, "scale_to_zero_seconds": 600, "idle_for": 599}, 1),
    ({"load": 0, "min_replicas": 0, "scale_to_zero_seconds": 600, "idle_for": 600, "current": 1}, 0),
    ({"metric": "gpu_util", "target": 60, "load": 90, "ready": 2, "current": 2}, 3),  # ceil(2 × 90 / 60)
    ({"metric": "rps", "target": 50, "load": 120}, 3),
])
def test_recommendation(kw: dict[str, Any], desired: int) -> None:
    assert _rec(**kw).desired == desired


def test_scale_up_at_once_scale_down_to_the_largest_recommendation_of_the_window() -> None:
    up = _rec(load=40, current=2)
    assert up.desired == 5 and "scale up" in up.reason
    # 100 s later the load halves: held at 5 (5 was recommended within the 300 s window).
    held = _rec(load=20, current=5, window=up.window, now=1100.0)
    assert held.desired == 5 and "held" in held.reason
    # 301 s after the peak: only the lower recommendations remain in the window.
    down = _rec(load=20, current=5, window=held.window, now=1301.0)
    assert down.desired == 3 and "scale down" in down.reason
