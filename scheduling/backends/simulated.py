"""The built-in simulated cluster (DESIGN.md §4): nodes from a YAML inventory, pods that
go Pending → Running after a start delay and finish after their declared duration.

Pods live in the ``SimulatedPod`` table so that the web server, the Celery workers and
beat all see one cluster. Time is the wall clock: the periodic reconcile task is what
"advances" the simulation, by observing the pods' phases and acting on them.

Inventory format (see scheduling/inventories/demo.yaml)::

    start_delay_seconds: 3          # Pending → Running
    create_delay_seconds: 0         # the API server's time to create one pod
    default_duration_seconds: 60    # for jobs that declare none
    nodes:
      - name: h100-{i}              # {i} is replaced when count > 1
        count: 2
        cpu_cores: 96
        ram_gib: 1024
        labels: {camp.io/pool: training}
        ready: true
        gpus: {model: H100-80G, count: 8, memory_mib: 81920, vendor: NVIDIA,
               numa: [0, 0, 0, 0, 1, 1, 1, 1], unhealthy: [], max_sharers: 10}
        nvlink_islands: [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import yaml
from django.db import IntegrityError, transaction
from django.utils import timezone

from ..models import Cluster, SimulatedPod
from .base import (
    MANAGED_BY,
    BackendError,
    GpuInfo,
    JobObjects,
    LineCursor,
    NamespaceSpec,
    NodeInfo,
    PodEvent,
    PodSpec,
    PodStatus,
)
from .vendors import template_dicts, vendor


class InventoryError(ValueError):
    """The YAML inventory is malformed; the message names the problem."""


def parse_inventory(text: str) -> tuple[list[NodeInfo], dict[str, Any]]:
    """Nodes and options of a YAML inventory.

    Parsed once per process for each inventory text (``_parsed``, keyed by the text itself, so
    an edited inventory is parsed anew): every simulated backend is made from its cluster's
    row, and a dispatch (one per admitted job) parsed the whole inventory again — 0.68 s of a
    worker's time per dispatch on the openb trace's 1,213 nodes, half of what two workers did
    while 50,000 jobs were admitted (issue 35, docs/BENCHMARKS.md §14c). The nodes are frozen
    dataclasses shared between callers; the list and the options are each caller's own."""
    nodes, options = _parsed(text or "")
    return list(nodes), dict(options)


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> tuple[tuple[NodeInfo, ...], dict[str, Any]]:
    try:
        data = yaml.safe_load(text or "") or {}
    except yaml.YAMLError as exc:
        raise InventoryError(f"The inventory is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise InventoryError("The inventory must be a mapping with a 'nodes' list.")
    nodes: list[NodeInfo] = []
    seen: set[str] = set()
    for n, entry in enumerate(data.get("nodes") or []):
        if not isinstance(entry, dict) or "name" not in entry:
            raise InventoryError(f"nodes[{n}] needs a name.")
        count = int(entry.get("count", 1))
        for i in range(count):
            name = str(entry["name"]).replace("{i}", str(i)) if count > 1 or "{i}" in str(
                entry["name"]) else str(entry["name"])
            if name in seen:
                raise InventoryError(f"Node {name} appears twice.")
            seen.add(name)
            nodes.append(_node(name, entry))
    options = {
        "start_delay_seconds": float(data.get("start_delay_seconds", 3)),
        "default_duration_seconds": float(data.get("default_duration_seconds", 60)),
        # How long the simulated API server takes to create one pod (default 0): a slow
        # dispatch, e.g. to kill a worker in the middle of one.
        "create_delay_seconds": float(data.get("create_delay_seconds", 0)),
    }
    return tuple(nodes), options


def _node(name: str, entry: dict[str, Any]) -> NodeInfo:
    g = entry.get("gpus") or {}
    gpus: list[GpuInfo] = []
    if g:
        v = vendor(str(g.get("vendor", "NVIDIA")))
        numa = list(g.get("numa") or [])
        unhealthy = set(g.get("unhealthy") or [])
        for i in range(int(g.get("count", 0))):
            uuid = "GPU-" + hashlib.sha256(f"{name}/{i}".encode()).hexdigest()[:32]
            gpus.append(GpuInfo(
                index=i, uuid=uuid, model=str(g["model"]), memory_mib=int(g["memory_mib"]),
                vendor=v.name, numa_node=int(numa[i]) if i < len(numa) else 0,
                healthy=i not in unhealthy, sharing=str(g.get("sharing", v.sharing)),
                templates=tuple(g.get("templates") or template_dicts(v)),
                max_sharers=int(g.get("max_sharers", 10)),
            ))
    return NodeInfo(
        name=name,
        cpu_millicores=int(float(entry.get("cpu_cores", 32)) * 1000),
        ram_mib=int(float(entry.get("ram_gib", 256)) * 1024),
        max_pods=int(entry.get("max_pods", 110)),
        labels={str(k): str(v) for k, v in (entry.get("labels") or {}).items()},
        ready=bool(entry.get("ready", True)),
        cordoned=bool(entry.get("cordoned", False)),
        gpus=tuple(gpus),
        nvlink_islands=tuple(tuple(int(x) for x in isl) for isl in entry.get("nvlink_islands") or []),
    )


class SimulatedBackend:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nodes, self.options = parse_inventory(cluster.inventory)

    def list_nodes(self, camp_jobs: Callable[[], Collection[str]] | None = None) -> list[NodeInfo]:
        return list(self.nodes)

    def ensure_namespace(self, spec: NamespaceSpec) -> None:
        return None  # namespaces are implicit in the simulation

    def ensure_job_objects(self, objs: JobObjects) -> str:
        return ""  # the simulated pods keep rank 0's name

    def create_pod(self, spec: PodSpec) -> bool:
        if spec.node not in {n.name for n in self.nodes}:
            raise BackendError(f"node {spec.node} does not exist", status=422)
        if self.options["create_delay_seconds"]:
            time.sleep(self.options["create_delay_seconds"])
        now = timezone.now()
        start = now + dt.timedelta(seconds=self.options["start_delay_seconds"])
        duration = spec.duration_seconds or self.options["default_duration_seconds"]
        try:
            with transaction.atomic():
                SimulatedPod.objects.create(
                    cluster=self.cluster, namespace=spec.namespace, name=spec.name, node=spec.node,
                    labels={**spec.labels, MANAGED_BY: "camp"},
                    annotations={"camp.io/env": dict(spec.env)},
                    start_at=start, finish_at=start + dt.timedelta(seconds=float(duration)),
                    fail=spec.env.get("CAMP_SIMULATE_FAILURE") == "1",
                )
        except IntegrityError:
            # Already there (a retried dispatch): a live pod means done; a deleted one is
            # recreated from this spec (a requeued job's new attempt: new node, new env).
            updated = SimulatedPod.objects.filter(
                cluster=self.cluster, namespace=spec.namespace, name=spec.name,
                deleted_at__isnull=False,
            ).update(deleted_at=None, node=spec.node, start_at=start,
                     finish_at=start + dt.timedelta(seconds=float(duration)),
                     labels={**spec.labels, MANAGED_BY: "camp"},
                     annotations={"camp.io/env": dict(spec.env)},
                     fail=spec.env.get("CAMP_SIMULATE_FAILURE") == "1")
            return bool(updated)
        return True

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int = 30, uid: str = "") -> None:
        SimulatedPod.objects.filter(
            cluster=self.cluster, namespace=namespace, name=name, deleted_at__isnull=True
        ).update(deleted_at=timezone.now())

    def delete_job_objects(self, namespace: str, name: str) -> None:
        return None

    # A simulated cluster has no pods Camp did not create (issue 34): nothing to bind.
    def bind_namespace(self, namespace: str, project_id: int) -> None:
        raise BackendError("A simulated cluster has no namespaces of its own to bind", status=400)

    def namespace_still_bound(self, namespace: str, project_id: int) -> bool:
        return False

    def list_waiting_external_pods(self) -> list[Any]:
        return []

    def external_pod_exists(self, namespace: str, name: str, uid: str) -> bool:
        return False

    def tell_pod(self, namespace: str, name: str, uid: str, reason: str, message: str, *,
                 event: bool = True) -> None:
        return None

    def bind_external_pod(self, spec: PodSpec, uid: str) -> None:
        raise BackendError(f"Pod {spec.namespace}/{spec.name} is not in a simulated cluster", status=404)

    def list_queue_jobs(self, labels: Collection[str]) -> list[Any]:
        return []

    def suspend_job(self, namespace: str, name: str, uid: str, suspend: bool) -> None:
        raise BackendError(f"Job {namespace}/{name} is not in a simulated cluster", status=404)

    def job_pods(self, namespace: str, job_uid: str) -> list[Any]:
        return []

    def tell_job(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        return None

    def list_job_objects(self) -> list[tuple[str, str, int]]:
        return []  # per-job objects are implicit in the simulation

    def list_pods(self) -> list[PodStatus]:
        now = timezone.now()
        return [
            _status(p, now)
            for p in SimulatedPod.objects.filter(cluster=self.cluster, deleted_at__isnull=True)
        ]

    def watch_pods(self, *, timeout_seconds: int) -> Iterator[PodEvent]:
        for status in self.list_pods():
            yield PodEvent("MODIFIED", status)

    def pod_logs(self, namespace: str, name: str, *, tail_lines: int = 200) -> str:
        pod = SimulatedPod.objects.filter(cluster=self.cluster, namespace=namespace, name=name,
                                          deleted_at__isnull=True).first()
        if pod is None:
            return ""
        return "\n".join(synthetic_logs(pod, timezone.now())[-tail_lines:])

    def pod_http_get(self, namespace: str, name: str, port: int, path: str, *,
                     timeout: float = 5.0) -> bytes | None:
        return None  # simulated pods run no server

    def delete_object(self, namespace: str, kind: str, name: str) -> None:
        return None  # extra objects are implicit in the simulation

    def list_services(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        return []

    def list_ingresses(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        return []

    POLL_SECONDS = 0.5

    def follow_pod_logs(self, namespace: str, name: str, *, tail_lines: int, timeout_seconds: float,
                        stop: threading.Event) -> Iterator[str]:
        """The synthetic log as it grows on the simulated clock (re-derived every
        ``POLL_SECONDS``; lines already sent are skipped), until the pod finishes or is
        deleted, ``timeout_seconds`` pass or ``stop`` is set."""
        deadline = time.monotonic() + timeout_seconds
        cursor = LineCursor()
        first = True
        while True:
            pod = SimulatedPod.objects.filter(cluster=self.cluster, namespace=namespace, name=name,
                                              deleted_at__isnull=True).first()
            if pod is None:
                return
            now = timezone.now()
            fresh = cursor.new(synthetic_logs(pod, now))
            yield from (fresh[-tail_lines:] if tail_lines > 0 else []) if first else fresh
            first = False
            if pod.finish_at is not None and now >= pod.finish_at:
                return  # its last line is out
            if stop.wait(self.POLL_SECONDS) or time.monotonic() >= deadline:
                return


STEP_SECONDS = 1.0  # one simulated training step per second of running time
_STEP_IN_PATH = re.compile(r"step-(\d+)")


def synthetic_logs(pod: SimulatedPod, now: dt.datetime) -> list[str]:
    """What the pod would have printed by ``now``, derived from its env and its clock.

    Training pods (``CAMP_WORKLOAD=training``) print a step line every 10 steps and, on
    rank 0, ``CAMP_CHECKPOINT step=<n> path=<dir>/step-<n>`` every ``CAMP_CHECKPOINT_EVERY``
    steps (the convention real training images follow too, docs/WORKLOADS.md); a pod given
    ``CAMP_RESUME_FROM`` continues from that checkpoint's step. Dev environments print
    their server's start-up lines."""
    env = dict((pod.annotations or {}).get("camp.io/env") or {})
    if now < pod.start_at:
        return []
    end = min(now, pod.finish_at) if pod.finish_at else now

    def ts(t: dt.datetime) -> str:
        return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    lines = [f"{ts(pod.start_at)} camp-sim: pod {pod.name} started on node {pod.node}"]
    workload = env.get("CAMP_WORKLOAD", "")
    if workload in ("jupyter", "vscode", "ssh"):
        what = {"jupyter": f"Jupyter Server is running at http://0.0.0.0:8888{env.get('CAMP_BASE_URL', '/')}",
                "vscode": "HTTP server listening on http://0.0.0.0:8080/",
                "ssh": "Server listening on 0.0.0.0 port 22."}[workload]
        lines.append(f"{ts(pod.start_at)} {what}")
    elif workload == "training":
        rank = env.get("RANK", "0")
        lines.append(f"{ts(pod.start_at)} rank {rank} of {env.get('WORLD_SIZE', '1')}, "
                     f"master {env.get('MASTER_ADDR', 'localhost')}:{env.get('MASTER_PORT', '29500')}")
        first = 0
        resume = env.get("CAMP_RESUME_FROM", "")
        if resume:
            m = _STEP_IN_PATH.search(resume)
            first = int(m.group(1)) if m else 0
            lines.append(f"{ts(pod.start_at)} resuming from checkpoint {resume} at step {first}")
        every = int(env.get("CAMP_CHECKPOINT_EVERY", "0") or 0)
        ckpt_dir = env.get("CAMP_CHECKPOINT_DIR", "")
        done = int((end - pod.start_at).total_seconds() / STEP_SECONDS)
        for k in range(max(1, done - 2000), done + 1):
            step = first + k
            at = pod.start_at + dt.timedelta(seconds=k * STEP_SECONDS)
            if step % 10 == 0:
                lines.append(f"{ts(at)} step {step} loss {2.5 * math.exp(-step / 500):.4f}")
            if rank == "0" and every and ckpt_dir and step % every == 0:
                lines.append(f"{ts(at)} CAMP_CHECKPOINT step={step} path={ckpt_dir.rstrip('/')}/step-{step}")
    if pod.finish_at and now >= pod.finish_at:
        lines.append(f"{ts(pod.finish_at)} " + ("error: simulated failure" if pod.fail else "done"))
    return lines


def _status(p: SimulatedPod, now: dt.datetime) -> PodStatus:
    if now < p.start_at:
        phase = "Pending"
    elif p.finish_at is None or now < p.finish_at:
        phase = "Running"
    else:
        phase = "Failed" if p.fail else "Succeeded"
    message = "simulated failure" if phase == "Failed" else ""
    failed = phase == "Failed"
    return PodStatus(name=p.name, namespace=p.namespace, phase=phase, labels=p.labels,
                     message=message, ready=phase == "Running",
                     terminated_reason="Error" if failed else "Completed" if phase == "Succeeded" else "",
                     exit_code=1 if failed else 0 if phase == "Succeeded" else None,
                     terminated_message=message)
