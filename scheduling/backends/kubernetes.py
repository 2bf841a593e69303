"""The Kubernetes backend: the only module that talks to a cluster (DESIGN.md §4).

Placement reaches the node the way HAMi expects it (verified against HAMi v2.10.0's
sources; docs/KUBERNETES.md): pods carry Camp's scheduler name and no ``nodeName`` (HAMi's
webhook refuses GPU pods already bound), then are bound through ``pods/binding``. On a HAMi
node, first HAMi's bind handshake: the pod carries ``hami.io/vgpu-node``, ``hami.io/vgpu-time``
and both device encodings (``…-to-allocate`` and ``…-allocated``: ``UUID,Type,mem,cores:`` per
device, containers joined by ``;``) with the ``gpu``/``gpumem``/``gpucores`` limits; Camp takes
the node lock ``hami.io/mutex.lock``, sets ``hami.io/bind-phase: allocating`` and
``hami.io/bind-time``, binds, and waits for the device plugin's ``success``/``failed``. Nodes
without HAMi get whole cards (``nvidia.com/gpu`` only) and no HAMi annotation.

Inventory comes from the nodes: ``hami.io/node-nvidia-register`` (a JSON array of
DeviceInfo ``{id, index, count, devmem, devcore, type, numa, mode, health}``; older
releases wrote ``id,count,devmem,devcore,type,numa,health[,index,mode]:`` entries), else
``nvidia.com/gpu`` capacity with the GPU feature-discovery labels; what pods Camp did not
create hold on them (HAMi's ``…-devices-allocated`` of its pods, whole cards of other pods
asking ``nvidia.com/gpu``) comes with them (``_foreign``, docs/KUBERNETES.md).

Every call retries 5xx, 429 and timeouts with exponential backoff; a create answered
409 Conflict means "already done" (names are deterministic).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import urllib3
import yaml
from django.conf import settings
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from ..models import Cluster, installation_id
from .base import (
    ADMISSION_ERROR,
    LABEL_ATTEMPT,
    LABEL_BOUND_PROJECT,
    LABEL_EXTERNAL,
    LABEL_INSTALLATION,
    LABEL_JOB_ID,
    LABEL_JOB_OBJECT,
    LABEL_PROJECT_ID,
    LABEL_REGISTRATION,
    MANAGED_BY,
    RENDEZVOUS_PORT,
    BackendError,
    BindPending,
    CallBudget,
    ExtraObject,
    GpuInfo,
    JobObjects,
    LineCursor,
    NamespaceSpec,
    NodeInfo,
    PodEvent,
    PodSpec,
    PodStatus,
    ResourceVersionExpired,
    refusal_message,
    split_lines,
)
from .credentials import decrypt_credentials, kubeconfig_problems
from .naming import rendezvous_service_name
from .vendors import VENDORS, template_dicts, vendor

logger = logging.getLogger(__name__)
T = TypeVar("T")

RETRYABLE = {429, 500, 502, 503, 504}
NODE_LOCK = "hami.io/mutex.lock"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""On an unbound claim of a ``WaitForFirstConsumer`` StorageClass: the node its volume is to be
provisioned for (kube-scheduler's VolumeBinding plugin writes it; Camp, binding pods itself, too)."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
BIND_PHASE = "hami.io/bind-phase"
HANDSHAKE_STALE_SECONDS = 60  # HAMi's CheckHealth: a Requesting_ handshake unanswered this long


def scheduler_name() -> str:
    return str(getattr(settings, "CAMP_SCHEDULER_NAME", "camp-scheduler"))


def bind_timeout() -> int:
    return int(getattr(settings, "CAMP_HAMI_BIND_TIMEOUT_SECONDS", 60))


def bind_poll() -> int:
    return int(getattr(settings, "CAMP_HAMI_BIND_POLL_SECONDS", 5))


def nodelock_expiry() -> int:
    return int(getattr(settings, "CAMP_HAMI_NODELOCK_EXPIRE_SECONDS", 300))


def handshake_dead(value: str, allocatable_count: int, now: dt.datetime | None = None) -> bool:
    """HAMi's CheckHealth (pkg/device/devices.go): the scheduler side writes
    ``Requesting_<2006-01-02 15:04:05>`` and a live device plugin answers with
    ``Reported_…``; a ``Requesting_`` older than 60 s on a node that no longer advertises
    the GPU resource means the plugin is gone."""
    if not value.startswith("Requesting"):
        return False
    _, _, stamp = value.partition("_")
    try:
        asked = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return False  # HAMi treats an unreadable stamp as healthy
    now = now or dt.datetime.now()  # HAMi parses it in local time
    return (now - asked).total_seconds() > HANDSHAKE_STALE_SECONDS and allocatable_count <= 0
QUOTA_NAME = "camp-project-quota"
WORKLOADS_ROLE = "camp-agent-workloads"
"""The camp-agent chart's ClusterRole of Camp's rights inside its own namespaces."""
ROLE_BINDING = "camp-agent"
"""The RoleBinding of ``WORKLOADS_ROLE`` Camp creates in each namespace it creates."""
GRANT_WAIT_SECONDS = 30
SELECTOR = f"{MANAGED_BY}=camp"
POD_PAGE = 500
"""Pods per page when the inventory sync lists every pod (``limit``/``continue``)."""


def encode_devices(slices: Any) -> str:
    """HAMi's EncodePodSingleDevice (pkg/device/devices.go, v2.8–v2.10), byte for byte: each
    device ``UUID,Type,mem,cores:``, each container's list ended by ``;`` (one container with
    one device: ``GPU-x,NVIDIA,20000,25:;``)."""
    if not slices:
        return ""
    containers = max(s.container for s in slices) + 1
    return "".join(
        "".join(f"{s.uuid},{vendor(s.vendor).hami_type},{s.memory_mib},{s.cores_percent}:"
                for s in slices if s.container == c) + ";"
        for c in range(containers)
    )


def parse_hami_register(value: str) -> list[GpuInfo]:
    """GPUs from ``hami.io/node-nvidia-register`` (JSON array, or the older colon format)."""
    value = value.strip()
    out: list[GpuInfo] = []
    if value.startswith("["):
        for i, d in enumerate(json.loads(value)):
            out.append(GpuInfo(
                index=int(d.get("index", i)), uuid=str(d["id"]), model=str(d.get("type", "")),
                memory_mib=int(d.get("devmem", 0)), vendor="NVIDIA",
                # Go's omitempty drops "health": false, so a device without it is unhealthy.
                numa_node=int(d.get("numa", 0)), healthy=bool(d.get("health", False)),
                max_sharers=int(d.get("count", 10)) or 1,
            ))
        return out
    for i, entry in enumerate(e for e in value.split(":") if "," in e):
        items = entry.split(",")
        out.append(GpuInfo(
            index=int(items[7]) if len(items) >= 9 else i, uuid=items[0], model=items[4],
            memory_mib=int(items[2]), vendor="NVIDIA", numa_node=int(items[5] or 0),
            healthy=items[6].lower() == "true", max_sharers=int(items[1]) or 1,
        ))
    return out


class DeviceAnnotationError(ValueError):
    """A pod's HAMi device annotation HAMi itself could not decode (the pod is not counted)."""


def decode_pod_devices(value: str) -> list[list[tuple[str, str, int, int]]]:
    """HAMi's DecodePodDevices for one annotation (pkg/device/devices.go, v2.10.0): containers
    split on ``;`` (empty ones kept: the index is the container's), devices on ``:``; an entry
    with a comma is ``UUID,Type,Usedmem,Usedcores`` (fewer than four fields, or a number that
    does not parse as a 32-bit integer, is an error); entries without a comma are skipped."""
    out: list[list[tuple[str, str, int, int]]] = []
    for container in value.split(";"):
        devices: list[tuple[str, str, int, int]] = []
        for entry in container.split(":") if container else ():
            if "," not in entry:
                continue
            items = entry.split(",")
            if len(items) < 4:
                raise DeviceAnnotationError(f"missing fields in {entry!r}")
            numbers = []
            for what, raw in (("memory", items[2]), ("core", items[3])):
                try:
                    n = int(raw, 10)  # Go's ParseInt(s, 10, 32): no spaces, no underscores
                except ValueError:
                    raise DeviceAnnotationError(f"invalid {what} field {raw!r}") from None
                if raw.strip() != raw or "_" in raw or not -2**31 <= n < 2**31:
                    raise DeviceAnnotationError(f"invalid {what} field {raw!r}")
                numbers.append(n)
            devices.append((items[0], items[1], numbers[0], numbers[1]))
        out.append(devices)
    return out


def init_containers_succeeded(status: Mapping[str, Any]) -> bool:
    """HAMi's AllInitContainersSucceeded (pkg/util/util.go): the pod reports init container
    statuses and every one has terminated with exit code 0. ``status`` is the pod's status
    as the API server sends it (JSON)."""
    def succeeded(s: Mapping[str, Any]) -> bool:
        done = (s.get("state") or {}).get("terminated")
        return done is not None and done.get("exitCode", 0) == 0  # Go: a missing int is 0

    states = status.get("initContainerStatuses") or []
    return bool(states) and all(succeeded(s) for s in states)


def pod_device_usage(value: str, init_containers: int = 0, *,
                     init_done: bool = False) -> dict[str, tuple[int, int, int]]:
    """Per device UUID, what a pod holds: (memory MiB, cores %, slots), HAMi's
    CollapseInitContainerUsage (pkg/device/initContainer.go): init containers run one after
    another (their peak counts, one slot), app containers together (summed, a slot each); a
    device takes the larger of the two, at least one slot. With ``init_done`` (every init
    container succeeded, ``init_containers_succeeded``) only the app containers count, as
    HAMi's scheduler shrinks the pod then (onUpdatePod, AppContainersOnlyDeviceUsage): a
    device only init containers used is no longer held."""
    if init_done:
        app_only: dict[str, tuple[int, int, int]] = {}
        for i, devices in enumerate(decode_pod_devices(value)):
            if i < init_containers:
                continue
            for uuid, _type, mem, cores in devices:
                m, c, n = app_only.get(uuid, (0, 0, 0))
                app_only[uuid] = (m + mem, c + cores, n + 1)
        return dict(sorted(app_only.items()))
    init: dict[str, list[int]] = {}
    app: dict[str, list[int]] = {}
    for i, devices in enumerate(decode_pod_devices(value)):
        for uuid, _type, mem, cores in devices:
            if i < init_containers:
                u = init.setdefault(uuid, [0, 0, 0])
                u[0], u[1], u[2] = max(u[0], mem), max(u[1], cores), 1
            else:
                u = app.setdefault(uuid, [0, 0, 0])
                u[0], u[1], u[2] = u[0] + mem, u[1] + cores, u[2] + 1
    out = {}
    for uuid in sorted(set(init) | set(app)):
        a, b = init.get(uuid, [0, 0, 0]), app.get(uuid, [0, 0, 0])
        out[uuid] = (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2], 1))
    return out


