"""Per-service load for the autoscaler, and its replica recommendation (pure functions).

Load comes from a *load source*: ``simulated`` (the default; it serves simulated clusters
only — on a Kubernetes cluster without a real source the autoscaler holds the replica
count) is a daily curve with bursts, deterministic per service and time, so
the demo, the tests and the co-location benchmark all see the same day. A Prometheus
source is a seam: :data:`LOAD_SOURCES` maps the ``SERVING_LOAD_SOURCE`` setting to a
function ``(service, at) -> float``; a deployment that exports its servers' request
metrics (vLLM's ``vllm:num_requests_running``, TGI's ``tgi_queue_size`` + batch size,
Triton's ``nv_inference_pending_request_count``) registers one there (docs/SERVING.md).

The recommendation follows Kubernetes' HorizontalPodAutoscaler: ``ceil(load / target)``
replicas (for GPU utilisation, ``ceil(ready × utilisation / target)``), scale up at once,
scale down only to the largest recommendation of the stabilisation window
(``behavior.scaleDown.stabilizationWindowSeconds``), within min/max replicas.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_PROFILE: dict[str, float] = {
    "base": 1.0,  # load at the quietest hour
    "peak": 24.0,  # load at peak_hour (before bursts)
    "peak_hour": 14.0,  # UTC
    "burst_every_minutes": 90.0,  # one burst in each such window, at a per-service offset
    "burst_minutes": 6.0,
    "burst": 0.5,  # a burst adds this fraction of peak
}


def simulated_load(service_id: int, profile: Mapping[str, Any], at: dt.datetime) -> float:
    """Concurrent requests of a service at ``at``: a raised-cosine day between ``base`` and
    ``peak`` (highest at ``peak_hour``), plus short bursts at offsets derived from the
    service id (SHA-256, so every process and run agrees)."""
    p = {**DEFAULT_PROFILE, **{k: float(v) for k, v in profile.items() if k in DEFAULT_PROFILE}}
    hours = at.hour + at.minute / 60 + at.second / 3600
    day = (1 + math.cos(2 * math.pi * (hours - p["peak_hour"]) / 24)) / 2
    load = p["base"] + (p["peak"] - p["base"]) * day
    every = max(1.0, p["burst_every_minutes"]) * 60
    if p["burst"] > 0 and p["burst_minutes"] > 0:
        window = int(at.timestamp() // every)
        digest = hashlib.sha256(f"{service_id}:{window}".encode()).digest()
        offset = int.from_bytes(digest[:4], "big") / 2**32 * max(0.0, every - p["burst_minutes"] * 60)
        into = at.timestamp() - window * every
        if offset <= into < offset + p["burst_minutes"] * 60:
            load += p["burst"] * p["peak"]
    return round(max(0.0, load), 3)


def _simulated(service: Any, at: dt.datetime) -> float:
    return simulated_load(service.pk, service.load_profile or {}, at)


LOAD_SOURCES: dict[str, Callable[[Any, dt.datetime], float]] = {"simulated": _simulated}


def load_of(service: Any, at: dt.datetime) -> float | None:
    """The service's load now, or None when nothing measures it: the simulated curve serves
    simulated clusters only (real inference must never scale on, or preempt real training
    for, made-up numbers), and an unknown ``SERVING_LOAD_SOURCE`` is reported, not guessed."""
    from django.conf import settings

    source = getattr(settings, "SERVING_LOAD_SOURCE", "simulated")
    if source not in LOAD_SOURCES:
        logger.warning("SERVING_LOAD_SOURCE=%r is not one of %s: model services hold their replicas",
                       source, ", ".join(LOAD_SOURCES))
        return None
    if source == "simulated" and service.cluster.backend != "simulated":
        return None
    return LOAD_SOURCES[source](service, at)


@dataclass(frozen=True)
class Recommendation:
    desired: int
    raw: int
    reason: str
    window: list[list[float]]
    """The stabilisation window's recommendations after this one ([epoch s, replicas])."""


def recommend(*, metric: str, target: float, load: float, ready: int, current: int,
              min_replicas: int, max_replicas: int, window: list[list[float]], window_seconds: int,
              now: float, idle_for: float | None, scale_to_zero_seconds: int | None) -> Recommendation:
    """How many replicas a service should have now (see the module docstring)."""
    if metric == "gpu_util":
        raw = math.ceil(max(ready, 1) * load / target) if load > 0 else 0
    else:
        raw = math.ceil(load / target - 1e-9) if load > 0 else 0
    floor = max(min_replicas, 1)
    if scale_to_zero_seconds is not None and load <= 0 and idle_for is not None \
            and idle_for >= scale_to_zero_seconds:
        floor = 0
    raw = min(max(raw, floor), max_replicas)
    kept = [w for w in window if 0 <= now - w[0] < window_seconds] + [[now, float(raw)]]
    if raw >= current:
        desired = raw
        why = "scale up" if raw > current else "steady"
    else:
        desired = min(current, int(max(w[1] for w in kept)))
        why = "scale down" if desired < current else "scale down held by the stabilisation window"
    if desired == 0:
        why = f"idle for {int(idle_for or 0)} s: scale to zero"
    unit = {"gpu_util": "% GPU", "rps": "req/s"}.get(metric, "concurrent requests")
    reason = f"{why}: load {load:g} {unit}, target {target:g} per replica → {raw}; desired {desired}"
    return Recommendation(desired=desired, raw=raw, reason=reason, window=kept)
