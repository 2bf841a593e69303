"""What every cluster backend offers the services (DESIGN.md §4).

Backends speak in plain dataclasses: the services never see a Kubernetes object and
the simulated backend never needs one. Every call is idempotent: creating what
already exists succeeds, deleting what is gone succeeds.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_TENANT = "camp.io/tenant"
LABEL_PROJECT = "camp.io/project"
LABEL_PROJECT_ID = "camp.io/project-id"
LABEL_JOB = "camp.io/job"
LABEL_JOB_ID = "camp.io/job-id"
LABEL_JOB_OBJECT = "camp.io/job-object"
"""On a job's owned extra objects: the name of its ConfigMap (deleted with it)."""
LABEL_ROLE = "camp.io/role"
LABEL_REPLICA = "camp.io/replica"
LABEL_INSTALLATION = "camp.io/installation"
"""On everything Camp creates: the installation that created it (``models.installation_id``)."""
LABEL_REGISTRATION = "camp.io/registration"
"""On everything Camp creates: the cluster registration (``Cluster`` id) that created it."""
LABEL_ATTEMPT = "camp.io/attempt"
LABEL_BOUND_PROJECT = "camp.io/bound-project-id"
"""On a namespace Camp did not create, bound to a project (issue 34): that project's id."""
LABEL_EXTERNAL = "camp.io/external"
"""On a pod Camp did not create and has adopted as an ``external`` job's pod (issue 34)."""


def left_to_owner(pod: Any) -> bool:
    """A finished pod Camp did not create (an external job's, issue 34): its owner (a Job, a
    user) reads and deletes it; Camp only deletes live ones (preemption, eviction, cancel)."""
    return pod.labels.get(LABEL_EXTERNAL) == "true" and pod.phase in ("Succeeded", "Failed")
"""On a job's pods: the job's attempt (``Job.attempts``) that created them. Pod names repeat
across attempts; this (with the placement, ``KubernetesBackend._same_placement``) tells which
attempt a pod is, and HAMi never rewrites it (its device plugin does rewrite
``…-devices-to-allocate``)."""

RENDEZVOUS_PORT = 29500
"""Where rank 0 of a distributed job listens for its peers (``MASTER_PORT``: torch's default)."""
RENDEZVOUS_ENV = ("MASTER_ADDR", "PET_MASTER_ADDR")
"""The variables that name a distributed job's rendezvous host (torch.distributed, torchrun,
DeepSpeed): set to rank 0's DNS name from rows, replaced at dispatch by the address the
backend gives it (``ClusterBackend.ensure_job_objects``)."""


class BackendError(Exception):
    """A cluster call failed for good (after retries); ``message`` is for users."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False,
                 unreachable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.unreachable = unreachable
        """The cluster did not answer (connection refused, timeout, TLS): not the job's fault."""


class BindPending(BackendError):
    """The device plugin has not answered a pod's bind handshake yet, and its time is not up:
    the pod stays bound (its node locked); a later dispatch goes on waiting
    (``CAMP_HAMI_BIND_POLL_SECONDS``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


@dataclass(frozen=True)
class CallBudget:
    """How long one periodic run may spend on one cluster (``services.cluster_periodic``): each
    call gets at most ``connect``/``read`` seconds, capped by what is left before ``deadline``
    (on ``clock``), and ``retries`` tries more (the next run is the retry). A call that would
    start after the deadline raises ``BudgetSpent``: the run ends there and the rest waits for
    the next run (every periodic step is idempotent)."""

    deadline: float
    connect: float
    read: float
    retries: int = 0
    clock: Callable[[], float] = time.monotonic

    def timeouts(self) -> tuple[float, float]:
        """(connect, read) timeouts for a call starting now; BudgetSpent when nothing is left."""
        left = self.deadline - self.clock()
        if left <= 0:
            raise BudgetSpent("this run's time for the cluster is spent; the rest waits for the "
                              "next run", retryable=True)
        return min(self.connect, left), min(self.read, left)


class ResourceVersionExpired(BackendError):  # noqa: N818 (it is the Kubernetes name: 410 Gone)
    """The watch's resourceVersion is too old (410 Gone): relist."""