def _resource_count(spec: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request of an extended resource, as kube-scheduler computes it:
    the larger of the app containers' sum and the largest init container (limits, else
    requests; the two are equal for extended resources). ``spec`` is the pod's spec as the
    API server sends it (JSON, camelCase)."""
    def one(c: Mapping[str, Any]) -> int:
        res = c.get("resources") or {}
        for part in (res.get("limits") or {}, res.get("requests") or {}):
            if resource in part:
                try:
                    return max(0, int(parse_quantity(part[resource])))
                except (ValueError, TypeError):
                    return 0
        return 0
    app = sum(one(c) for c in (spec.get("containers") or []))
    init = max((one(c) for c in (spec.get("initContainers") or [])), default=0)
    return max(app, init)


def _gfd_gpus(name: str, capacity: dict[str, str], labels: dict[str, str]) -> list[GpuInfo]:
    """GPUs from ``nvidia.com/gpu`` capacity and GPU feature discovery labels."""
    count = int(capacity.get("nvidia.com/gpu", "0") or 0) or int(labels.get("nvidia.com/gpu.count", "0"))
    model = labels.get("nvidia.com/gpu.product", "nvidia-gpu")
    memory = int(labels.get("nvidia.com/gpu.memory", "0") or 0)
    # Without HAMi there is no per-device id nor slicing: whole cards only.
    return [GpuInfo(index=i, uuid=f"{name}-gpu{i}", model=model, memory_mib=memory,
                    sharing="exclusive-only", max_sharers=1) for i in range(count)]


def _mib(quantity: str | None) -> int:
    return int(parse_quantity(quantity or "0") / (1024 * 1024))


def _millicores(quantity: str | None) -> int:
    return int(parse_quantity(quantity or "0") * 1000)


class KubernetesBackend:
    def __init__(self, api_client: k8s.ApiClient, *, retries: int | None = None,
                 backoff: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.storage = k8s.StorageV1Api(api_client)
        # Retries of one call and the first backoff step (doubling each try): settings
        # CAMP_KUBE_API_RETRIES and CAMP_KUBE_API_BACKOFF_MS (4 and 200 ms: 3 s per call at most).
        self.retries = int(getattr(settings, "CAMP_KUBE_API_RETRIES", 4)) if retries is None else retries
        self.backoff = (int(getattr(settings, "CAMP_KUBE_API_BACKOFF_MS", 200)) / 1000
                        if backoff is None else backoff)
        self.sleep = sleep
        self._owner_uids: dict[tuple[str, str], str] = {}
        self.owner: dict[str, str] = {}
        """The installation and registration labels of what this backend creates
        (``for_cluster``); what carries other values is another's and never touched."""
        self.timeout: float | tuple[float, float] = 30  # seconds, or (connect, read)
        # A periodic run's time for this cluster (``services.cluster_periodic``): timeouts and
        # retries from it, capped by its deadline, instead of the ones above.
        self.budget: CallBudget | None = None
        # ``_call`` retries with backoff itself; urllib3's own silent retries under it would
        # multiply every wait on a dead server (and log a line per attempt).
        pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
        if pool is not None:
            pool.connection_pool_kw["retries"] = False

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> KubernetesBackend:
        backend = cls._connect(cluster)
        backend.owner = {LABEL_INSTALLATION: installation_id(), LABEL_REGISTRATION: str(cluster.pk)}
        return backend

    def own(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with ``labels`` is Camp's and this registration's: Camp's label,
        and this installation's and registration's (an object made before those labels
        existed, without them, counts as its own)."""
        labels = labels or {}
        return labels.get(MANAGED_BY) == "camp" and all(
            labels.get(k, v) == v for k, v in self.owner.items())

    @classmethod
    def _connect(cls, cluster: Cluster) -> KubernetesBackend:
        creds = decrypt_credentials(cluster.credentials_encrypted)
        if creds.get("kubeconfig"):
            # Refused when stored too (services.cluster_create/update); checked again for
            # credentials stored before that check existed.
            problems = kubeconfig_problems(creds["kubeconfig"])
            if problems:
                raise BackendError(f"Refusing the cluster's kubeconfig: {problems[0]}", status=400)
            api = k8s_config.new_client_from_config_dict(yaml.safe_load(creds["kubeconfig"]))
            if cluster.api_server:
                api.configuration.host = cluster.api_server
            return cls(api)
        if not cluster.api_server:
            raise BackendError("The cluster has no API server URL and no kubeconfig", status=400)
        configuration = k8s.Configuration()
        configuration.host = cluster.api_server
        if creds.get("token"):
            configuration.api_key = {"authorization": f"Bearer {creds['token']}"}
        if creds.get("ca_cert"):
            fd, path = tempfile.mkstemp(prefix="camp-ca-", suffix=".pem")
            with os.fdopen(fd, "w") as fh:
                fh.write(creds["ca_cert"])
            configuration.ssl_ca_cert = path
        return cls(k8s.ApiClient(configuration))

    # -- retries -----------------------------------------------------------------------------

    def _call(self, fn: Callable[..., T], *args: Any, ok: tuple[int, ...] = (), **kwargs: Any) -> T | None:
        """Call the API; statuses in ``ok`` return None; 5xx/429/timeouts retry with backoff.
        Under a ``budget`` each try's timeouts are what is left of it (``BudgetSpent`` when
        nothing is), and its retries replace ``retries``."""
        budget = self.budget
        retries = self.retries if budget is None else budget.retries
        for attempt in range(retries + 1):
            if budget is not None:
                kwargs["_request_timeout"] = budget.timeouts()
            else:
                kwargs.setdefault("_request_timeout", self.timeout)
            try:
                return fn(*args, **kwargs)
            except ApiException as exc:
                if exc.status in ok:
                    return None
                if exc.status in RETRYABLE and attempt < retries:
                    self.sleep(self.backoff * 2 ** attempt)
                    continue
                raise BackendError(_describe(exc), status=exc.status,
                                   retryable=exc.status in RETRYABLE, unreachable=not exc.status) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                if attempt < retries:
                    self.sleep(self.backoff * 2 ** attempt)
                    continue
                raise BackendError(f"Kubernetes API unreachable at {self.api.configuration.host} "
                                   f"({_reason(exc)})", retryable=True, unreachable=True) from exc
        raise AssertionError("unreachable")

    def probe(self, *, timeout: float | None = None) -> None:
        """One quick ``GET /version`` (no retries): BackendError unless the server answers
        within ``timeout`` seconds (``CAMP_KUBE_PROBE_SECONDS``). Periodic runs probe first
        (``services.cluster_periodic``), so a dead or hung API server costs a worker seconds,
        not a request timeout."""
        if timeout is None:
            timeout = float(getattr(settings, "CAMP_KUBE_PROBE_SECONDS", 3))
        limit = (timeout, timeout)
        if self.budget is not None:
            left = self.budget.timeouts()
            limit = min(timeout, left[0]), min(timeout, left[1])
        try:
            # Read, not deserialised: that it answered is all the probe asks.
            answer = k8s.VersionApi(self.api).get_code(_request_timeout=limit, _preload_content=False)
            answer.read()
            answer.release_conn()
        except ApiException as exc:
            if exc.status in (401, 403):
                return  # it answered; what the credentials may do is checked elsewhere
            raise BackendError(_describe(exc), status=exc.status, retryable=True,
                               unreachable=not exc.status) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendError(f"Kubernetes API unreachable at {self.api.configuration.host} "
                               f"({_reason(exc)})", retryable=True, unreachable=True) from exc

    # -- inventory ---------------------------------------------------------------------------

    def list_nodes(self, camp_jobs: Callable[[], Collection[str]] | None = None) -> list[NodeInfo]:
        """The nodes, each GPU with what pods Camp did not create hold on it (``_foreign``;
        ``camp_jobs`` names the jobs whose pods are Camp's). When the pods cannot be listed
        the nodes are still returned (their readiness and health matter most), marked
        ``foreign_known=False``: the sync keeps the last figures."""
        nodes = self._call(self.core.list_node)
        assert nodes is not None
        infos = [self._node(n) for n in nodes.items]
        if not any(i.gpus for i in infos):
            return infos
        try:
            by_uuid, cards = self._foreign(camp_jobs)
        except BackendError as exc:
            logger.warning("cannot list pods (%s): GPUs held by other schedulers' pods keep their "
                           "last known figures", exc)
            return [dataclasses.replace(i, foreign_known=False) for i in infos]
        out = []
        for info in infos:
            gpus = tuple(dataclasses.replace(
                g, foreign_memory_mib=by_uuid[g.uuid][0], foreign_cores_percent=by_uuid[g.uuid][1],
                foreign_sharers=by_uuid[g.uuid][2], foreign_pods=tuple(by_uuid[g.uuid][3]))
                if g.uuid in by_uuid else g for g in info.gpus)
            count, pods = cards.get(info.name, (0, []))
            out.append(dataclasses.replace(info, gpus=gpus, foreign_whole_cards=count,
                                           foreign_card_pods=tuple(pods)))
        return out

    def _all_pods(self, field_selector: str) -> Iterator[dict[str, Any]]:
        """Every pod of the cluster matching ``field_selector``, in pages of ``POD_PAGE`` (a
        list of 30,000 pods in one answer is tens of MB and seconds of work for the API
        server), each as the plain JSON the API server sent: building the client's V1Pod
        models costs ~1.6 ms of CPU per pod, json.loads a small fraction of that
        (bench/foreign_pods.py). A page that fails raises BackendError."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"field_selector": field_selector, "limit": POD_PAGE,
                                      "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            resp = self._call(self.core.list_pod_for_all_namespaces, **kwargs)
            assert resp is not None
            try:
                page = json.loads(resp.data)
                resp.release_conn()
            except ValueError as exc:
                raise BackendError(f"unreadable pod list from the API server ({exc})",
                                   retryable=True) from exc
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return

    def _foreign(self, camp_jobs: Callable[[], Collection[str]] | None = None) -> tuple[
            dict[str, tuple[int, int, int, list[str]]], dict[str, tuple[int, list[str]]]]:
        """GPUs held by pods Camp did not create and that have not ended (Succeeded/Failed;
        a terminating pod still holds its devices, as HAMi counts it):

        * a pod HAMi placed (``hami.io/vgpu-node``) holds, per device UUID, what its
          ``…-devices-allocated`` annotation says, decoded and collapsed as HAMi's scheduler
          does (``pod_device_usage``): {uuid: (memory MiB, cores %, slots, pods)};
        * any other bound pod (no ``hami.io/vgpu-node``) asking for a vendor's GPU resource
          (``nvidia.com/gpu``: the default scheduler's whole cards) holds that many whole
          cards of its node, which ones unknown: {node: (cards, pods)} (the inventory sync picks free ones).

        Rule (Camp's pods): a pod is Camp's when it carries Camp's label and the id of one of
        ``camp_jobs()`` (the jobs holding an allocation in this cluster, asked after the pods
        are listed, so a job admitted meanwhile is Camp's); without ``camp_jobs``, any job id.
        Not the scheduler name: renaming ``CAMP_SCHEDULER_NAME`` must not turn Camp's running
        pods into someone else's, and a pod naming Camp's scheduler that Camp did not create
        (or whose job has ended in Camp) still holds its GPUs. A pod that copies the label
        without a live job's id is someone else's.

        An annotation HAMi could not decode is logged and the pod ignored (as HAMi's
        scheduler ignores it); it never stops the sync. A pod list that fails raises
        BackendError (never "no pods")."""
        # (pod name, Camp job id or "", {uuid: usage}, node, whole cards)
        held: list[tuple[str, str, dict[str, tuple[int, int, int]], str, int]] = []
        for pod in self._all_pods("status.phase!=Succeeded,status.phase!=Failed"):
            meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            if phase in ("Succeeded", "Failed"):
                continue
            labels = meta.get("labels") or {}
            # Another installation's (or registration's) pods hold GPUs like anyone else's.
            job_id = str(labels.get(LABEL_JOB_ID) or "") if self.own(labels) else ""
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            ann = meta.get("annotations") or {}
            usage: dict[str, tuple[int, int, int]] = {}
            if ann.get("hami.io/vgpu-node"):
                for v in VENDORS.values():
                    raw = ann.get(v.allocated_annotation)
                    if not raw:
                        continue
                    try:
                        found = pod_device_usage(
                            raw, len(spec.get("initContainers") or []),
                            init_done=init_containers_succeeded(pod.get("status") or {}))
                    except DeviceAnnotationError as exc:
                        logger.warning("pod %s: ignoring its %s %r (HAMi cannot decode it either: %s)",
                                       name, v.allocated_annotation, raw[:200], exc)
                        continue
                    for uuid, (mem, cores, slots) in found.items():
                        m, c, n = usage.get(uuid, (0, 0, 0))
                        usage[uuid] = (m + mem, c + cores, n + slots)
            node = spec.get("nodeName") or ""
            count = 0
            if not ann.get("hami.io/vgpu-node") and node:
                # HAMi's pods count by their annotation only, as HAMi counts them.
                count = sum(_resource_count(spec, v.count_resource) for v in VENDORS.values())
            if usage or count:
                held.append((name, job_id, usage, node, count))
        live = set(camp_jobs()) if camp_jobs is not None and any(h[1] for h in held) else None
        by_uuid: dict[str, tuple[int, int, int, list[str]]] = {}
        cards: dict[str, tuple[int, list[str]]] = {}
        for name, job_id, usage, node, count in held:
            if job_id and (job_id in live if live is not None else camp_jobs is None):
                continue  # Camp's own pod: its GPUs are Camp's allocations
            for uuid, (mem, cores, slots) in usage.items():
                m, c, n, pods = by_uuid.get(uuid, (0, 0, 0, []))
                by_uuid[uuid] = (m + mem, c + cores, n + slots, [*pods, name])
            if count:
                have, pods = cards.get(node, (0, []))
                cards[node] = (have + count, [*pods, name])
        return by_uuid, cards

    def _node(self, n: Any) -> NodeInfo:
        meta, status = n.metadata, n.status
        labels = dict(meta.labels or {})
        annotations = dict(meta.annotations or {})
        alloc = dict((status.allocatable if status else None) or (status.capacity if status else None) or {})
        capacity = dict((status.capacity if status else None) or {})
        condition = next((c for c in ((status.conditions if status else None) or []) if c.type == "Ready"),
                         None)
        # Kubernetes' rule: only Ready=True is ready; False (the kubelet says so) and Unknown
        # (the node-lifecycle controller stopped hearing from it) are not.
        ready = condition is not None and condition.status == "True"
        not_ready_reason = "" if ready or condition is None else ": ".join(
            x for x in (condition.reason, " ".join((condition.message or "").split())[:200]) if x)
        gpus: list[GpuInfo] = []
        for v in VENDORS.values():
            raw = annotations.get(v.register_annotation)
            if raw:
                try:
                    found = parse_hami_register(raw)
                except (ValueError, KeyError, IndexError):
                    logger.warning("node %s: unreadable %s", meta.name, v.register_annotation)
                    continue
                # A node whose device plugin stopped answering HAMi's handshake takes no GPU pods.
                alive = not handshake_dead(annotations.get(v.handshake, ""),
                                           int(parse_quantity(alloc.get(v.count_resource, "0"))))
                gpus.extend(GpuInfo(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib,
                                    vendor=v.name, numa_node=g.numa_node, healthy=g.healthy and alive,
                                    sharing=v.sharing, templates=tuple(template_dicts(v)),
                                    max_sharers=g.max_sharers) for g in found)
        if not gpus:
            gpus = _gfd_gpus(meta.name, capacity, labels)
        taints = tuple({"key": t.key, "value": t.value or "", "effect": t.effect}
                       for t in (n.spec.taints or [])) if n.spec else ()
        return NodeInfo(
            name=meta.name, cpu_millicores=_millicores(alloc.get("cpu")), ram_mib=_mib(alloc.get("memory")),
            max_pods=int(alloc.get("pods", "110")), labels=labels, taints=taints, ready=ready,
            not_ready_since=None if ready else (condition.last_transition_time if condition else None),
            not_ready_reason=not_ready_reason or ("" if ready else "no Ready condition"),
            cordoned=bool(n.spec and n.spec.unschedulable), gpus=tuple(gpus),
        )

    # -- namespaces and per-job objects ------------------------------------------------------

    def ensure_namespace(self, spec: NamespaceSpec) -> None:
        """The project's namespace (created with its labels, never relabelled: Camp may not
        patch namespaces), Camp's rights in it (``_grant_workloads``) and its ResourceQuota.
        A namespace of that name that Camp did not make for this project, or that another
        installation or registration made, is refused."""
        spec = dataclasses.replace(spec, labels={**spec.labels, **self.owner})
        existing = self._call(self.core.read_namespace, spec.name, ok=(404,))
        if existing is None:
            self._call(self.core.create_namespace,
                       {"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": spec.name, "labels": dict(spec.labels)}}, ok=(409,))
        else:
            have = existing.metadata.labels or {}
            if not self.own({**have, MANAGED_BY: "camp"}):
                # Another Camp installation's (or registration's) namespace: never adopt it.
                raise BackendError(f"Namespace {spec.name} belongs to another Camp installation or "
                                   f"registration of this cluster ({LABEL_INSTALLATION}="
                                   f"{have.get(LABEL_INSTALLATION)}); give this cluster another "
                                   f"namespace prefix", status=409)
            owner = (existing.metadata.labels or {}).get(LABEL_PROJECT_ID)
            if owner != spec.labels.get(LABEL_PROJECT_ID):
                # Another project's namespace, or one Camp did not create: never adopt it
                # (its volumes and secrets are there; Camp would grant itself rights in it).
                whose = f"belongs to another project (camp.io/project-id={owner})" if owner \
                    else "was not created by Camp (no camp.io/project-id label)"
                raise BackendError(f"Namespace {spec.name} {whose}; refusing to use it", status=409)
        self._grant_workloads(spec.name)
        if spec.quota:
            body = {"apiVersion": "v1", "kind": "ResourceQuota",
                    "metadata": {"name": QUOTA_NAME, "namespace": spec.name, "labels": dict(spec.labels)},
                    "spec": {"hard": dict(spec.quota)}}
            if self._call(self.core.create_namespaced_resource_quota, spec.name, body, ok=(409,)) is None:
                self._call(self.core.patch_namespaced_resource_quota, QUOTA_NAME, spec.name,
                           {"spec": {"hard": dict(spec.quota)}})

    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) of the ServiceAccount whose token Camp uses here, read from the
        token's ``sub`` claim (``system:serviceaccount:<ns>:<name>``, in both TokenRequest
        and Secret tokens); None for any other identity (a user, a client certificate)."""
        header = str((self.api.configuration.api_key or {}).get("authorization", ""))
        token = header.removeprefix("Bearer ").strip()
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
        except (ValueError, TypeError):
            return None
        sub = str(claims.get("sub", "")) if isinstance(claims, dict) else ""
        prefix, _, rest = sub.partition("system:serviceaccount:")
        ns, _, name = rest.partition(":")
        return (ns, name) if not prefix and ns and name else None

    def _grant_workloads(self, namespace: str) -> None:
        """Camp's write rights in its own namespace: a RoleBinding of the camp-agent chart's
        ClusterRole ``WORKLOADS_ROLE`` to Camp's ServiceAccount (``REQUIRED_ACCESS["namespace"]``;
        RBAC lets Camp make it through ``bind`` on that one role). Credentials that are no
        ServiceAccount were checked at registration to hold those rights cluster-wide."""
        sa = self.service_account()
        if sa is None:
            return
        body = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": ROLE_BINDING, "namespace": namespace,
                             "labels": {MANAGED_BY: "camp"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": WORKLOADS_ROLE},
                "subjects": [{"kind": "ServiceAccount", "namespace": sa[0], "name": sa[1]}]}
        rbac = k8s.RbacAuthorizationV1Api(self.api)
        if self._call(rbac.create_namespaced_role_binding, namespace, body, ok=(409,)) is None:
            return  # made by an earlier dispatch
        # The authorizer learns of a new binding through its informer: wait until it does, or
        # the next write (the quota, the pods) is refused for a moment.
        authz = k8s.AuthorizationV1Api(self.api)
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": {"namespace": namespace, "verb": "create",
                                                  "resource": "pods"}}}
        deadline = time.monotonic() + GRANT_WAIT_SECONDS
        while True:
            answer = self._call(authz.create_self_subject_access_review, review)
            if answer is not None and answer.status and answer.status.allowed:
                return
            if time.monotonic() > deadline:
                raise BackendError(f"The RoleBinding {namespace}/{ROLE_BINDING} to ClusterRole "
                                   f"{WORKLOADS_ROLE} did not take effect within "
                                   f"{GRANT_WAIT_SECONDS} s", retryable=True)
            self.sleep(0.1)

    # -- namespaces bound to a project, and the pods there that name Camp (issue 34) ------------

    def binding_labels(self, project_id: int) -> dict[str, str]:
        """The labels that say, on a namespace, that it is bound to ``project_id`` of this
        installation and registration (issue 34). The cluster's side writes them (Camp may
        not relabel namespaces: REQUIRED_ACCESS), Camp's project admin binds in Camp: both
        sides consent, so no project admin can take a namespace of someone else."""
        return {LABEL_BOUND_PROJECT: str(project_id), **self.owner}

    def bind_namespace(self, namespace: str, project_id: int) -> None:
        """Check that the namespace carries ``binding_labels(project_id)`` (and is not one
        of Camp's own), then grant Camp its workload rights there (``_grant_workloads``).
        Refused, in words with the ``kubectl label`` to run: no such namespace, one of Camp's
        own, one labelled for another installation, registration or project, or unlabelled."""
        existing = self._call(self.core.read_namespace, namespace, ok=(404,))
        if existing is None:
            raise BackendError(f"There is no namespace {namespace} in this cluster", status=404)
        if not self.namespace_bound(existing, project_id):
            raise BackendError(self.binding_refusal(existing, project_id), status=409)
        self._grant_workloads(namespace)

    def namespace_bound(self, ns: Any, project_id: int) -> bool:
        have = ns.metadata.labels or {}
        if have.get(MANAGED_BY) == "camp":
            return False  # one Camp created for a project: never an external namespace
        return all(have.get(k) == v for k, v in self.binding_labels(project_id).items())

    def binding_refusal(self, ns: Any, project_id: int) -> str:
        have = ns.metadata.labels or {}
        name = ns.metadata.name
        if have.get(MANAGED_BY) == "camp":
            return f"Namespace {name} is one Camp created; only namespaces Camp did not create are bound"
        want = self.binding_labels(project_id)
        bound = have.get(LABEL_BOUND_PROJECT)
        if bound is not None and have.get(LABEL_INSTALLATION) not in (None, want[LABEL_INSTALLATION]):
            return (f"Namespace {name} is bound to a project of another Camp installation "
                    f"({LABEL_INSTALLATION}={have.get(LABEL_INSTALLATION)})")
        if bound is not None and bound != str(project_id):
            return f"Namespace {name} is bound to another project ({LABEL_BOUND_PROJECT}={bound})"
        labels = " ".join(f"{k}={v}" for k, v in want.items())
        return (f"Namespace {name} does not carry this binding's labels; whoever administers it in "
                f"the cluster runs: kubectl label namespace {name} {labels}")

    def namespace_still_bound(self, namespace: str, project_id: int) -> bool:
        """The namespace still carries the binding's labels (the cluster's side may withdraw)."""
        existing = self._call(self.core.read_namespace, namespace, ok=(404,))
        return existing is not None and self.namespace_bound(existing, project_id)

    def list_waiting_external_pods(self) -> list[Any]:
        """Pods that name Camp's scheduler, are not bound to a node and were not created by
        Camp (external pods, issue 34), in every namespace."""
        result = self._call(self.core.list_pod_for_all_namespaces,
                            field_selector=f"spec.schedulerName={scheduler_name()},spec.nodeName=")
        assert result is not None
        return [p for p in result.items
                if not (self.own(p.metadata.labels) and not (p.metadata.labels or {}).get(LABEL_EXTERNAL))]

    def external_pod_exists(self, namespace: str, name: str, uid: str) -> bool:
        pod = self._call(self.core.read_namespaced_pod, name, namespace, ok=(404,))
        return pod is not None and pod.metadata.uid == uid and not pod.metadata.deletion_timestamp

    def tell_pod(self, namespace: str, name: str, uid: str, reason: str, message: str, *,
                 event: bool = True) -> None:
        """Say why Camp does not bind a pod, where ``kubectl describe pod`` shows it: the pod's
        ``PodScheduled`` condition (False, as kube-scheduler writes it for a pod it cannot
        place) and, with ``event``, a Warning Event (reason ``reason``)."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._call(self.core.patch_namespaced_pod_status, name, namespace, {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": reason, "message": message[:1000],
            "lastTransitionTime": stamp}]}}, ok=(404,))
        if event:
            self._event("v1", "Pod", namespace, name, uid, reason, message)

    def _event(self, api_version: str, kind: str, namespace: str, name: str, uid: str, reason: str,
               message: str, *, warning: bool = True) -> None:
        """An Event about an object Camp did not create (``kubectl describe`` shows it)."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{name[:200]}.", "namespace": namespace},
                 "involvedObject": {"kind": kind, "apiVersion": api_version, "namespace": namespace,
                                    "name": name, "uid": uid},
                 "reason": reason, "message": message[:1000], "type": "Warning" if warning else "Normal",
                 "source": {"component": scheduler_name()}, "reportingComponent": scheduler_name(),
                 "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}
        self._call(self.core.create_namespaced_event, namespace, body, ok=(403, 404))

    def list_queue_jobs(self, labels: Collection[str]) -> list[Any]:
        """The ``batch/v1`` Jobs of every namespace that carry one of ``labels`` (a queue's
        name: Kueue's ``kueue.x-k8s.io/queue-name`` or Camp's own), each Job once."""
        batch = k8s.BatchV1Api(self.api)
        seen: dict[str, Any] = {}
        for label in labels:
            result = self._call(batch.list_job_for_all_namespaces, label_selector=label)
            assert result is not None
            for job in result.items:
                seen.setdefault(job.metadata.uid, job)
        return list(seen.values())

    def suspend_job(self, namespace: str, name: str, uid: str, suspend: bool) -> None:
        """Set a Job's ``spec.suspend`` (its controller then deletes its active pods, or makes
        them); the Job's UID is a precondition (a new Job of the name is another one). A Job
        gone, or replaced, raises with status 404."""
        batch = k8s.BatchV1Api(self.api)
        body = {"metadata": {"uid": uid}, "spec": {"suspend": suspend}}
        try:
            self._call(batch.patch_namespaced_job, name, namespace, body)
        except BackendError as exc:
            if exc.status in (404, 409):  # 409: the UID precondition (a new Job of the name)
                raise BackendError(f"Job {namespace}/{name} is gone", status=404) from exc
            raise

    def job_pods(self, namespace: str, job_uid: str) -> list[Any]:
        """The pods a Job's controller made (its ``controller-uid`` label and owner), oldest
        first, without those being deleted."""
        result = self._call(self.core.list_namespaced_pod, namespace,
                            label_selector=f"controller-uid={job_uid}")
        assert result is not None
        pods = [p for p in result.items if not p.metadata.deletion_timestamp
                and any(o.uid == job_uid for o in p.metadata.owner_references or [])]
        return sorted(pods, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))

    def tell_job(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """Why Camp holds a Job (a Warning Event on it; ``kubectl describe job`` shows it)."""
        self._event("batch/v1", "Job", namespace, name, uid, reason, message)

    def bind_external_pod(self, spec: PodSpec, uid: str) -> None:
        """Place an external pod Camp did not create (issue 34) as it places its own: Camp's
        labels (so its watch follows the pod) and, on a HAMi node, HAMi's device annotations,
        then the bind (HAMi's handshake on a HAMi node). The pod's spec is never edited. A pod
        gone, or replaced by another of its name, raises (not retryable)."""
        pod = self._call(self.core.read_namespaced_pod, spec.name, spec.namespace, ok=(404,))
        if pod is None or pod.metadata.deletion_timestamp or pod.metadata.uid != uid:
            raise BackendError(f"Pod {spec.namespace}/{spec.name} is gone", status=404)
        node = self._call(self.core.read_node, spec.node, ok=(404,))
        if node is None:
            raise BackendError(f"Node {spec.node} is gone from the cluster")
        hami = bool(spec.slices) and bool(
            (node.metadata.annotations or {}).get(vendor(spec.slices[0].vendor).register_annotation))
        if pod.spec.node_name:
            if hami and (pod.metadata.annotations or {}).get(BIND_PHASE) == "allocating":
                self._hami_conclude(spec, pod)
            return
        annotations: dict[str, str] = {}
        if hami:
            v = vendor(spec.slices[0].vendor)
            encoded = encode_devices(spec.slices)
            annotations = {"hami.io/vgpu-node": spec.node, "hami.io/vgpu-time": str(int(time.time())),
                           v.allocate_annotation: encoded, v.allocated_annotation: encoded}
        self._call(self.core.patch_namespaced_pod, spec.name, spec.namespace, {"metadata": {
            "labels": {**spec.labels, **self.owner}, "annotations": annotations}})
        if hami:
            self._hami_bind(spec)
        else:
            self._bind(spec)

    def ensure_job_objects(self, objs: JobObjects) -> str:
        """The job's ConfigMap (its pods' owner), for a distributed job its headless Service
        (each pod's DNS name, for hostfiles and ``TF_CONFIG``) and a ClusterIP Service
        selecting rank 0, whose IP is returned: the rendezvous address, which needs no
        cluster DNS and exists before any pod does (docs/KUBERNETES.md)."""
        objs = dataclasses.replace(objs, labels={**objs.labels, **self.owner})
        cm = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": objs.name, "namespace": objs.namespace, "labels": dict(objs.labels)},
              "data": dict(objs.data)}
        self._call(self.core.create_namespaced_config_map, objs.namespace, cm, ok=(409,))
        if objs.headless_service:
            svc: dict[str, Any] = {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": objs.name, "namespace": objs.namespace,
                                "labels": dict(objs.labels)},
                   "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                            "selector": {LABEL_JOB_ID: objs.labels[LABEL_JOB_ID]},
                            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}}
            refs = self._owner_refs(objs.namespace, objs.name)
            if refs:
                svc["metadata"]["ownerReferences"] = refs
            self._call(self.core.create_namespaced_service, objs.namespace, svc, ok=(409,))
        for extra in objs.extra:
            self._ensure_extra(objs, extra)
        return self._ensure_rendezvous(objs) if objs.headless_service and objs.rendezvous else ""

    def _ensure_rendezvous(self, objs: JobObjects) -> str:
        """The rank-0 Service (an owned extra: deleted with the job's objects) and its
        ClusterIP, allocated by the API server when the Service is created (read back when an
        earlier dispatch made it). "" when the server gives none or Camp may not read it back
        (the pods keep rank 0's DNS name)."""
        name = rendezvous_service_name(objs.name)
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": dict(objs.rendezvous), "publishNotReadyAddresses": True,
                        "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT,
                                   "targetPort": RENDEZVOUS_PORT}]}}
        made = self._ensure_extra(objs, ExtraObject(svc))
        if made is None:  # (403: a chart older than ``get services``; its pods keep the DNS name)
            made = self._call(self.core.read_namespaced_service, name, objs.namespace, ok=(403, 404))
        ip = str(getattr(getattr(made, "spec", None), "cluster_ip", None) or "")
        return "" if ip in ("", "None") else ip

    # Extra objects of workloads (scheduling/extensions.py): kind → (API, method suffix).
    _EXTRA_KINDS = {"Service": ("core", "service"), "Secret": ("core", "secret"),
                    "ConfigMap": ("core", "config_map"),
                    "PersistentVolumeClaim": ("core", "persistent_volume_claim"),
                    "Ingress": ("networking", "ingress")}

    def _extra_api(self, kind: str) -> tuple[Any, str]:
        if kind not in self._EXTRA_KINDS:
            raise BackendError(f"Camp does not create {kind} objects")
        api, suffix = self._EXTRA_KINDS[kind]
        return getattr(self, api), suffix

    def _ensure_extra(self, objs: JobObjects, extra: ExtraObject) -> Any:
        """Create it (None when it already existed: 409); a Secret or ConfigMap that existed
        is brought up to date."""
        body = json.loads(json.dumps(dict(extra.manifest)))
        meta = body.setdefault("metadata", {})
        meta["namespace"] = objs.namespace
        meta.setdefault("labels", {}).update({MANAGED_BY: "camp", **self.owner})
        if extra.owned:
            meta["labels"][LABEL_JOB_OBJECT] = objs.name  # deleted with the job (delete_job_objects)
            refs = self._owner_refs(objs.namespace, objs.name)
            if refs:
                meta["ownerReferences"] = refs
        api, suffix = self._extra_api(body["kind"])
        created = self._call(getattr(api, f"create_namespaced_{suffix}"), objs.namespace, body, ok=(409,))
        if created is None and body["kind"] == "Secret":
            # Registry credentials may have been rotated since the secret was made.
            self._call(self.core.patch_namespaced_secret, meta["name"], objs.namespace,
                       {"data": body.get("data", {}), "type": body.get("type")})
        elif created is None and body["kind"] == "ConfigMap":
            # Derived data (e.g. an SSH environment's authorized_keys) may have changed
            # since an earlier run created it.
            self._call(self.core.patch_namespaced_config_map, meta["name"], objs.namespace,
                       {"data": body.get("data", {})})
        return created

    def delete_object(self, namespace: str, kind: str, name: str) -> None:
        api, suffix = self._extra_api(kind)
        self._call(getattr(api, f"delete_namespaced_{suffix}"), name, namespace, ok=(404,))

    def _owner_refs(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Pods and services are owned by the job's ConfigMap: deleting it cleans up.
        An owner reference needs the owner's uid; without one (the ConfigMap is gone) the
        objects carry none and the reconcile task deletes them instead."""
        key = (namespace, name)
        uid = self._owner_uids.get(key)
        if uid is None:
            cm = self._call(self.core.read_namespaced_config_map, name, namespace, ok=(404,))
            uid = (cm.metadata.uid if cm is not None else None) or ""
            self._owner_uids[key] = uid
        if not uid:
            return []
        return [{"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid,
                 "controller": True, "blockOwnerDeletion": True}]

    def delete_job_objects(self, namespace: str, name: str) -> None:
        """Delete a job's ConfigMap, its headless Service and its owned extras (labelled
        ``camp.io/job-object=<name>``). Explicitly: owner references cascade only where a
        garbage collector runs (not on a bare API server, and never for an owner gone)."""
        self._call(self.core.delete_namespaced_config_map, name, namespace,
                   body=k8s.V1DeleteOptions(propagation_policy="Background"), ok=(404,))
        self._call(self.core.delete_namespaced_service, name, namespace, ok=(404,))
        self._owner_uids.pop((namespace, name), None)
        for kind in ("Service", "Ingress", "ConfigMap"):
            api, suffix = self._extra_api(kind)
            listed = self._call(getattr(api, f"list_namespaced_{suffix}"), namespace,
                                label_selector=f"{SELECTOR},{LABEL_JOB_OBJECT}={name}", ok=(404,))
            for obj in (listed.items if listed is not None else []):
                labels = obj.metadata.labels or {}
                # Checked again here: a label selector is a server convenience, not a guarantee.
                if self.own(labels) and labels.get(LABEL_JOB_OBJECT) == name:
                    self._call(getattr(api, f"delete_namespaced_{suffix}"), obj.metadata.name,
                               namespace, ok=(404,))

    def list_services(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        listed = self._call(self.core.list_service_for_all_namespaces, label_selector=f"{SELECTOR},{label}")
        out = []
        for svc in (listed.items if listed is not None else []):
            labels = dict(svc.metadata.labels or {})
            if self.own(labels) and label in labels:  # checked again, as elsewhere
                out.append((svc.metadata.namespace, svc.metadata.name, labels))
        return out

    def list_ingresses(self, label: str) -> list[tuple[str, str, dict[str, str]]]:
        listed = self._call(self.networking.list_ingress_for_all_namespaces,
                            label_selector=f"{SELECTOR},{label}")
        out = []
        for ing in (listed.items if listed is not None else []):
            labels = dict(ing.metadata.labels or {})
            if self.own(labels) and label in labels:
                out.append((ing.metadata.namespace, ing.metadata.name, labels))
        return out

    def list_job_objects(self) -> list[tuple[str, str, int]]:
        """(namespace, owner name, job id) of every per-job ConfigMap Camp made (the owner of
        its job's other objects): what reconcile checks for leftovers."""
        listed = self._call(self.core.list_config_map_for_all_namespaces,
                            label_selector=f"{SELECTOR},{LABEL_JOB_ID}")
        out = []
        for cm in (listed.items if listed is not None else []):
            labels = cm.metadata.labels or {}
            job_id = labels.get(LABEL_JOB_ID, "")
            if self.own(labels) and job_id.isdigit():
                out.append((cm.metadata.namespace, cm.metadata.name, int(job_id)))
        return out

    # -- pods --------------------------------------------------------------------------------

    def pod_body(self, spec: PodSpec, *, hami: bool = True) -> dict[str, Any]:
        """The pod as Camp creates it: Camp's scheduler name and no ``nodeName`` (it is bound
        afterwards, ``create_pod``). On a HAMi node the GPU limits carry the slice (count,
        memory MiB, cores %) and the device annotations HAMi's scheduler writes in Filter
        (``vgpu-node``, ``vgpu-time``, the to-allocate and allocated encodings); on a node
        without HAMi only whole cards are asked for, with no HAMi annotation."""
        limits: dict[str, str] = {"cpu": f"{spec.cpu_millicores}m", "memory": f"{spec.ram_mib}Mi"}
        annotations: dict[str, str] = {}
        tolerations: list[dict[str, str]] = []
        if spec.slices:
            v = vendor(spec.slices[0].vendor)
            first = spec.slices[0]
            limits[v.count_resource] = str(len(spec.slices))
            # GPU nodes are often tainted with their GPU resource name (the
            # ExtendedResourceToleration convention): a GPU pod tolerates it.
            tolerations.append({"key": v.count_resource, "operator": "Exists"})
            if hami:
                if v.memory_resource:
                    limits[v.memory_resource] = str(first.memory_mib)
                if v.cores_resource:
                    limits[v.cores_resource] = str(first.cores_percent)
                encoded = encode_devices(spec.slices)
                annotations = {
                    "hami.io/vgpu-node": spec.node,
                    "hami.io/vgpu-time": str(int(time.time())),
                    v.allocate_annotation: encoded,
                    # HAMi's scheduler rebuilds a node's GPU usage from this one.
                    v.allocated_annotation: encoded,
                }
        container: dict[str, Any] = {
            "name": "main", "image": spec.image,
            "env": [{"name": k, "value": v} for k, v in sorted(spec.env.items())],
            "resources": {"requests": {"cpu": f"{spec.cpu_millicores}m", "memory": f"{spec.ram_mib}Mi"},
                          "limits": limits},
        }
        if spec.command:
            container["command"] = list(spec.command)
        if spec.ports:
            container["ports"] = [dict(p) for p in spec.ports]
        if spec.args:
            container["args"] = list(spec.args)
        if spec.readiness_probe:
            container["readinessProbe"] = json.loads(json.dumps(dict(spec.readiness_probe)))
        if spec.working_dir:
            container["workingDir"] = spec.working_dir
        if spec.container_security_context:
            container["securityContext"] = json.loads(json.dumps(dict(spec.container_security_context)))
        pod_spec: dict[str, Any] = {"schedulerName": scheduler_name(), "restartPolicy": "Never",
                                    "containers": [container]}
        if spec.security_context:
            pod_spec["securityContext"] = json.loads(json.dumps(dict(spec.security_context)))
        if tolerations:
            pod_spec["tolerations"] = tolerations
        if spec.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
        if spec.subdomain:
            pod_spec["hostname"] = spec.name
            pod_spec["subdomain"] = spec.subdomain
        metadata: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace,
                                    "labels": {**spec.labels, **self.owner}, "annotations": annotations}
        if spec.owner:
            refs = self._owner_refs(spec.namespace, spec.owner)
            if refs:
                metadata["ownerReferences"] = refs
            pod_spec["volumes"] = [{"name": "camp", "configMap": {"name": spec.owner}}]
            container["volumeMounts"] = [{"name": "camp", "mountPath": "/etc/camp", "readOnly": True}]
        if spec.volumes:
            pod_spec.setdefault("volumes", []).extend(dict(v) for v in spec.volumes)
        if spec.volume_mounts:
            container.setdefault("volumeMounts", []).extend(dict(m) for m in spec.volume_mounts)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}

    def create_pod(self, spec: PodSpec) -> bool:
        """Create the pod and bind it to its node as a scheduler does; True if this call
        created it. Idempotent: a pod already bound (an earlier dispatch got that far) is
        left as it is. A GPU pod on a HAMi node goes through HAMi's bind handshake
        (``_hami_bind``); a failed or unanswered handshake deletes the pod and raises."""
        existing = self._call(self.core.read_namespaced_pod, spec.name, spec.namespace, ok=(404,))
        node = self._call(self.core.read_node, spec.node, ok=(404,))
        if node is None:
            raise BackendError(f"Node {spec.node} is gone from the cluster", status=404)
        ready = next((c for c in (node.status.conditions if node.status else None) or []
                      if c.type == "Ready"), None)
        if existing is None and (ready is None or ready.status != "True"):
            # Placed from an inventory taken before the node went NotReady: no new pod there
            # (Kubernetes' scheduler never binds to a node that is not Ready either).
            said = ": ".join(x for x in ((ready.reason, ready.message) if ready else ()) if x)
            raise BackendError(f"Node {spec.node} is not Ready ({said or 'no Ready condition'}); "
                               "nothing new is placed there until it is")
        hami = bool(spec.slices) and bool(
            (node.metadata.annotations or {}).get(vendor(spec.slices[0].vendor).register_annotation))
        if existing is not None and not self._same_placement(existing, spec, hami):
            # A pod of an earlier attempt of this job (pod names are deterministic) left
            # placed elsewhere: its cleanup failed (the API server was down) and the job was
            # admitted again. Reusing it would bind a pod whose HAMi annotations name
            # another node or other devices (the device plugin never answers, the node
            # stays locked), or leave it running where the database says it is not.
            self._call(self.core.delete_namespaced_pod, spec.name, spec.namespace,
                       grace_period_seconds=0, ok=(404,))
            self._await_gone(spec)
            existing = None
        if existing is not None and existing.spec.node_name:
            if hami and (existing.metadata.annotations or {}).get(BIND_PHASE) == "allocating":
                self._hami_conclude(spec, existing)  # an earlier dispatch handed the wait over
            return False
        created = existing is None and self._call(
            self.core.create_namespaced_pod, spec.namespace, self.pod_body(spec, hami=hami),
            ok=(409,)) is not None
        self._select_node_for_claims(spec)
        if hami:
            self._hami_bind(spec)
        else:
            self._bind(spec)
        return created

    def _select_node_for_claims(self, spec: PodSpec) -> None:
        """What kube-scheduler's VolumeBinding plugin does before it binds a pod: each claim
        the pod mounts that is not bound yet and whose StorageClass binds at the first
        consumer (``WaitForFirstConsumer``, e.g. local-path, the default class of k3s and
        kind) is annotated with the chosen node, so that its provisioner makes the volume
        there. Camp binds pods itself, so without this such a claim would wait forever. A
        class with no provisioner (pre-made local volumes) is left to ``pod_problem``'s
        reason: only kube-scheduler binds those, and Camp does not."""
        for volume in spec.volumes:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            if not claim:
                continue
            pvc = self._call(self.core.read_namespaced_persistent_volume_claim, claim, spec.namespace,
                             ok=(404,))
            if pvc is None or (pvc.status and pvc.status.phase == "Bound") or pvc.spec.volume_name:
                continue
            if (pvc.metadata.annotations or {}).get(SELECTED_NODE) == spec.node:
                continue
            cls = self._storage_class(pvc.spec.storage_class_name)
            if (cls is None or cls.volume_binding_mode != "WaitForFirstConsumer"
                    or cls.provisioner == NO_PROVISIONER):
                continue
            self._call(self.core.patch_namespaced_persistent_volume_claim, claim, spec.namespace,
                       {"metadata": {"annotations": {SELECTED_NODE: spec.node}}})

    def _storage_class(self, name: str | None) -> Any:
        """The StorageClass ``name`` (None: none named, gone, or not readable: a chart older
        than ``get storageclasses``, which then behaves as before)."""
        if not name:
            return None
        return self._call(self.storage.read_storage_class, name, ok=(403, 404))

    def _same_placement(self, pod: Any, spec: PodSpec, hami: bool) -> bool:
        """Whether an existing pod is the one ``spec`` describes: of the same attempt
        (``camp.io/attempt``, when both carry it), bound to its node (or not bound yet) and,
        on a HAMi node, carrying its node and ``…-devices-allocated`` annotations. Never
        ``…-devices-to-allocate``: HAMi's device plugin erases it once it has allocated
        (``;`` per container), so a healthy pod would read as another's."""
        attempt = (pod.metadata.labels or {}).get(LABEL_ATTEMPT)
        if attempt is not None and spec.labels.get(LABEL_ATTEMPT) not in (None, attempt):
            return False
        if pod.spec.node_name and pod.spec.node_name != spec.node:
            return False
        if not hami:
            return True
        have = pod.metadata.annotations or {}
        # rstrip: a pod made before the encoding ended each container with ";" is the same.
        allocated = (have.get(vendor(spec.slices[0].vendor).allocated_annotation) or "").rstrip(";")
        return (have.get("hami.io/vgpu-node") == spec.node
                and allocated == encode_devices(spec.slices).rstrip(";"))

    def _await_gone(self, spec: PodSpec, seconds: float = 10.0) -> None:
        """Wait until a pod deleted with grace 0 is gone (immediate on the API server)."""
        deadline = time.monotonic() + seconds
        while self._call(self.core.read_namespaced_pod, spec.name, spec.namespace,
                         ok=(404,)) is not None:
            if time.monotonic() >= deadline:
                raise BackendError(f"Pod {spec.name} of an earlier attempt is still being deleted",
                                   retryable=True)
            self.sleep(0.2)

    # -- HAMi's bind handshake (HAMi v2.10.0: pkg/scheduler/scheduler.go Bind, pkg/util/nodelock)

    def _bind(self, spec: PodSpec) -> None:
        """The Binding subresource, as kube-scheduler binds (409: already bound)."""
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": spec.name, "namespace": spec.namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": spec.node}}
        # POST pods/{name}/binding (RBAC ``pods/binding``, what REQUIRED_ACCESS grants), never
        # the namespace's ``bindings`` collection (RBAC ``bindings``). The v1.24 apiserver's
        # answer does not deserialise into V1Binding: read it raw.
        self._call(self.core.create_namespaced_pod_binding, spec.name, spec.namespace, body,
                   _preload_content=False, ok=(409,))

    def _hami_bind(self, spec: PodSpec) -> None:
        """Lock the node, mark the pod allocating, bind, then wait for the device plugin's
        ``hami.io/bind-phase`` answer. On ``failed`` or no answer within the bind timeout
        the lock is released (if still ours) and the pod deleted, so nothing is left half
        bound; the caller requeues the job with the reason."""
        deadline = time.monotonic() + bind_timeout()
        self._lock_node(spec, deadline)
        try:
            now = str(int(time.time()))
            self._call(self.core.patch_namespaced_pod, spec.name, spec.namespace,
                       {"metadata": {"annotations": {
                           BIND_PHASE: "allocating", "hami.io/bind-time": now, "hami.io/vgpu-time": now}}})
            self._bind(spec)
        except BackendError:
            self._release_node_lock(spec)
            raise
        self._hami_conclude(spec, None, bound_at=int(now))

    def _hami_conclude(self, spec: PodSpec, pod: Any, *, bound_at: int | None = None) -> None:
        """Wait for the device plugin's answer to a bound pod's handshake, for at most
        ``bind_poll()`` seconds of this call: BindPending if it has not answered and the bind
        timeout (from ``hami.io/bind-time``) is not up, so the wait resumes in a later
        dispatch instead of holding this worker. On ``failed`` or no answer in time the lock
        is released (if still ours) and the pod deleted, so nothing is left half bound; the
        caller requeues the job with the reason."""
        if bound_at is None:
            raw = (pod.metadata.annotations or {}).get("hami.io/bind-time", "")
            bound_at = int(raw) if raw.isdigit() else int(time.time())
        left = bound_at + bind_timeout() - time.time()
        try:
            phase = self._await_bind_phase(spec, time.monotonic() + max(0.0, min(left, bind_poll())))
        except BackendError:
            self._release_node_lock(spec)
            raise
        if phase == "success":
            return
        if not phase and bound_at + bind_timeout() > time.time():
            raise BindPending(f"HAMi's device plugin on node {spec.node} has not answered for pod "
                              f"{spec.name} yet")
        self._release_node_lock(spec)
        self._call(self.core.delete_namespaced_pod, spec.name, spec.namespace, grace_period_seconds=0,
                   ok=(404,))
        if phase == "failed":
            raise BackendError(refusal_message(spec.node, spec.name))
        raise BackendError(f"HAMi's device plugin on node {spec.node} did not answer for pod "
                           f"{spec.name} within {bind_timeout()} s (is it running?)")

    def _await_bind_phase(self, spec: PodSpec, deadline: float) -> str:
        """Poll the pod until its bind-phase is success/failed (or it runs); "" on timeout.
        Polling, not a watch: one pod for a bounded few seconds, and it survives a dropped
        connection without extra code."""
        delay = 0.1
        while True:
            pod = self._call(self.core.read_namespaced_pod, spec.name, spec.namespace, ok=(404,))
            if pod is None:
                return "failed"
            phase = (pod.metadata.annotations or {}).get(BIND_PHASE, "")
            if phase in ("success", "failed"):
                return phase
            if (pod.status.phase if pod.status else "") in ("Running", "Succeeded"):
                return "success"
            if (pod.status.phase if pod.status else "") == "Failed":
                return "failed"  # refused at the kubelet's admission
            if time.monotonic() >= deadline:
                return ""
            self.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _lock_owner(self, spec: PodSpec) -> str:
        return f",{spec.namespace},{spec.name}"

    def _lock_node(self, spec: PodSpec, deadline: float) -> None:
        """HAMi's LockNode: one allocating pod per node. The lock is the node annotation
        ``hami.io/mutex.lock: <RFC3339 time>,<namespace>,<pod>``, set with the node's
        resourceVersion (a concurrent locker gets 409). A lock older than the expiry, or
        whose pod is gone, is broken; one held by this pod counts as taken; another live
        one is waited for until ``deadline``."""
        delay = 0.1
        while True:
            node = self._call(self.core.read_node, spec.node)
            assert node is not None
            current = (node.metadata.annotations or {}).get(NODE_LOCK)
            if current is not None and current.endswith(self._lock_owner(spec)):
                return
            if current is None or self._lock_is_stale(current):
                value = (dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                         + self._lock_owner(spec))
                patch = {"metadata": {"annotations": {NODE_LOCK: value},
                                      "resourceVersion": node.metadata.resource_version}}
                if self._call(self.core.patch_node, spec.node, patch, ok=(409,)) is not None:
                    return
            if time.monotonic() >= deadline:
                raise BackendError(f"Node {spec.node} stayed locked by another pod's GPU allocation "
                                   f"({current}) for {bind_timeout()} s", retryable=True)
            self.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _lock_is_stale(self, value: str) -> bool:
        parts = value.split(",")
        try:
            locked_at = dt.datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%S%z")
        except ValueError:
            return True  # unreadable: HAMi's ParseNodeLock fails and the lock is not honoured
        if (dt.datetime.now(dt.UTC) - locked_at).total_seconds() > nodelock_expiry():
            return True
        if len(parts) == 3 and parts[1] and parts[2]:
            # Dangling: its pod is gone (HAMi releases such a lock too).
            return self._call(self.core.read_namespaced_pod, parts[2], parts[1], ok=(404,)) is None
        return False

    def _release_node_lock(self, spec: PodSpec) -> None:
        """HAMi's ReleaseNodeLock with the owner check: drop the lock only if this pod holds it."""
        node = self._call(self.core.read_node, spec.node, ok=(404,))
        if node is None:
            return
        current = (node.metadata.annotations or {}).get(NODE_LOCK)
        if current is None or not current.endswith(self._lock_owner(spec)):
            return
        self._call(self.core.patch_node, spec.node,
                   {"metadata": {"annotations": {NODE_LOCK: None},
                                 "resourceVersion": node.metadata.resource_version}}, ok=(409,))

    def delete_pod(self, namespace: str, name: str, *, grace_seconds: int = 30, uid: str = "") -> None:
        """Delete the pod (gone already: done). With ``uid``, only that pod (a precondition:
        a later attempt's pod of the same name answers 409 and is left alone)."""
        body = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid)) if uid else None
        self._call(self.core.delete_namespaced_pod, name, namespace, body=body,
                   grace_period_seconds=grace_seconds, ok=(404, 409))

    def pod_problem(self, namespace: str, name: str) -> str:
        """Why a Pending pod is not starting, as only its claims and events say (its own
        status is read by ``podcause.waiting_problem``); "" when they say nothing wrong.

        * A PersistentVolumeClaim it mounts that is missing or not ``Bound``: a claim that
          names no StorageClass after creation was made when the cluster had no default one
          (the DefaultStorageClass admission plugin fills it in otherwise), so nothing will
          ever provision it — said so. Camp binds pods itself, so kube-scheduler's volume
          check never runs; this is where that check's answer comes back.
        * Else the pod's latest ``Warning`` event (``FailedMount``, ``FailedAttachVolume``,
          ``FailedCreatePodSandBox``, ``FailedScheduling``, …) as ``Reason: message``.
        Events or claims Camp may not read (403) say nothing."""
        pod = self._call(self.core.read_namespaced_pod, name, namespace, ok=(404,))
        if pod is None:
            return ""
        for volume in (pod.spec.volumes or []) if pod.spec else []:
            source = volume.persistent_volume_claim
            if source is None:
                continue
            claim = source.claim_name
            try:
                pvc = self.core.read_namespaced_persistent_volume_claim(
                    claim, namespace, _request_timeout=self.timeout)
            except ApiException as exc:
                if exc.status == 404:
                    return f"volume claim {claim} does not exist"
                continue
            except (urllib3.exceptions.HTTPError, OSError):
                continue
            phase = (pvc.status.phase if pvc.status else None) or "Pending"
            if phase == "Bound":
                continue
            storage_class = pvc.spec.storage_class_name if pvc.spec else None
            if not storage_class and not (pvc.spec and pvc.spec.volume_name):
                return (f"volume claim {claim} is not bound ({phase}): it names no StorageClass and the "
                        "cluster has no default one, so no volume will be provisioned (mark a "
                        "StorageClass default, or set WORKSPACES_STORAGE_CLASS)")
            try:
                cls = self._storage_class(storage_class)
            except BackendError:  # (the reason below without it)
                cls = None
            if (cls is not None and cls.volume_binding_mode == "WaitForFirstConsumer"
                    and cls.provisioner == NO_PROVISIONER and not pvc.spec.volume_name):
                return (f"volume claim {claim} is not bound ({phase}): its StorageClass {storage_class} "
                        "has no provisioner and binds pre-made volumes when kube-scheduler places "
                        "the pod, which Camp does itself, so nothing will bind it (use a class with "
                        "a provisioner, or Immediate binding)")
            said = self._latest_warning(namespace, "PersistentVolumeClaim", claim)
            return (f"volume claim {claim} is not bound ({phase}, StorageClass {storage_class})"
                    + (f": {said}" if said else ""))
        return self._latest_warning(namespace, "Pod", name)

    def _latest_warning(self, namespace: str, kind: str, name: str) -> str:
        try:
            listed = self.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
                _request_timeout=self.timeout)
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return ""
        epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
        warnings = sorted((e for e in listed.items if e.type == "Warning"),
                          key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp
                          or epoch)
        if not warnings:
            return ""
        e = warnings[-1]
        return f"{e.reason}: {' '.join((e.message or '').split())[:300]}"

    def pod_logs(self, namespace: str, name: str, *, tail_lines: int = 200) -> str:
        text = self._call(self.core.read_namespaced_pod_log, name, namespace, container="main",
                          tail_lines=tail_lines, timestamps=True, ok=(400, 404))
        return "\n".join(line for line in str(text or "").splitlines() if _container_line(line))

    def pod_http_get(self, namespace: str, name: str, port: int, path: str, *,
                     timeout: float = 5.0) -> bytes | None:
        # (built by hand: the generated connect_get_namespaced_pod_proxy_with_path quotes the
        # path's slashes, which the API server then forwards as %2F)
        where, _, query = path.partition("?")
        resource = (f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}:{int(port)}"
                    f"/proxy/{quote(where.lstrip('/'), safe='/')}" + (f"?{query}" if query else ""))
        try:
            resp = self.api.call_api(resource, "GET", auth_settings=["BearerToken"], _preload_content=False,
                                     _request_timeout=timeout, _return_http_data_only=True)
        except ApiException:
            return None  # 503 (pod not listening yet), 404 (gone), 403: not answering
        except (urllib3.exceptions.HTTPError, OSError):
            return None
        if resp.status != 200:
            return None
        return bytes(resp.data)

    # Streams read with this socket timeout, then reconnect from the last line's time: a
    # stopped follower (its client went away) ends within this long even on a silent pod.
    FOLLOW_READ_SECONDS = 15.0

    def follow_pod_logs(self, namespace: str, name: str, *, tail_lines: int, timeout_seconds: float,
                        stop: threading.Event) -> Iterator[str]:
        """``kubectl logs -f --timestamps``: ``read_namespaced_pod_log(follow=True)`` with
        ``_preload_content=False``, read chunk by chunk. A stream idle for
        ``FOLLOW_READ_SECONDS`` (or dropped) is reopened with ``since_seconds`` from the last
        line seen, duplicates dropped; the stream ending on its own means the container ended."""
        deadline = time.monotonic() + timeout_seconds
        cursor = LineCursor()
        first = True
        while not stop.is_set() and time.monotonic() < deadline:
            kwargs: dict[str, Any] = {"container": "main", "follow": True, "timestamps": True,
                                      "_preload_content": False,
                                      "_request_timeout": (10, self.FOLLOW_READ_SECONDS)}
            if first:
                kwargs["tail_lines"] = max(0, tail_lines)
            else:
                since = cursor.since_seconds(time.time())
                if since is not None:
                    kwargs["since_seconds"] = since
            try:
                response = self.core.read_namespaced_pod_log(name, namespace, **kwargs)
            except ApiException as exc:
                if exc.status in (400, 404):
                    return  # not started yet, or gone: nothing (more) to follow
                if exc.status in RETRYABLE:
                    stop.wait(self.backoff)
                    continue
                raise BackendError(_describe(exc), status=exc.status) from exc
            except (urllib3.exceptions.HTTPError, OSError):
                stop.wait(self.backoff)
                continue
            try:
                for line in split_lines(response.stream(2 ** 14)):
                    if not _container_line(line):
                        # The kubelet's own error about a removed container ("unable to
                        # retrieve container logs for …", "rpc error: code = NotFound …"),
                        # sent in the stream: not the container's output, and its end.
                        logger.debug("pod %s/%s: log stream ended with %r", namespace, name, line[:200])
                        return
                    yield from cursor.new([line])
                    if stop.is_set() or time.monotonic() >= deadline:
                        return
                return  # the server ended the stream: the container has ended
            except (urllib3.exceptions.HTTPError, OSError):
                pass  # idle past the read timeout, or dropped: reconnect from the last line
            finally:
                response.close()
                response.release_conn()
                first = False

    def _pods(self) -> tuple[list[PodStatus], str]:
        result = self._call(self.core.list_pod_for_all_namespaces, label_selector=SELECTOR)
        assert result is not None
        pods = [_pod_status(p) for p in result.items]
        # Filter again client-side: label selectors are a server convenience, not a guarantee;
        # and only this installation's and registration's pods (``own``).
        return [p for p in pods if self.own(p.labels)], (
            result.metadata.resource_version or "")

    def list_pods(self) -> list[PodStatus]:
        return self._pods()[0]

    def watch_pods(self, *, timeout_seconds: int) -> Iterator[PodEvent]:
        """List, then watch from the list's resourceVersion; reconnect on a dropped stream
        and relist on 410 Gone (the relist is reported as MODIFIED events)."""
        deadline = time.monotonic() + timeout_seconds
        pods, rv = self._pods()
        for p in pods:
            yield PodEvent("MODIFIED", p)
        while time.monotonic() < deadline:
            w = k8s_watch.Watch()
            try:
                kwargs: dict[str, Any] = {"label_selector": SELECTOR,
                                          "timeout_seconds": max(1, int(deadline - time.monotonic())),
                                          "_request_timeout": timeout_seconds + 5}
                if rv and rv.isdigit():
                    kwargs["resource_version"] = rv
                for event in w.stream(self.core.list_pod_for_all_namespaces, **kwargs):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else None
                        if code == 410:
                            raise ResourceVersionExpired("resourceVersion expired", status=410)
                        continue
                    new_rv = getattr(obj.metadata, "resource_version", None)
                    if new_rv:
                        rv = new_rv
                    status = _pod_status(obj)
                    if self.own(status.labels):
                        yield PodEvent(event["type"], status)
                    if time.monotonic() >= deadline:
                        w.stop()
                        return
            except (ResourceVersionExpired, ApiException) as exc:
                if isinstance(exc, ApiException) and exc.status != 410:
                    if exc.status not in RETRYABLE:
                        raise BackendError(_describe(exc), status=exc.status) from exc
                    self.sleep(self.backoff)
                    continue
                pods, rv = self._pods()  # 410 Gone: our resourceVersion is too old — relist
                for p in pods:
                    yield PodEvent("MODIFIED", p)
            except (urllib3.exceptions.HTTPError, OSError):
                # Dropped stream: reconnect from the last rv, if the server answers. A server
                # that does not (restarting, gone) is an outage for the caller to report and
                # back off from (BackendError), not a silent reconnect loop.
                self.probe()
                self.sleep(self.backoff)


