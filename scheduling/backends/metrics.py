"""The optional utilisation feed: per-GPU utilisation and used memory from Prometheus.

Read through Prometheus' HTTP query API (``GET /api/v1/query?query=<metric>``, an instant
vector). Two exporters are understood, matched to GPUs by UUID first, then by node and
index:

====================  ==========================  =====  ===================================
exporter              metric                      unit   labels used
====================  ==========================  =====  ===================================
NVIDIA dcgm-exporter  ``DCGM_FI_DEV_GPU_UTIL``    %      ``UUID``, ``Hostname``, ``gpu``
NVIDIA dcgm-exporter  ``DCGM_FI_DEV_FB_USED``     MiB    ``UUID``, ``Hostname``, ``gpu``
HAMi vGPU monitor     ``HostCoreUtilization``     %      ``deviceuuid``, ``deviceidx``, node*
HAMi vGPU monitor     ``HostGPUMemoryUsage``      bytes  ``deviceuuid``, ``deviceidx``, node*
====================  ==========================  =====  ===================================

(*) HAMi's monitor carries no node label of its own; ``node``/``Hostname``/``kubernetes_node``
added by relabelling are used when present. Unknown series are ignored.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from .base import BackendError

UTIL_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "HostCoreUtilization")
MEMORY_METRICS = {"DCGM_FI_DEV_FB_USED": 1.0, "HostGPUMemoryUsage": 1.0 / (1024 * 1024)}
"""Metric → factor to MiB."""
NODE_LABELS = ("Hostname", "node", "kubernetes_node", "nodename")


@dataclass
class GpuSample:
    uuid: str = ""
    node: str = ""
    index: int | None = None
    utilization_percent: float | None = None
    memory_used_mib: int | None = None


def _labels_key(labels: dict[str, str]) -> tuple[str, str, int | None]:
    uuid = labels.get("UUID") or labels.get("deviceuuid") or labels.get("uuid") or ""
    node = next((labels[k] for k in NODE_LABELS if labels.get(k)), "")
    raw = labels.get("gpu") or labels.get("deviceidx") or labels.get("index")
    index = int(raw) if raw is not None and raw.isdigit() else None
    return uuid, node, index


def query(base_url: str, promql: str, *, timeout: float = 10.0) -> list[dict[str, Any]]:
    """One instant query; the ``result`` list of a vector answer."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (admin-set URL)
            body = json.loads(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise BackendError(f"Prometheus at {base_url} did not answer: {exc}", retryable=True) from exc
    if body.get("status") != "success":
        raise BackendError(f"Prometheus query failed: {body.get('error', 'unknown error')}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        return []
    return list(data.get("result") or [])


def gpu_samples(base_url: str, *, timeout: float = 10.0) -> list[GpuSample]:
    """Per-GPU utilisation and used memory, one sample per GPU (merged over metrics)."""
    samples: dict[tuple[str, str, int | None], GpuSample] = {}

    def sample_for(labels: dict[str, str]) -> GpuSample:
        key = _labels_key(labels)
        if key not in samples:
            samples[key] = GpuSample(uuid=key[0], node=key[1], index=key[2])
        return samples[key]

    for name in UTIL_METRICS:
        for row in query(base_url, name, timeout=timeout):
            value = float(row["value"][1])
            if math.isfinite(value):
                sample_for(row.get("metric") or {}).utilization_percent = max(0.0, min(100.0, value))
    for name, factor in MEMORY_METRICS.items():
        for row in query(base_url, name, timeout=timeout):
            value = float(row["value"][1])
            if math.isfinite(value):
                sample_for(row.get("metric") or {}).memory_used_mib = max(0, round(value * factor))
    return [s for s in samples.values() if s.uuid or (s.node and s.index is not None)]
