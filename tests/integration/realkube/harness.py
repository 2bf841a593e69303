"""A real kube-apiserver for the tests, and stand-ins for what cannot run here.

The apiserver is ``../shared/tools/kube-apiserver`` (upstream Kubernetes v1.24.0) with etcd
from Debian, started by ``../shared/tools/start-kube-apiserver.sh`` on free loopback ports in
a fresh directory and stopped through its PID files (DESIGN.md §6). Everything Camp does to
the cluster goes over HTTPS to that server through the official client, with a token of the
camp-agent chart's ServiceAccount (``KubeApiserver.install_agent``): exactly the chart's
rights, never the admin's ``system:masters`` token, which only the stand-ins and the tests'
own checks use.

What no process here can be, and so is stood in for (each written from the real component's
sources and saying which):

* ``Kubelet``: a kubelet moves a bound pod through its phases. Ours watches pods with
  ``spec.nodeName`` and patches their ``status`` (Pending → Running; Succeeded/Failed on
  request). Before a GPU pod on a HAMi node runs, it asks the device plugin to allocate,
  as the real kubelet calls the device plugin's ``Allocate`` at container start.
* ``HamiDevicePlugin``: the device-plugin side of HAMi's bind handshake, after HAMi v2.10.0
  ``pkg/util/util.go`` ``GetPendingPod`` (a Pending pod bound to this node with
  ``hami.io/bind-time``, ``hami.io/bind-phase`` allocating and ``hami.io/vgpu-node`` equal to
  the node), ``pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go`` ``Allocate``
  (the devices in ``hami.io/vgpu-devices-to-allocate`` must exist on the node) and
  ``plugin/util.go``: on success ``patchErasedAnnotation`` first (the allocated containers'
  device lists are erased from ``hami.io/vgpu-devices-to-allocate``, re-encoded by
  ``EncodePodSingleDevice``: a one-container pod's becomes ``;``), then
  ``PodAllocationTrySuccess``/``PodAllocationSuccess``; on refusal ``PodAllocationFailed``
  (set ``hami.io/bind-phase`` to success/failed, then ``nodelock.ReleaseNodeLock``: drop
  ``hami.io/mutex.lock`` if this pod holds it), and ``Allocate`` returns an error, on which the
  kubelet fails the pod at admission (phase Failed, reason ``UnexpectedAdmissionError``) in the
  same instant: the kubelet stand-in does both in one step, racing Camp as a real node does.
* ``HamiWebhook``: HAMi's admission rule (``pkg/scheduler/webhook.go`` ``Handle``) served over
  HTTPS on 127.0.0.1 and registered with a ``MutatingWebhookConfiguration``, so the real
  apiserver runs it on every pod create: a pod asking for ``nvidia.com/gpu*`` whose
  ``schedulerName`` is empty or ``default-scheduler`` gets HAMi's scheduler name and is
  denied ("pod has node assigned") when ``spec.nodeName`` is already set; a pod naming
  another scheduler is allowed untouched.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

ROOT = Path(__file__).resolve().parents[3]
SHARED_TOOLS = ROOT.parent / "shared" / "tools"
ETCD = Path("/usr/bin/etcd")
AGENT_CHART = ROOT / "deploy" / "helm" / "camp-agent"
AGENT_RELEASE = "camp-agent"
AGENT_NAMESPACE = "camp-system"

LOCK = "hami.io/mutex.lock"
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"
VGPU_NODE = "hami.io/vgpu-node"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATED = "hami.io/vgpu-devices-allocated"
REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
HAMI_SCHEDULER = "hami-scheduler"
ADMISSION_ERROR = "UnexpectedAdmissionError"
"""The reason a kubelet gives a pod it refused at admission (a device plugin's Allocate failed)."""
GPU_RESOURCE_PREFIX = "nvidia.com/gpu"


def unavailable_reason() -> str | None:
    """Why the real apiserver cannot start here, or None when it can."""
    if not (SHARED_TOOLS / "start-kube-apiserver.sh").exists():
        return (f"no real kube-apiserver: {SHARED_TOOLS} is absent (the project's shared/ tools "
                "sit beside the clone on the project's machines; DESIGN.md §6)")
    if not ETCD.exists():
        return "no etcd at /usr/bin/etcd: apt-get install etcd-server (make test installs it as root)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class KubeApiserver:
    """One running etcd + kube-apiserver pair; ``stop()`` ends exactly those two and removes
    their directory; ``restart()`` (``halt()`` then ``resume()``) is an apiserver outage that
    keeps the port and the etcd data. The one start helper of the test suite (the realkube
    fixtures, the Helm test, the reliability suite's apiserver fault)."""

    base: Path
    host: str
    token: str
    ca_pem: str
    kubeconfig: Path
    agent_token: str = ""
    """A token of the camp-agent chart's ServiceAccount (``install_agent``): what Camp uses."""
    _core: k8s.CoreV1Api | None = field(default=None, repr=False)
    _env: dict[str, str] = field(default_factory=dict, repr=False)  # the start script's settings

    @classmethod
    def start(cls, *, prefix: str = "camp-kube-", agent: bool = True) -> KubeApiserver:
        """A fresh etcd + kube-apiserver in a new directory on free loopback ports (ready
        when this returns); RuntimeError with the script's stderr if it did not start.
        With ``agent``, the camp-agent chart installed and a token of its ServiceAccount
        made (``install_agent``): ``credentials`` are then Camp's, never the admin's."""
        base = Path(tempfile.mkdtemp(prefix=prefix))
        port = free_port()
        token = "camp-test-" + base64.urlsafe_b64encode(os.urandom(12)).decode().rstrip("=")
        env = {**os.environ, "BASE": str(base), "RUN": str(base / "run"), "API_PORT": str(port),
               "ETCD_PORT": str(free_port()), "ETCD_PEER_PORT": str(free_port()), "TOKEN": token}
        server = cls(base=base, host=f"https://127.0.0.1:{port}", token=token,
                     ca_pem="", kubeconfig=base / "run" / "kubeconfig", _env=env)
        try:
            server._launch(keep_data=False)
            if agent:
                server.install_agent()
        except (RuntimeError, subprocess.SubprocessError):
            server.stop()
            raise
        return server

    def install_agent(self) -> None:
        """docs/DEPLOY.md's steps in the managed cluster, as a platform admin (the admin
        token): ``helm install`` the camp-agent chart into ``camp-system``, then a token of
        its ServiceAccount through the TokenRequest API (``kubectl create token``)."""
        from tests.integration.deploy.tools import install_tools

        tools = install_tools()
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

        def run(*cmd: str | Path) -> str:
            done = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True,
                                  timeout=180, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(map(str, cmd[:3]))} failed: {done.stderr[-2000:]}")
            return done.stdout

        run(tools["helm"], "install", AGENT_RELEASE, AGENT_CHART, "-n", AGENT_NAMESPACE,
            "--create-namespace", "--wait=false")
        self.agent_token = run(tools["kubectl"], "-n", AGENT_NAMESPACE, "create", "token",
                               agent_service_account(), "--duration=24h").strip()

    def _launch(self, *, keep_data: bool) -> None:
        env = {**self._env, "KEEP_DATA": "1" if keep_data else "0"}
        started = subprocess.run(["bash", str(SHARED_TOOLS / "start-kube-apiserver.sh")], env=env,
                                 capture_output=True, text=True, timeout=120, check=False)
        if started.returncode != 0:
            raise RuntimeError(f"kube-apiserver did not start: {started.stderr[-2000:]}")
        self.ca_pem = (self.base / "run" / "pki" / "ca.crt").read_text()

    def halt(self) -> None:
        """Stop the apiserver and its etcd (exactly those two, through their PID files),
        keeping the data, certificates and ports for ``resume``."""
        subprocess.run(["bash", str(SHARED_TOOLS / "stop-kube-apiserver.sh")],
                       env={**os.environ, "RUN": str(self.base / "run")},
                       capture_output=True, timeout=60, check=False)

    def resume(self) -> None:
        """Start a halted server again: the same port, token, CA and etcd data
        (``KEEP_DATA=1``); returns once it answers ``/readyz``."""
        self._launch(keep_data=True)

    def restart(self, *, down_seconds: float = 0.0) -> float:
        """An apiserver outage: halt, stay down ``down_seconds``, resume on the same port
        with the same data. Returns how long it was down (until ready again)."""
        began = time.monotonic()
        self.halt()
        time.sleep(down_seconds)  # the outage itself, not a wait for something
        self.resume()
        return time.monotonic() - began

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.base, ignore_errors=True)

    def client(self) -> k8s.ApiClient:
        cfg = k8s.Configuration()
        cfg.host = self.host
        cfg.api_key = {"authorization": f"Bearer {self.token}"}
        cfg.ssl_ca_cert = str(self.base / "run" / "pki" / "ca.crt")
        return k8s.ApiClient(cfg)

    @property
    def core(self) -> k8s.CoreV1Api:
        if self._core is None:
            self._core = k8s.CoreV1Api(self.client())
        return self._core

    @property
    def credentials(self) -> dict[str, str]:
        """What an admin pastes when registering the cluster in Camp: the camp-agent
        ServiceAccount's token (never the admin's ``system:masters`` one) and the CA."""
        if not self.agent_token:
            raise RuntimeError("no camp-agent token: start(agent=True) or install_agent() first")
        return {"token": self.agent_token, "ca_cert": self.ca_pem}

    def reset(self) -> None:
        """Remove what a test left: nodes, and every namespace but the system ones and the
        camp-agent chart's (pods first, with grace 0, since nothing here finalises a graceful
        delete)."""
        core = self.core
        for ns in core.list_namespace().items:
            name = ns.metadata.name
            if name in ("default", "kube-system", "kube-public", "kube-node-lease", AGENT_NAMESPACE):
                core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
                continue
            core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
            try:
                core.delete_namespace(name, grace_period_seconds=0)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        for node in core.list_node().items:
            core.delete_node(node.metadata.name)
        sched = k8s.SchedulingV1Api(self.client())
        for pc in sched.list_priority_class().items:
            if not pc.metadata.name.startswith("system-"):  # the apiserver's own two stay
                sched.delete_priority_class(pc.metadata.name)
        adm = k8s.AdmissionregistrationV1Api(self.client())
        for hook in adm.list_mutating_webhook_configuration().items:
            adm.delete_mutating_webhook_configuration(hook.metadata.name)