def _container_line(line: str) -> bool:
    """A line the container wrote: with ``timestamps=True`` the kubelet stamps every line
    of the container's output (``<RFC 3339 time> <text>``); a line without one is the
    kubelet's own message (an error about the container's log it could not read)."""
    return LineCursor.key(line) is not None


def _pod_status(p: Any) -> PodStatus:
    meta = p.metadata
    phase = (p.status.phase if p.status else None) or "Pending"
    message = (p.status.message if p.status else None) or ""
    conditions = (p.status.conditions if p.status else None) or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    reason = (p.status.reason if p.status else None) or ""
    bind_phase = (meta.annotations or {}).get(BIND_PHASE)
    refused = phase == "Failed" and (reason == ADMISSION_ERROR or bind_phase == "failed")
    probed = any(c.readiness_probe is not None for c in ((p.spec.containers if p.spec else None) or []))
    unschedulable = next((c.message or c.reason or "" for c in conditions
                          if c.type == "PodScheduled" and c.status == "False"), "")
    main = next((c for c in ((p.status.container_statuses if p.status else None) or [])
                 if c.name == "main"), None)
    waiting = main.state.waiting if main is not None and main.state else None
    ended = main.state.terminated if main is not None and main.state else None
    if ended is None and main is not None and main.last_state is not None:
        ended = main.last_state.terminated
    return PodStatus(name=meta.name, namespace=meta.namespace or "", phase=phase,
                     labels=dict(meta.labels or {}), message=message,
                     deleting=bool(meta.deletion_timestamp), ready=ready, probed=probed,
                     reason=reason, uid=meta.uid or "",
                     node=(p.spec.node_name if p.spec else None) or "", refused=refused,
                     binding=phase == "Pending" and bind_phase == "allocating",
                     unschedulable=unschedulable if phase == "Pending" else "",
                     waiting_reason=(waiting.reason or "") if waiting else "",
                     waiting_message=(waiting.message or "") if waiting else "",
                     terminated_reason=(ended.reason or "") if ended else "",
                     exit_code=ended.exit_code if ended else None,
                     signal=(ended.signal or None) if ended else None,
                     terminated_message=(ended.message or "") if ended else "")