class BudgetSpent(BackendError):  # noqa: N818 (a state, like ResourceVersionExpired)
    """A periodic run used up its time for one cluster (``CallBudget``) between calls: the
    cluster answered, so it is not unreachable; the run stops and the next one goes on."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str
    memory_mib: int
    vendor: str = "NVIDIA"
    numa_node: int = 0
    healthy: bool = True
    sharing: str = "shareable"
    templates: tuple[Mapping[str, Any], ...] = ()
    max_sharers: int = 10
    # Held by pods Camp did not create (HAMi's ``…-devices-allocated`` of other pods, decoded
    # as HAMi's scheduler does): subtracted from what Camp may place on this card.
    foreign_memory_mib: int = 0
    foreign_cores_percent: int = 0
    foreign_sharers: int = 0
    foreign_pods: tuple[str, ...] = ()
    """``namespace/name`` of those pods (for the reasons users read)."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    cpu_millicores: int
    ram_mib: int
    max_pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    ready: bool = True
    not_ready_since: dt.datetime | None = None
    """When the Ready condition left ``True`` (its ``lastTransitionTime``), for a node not ready."""
    not_ready_reason: str = ""
    """The Ready condition's reason and message (``NodeStatusUnknown: Kubelet stopped posting…``)."""
    cordoned: bool = False
    gpus: tuple[GpuInfo, ...] = ()
    nvlink_islands: tuple[tuple[int, ...], ...] = ()
    foreign_whole_cards: int = 0
    """Whole cards asked (``nvidia.com/gpu``) by pods Camp did not create that are bound here
    without HAMi's per-device annotation: the inventory sync takes that many free cards off."""
    foreign_card_pods: tuple[str, ...] = ()
    """``namespace/name`` of those pods."""
    foreign_known: bool = True
    """False when the pods could not be listed: the foreign figures above are unknown and the
    inventory sync keeps the ones it had."""


@dataclass(frozen=True)
class SliceSpec:
    """One GPU slice of one container, as the device plugin must enforce it."""

    uuid: str
    vendor: str
    memory_mib: int
    cores_percent: int
    container: int = 0


@dataclass(frozen=True)
class PodSpec:
    """A pod to create, already bound to its node with its GPU slices chosen."""

    name: str
    namespace: str
    node: str
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    labels: Mapping[str, str]
    cpu_millicores: int
    ram_mib: int
    slices: tuple[SliceSpec, ...]
    owner: str = ""
    """Name of the per-job ConfigMap that owns the pod (clean-up by garbage collection)."""
    subdomain: str = ""
    duration_seconds: int | None = None
    """Only the simulated backend uses it: how long the pod runs."""
    # Workload extras (scheduling/extensions.py), in Kubernetes' own shapes:
    ports: tuple[Mapping[str, Any], ...] = ()
    """Container ports, e.g. ``{"name": "http", "containerPort": 8888}``."""
    volumes: tuple[Mapping[str, Any], ...] = ()
    """Pod volumes, e.g. ``{"name": "home", "persistentVolumeClaim": {"claimName": ...}}``."""
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()
    """Names of Secrets (type ``kubernetes.io/dockerconfigjson``) in the pod's namespace."""
    args: tuple[str, ...] = ()
    """The main container's arguments (its image's entrypoint runs them: a model server)."""
    readiness_probe: Mapping[str, Any] | None = None
    """The main container's readinessProbe (a model service's health path), in Kubernetes' shape."""
    working_dir: str = ""
    """The main container's ``workingDir`` (a dev environment's home mount)."""
    security_context: Mapping[str, Any] | None = None
    """The pod's ``securityContext`` (``runAsUser``/``runAsGroup``/``fsGroup``: how its image runs)."""
    container_security_context: Mapping[str, Any] | None = None
    """The main container's ``securityContext`` (Pod Security "restricted" where the image allows)."""


@dataclass(frozen=True)
class ExtraObject:
    """A namespaced object created with a job's objects (a Service, Ingress, PVC, Secret or
    ConfigMap) — the workload extension point (scheduling/extensions.py)."""

    manifest: Mapping[str, Any]
    owned: bool = True
    """Owned by the job's ConfigMap, so deleted with the job. False for objects that outlive
    one run (a home volume, a registry pull secret shared by the project's jobs)."""


@dataclass(frozen=True)
class JobObjects:
    """Per-job objects created before the pods: the owner ConfigMap and, for distributed
    jobs, a headless Service."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    data: Mapping[str, str]
    headless_service: bool = False
    extra: tuple[ExtraObject, ...] = ()
    rendezvous: Mapping[str, str] = field(default_factory=dict)
    """Labels of the pod that hosts the job's rendezvous (rank 0, ``MASTER_ADDR``). A backend
    that can give it an address needing no DNS returns that address from
    ``ensure_job_objects`` (Kubernetes: a ClusterIP Service selecting that pod) and the
    dispatch writes it into the pods' ``RENDEZVOUS_ENV``."""