def agent_service_account() -> str:
    """The ServiceAccount the camp-agent chart creates (its values.yaml)."""
    import yaml

    values = yaml.safe_load((AGENT_CHART / "values.yaml").read_text())
    return str(values["serviceAccount"]["name"])


def default_storage_class(server: KubeApiserver, present: bool) -> None:
    """A default StorageClass ``standard`` (the DefaultStorageClass admission plugin writes
    it into claims that name none), or none: claims then stay unbound (``Kubelet``)."""
    storage = k8s.StorageV1Api(server.client())
    try:
        storage.delete_storage_class("standard")
    except ApiException as exc:
        if exc.status != 404:
            raise
    if present:
        storage.create_storage_class({
            "metadata": {"name": "standard",
                         "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "camp.test/standin", "volumeBindingMode": "Immediate"})


# -- nodes -----------------------------------------------------------------------------------


def hami_devices(count: int, *, model: str = "NVIDIA-A100-SXM4-80GB", memory_mib: int = 81920,
                 prefix: str = "GPU-", sharers: int = 10,
                 healthy: bool | None = True) -> list[dict[str, Any]]:
    """Entries of ``hami.io/node-nvidia-register`` as HAMi's device plugin writes them
    (pkg/device/devices.go DeviceInfo, JSON; ``health`` dropped by omitempty when false)."""
    out = []
    for i in range(count):
        d: dict[str, Any] = {"id": f"{prefix}{i:04d}-{model[-8:].lower()}", "index": i, "count": sharers,
                             "devmem": memory_mib, "devcore": 100, "type": model, "numa": i // 4,
                             "mode": "hami-core"}
        if healthy is not None:
            d["health"] = healthy
        out.append(d)
    return out


def handshake_now() -> str:
    """A live device plugin's handshake value, ``Reported_<time>`` (HAMi docs/develop/
    protocol.md); the scheduler side overwrites it with ``Requesting_<time>`` and treats a
    ``Requesting_`` older than 60 s with no allocatable GPUs as a dead plugin."""
    return "Reported_" + dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def create_node(core: k8s.CoreV1Api, name: str, *, devices: list[dict[str, Any]] | None = None,
                gfd_gpus: int = 0, gfd_product: str = "Tesla-T4", gfd_memory_mib: int = 15360,
                handshake: str | None = None, labels: dict[str, str] | None = None,
                taints: list[dict[str, str]] | None = None, ready: bool = True,
                cpu: str = "64", memory: str = "512Gi") -> Any:
    """A node as the kubelet and the device plugins would publish it: a HAMi node when
    ``devices`` is given (register annotation + handshake), else a plain ``nvidia.com/gpu``
    node with GPU feature-discovery labels when ``gfd_gpus`` > 0, else a CPU node."""
    annotations: dict[str, str] = {}
    node_labels = dict(labels or {})
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    if devices is not None:
        annotations[REGISTER] = json.dumps(devices)
        annotations[HANDSHAKE] = handshake if handshake is not None else handshake_now()
        capacity["nvidia.com/gpu"] = str(sum(int(d.get("count", 1)) for d in devices))
    elif gfd_gpus:
        capacity["nvidia.com/gpu"] = str(gfd_gpus)
        node_labels.update({"nvidia.com/gpu.product": gfd_product, "nvidia.com/gpu.count": str(gfd_gpus),
                            "nvidia.com/gpu.memory": str(gfd_memory_mib)})
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": node_labels, "annotations": annotations},
            "spec": {"taints": taints or []}}
    core.create_node(body)
    status = {"status": {"capacity": capacity, "allocatable": capacity,
                         "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                         "reason": "KubeletReady" if ready else "KubeletNotReady",
                                         "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}]}}
    core.patch_node_status(name, status)
    # The apiserver's TaintNodesByCondition admission adds node.kubernetes.io/not-ready to
    # every new node; the node lifecycle controller (not running here) lifts it once the node
    # is Ready. Do what it would: keep only the taints asked for (and not-ready if not Ready).
    wanted = list(taints or [])
    if not ready:
        wanted.append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    return core.patch_node(name, {"spec": {"taints": wanted}})


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _gone(exc: BaseException) -> bool:
    """A pod deleted between a list and a write to it: a kubelet moves on."""
    return isinstance(exc, ApiException) and exc.status == 404


def _requests_gpu(pod: Any) -> bool:
    for c in pod.spec.containers or []:
        res = c.resources
        for part in ((res.limits if res else None) or {}, (res.requests if res else None) or {}):
            if any(k.startswith(GPU_RESOURCE_PREFIX) for k in part):
                return True
    return False


# -- HAMi's device plugin --------------------------------------------------------------------


class HamiDevicePlugin:
    """The device-plugin half of HAMi's bind handshake for the HAMi nodes of the test cluster.

    ``mode`` per node: "ok" answers success, "fail" answers failed (as when a device in the
    request is not on the node), "silent" never answers (a dead plugin; the scheduler side
    must time out and clean up).
    """

    def __init__(self, core: k8s.CoreV1Api) -> None:
        self.core = core
        self.mode: dict[str, str] = {}
        self.allocations: list[tuple[str, str, str]] = []  # (node, pod, devices) answered success

    def _pending_pod(self, node: str) -> Any | None:
        """HAMi's GetPendingPod: the pod on this node waiting for its devices."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        for p in pods:
            ann = p.metadata.annotations or {}
            if (p.status.phase or "Pending") != "Pending" or BIND_TIME not in ann:
                continue
            if ann.get(BIND_PHASE) not in ("allocating", "success") or ann.get(VGPU_NODE) != node:
                continue
            return p
        return None

    def allocate(self, node_name: str, pod: Any) -> str:
        """The device plugin's ``Allocate`` for ``pod`` on ``node_name``: "success" (the
        container may start), "failed" (the plugin refused: bind-phase failed, and ``Allocate``
        returned an error, so the kubelet fails the pod at admission), or "" (no answer: a
        silent plugin, or no pod of this node in the handshake; the kubelet tries again)."""
        mode = self.mode.get(node_name, "ok")
        if mode == "silent":
            return ""
        pending = self._pending_pod(node_name)
        if pending is None or pending.metadata.uid != pod.metadata.uid:
            # Allocate answers an error: no pod of this node is in the bind handshake.
            return ""
        ann = pending.metadata.annotations or {}
        node = self.core.read_node(node_name)
        known = {d["id"] for d in json.loads((node.metadata.annotations or {}).get(REGISTER, "[]"))}
        requested = ann.get(TO_ALLOCATE, "")
        containers = requested.split(";")[:-1] if requested.endswith(";") else requested.split(";")
        wanted = [e.split(",")[0] for c in containers for e in c.split(":") if e]
        ok = mode == "ok" and bool(wanted) and all(u in known for u in wanted)
        if ok:
            # patchErasedAnnotation: every container's list popped, EncodePodSingleDevice of
            # the emptied lists (one ";" per container).
            self.core.patch_namespaced_pod(pending.metadata.name, pending.metadata.namespace, {
                "metadata": {"annotations": {TO_ALLOCATE: ";" * len(containers)}}})
        self._answer(node_name, pending, "success" if ok else "failed")
        if ok:
            self.allocations.append((node_name, pending.metadata.name, requested))
        return "success" if ok else "failed"

    def _answer(self, node_name: str, pod: Any, phase: str) -> None:
        """PodAllocationSuccess/Failed: bind-phase, then ReleaseNodeLock (owner checked)."""
        self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                       {"metadata": {"annotations": {BIND_PHASE: phase}}})
        node = self.core.read_node(node_name)
        lock = (node.metadata.annotations or {}).get(LOCK)
        owner = f",{pod.metadata.namespace},{pod.metadata.name}"
        if lock is not None and ("," not in lock or lock.endswith(owner)):
            self.core.patch_node(node_name, {"metadata": {"annotations": {LOCK: None},
                                                          "resourceVersion": node.metadata.resource_version}})


# -- the kubelet -----------------------------------------------------------------------------


class Kubelet:
    """Moves pods bound to a node through their phases, as the kubelet would report them.

    A GPU pod on a HAMi node (one with the register annotation) starts only after the device
    plugin allocated its devices; otherwise it fails with the kubelet's admission error.
    ``hold`` names pods (by name) to leave Pending.
    """

    def __init__(self, core: k8s.CoreV1Api, plugin: HamiDevicePlugin) -> None:
        self.core = core
        self.plugin = plugin
        self.hold: set[str] = set()
        self.waiting: dict[str, tuple[str, str]] = {}
        """Pod name → (reason, message) its main container waits with, as the kubelet reports
        an image it cannot pull (``ImagePullBackOff``) or a container it cannot create."""
        self._mount_warned: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-standin", daemon=True)
        self._seen: set[str] = set()
        self.errors: list[str] = []

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # Woken by the pods' watch (a real kubelet reacts to a bind at once), with a pass at
        # least every 0.2 s.
        while not self._stop.is_set():
            try:
                self.sync()
                stream = k8s_watch.Watch().stream(self.core.list_pod_for_all_namespaces,
                                                  timeout_seconds=1, _request_timeout=2)
                for event in stream:
                    pod = event["object"]
                    # Only a bound pod still Pending has something for the kubelet to do.
                    if (pod.spec.node_name and (pod.status.phase or "Pending") == "Pending"
                            and not pod.metadata.deletion_timestamp):
                        self.sync()
                    if self._stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 — a stand-in keeps running, and records why
                if not _gone(exc):
                    self.errors.append(repr(exc))
            self._stop.wait(0.05)

    def sync(self) -> None:
        """One pass over bound pods (also callable directly from a test)."""
        hami_nodes = {n.metadata.name for n in self.core.list_node().items
                      if REGISTER in (n.metadata.annotations or {})}
        bound = self._bind_claims()
        for pod in self.core.list_pod_for_all_namespaces().items:
            node = pod.spec.node_name
            if not node or pod.metadata.deletion_timestamp or pod.metadata.name in self.hold:
                continue
            if (pod.status.phase or "Pending") != "Pending":
                continue
            if pod.metadata.name in self.waiting:
                self._wait(pod, *self.waiting[pod.metadata.name])
                continue
            # Admission first (the device plugin's Allocate), as the real kubelet admits a pod
            # before its volume manager mounts anything.
            if _requests_gpu(pod) and node in hami_nodes:
                phase = (pod.metadata.annotations or {}).get(BIND_PHASE)
                answer = phase if phase in ("success", "failed") else self.plugin.allocate(node, pod)
                if answer == "failed":
                    # Allocate returned an error: the kubelet's admission fails the pod in the
                    # same instant (kubelet/cm/devicemanager → lifecycle.PodAdmitResult).
                    self._set_phase(pod, "Failed", ADMISSION_ERROR,
                                    "Pod Allocate failed due to device plugin allocation failure")
                    continue
                if answer != "success":
                    continue
            unbound = [v for v in pod.spec.volumes or [] if v.persistent_volume_claim is not None
                       and (pod.metadata.namespace, v.persistent_volume_claim.claim_name) not in bound]
            if unbound:
                # The kubelet's volume manager: a pod whose claim is not bound never gets its
                # containers; it stays ContainerCreating and says FailedMount.
                self._wait(pod, "ContainerCreating", "")
                if pod.metadata.uid not in self._mount_warned:
                    self._mount_warned.add(pod.metadata.uid)
                    claim = unbound[0].persistent_volume_claim.claim_name
                    self.event(pod, "FailedMount", (
                        f"Unable to attach or mount volumes: unmounted volumes=[{unbound[0].name}]: "
                        f"error processing PVC {pod.metadata.namespace}/{claim}: PVC is not bound"))
                continue
            self._set_phase(pod, "Running")

    def _bind_claims(self) -> set[tuple[str, str]]:
        """The PV controller's part (with a provisioner behind every StorageClass that names
        one): a claim naming a StorageClass is bound — one of a ``WaitForFirstConsumer`` class
        only once it carries ``volume.kubernetes.io/selected-node`` (the provisioner waits for
        the scheduler's choice), never one of a class without provisioner (its pre-made
        volumes only kube-scheduler binds); one naming none (made when the cluster had no
        default class) stays Pending forever. The bound claims, as (namespace, name)."""
        bound = set()
        storage = k8s.StorageV1Api(self.core.api_client)
        classes = {c.metadata.name: c for c in storage.list_storage_class().items}
        for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            key = (pvc.metadata.namespace, pvc.metadata.name)
            cls = classes.get(pvc.spec.storage_class_name or "")
            waits = cls is not None and cls.volume_binding_mode == "WaitForFirstConsumer" and (
                cls.provisioner == "kubernetes.io/no-provisioner"
                or "volume.kubernetes.io/selected-node" not in (pvc.metadata.annotations or {}))
            if (pvc.status.phase if pvc.status else None) == "Bound":
                bound.add(key)
            elif pvc.spec.storage_class_name and not waits:
                self.core.patch_namespaced_persistent_volume_claim_status(
                    pvc.metadata.name, pvc.metadata.namespace, {"status": {"phase": "Bound"}})
                bound.add(key)
        return bound

    def _wait(self, pod: Any, reason: str, message: str) -> None:
        """The main container waits (the kubelet's ``state.waiting``), the pod stays Pending."""
        current = [c for c in (pod.status.container_statuses or []) if c.state and c.state.waiting]
        if current and current[0].state.waiting.reason == reason:
            return
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
            "phase": "Pending", "hostIP": "10.0.0.10", "startTime": _now(),
            "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"waiting": {
                                       "reason": reason, **({"message": message} if message else {})}}}
                                  for c in pod.spec.containers]}})

    def event(self, pod: Any, reason: str, message: str, *, kind: str = "Warning") -> None:
        """An event about the pod, as the kubelet records one."""
        now = _now()
        self.core.create_namespaced_event(pod.metadata.namespace, {
            "metadata": {"name": f"{pod.metadata.name}.{os.urandom(6).hex()}"},
            "involvedObject": {"kind": "Pod", "name": pod.metadata.name,
                               "namespace": pod.metadata.namespace, "uid": pod.metadata.uid},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now, "source": {"component": "kubelet"}})

    def _set_phase(self, pod: Any, phase: str, reason: str = "", message: str = "") -> None:
        status: dict[str, Any] = {"phase": phase, "hostIP": "10.0.0.10", "podIP": "10.1.0.10",
                                  "startTime": _now()}
        if phase == "Running":
            status["conditions"] = [{"type": "Ready", "status": "True"}]
            status["containerStatuses"] = [
                {"name": c.name, "image": c.image, "imageID": "", "ready": True, "restartCount": 0,
                 "state": {"running": {"startedAt": _now()}}} for c in pod.spec.containers]
        if reason:
            status["reason"] = reason
            status["message"] = message
        try:
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace,
                                                  {"status": status})
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile (Camp cleaned up): a kubelet moves on
                raise

    def finish(self, namespace: str, name: str, *, succeeded: bool = True, message: str = "",
               exit_code: int | None = None, reason: str = "", container_message: str = "") -> None:
        """The container exited: Succeeded (exit 0) or Failed (exit 1, or ``exit_code`` with
        the runtime's ``reason``: ``OOMKilled`` and 137, ``StartError`` and 128, …), as the
        kubelet writes the container's ``state.terminated``."""
        phase = "Succeeded" if succeeded else "Failed"
        terminated: dict[str, Any] = {
            "exitCode": exit_code if exit_code is not None else (0 if succeeded else 1),
            "reason": reason or ("Completed" if succeeded else "Error"),
            "startedAt": _now(), "finishedAt": _now()}
        if container_message:
            terminated["message"] = container_message
        self.core.patch_namespaced_pod_status(name, namespace, {"status": {
            "phase": phase, "message": message,
            "containerStatuses": [{"name": "main", "image": "x", "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": terminated}}]}})