def _describe(exc: ApiException) -> str:
    if not exc.status:  # the client's wrapping of a TLS or connection failure: no answer
        text = str(exc.reason or "")
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return "The API server's TLS certificate could not be verified (wrong or missing CA certificate)"
        return f"Kubernetes API unreachable ({text.splitlines()[0][:200] if text else 'no answer'})"
    if exc.status == 401:  # e.g. a `kubectl create token` token past its --duration
        return ("Kubernetes API answered 401 Unauthorized: the cluster's token is wrong or has "
                "expired; register a new one (the cluster's credentials, docs/DEPLOY.md)")
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return f"Kubernetes API answered {exc.status} {exc.reason or ''}: {message}".strip(": ")[:400]


# What Camp does in a cluster, as RBAC rules (verb, API group, resource[/subresource],
# resource name or "" for any): the one source of the camp-agent chart's two ClusterRoles and
# of docs/KUBERNETES.md's table (tests compare them). "cluster": granted cluster-wide, reads,
# HAMi's node lock annotation, new namespaces, and granting itself ``WORKLOADS_ROLE`` in them.
# "namespace": the writes, granted only inside Camp's namespaces by the RoleBinding Camp
# creates with each (``_grant_workloads``). Checked when a cluster is registered.
Access = tuple[str, str, str, str]
REQUIRED_ACCESS: dict[str, tuple[Access, ...]] = {
    "cluster": (
        *((v, "", "nodes", "") for v in ("get", "list", "watch", "patch")),
        *((v, "", "namespaces", "") for v in ("get", "create")),
        *((v, "", "pods", "") for v in ("get", "list", "watch")),
        # why a pod naming Camp's scheduler is not bound, in any namespace (issue 34)
        ("patch", "", "pods/status", ""),
        ("create", "", "events", ""),
        # batch/v1 Jobs labelled for a queue, admitted as Kueue does (issue 34)
        *((v, "batch", "jobs", "") for v in ("get", "list", "watch")),
        ("list", "", "configmaps", ""),
        ("list", "", "services", ""),
        ("list", "networking.k8s.io", "ingresses", ""),
        # a claim's binding mode: one that waits for its first consumer gets Camp's node
        ("get", "storage.k8s.io", "storageclasses", ""),
        ("create", "rbac.authorization.k8s.io", "rolebindings", ""),
        ("bind", "rbac.authorization.k8s.io", "clusterroles", WORKLOADS_ROLE),
        ("get", "rbac.authorization.k8s.io", "clusterroles", WORKLOADS_ROLE),
    ),
    "namespace": (
        *((v, "", "pods", "") for v in ("create", "patch", "delete")),
        ("create", "", "pods/binding", ""),
        ("get", "", "pods/log", ""),
        ("get", "", "pods/proxy", ""),  # a notebook server's own activity (workspaces/services/culling.py)
        *((v, "", "resourcequotas", "") for v in ("create", "patch")),
        *((v, "", "configmaps", "") for v in ("get", "create", "patch", "delete")),
        # get: a job's rendezvous address, the ClusterIP of a Service an earlier dispatch made
        *((v, "", "services", "") for v in ("get", "create", "delete")),
        *((v, "", "secrets", "") for v in ("create", "patch", "delete")),
        # patch: the selected-node annotation of a WaitForFirstConsumer claim (_select_node_for_claims)
        *((v, "", "persistentvolumeclaims", "") for v in ("get", "create", "patch", "delete")),
        ("list", "", "events", ""),  # why a pod cannot start: its Warning events (podcause.py)
        *((v, "networking.k8s.io", "ingresses", "") for v in ("create", "delete")),
        # suspend/un-suspend a queued batch/v1 Job (only in a namespace bound to a project)
        ("patch", "batch", "jobs", ""),
    ),
}
CHECK_TIMEOUT_SECONDS = 5


