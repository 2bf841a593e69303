"""Per-service load for the autoscaler, and its replica recommendation (pure functions).

Load comes from a *load source* (:data:`LOAD_SOURCES`, chosen by ``SERVING_LOAD_SOURCE``):

* ``auto`` (the default) picks per cluster: ``prometheus`` for a cluster with a Prometheus
  URL, ``simulated`` for a simulated one, and nothing otherwise (the autoscaler holds the
  replica count: real inference never scales on made-up numbers);
* ``prometheus`` queries the cluster's Prometheus (``scheduling.backends.metrics.query``)
  with one PromQL template per autoscale metric (``SERVING_PROMETHEUS_QUERIES``, vLLM's
  metrics by default) restricted to the service's replica pods, and reads latency p50/p95
  from the request-latency histogram (``SERVING_PROMETHEUS_LATENCY``);
* ``simulated`` is a daily curve with bursts, deterministic per service and time, so the
  demo, the tests and the co-location benchmark all see the same day (simulated clusters only).

A source returns a :class:`LoadReading` (or a bare float); a reading without load carries
the reason, which the service shows while it holds its replicas (docs/SERVING.md).

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
import time
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


@dataclass(frozen=True)
class LoadReading:
    """One reading of a service's load: ``load`` None means unknown (``error`` says why; the
    autoscaler then holds the replica count). Latencies are in seconds, None when unknown."""

    load: float | None
    p50: float | None = None
    p95: float | None = None
    error: str = ""


def _simulated(service: Any, at: dt.datetime) -> LoadReading:
    if service.cluster.backend != "simulated":
        return LoadReading(None, error="the simulated load serves simulated clusters only")
    return LoadReading(simulated_load(service.pk, service.load_profile or {}, at))


# vLLM's metrics (the ``vllm:`` gauges, counters and histograms of its /metrics, listed in vLLM's
# docs/design/v1/metrics.md) and dcgm-exporter's GPU utilisation. ``{selector}`` becomes the label
# matchers of the service's replica pods (SERVING_PROMETHEUS_SELECTOR).
DEFAULT_QUERIES: dict[str, str] = {
    "concurrency": 'sum({__name__=~"vllm:num_requests_(running|waiting)",{selector}})',
    "rps": "sum(rate(vllm:request_success_total{{selector}}[1m]))",
    "gpu_util": "avg(DCGM_FI_DEV_GPU_UTIL{{selector}})",
}
DEFAULT_LATENCY = ("histogram_quantile({quantile}, "
                   "sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{{selector}}[5m])))")
DEFAULT_SELECTOR = 'namespace="{namespace}",pod=~"{pods}"'


def _fill(template: str, **values: str) -> str:
    # Plain replacement, not str.format: PromQL is full of braces.
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template


def prometheus_selector(service: Any) -> str | None:
    """The label matchers of ``service``'s replica pods (None when the template names the
    pods, ``{pods}``, and it has none): by default the project's namespace and the pods'
    names, the labels Prometheus' Kubernetes discovery (and kube-prometheus' PodMonitors)
    put on every scraped series."""
    from django.conf import settings

    from scheduling.models import Allocation
    from scheduling.selectors import project_namespace_name

    template = getattr(settings, "SERVING_PROMETHEUS_SELECTOR", DEFAULT_SELECTOR)
    pods: list[str] = []
    if "{pods}" in template:
        pods = sorted(Allocation.objects.filter(
            job__service_replica__service=service, job__service_replica__removed_reason="",
        ).values_list("pod_name", flat=True).distinct())  # DNS labels: nothing to escape in a regex
        if not pods:
            return None
    return _fill(template, namespace=project_namespace_name(cluster=service.cluster, project=service.project),
                 pods="|".join(pods), service_id=str(service.pk))


def _first_value(rows: list[dict[str, Any]]) -> float | None:
    for row in rows:
        value = float(row["value"][1])
        if math.isfinite(value):
            return value
    return None


_UNREACHABLE: dict[str, tuple[float, str]] = {}
"""Prometheus URL → (monotonic time, error) of its last failure to answer, in this process."""
UNREACHABLE_SECONDS = 10.0
"""For this long after a Prometheus did not answer, other services of the tick skip it (each
read would wait for the timeout again: a hung server times one tick × services out)."""


def _prometheus(service: Any, at: dt.datetime) -> LoadReading:
    """The service's load and latency from its cluster's Prometheus (instant queries, now)."""
    from django.conf import settings

    from scheduling.backends.base import BackendError
    from scheduling.backends.metrics import query

    url = service.cluster.prometheus_url
    if not url:
        return LoadReading(None, error="the cluster has no Prometheus URL")
    selector = prometheus_selector(service)
    if selector is None:  # the selector names the pods and there is none
        return LoadReading(None, error="no replica pod to measure yet")
    down = _UNREACHABLE.get(url)
    if down is not None and time.monotonic() - down[0] < UNREACHABLE_SECONDS:
        return LoadReading(None, error=down[1])
    queries = {**DEFAULT_QUERIES, **getattr(settings, "SERVING_PROMETHEUS_QUERIES", {})}
    promql = _fill(queries[service.autoscale_metric], selector=selector)
    try:
        load = _first_value(query(url, promql))
        if load is None:
            return LoadReading(None, error=f"Prometheus has no series for {promql}"[:300])
        latency = getattr(settings, "SERVING_PROMETHEUS_LATENCY", DEFAULT_LATENCY)
        p50, p95 = (_first_value(query(url, _fill(latency, quantile=q, selector=selector)))
                    if latency else None for q in ("0.5", "0.95"))
    except BackendError as exc:
        logger.warning("model service %s: no load from Prometheus: %s", service.pk, exc)
        if exc.retryable:  # it did not answer (a refused query answers: no need to skip it)
            _UNREACHABLE[url] = (time.monotonic(), str(exc)[:300])
        return LoadReading(None, error=str(exc)[:300])
    _UNREACHABLE.pop(url, None)
    return LoadReading(round(max(0.0, load), 3), p50=p50, p95=p95)


def _auto(service: Any, at: dt.datetime) -> LoadReading:
    if service.cluster.prometheus_url:
        return _prometheus(service, at)
    if service.cluster.backend == "simulated":
        return _simulated(service, at)
    return LoadReading(None, error="no load source: give the cluster a Prometheus URL")


LOAD_SOURCES: dict[str, Callable[[Any, dt.datetime], LoadReading | float]] = {
    "auto": _auto, "prometheus": _prometheus, "simulated": _simulated}


def read_load(service: Any, at: dt.datetime) -> LoadReading:
    """The service's load now (``SERVING_LOAD_SOURCE``); without one, the reason. An unknown
    source name is reported, not guessed."""
    from django.conf import settings

    source = getattr(settings, "SERVING_LOAD_SOURCE", "auto")
    if source not in LOAD_SOURCES:
        logger.warning("SERVING_LOAD_SOURCE=%r is not one of %s: model services hold their replicas",
                       source, ", ".join(LOAD_SOURCES))
        return LoadReading(None, error=f"unknown load source {source!r}"[:300])
    reading = LOAD_SOURCES[source](service, at)
    return reading if isinstance(reading, LoadReading) else LoadReading(float(reading))


def load_of(service: Any, at: dt.datetime) -> float | None:
    """The service's load now, or None when nothing measures it (:func:`read_load`)."""
    return read_load(service, at).load


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