@dataclass(frozen=True)
class PodStatus:
    name: str
    namespace: str
    phase: str  # Pending, Running, Succeeded, Failed (Kubernetes pod phases)
    labels: Mapping[str, str] = field(default_factory=dict)
    message: str = ""
    deleting: bool = False
    ready: bool = False
    """The pod's Ready condition (its readiness probe passes): a model service's replica
    takes requests, and counts for a rollout, only then."""
    probed: bool = False
    """The pod declares a readiness probe: its job is running only once the pod is Ready
    (a notebook whose server does not answer yet is still starting)."""
    reason: str = ""
    """The pod's own ``status.reason`` (``Evicted``, ``UnexpectedAdmissionError``, …)."""
    unschedulable: str = ""
    """The ``PodScheduled=False`` condition's message (a scheduler or the kubelet refused it)."""
    waiting_reason: str = ""
    """The main container's ``state.waiting.reason`` (``ImagePullBackOff``, ``ErrImagePull``,
    ``CreateContainerConfigError``, ``ContainerCreating``, …)."""
    waiting_message: str = ""
    terminated_reason: str = ""
    """The main container's ``state.terminated.reason`` (``OOMKilled``, ``Error``,
    ``StartError``, ``Completed``), else that of its last termination."""
    exit_code: int | None = None
    signal: int | None = None
    terminated_message: str = ""
    uid: str = ""
    """The pod's UID: names repeat across a job's attempts, UIDs never do."""
    binding: bool = False
    """In HAMi's bind handshake, not answered yet (``hami.io/bind-phase: allocating``)."""
    node: str = ""
    refused: bool = False
    """Refused at admission by the node's device plugin: failed with the kubelet's
    ``UnexpectedAdmissionError``, or HAMi's ``hami.io/bind-phase: failed``. Not the job's
    failure: its dispatch failed, and it is requeued (``services.dispatch``)."""


@dataclass(frozen=True)
class PodEvent:
    type: str  # ADDED, MODIFIED, DELETED
    pod: PodStatus


ADMISSION_ERROR = "UnexpectedAdmissionError"
"""The reason a kubelet gives a pod it refused at admission because a device plugin's
``Allocate`` failed (kubelet's devicemanager; HAMi's plugin answers failed then)."""


def attempt_of(pod: PodStatus, attempt: int) -> bool:
    """Whether ``pod`` belongs to the job's ``attempt`` (its ``camp.io/attempt`` label; a pod
    made before that label existed counts as the current attempt's)."""
    return pod.labels.get(LABEL_ATTEMPT, str(attempt)) == str(attempt)


def refusal_message(node: str, pod: str) -> str:
    """What a job's reason says when the device plugin refused its pod's GPUs (both paths
    that see it: the dispatch's poll and the watcher)."""
    return (f"HAMi's device plugin on node {node} refused the GPUs of pod {pod} at admission "
            f"(bind-phase failed)")


@dataclass(frozen=True)
class NamespaceSpec:
    name: str
    labels: Mapping[str, str]
    quota: Mapping[str, str]
    """ResourceQuota ``spec.hard``; empty: no quota object."""