def access_rules(scope: str) -> list[dict[str, Any]]:
    """``REQUIRED_ACCESS[scope]`` as RBAC ``rules`` (one per group, resource and name)."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for verb, group, resource, name in REQUIRED_ACCESS[scope]:
        grouped.setdefault((group, resource, name), []).append(verb)
    return [{"apiGroups": [group], "resources": [resource], "verbs": verbs,
             **({"resourceNames": [name]} if name else {})}
            for (group, resource, name), verbs in grouped.items()]


def rules_grant(rules: Any, access: Access) -> bool:
    """Whether RBAC ``rules`` (dicts or client objects) allow ``access``, as the RBAC
    authorizer matches them (``*`` wildcards; resource names narrow)."""
    verb, group, resource, name = access

    def field(rule: Any, key: str, attr: str) -> list[str]:
        return list((rule.get(key) if isinstance(rule, dict) else getattr(rule, attr, None)) or [])

    for rule in rules or ():
        verbs, groups = field(rule, "verbs", "verbs"), field(rule, "apiGroups", "api_groups")
        resources = field(rule, "resources", "resources")
        names = field(rule, "resourceNames", "resource_names")
        if ((verb in verbs or "*" in verbs) and (group in groups or "*" in groups)
                and (resource in resources or "*" in resources) and (not names or name in names)):
            return True
    return False


def _described(access: Access) -> str:
    verb, group, resource, name = access
    return f"{verb} {resource}" + (f"/{name}" if name else "") + (f" ({group})" if group else "")


def access_problems(cluster: Cluster) -> dict[str, str]:
    """Why Camp cannot work with ``cluster`` as registered, by form field (``api_server``,
    ``credentials``), in words; empty when it can. One attempt per request, short timeouts:
    reachability (``/version``), authentication, then ``REQUIRED_ACCESS``: every cluster-wide
    rule through SelfSubjectAccessReview (the API that ``kubectl auth can-i`` uses); the
    namespaced rules either held cluster-wide too, or granted by the ClusterRole
    ``WORKLOADS_ROLE`` that Camp binds to its ServiceAccount in each namespace it creates."""
    creds = decrypt_credentials(cluster.credentials_encrypted) if cluster.credentials_encrypted else {}
    if not cluster.api_server and not creds.get("kubeconfig"):
        return {"api_server": "Give the API server URL (or a kubeconfig that names it)."}
    if not any(creds.get(k) for k in ("kubeconfig", "token")):
        return {"credentials": "No credentials: give a service account token or a kubeconfig."}
    try:
        backend = KubernetesBackend.for_cluster(cluster)
    except (BackendError, ValueError, TypeError, KeyError) as exc:
        return {"credentials": f"The kubeconfig cannot be used: {exc}"}
    host = backend.api.configuration.host
    timeout = CHECK_TIMEOUT_SECONDS
    unauthorized = {"credentials": "The API server refused the credentials (401 Unauthorized): "
                                   "the token is wrong or has expired (a token made with "
                                   "`kubectl create token` ends at its --duration; make a new one)."}
    try:
        k8s.VersionApi(backend.api).get_code(_request_timeout=timeout)
    except urllib3.exceptions.SSLError as exc:
        return {"api_server": f"The API server at {host} answered, but its TLS certificate could not "
                              f"be verified ({_reason(exc)}); give the cluster's CA certificate."}
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return {"api_server": f"The API server at {host} does not answer ({_reason(exc)})."}
    except ApiException as exc:
        if exc.status == 0:  # the client's wrapping of a connection or TLS failure
            text = str(exc.reason or "")
            if "CERTIFICATE_VERIFY_FAILED" in text or "SSL" in text:
                return {"api_server": f"The API server at {host} answered, but its TLS certificate "
                                      f"could not be verified; give the cluster's CA certificate."}
            return {"api_server": f"The API server at {host} does not answer ({_reason(exc)})."}
        if exc.status == 401:
            return unauthorized
        if exc.status not in (403,):  # /version may be closed to some identities: fine
            return {"api_server": f"{host} does not look like a Kubernetes API server "
                                  f"({_describe(exc)})."}
    authz = k8s.AuthorizationV1Api(backend.api)

    def allowed(access: Access) -> bool:
        verb, group, resource, name = access
        res, _, sub = resource.partition("/")
        attrs = {"verb": verb, "group": group, "resource": res}
        if sub:
            attrs["subresource"] = sub
        if name:
            attrs["name"] = name
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        review = authz.create_self_subject_access_review(body, _request_timeout=timeout)
        return bool(review.status and review.status.allowed)

    chart = "install or upgrade the camp-agent chart (docs/DEPLOY.md) and register its ServiceAccount's token"
    try:
        denied = [a for a in REQUIRED_ACCESS["cluster"] if not allowed(a)]
        if denied:
            return {"credentials": "These credentials may not " + ", ".join(map(_described, denied))
                                   + f" (cluster-wide): {chart}."}
        if all(allowed(a) for a in REQUIRED_ACCESS["namespace"]):
            return {}  # held cluster-wide already (an identity that is no ServiceAccount)
        if backend.service_account() is None:
            return {"credentials": "These credentials are no ServiceAccount token and may not "
                                   "write in every namespace; Camp grants itself its namespaced "
                                   f"rights by binding ClusterRole {WORKLOADS_ROLE} to its "
                                   f"ServiceAccount: {chart}."}
        role = k8s.RbacAuthorizationV1Api(backend.api).read_cluster_role(
            WORKLOADS_ROLE, _request_timeout=timeout)
    except ApiException as exc:
        if exc.status == 401:
            return unauthorized
        if exc.status == 404:
            return {"credentials": f"The ClusterRole {WORKLOADS_ROLE} (Camp's rights inside its "
                                   f"namespaces) does not exist: {chart}."}
        return {"credentials": f"Could not check the credentials' permissions ({_describe(exc)})."}
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return {"api_server": f"The API server at {host} stopped answering ({_reason(exc)})."}
    missing = [a for a in REQUIRED_ACCESS["namespace"] if not rules_grant(role.rules, a)]
    if missing:
        return {"credentials": f"The ClusterRole {WORKLOADS_ROLE} does not grant "
                               + ", ".join(map(_described, missing)) + f": {chart}."}
    return {}


def cluster_identity(cluster: Cluster) -> str:
    """The cluster's identity: its ``kube-system`` namespace's UID (the same through every
    endpoint and credentials, and different for every cluster); "" if it cannot be read."""
    try:
        backend = KubernetesBackend._connect(cluster)
        ns = backend.core.read_namespace("kube-system", _request_timeout=CHECK_TIMEOUT_SECONDS)
    except (BackendError, ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
        return ""
    return str(ns.metadata.uid or "")


def _reason(exc: BaseException) -> str:
    """The innermost cause of a connection error, in words (not "MaxRetryError")."""
    inner: BaseException = exc
    while True:
        nxt = getattr(inner, "reason", None) or inner.__cause__ or inner.__context__
        if not isinstance(nxt, BaseException) or nxt is inner:
            break
        inner = nxt
    text = str(inner)
    for marker, words in (("Connection refused", "connection refused"),
                          ("timed out", "timed out"), ("Name or service not known", "unknown host"),
                          ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed")):
        if marker in text:
            return words
    text = text.split(": ", 1)[-1][:200]
    if text == "b''":  # an empty read: the server closed the connection (a stream cut)
        return "connection closed by the server"
    return text or type(inner).__name__
