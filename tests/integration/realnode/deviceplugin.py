"""A kubelet device plugin standing in for HAMi's NVIDIA plugin on the real node (no GPUs here).

Written from HAMi's sources (Project-HAMi/HAMi): ``pkg/device-plugin/nvidiadevice/nvinternal/
plugin/server.go`` (``Register``, ``ListAndWatch``, ``Allocate``), ``pkg/util/util.go``
(``GetPendingPod``: the Pending pod bound to this node with ``hami.io/bind-time``,
``hami.io/bind-phase`` allocating and ``hami.io/vgpu-node`` = the node), ``pkg/device/devices.go``
(``PodAllocationTrySuccess``/``PodAllocationFailed``: ``hami.io/bind-phase`` success/failed,
then ``nodelock.ReleaseNodeLock``) and ``pkg/device/nvidia`` (the register annotation
``hami.io/node-nvidia-register`` and the handshake ``hami.io/node-handshake`` =
``Reported_<time>``, refreshed periodically). It speaks the kubelet's device-plugin API v1beta1
over gRPC on the kubelet's socket, so the REAL kubelet calls ``Allocate`` at admission and a
refusal fails the pod there (``UnexpectedAdmissionError``), exactly as on a HAMi node.

It advertises ``nvidia.com/gpu`` as HAMi does: each card split into ``sharers`` device IDs
(``<uuid>-<i>``). HAMi's ``nvidia.com/gpumem``/``gpucores`` are requests only HAMi's scheduler
reads; its plugin registers no such resource with the kubelet, which drops requests for
resources the node does not advertise (kubelet ``removeMissingExtendedResources``), so neither
do we; the register annotation carries the memory and cores Camp's inventory reads.

The few protobuf messages of ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`` are
encoded by hand below (field numbers from that file): the generated code would need protoc and
the protobuf runtime for eight small messages; grpcio carries raw bytes with our (de)serialisers.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from kubernetes.client.rest import ApiException

from tests.integration.realkube.harness import (
    BIND_PHASE,
    BIND_TIME,
    HANDSHAKE,
    LOCK,
    REGISTER,
    TO_ALLOCATE,
    VGPU_NODE,
    hami_devices,
    handshake_now,
)

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # the kubelet v1.24 hard-codes it
RESOURCE = "nvidia.com/gpu"

# --- protobuf wire format (proto3: varint = 0, length-delimited = 2) --------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _bool(num: int, value: bool) -> bytes:
    return _varint(num << 3) + _varint(1) if value else b""


def _parse(data: bytes) -> list[tuple[int, bytes | int]]:
    """(field number, bytes or int) of a message, in order."""
    out: list[tuple[int, bytes | int]] = []
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(data, i)
            out.append((num, v))
        elif wire == 2:
            n, i = _read_varint(data, i)
            out.append((num, data[i:i + n]))
            i += n
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return out


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def register_request(endpoint: str) -> bytes:
    # RegisterRequest{version=1, endpoint=2, resource_name=3, options=4 (DevicePluginOptions)}
    return _field(1, "v1beta1") + _field(2, endpoint) + _field(3, RESOURCE) + _field(4, b"")


def list_and_watch_response(ids: list[str]) -> bytes:
    # ListAndWatchResponse{devices=1 repeated Device{ID=1, health=2}}
    return b"".join(_field(1, _field(1, i) + _field(2, "Healthy")) for i in ids)


def allocate_request_ids(data: bytes) -> list[list[str]]:
    # AllocateRequest{container_requests=1 repeated ContainerAllocateRequest{devicesIDs=1 repeated}}
    return [[bytes(v).decode() for n, v in _parse(bytes(c)) if n == 1 and isinstance(v, bytes)]
            for num, c in _parse(data) if num == 1 and isinstance(c, bytes)]


def allocate_response(envs_per_container: list[dict[str, str]]) -> bytes:
    # AllocateResponse{container_responses=1 repeated ContainerAllocateResponse{envs=1 map}}
    return b"".join(_field(1, b"".join(_field(1, _field(1, k) + _field(2, v)) for k, v in envs.items()))
                    for envs in envs_per_container)


def _ident(b: bytes) -> bytes:
    return b


# --- the plugin ---------------------------------------------------------------------------------


class Refused(Exception):
    """Allocate's error answer (HAMi returns an error; the kubelet fails the pod's admission)."""


class HamiNodePlugin:
    """Serve on ``PLUGIN_DIR/<name>.sock``, register with the kubelet, publish HAMi's node
    annotations. ``refuse`` = True makes ``Allocate`` answer as HAMi does when the devices in
    the pod's annotation are not this node's (bind-phase failed, an error to the kubelet)."""

    def __init__(self, core: Any, node: str, *, cards: int = 2, sharers: int = 10,
                 memory_mib: int = 16384, name: str = "camp-hami") -> None:
        self.core, self.node = core, node
        self.devices = hami_devices(cards, sharers=sharers, memory_mib=memory_mib, model="NVIDIA-Tesla-T4")
        self.ids = [f"{d['id']}-{i}" for d in self.devices for i in range(int(d["count"]))]
        self.socket = PLUGIN_DIR / f"{name}.sock"
        self.refuse = False
        self.allocations: list[tuple[str, str]] = []  # (pod, devices) answered success
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._beat: threading.Thread | None = None

    # gRPC methods (``/v1beta1.DevicePlugin/...``)
    def _options(self, request: bytes, context: Any) -> bytes:
        return b""  # DevicePluginOptions{}: no PreStartContainer, no GetPreferredAllocation

    def _list_and_watch(self, request: bytes, context: Any) -> Iterator[bytes]:
        yield list_and_watch_response(self.ids)
        while not self._stop.wait(1.0) and context.is_active():
            pass

    def _allocate(self, request: bytes, context: Any) -> bytes:
        try:
            return self.allocate(allocate_request_ids(request))
        except Refused as exc:  # HAMi's answer: an error to the kubelet, which fails the pod
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
            raise
        except Exception as exc:  # noqa: BLE001 — a bug of ours: recorded for the test
            self.errors.append(repr(exc))
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))
            raise

    def _pending_pod(self) -> Any | None:
        """HAMi's ``GetPendingPod``."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}").items
        for p in pods:
            ann = p.metadata.annotations or {}
            if (p.status.phase or "Pending") != "Pending" or BIND_TIME not in ann:
                continue
            if ann.get(BIND_PHASE) == "allocating" and ann.get(VGPU_NODE) == self.node:
                return p
        return None

    def allocate(self, requests: list[list[str]]) -> bytes:
        pod = self._pending_pod()
        if pod is None:
            self._release_lock(None)
            raise Refused("no pending pod on this node (HAMi GetPendingPod)")
        ann = pod.metadata.annotations or {}
        known = {d["id"] for d in self.devices}
        # "uuid,NVIDIA,mem,cores:" per device, ";" between containers (HAMi EncodePodDevices)
        encoded = ann.get(TO_ALLOCATE, "")
        per_container = [[e.split(",") for e in c.split(":") if e] for c in encoded.split(";")]
        per_container = [c for c in per_container if c] or [[]]
        envs = []
        for idx, ids in enumerate(requests):
            want = per_container[idx] if idx < len(per_container) else []
            uuids = [d[0] for d in want]
            if self.refuse or len(want) != len(ids) or not all(u in known for u in uuids):
                self._answer(pod, "failed")
                raise Refused("device number not matched or device not on this node")
            # what HAMi's getAllocateResponse sets for HAMi-core (visible cards, memory limits)
            envs.append({"NVIDIA_VISIBLE_DEVICES": ",".join(uuids),
                         **{f"CUDA_DEVICE_MEMORY_LIMIT_{i}": f"{d[2]}m"
                            for i, d in enumerate(want) if len(d) > 2},
                         **({"CUDA_DEVICE_SM_LIMIT": want[0][3]} if want and len(want[0]) > 3 else {})})
        # EraseNextDeviceTypeFromAnnotation, then PodAllocationTrySuccess
        self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                       {"metadata": {"annotations": {TO_ALLOCATE: ""}}})
        self._answer(pod, "success")
        self.allocations.append((pod.metadata.name, ann.get(TO_ALLOCATE, "")))
        return allocate_response(envs)

    def _answer(self, pod: Any, phase: str) -> None:
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace,
                                           {"metadata": {"annotations": {BIND_PHASE: phase}}})
        except ApiException as exc:
            if exc.status != 404:  # the pod was deleted meanwhile: HAMi logs it and goes on
                raise
        self._release_lock(pod)

    def _release_lock(self, pod: Any | None) -> None:
        """``nodelock.ReleaseNodeLock``: drop ``hami.io/mutex.lock`` if this pod holds it."""
        node = self.core.read_node(self.node)
        lock = (node.metadata.annotations or {}).get(LOCK)
        if lock is None:
            return
        owner = f",{pod.metadata.namespace},{pod.metadata.name}" if pod is not None else None
        if owner is None or "," not in lock or lock.endswith(owner):
            with contextlib.suppress(ApiException):  # 409: the lock moved on (HAMi retries later)
                body = {"metadata": {"annotations": {LOCK: None},
                                     "resourceVersion": node.metadata.resource_version}}
                self.core.patch_node(self.node, body)

    # life
    def publish(self) -> None:
        self.core.patch_node(self.node, {"metadata": {"annotations": {
            REGISTER: json.dumps(self.devices), HANDSHAKE: handshake_now()}}})

    def __enter__(self) -> HamiNodePlugin:
        PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                self._options, request_deserializer=_ident, response_serializer=_ident),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch, request_deserializer=_ident, response_serializer=_ident),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                self._allocate, request_deserializer=_ident, response_serializer=_ident),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1beta1.DevicePlugin", handlers),))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        with grpc.insecure_channel(f"unix://{PLUGIN_DIR / 'kubelet.sock'}") as ch:
            register = ch.unary_unary("/v1beta1.Registration/Register", request_serializer=_ident,
                                      response_deserializer=_ident)
            register(register_request(self.socket.name), timeout=30)
        self.publish()
        self._beat = threading.Thread(target=self._heartbeat, name="hami-handshake", daemon=True)
        self._beat.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(20):
            try:
                self.publish()
            except Exception as exc:  # noqa: BLE001 — recorded; the next beat tries again
                self.errors.append(repr(exc))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=2).wait(5)
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self.socket.exists():
            self.socket.unlink()
        self.core.patch_node(self.node, {"metadata": {"annotations": {REGISTER: None, HANDSHAKE: None}}})


def wait_advertised(core: Any, node: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alloc = core.read_node(node).status.allocatable or {}
        if alloc.get(RESOURCE) == str(count):
            return
        time.sleep(0.5)
    raise AssertionError(f"the kubelet does not advertise {count} {RESOURCE}")