class ClusterBackend(Protocol):
    def list_nodes(self, camp_jobs: Callable[[], Collection[str]] | None = None) -> list[NodeInfo]:
        """The nodes with their GPUs; ``camp_jobs()`` names the jobs (ids) whose pods are
        Camp's, every other pod's GPUs count as held by others (``GpuInfo.foreign_*``)."""
        ...

    def ensure_namespace(self, spec: NamespaceSpec) -> None: ...

    def ensure_job_objects(self, objs: JobObjects) -> str:
        """Create the job's objects; the address of its rendezvous when the backend gives
        one that needs no DNS (``JobObjects.rendezvous``), else ""."""
        ...

    def create_pod(self, spec: PodSpec) -> bool:
        """Create the pod; False when it already existed (409 Conflict means done)."""
        ...

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int = 30, uid: str = "") -> None:
        """Delete the pod (idempotent); with ``uid``, only if it is still that pod."""
        ...

    # Pods Camp did not create (issue 34; only a Kubernetes cluster has them).
    def bind_namespace(self, namespace: str, project_id: int) -> None: ...

    def namespace_still_bound(self, namespace: str, project_id: int) -> bool: ...

    def list_waiting_external_pods(self) -> list[Any]: ...

    def external_pod_exists(self, namespace: str, name: str, uid: str) -> bool: ...

    def tell_pod(self, namespace: str, name: str, uid: str, reason: str, message: str, *,
                 event: bool = True) -> None: ...

    def bind_external_pod(self, spec: PodSpec, uid: str) -> None: ...

    # batch/v1 Jobs labelled for a queue, admitted as Kueue does (issue 34).
    def list_queue_jobs(self, labels: Collection[str]) -> list[Any]: ...

    def suspend_job(self, namespace: str, name: str, uid: str, suspend: bool) -> None: ...

    def job_pods(self, namespace: str, job_uid: str) -> list[Any]: ...

    def tell_job(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None: ...

    def delete_job_objects(self, namespace: str, name: str) -> None:
        """Delete the job's ConfigMap, headless Service and owned extras (idempotent)."""
        ...

    def list_job_objects(self) -> list[tuple[str, str, int]]:
        """(namespace, name, job id) of every per-job ConfigMap on the cluster."""
        ...

    def list_pods(self) -> list[PodStatus]:
        """Every pod this platform manages on the cluster."""
        ...

    def watch_pods(self, *, timeout_seconds: int) -> Iterator[PodEvent]:
        """Pod events for up to ``timeout_seconds`` (relisting on 410 Gone)."""
        ...

    def pod_logs(self, namespace: str, name: str, *, tail_lines: int = 200) -> str:
        """The last ``tail_lines`` lines of the pod's main container ("" if it is gone)."""
        ...

    def pod_http_get(self, namespace: str, name: str, port: int, path: str, *,
                     timeout: float = 5.0) -> bytes | None:
        """GET ``path`` from the pod's ``port`` through the API server's pod proxy (what
        ``kubectl get --raw /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`` does); the
        body of a 200 answer, None when the pod does not answer (or not with 200)."""
        ...

    def delete_object(self, namespace: str, kind: str, name: str) -> None:
        """Delete one extra object (e.g. a home PVC when its environment is deleted)."""
        ...

    def list_services(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        """(namespace, name, labels) of every Service Camp made that carries ``label`` (a
        workload's objects that outlive single jobs, swept when their workload is gone)."""
        ...

    def list_ingresses(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        """(namespace, name, labels) of every Ingress Camp made that carries ``label`` (swept
        like ``list_services``' Services)."""
        ...

    def follow_pod_logs(self, namespace: str, name: str, *, tail_lines: int, timeout_seconds: float,
                        stop: threading.Event) -> Iterator[str]:
        """The pod's last ``tail_lines`` lines, then new ones as they are written, until the
        container ends, ``timeout_seconds`` pass or ``stop`` is set. Blocking: callers run
        it in a thread of its own."""
        ...


class LineCursor:
    """Which timestamped log lines (``<RFC 3339 time> <text>``) were already emitted, so
    that polling a log again, or reconnecting to a stream from a time, yields each line
    once. Times compare as numbers (Kubernetes trims trailing zeros of the fraction)."""

    def __init__(self) -> None:
        self.last: tuple[str, int] | None = None
        self.at_last: set[str] = set()

    @staticmethod
    def key(line: str) -> tuple[str, int] | None:
        stamp = line.split(" ", 1)[0]
        if len(stamp) < 20 or not stamp.endswith("Z") or stamp[10:11] != "T":
            return None
        whole, _, fraction = stamp[:-1].partition(".")
        if not fraction.isdigit() and fraction:
            return None
        return whole, int((fraction or "0")[:9].ljust(9, "0"))

    def new(self, lines: Iterable[str]) -> list[str]:
        out = []
        for line in lines:
            k = self.key(line)
            if k is None:
                k = self.last  # an untimed line belongs with the one before it
            if k is not None and self.last is not None and k < self.last:
                continue
            if k is not None and k == self.last:
                if line in self.at_last:
                    continue
                self.at_last.add(line)
            else:
                self.last, self.at_last = k, {line}
            out.append(line)
        return out

    def since_seconds(self, now: float) -> int | None:
        """For a reconnect: how far back to ask (a little more; duplicates are dropped)."""
        if self.last is None:
            return None
        import datetime as dt

        at = dt.datetime.strptime(self.last[0], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
        return max(1, int(now - at) + 2)


def split_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Lines of a byte stream that arrives in arbitrary chunks (a partial last line is kept
    until its newline, or the end of the stream)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            yield raw.rstrip(b"\r").decode("utf-8", errors="replace")
    if pending:
        yield pending.decode("utf-8", errors="replace")
