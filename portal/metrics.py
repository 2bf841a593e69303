"""Prometheus metrics at /metrics, computed from the database at scrape time.

A custom collector (prometheus_client's documented pattern for state owned by
another system) rather than in-process counters: web and worker processes are
many and short-lived, the database is the one place that sees them all.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from scheduling.models import Cluster, Job

from . import selectors
from .models import CycleStat, DispatchError

WAIT_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 24 * 3600)
CYCLE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
WINDOW = dt.timedelta(hours=1)


def _histogram(values: list[float], buckets: tuple[float, ...]) -> tuple[list[tuple[str, float]], float]:
    counts = []
    for b in buckets:
        counts.append((str(b), float(sum(1 for v in values if v <= b))))
    counts.append(("+Inf", float(len(values))))
    return counts, float(sum(values))


class CampCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        gpus = GaugeMetricFamily("camp_gpus", "GPU cards by state", labels=["cluster", "state"])
        share = GaugeMetricFamily("camp_gpu_share_allocated",
                                  "GPU-equivalents allocated (slices count their share)", labels=["cluster"])
        mem = GaugeMetricFamily("camp_gpu_memory_mib", "GPU memory, MiB", labels=["cluster", "state"])
        cores = GaugeMetricFamily("camp_gpu_compute_percent", "GPU compute, percent of a card summed",
                                  labels=["cluster", "state"])
        jobs = GaugeMetricFamily("camp_jobs", "Jobs by state", labels=["cluster", "state"])
        waits = HistogramMetricFamily("camp_queue_wait_seconds",
                                      "Submit-to-admit wait of jobs admitted in the last hour",
                                      labels=["cluster"])
        cycles = HistogramMetricFamily("camp_cycle_duration_seconds",
                                       "Scheduling cycle duration over the last hour", labels=["cluster"])
        errors = CounterMetricFamily("camp_dispatch_errors", "Failed attempts to create pods",
                                     labels=["cluster"])
        reachable = GaugeMetricFamily("camp_cluster_reachable",
                                      "1 while the cluster's API server answers, 0 while reconcile "
                                      "backs off from it", labels=["cluster"])
        watch_ok = GaugeMetricFamily("camp_watch_healthy",
                                     "1 while the pod watcher's heartbeat is fresh and its last "
                                     "error is not newer than its last event", labels=["cluster"])
        watch_last = GaugeMetricFamily("camp_watch_last_event_timestamp_seconds",
                                       "Unix time of the pod watcher's last applied event",
                                       labels=["cluster"])
        since = timezone.now() - WINDOW
        error_counts = dict(DispatchError.objects.order_by().values_list("cluster_id")
                            .annotate(n=Count("id")))
        for cluster in Cluster.objects.filter(enabled=True):
            now = selectors.cluster_now(cluster, wait_window=WINDOW)
            name = cluster.name
            gpus.add_metric([name, "in_use"], now.gpus_in_use)
            gpus.add_metric([name, "held_by_others"], now.gpus_held_by_others)
            gpus.add_metric([name, "free"], now.gpus_total - now.gpus_in_use - now.gpus_held_by_others)
            share.add_metric([name], now.gpu_share_allocated)
            mem.add_metric([name, "allocated"], now.gpu_memory_allocated_mib)
            mem.add_metric([name, "held_by_others"], now.gpu_memory_held_by_others_mib)
            mem.add_metric([name, "free"], max(0, now.gpu_memory_total_mib - now.gpu_memory_allocated_mib
                                               - now.gpu_memory_held_by_others_mib))
            cores.add_metric([name, "allocated"], now.cores_allocated_percent)
            cores.add_metric([name, "free"], 100 * now.gpus_total - now.cores_allocated_percent)
            for state, n in now.jobs_by_state.items():
                jobs.add_metric([name, state], n)
            buckets, total = _histogram(now.wait_seconds, WAIT_BUCKETS)
            waits.add_metric([name], buckets, total)
            durations = list(CycleStat.objects.filter(cluster=cluster, at__gte=since)
                             .values_list("seconds", flat=True))
            buckets, total = _histogram(durations, CYCLE_BUCKETS)
            cycles.add_metric([name], buckets, total)
            errors.add_metric([name], error_counts.get(cluster.pk, 0))
            reachable.add_metric([name], 1.0 if cluster.reachable else 0.0)
            if cluster.backend == "kubernetes":
                watch_ok.add_metric([name], 1.0 if cluster.watch_healthy else 0.0)
                if cluster.watch_last_event_at is not None:
                    watch_last.add_metric([name], cluster.watch_last_event_at.timestamp())
        yield from (gpus, share, mem, cores, jobs, waits, cycles, errors, reachable, watch_ok,
                    watch_last)
        yield GaugeMetricFamily("camp_jobs_total", "Jobs known to Camp", value=Job.objects.count())
