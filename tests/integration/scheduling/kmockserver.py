"""kmock (PyPI) serving the Kubernetes API over real HTTP, in a thread with its own loop.

Everything that touches the emulator's store (``k.objects``) runs on the emulator's own event
loop under its own ``asyncio.Lock``, as kmock's request handling does. kmock keeps no
thread-safety of its own: a thread that deleted a POSTed Binding between kmock's storing it
(``_handle``) and reading it back (``_serve_create``) made kmock answer 500 (``assert obj is not
None``), and under CPU load often enough to exhaust Camp's retries and fail the dispatch."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import kmock
from kmock._internal.rendering import Response

T = TypeVar("T")

_PODS = kmock.resource("", "v1", "pods")
_NODES = kmock.resource("", "v1", "nodes")
# id(emulator) → its event loop, so that the test thread's store access runs there.
_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}


@contextmanager
def kmock_server() -> Iterator[Any]:
    state: dict[str, Any] = {}
    stop = threading.Event()

    def run() -> None:
        async def main() -> None:
            async with kmock.KubernetesEmulator() as k, kmock.Server(k):
                # The apiserver applies a Binding to its pod within the request (pods/binding).
                k[kmock.method.POST, _PODS, kmock.subresource("binding")] << (
                    lambda request: _bind(k, request))
                hami = asyncio.create_task(_hami_answers(k))
                _LOOPS[id(k)] = asyncio.get_running_loop()
                state["k"] = k
                try:
                    while not stop.is_set():
                        await asyncio.sleep(0.02)
                finally:
                    _LOOPS.pop(id(k), None)
                    hami.cancel()

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "k" not in state:
        assert time.monotonic() < deadline, "kmock did not start"
        time.sleep(0.02)
    try:
        yield state["k"]
    finally:
        stop.set()
        thread.join(timeout=5)


def _in_store(k: Any, fn: Callable[[], T]) -> T:
    """Run ``fn`` on the emulator's loop holding its lock (directly if there is no loop to
    go to, or if already on it)."""
    loop = _LOOPS.get(id(k))
    try:
        on_loop = asyncio.get_running_loop() is loop
    except RuntimeError:
        on_loop = False
    if loop is None or on_loop:
        return fn()

    async def locked() -> T:
        async with k._lock:
            return fn()

    return asyncio.run_coroutine_threadsafe(locked(), loop).result(timeout=30)


def seed(
    k: Any, resource: tuple[str, str, str], namespace: str | None, name: str, obj: dict[str, Any]
) -> None:
    """Put an object straight into the emulator's store (no HTTP)."""

    def put() -> None:
        k.objects[(kmock.resource(*resource), namespace, name)] = obj

    _in_store(k, put)


def stored(k: Any, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
    group, version = ("", "v1")
    return _in_store(
        k, lambda: dict(k.objects[(kmock.resource(group, version, plural), namespace, name)].raw)
    )


def _status(code: int, reason: str = "", message: str = "") -> Response:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "code": code,
        "status": "Success" if code < 400 else "Failure",
    }
    if reason:
        body.update(reason=reason, message=message)
    return Response(status=code, payload=body)


async def _bind(k: Any, request: Any) -> Response:
    """POST pods/{name}/binding as the apiserver answers it (pkg/registry/core/pod/storage
    BindingREST): the pod gets the target's nodeName, 404 without the pod, 409 if it is
    already bound."""
    meta = request.data.get("metadata") or {}
    namespace, name = request.namespace or meta.get("namespace"), request.name or meta.get("name")
    target = (request.data.get("target") or {}).get("name", "")
    async with k._lock:
        key = (_PODS, namespace, name)
        if key not in k.objects or k.objects[key].deleted:
            return _status(404, "NotFound", f'pods "{name}" not found')
        pod = dict(k.objects[key].raw)
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            return _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": '
                f'pod {name} is already assigned to node "{bound}"',
            )
        pod["spec"] = {**pod.get("spec", {}), "nodeName": target}
        k.objects[key] = pod
    return _status(201)


async def _hami_answers(k: Any) -> None:
    """Answer HAMi's bind handshake for kmock's pods as the device plugin would (bind-phase
    allocating → success), straight in the emulator's store. The real handshake, with the
    node lock and the device checks, is tested on the real apiserver (tests/integration/
    realkube); kmock tests only need the answer to check what Camp creates."""
    while True:
        async with k._lock:
            for key in [key for key in k.objects if key[0] == _PODS]:
                if k.objects[key].deleted:
                    continue
                raw = dict(k.objects[key].raw)
                ann = (raw.get("metadata") or {}).get("annotations") or {}
                # As HAMi's GetPendingPod: only a pod already bound to its node is answered.
                if ann.get("hami.io/bind-phase") == "allocating" and (raw.get("spec") or {}).get("nodeName"):
                    raw["metadata"] = {
                        **raw["metadata"],
                        "annotations": {**ann, "hami.io/bind-phase": "success"},
                    }
                    k.objects[key] = raw
                    _release_lock(k, ann.get("hami.io/vgpu-node", ""), f",{key[1]},{key[2]}")
        await asyncio.sleep(0.05)


def _release_lock(k: Any, node: str, owner: str) -> None:
    """HAMi's ReleaseNodeLock after a successful allocation: the node lock goes if ours."""
    key = (_NODES, None, node)
    if key not in k.objects or k.objects[key].deleted:
        return
    raw = dict(k.objects[key].raw)
    ann = dict((raw.get("metadata") or {}).get("annotations") or {})
    if ann.get("hami.io/mutex.lock", "").endswith(owner):
        del ann["hami.io/mutex.lock"]
        raw["metadata"] = {**raw["metadata"], "annotations": ann}
        k.objects[key] = raw