# -- HAMi's admission webhook ----------------------------------------------------------------


def _self_signed(host: str = "127.0.0.1") -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) for 127.0.0.1, made with the ``cryptography`` package."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hami-webhook-standin")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def hami_admission(pod: dict[str, Any], scheduler_name: str = HAMI_SCHEDULER) -> tuple[bool, str, list[Any]]:
    """HAMi's webhook.go ``Handle`` for one pod: (allowed, message, JSON patch)."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        return False, "pod has no containers", []
    current = spec.get("schedulerName") or ""
    # HAMi leaves alone a pod that names another scheduler (default-scheduler is overwritten:
    # ForceOverwriteDefaultScheduler defaults to true in the chart).
    if current and current not in ("default-scheduler", scheduler_name):
        return True, "pod already has different scheduler assigned", []
    has_resource = any(
        k.startswith(GPU_RESOURCE_PREFIX)
        for c in (spec.get("initContainers") or []) + containers
        for part in ((c.get("resources") or {}).get("limits") or {},
                     (c.get("resources") or {}).get("requests") or {})
        for k in part)
    if not has_resource:
        return True, "no GPU resource found", []
    if spec.get("nodeName"):
        return False, "pod has node assigned", []
    op = "replace" if "schedulerName" in spec else "add"
    return True, "", [{"op": op, "path": "/spec/schedulerName", "value": scheduler_name}]


class HamiWebhook:
    """HAMi's mutating admission webhook rule, served on 127.0.0.1 over HTTPS and registered
    on the real apiserver for pod creates. ``reviews`` records (pod name, allowed, message)."""

    def __init__(self) -> None:
        self.reviews: list[tuple[str, bool, str]] = []
        cert, key = _self_signed()
        self.ca_pem = cert
        self._dir = Path(tempfile.mkdtemp(prefix="camp-hami-webhook-"))
        (self._dir / "tls.crt").write_bytes(cert)
        (self._dir / "tls.key").write_bytes(key)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's naming
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                pod = request["object"]
                allowed, message, patch = hami_admission(pod)
                name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get(
                    "generateName", "")
                outer.reviews.append((name, allowed, message))
                response: dict[str, Any] = {"uid": request["uid"], "allowed": allowed}
                if not allowed:
                    response["status"] = {"code": 403, "message": message}
                elif patch:
                    response["patchType"] = "JSONPatch"
                    response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": response}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self._dir / "tls.crt", self._dir / "tls.key")
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HamiWebhook:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def register(self, api_client: k8s.ApiClient, name: str = "hami-webhook") -> None:
        """A MutatingWebhookConfiguration like HAMi's chart installs (pods, CREATE, fail closed)."""
        body = {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "vgpu.hami.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail", "timeoutSeconds": 10,
                "clientConfig": {"url": f"https://127.0.0.1:{self.port}/webhook",
                                 "caBundle": base64.b64encode(self.ca_pem).decode()},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "*"}],
                "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                     "values": ["kube-system"]}]},
            }],
        }
        k8s.AdmissionregistrationV1Api(api_client).create_mutating_webhook_configuration(body)
        # The apiserver loads webhook configurations asynchronously: wait until it calls us.
        probe = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "hami-webhook-probe", "namespace": "default"},
                 "spec": {"nodeName": "nowhere", "containers": [{
                     "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        core = k8s.CoreV1Api(api_client)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                core.create_namespaced_pod("default", probe, dry_run="All")
            except ApiException as exc:
                if "pod has node assigned" in (exc.body or ""):
                    return
            time.sleep(0.2)
        raise RuntimeError("the apiserver never called the HAMi webhook stand-in")


# -- helpers ---------------------------------------------------------------------------------


def wait_until(check: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def camp_pods(core: k8s.CoreV1Api) -> list[Any]:
    return list(core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=camp").items)


def watch_events(core: k8s.CoreV1Api, seconds: int) -> Iterator[dict[str, Any]]:
    """Raw pod watch events for ``seconds`` (for tests that assert on what the cluster saw)."""
    yield from k8s_watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=seconds)
