"""kmock (PyPI) serving the Kubernetes API over real HTTP, in a thread with its own loop."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import kmock


@contextmanager
def kmock_server() -> Iterator[Any]:
    state: dict[str, Any] = {}
    stop = threading.Event()

    def run() -> None:
        async def main() -> None:
            async with kmock.KubernetesEmulator() as k, kmock.Server(k):
                state["k"] = k
                state["loop"] = asyncio.get_running_loop()
                while not stop.is_set():
                    await asyncio.sleep(0.02)

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while "k" not in state:
        assert time.monotonic() < deadline, "kmock did not start"
        time.sleep(0.02)
    try:
        with hami_answers(state["k"]):
            yield state["k"]
    finally:
        stop.set()
        thread.join(timeout=5)


def seed(k: Any, resource: tuple[str, str, str], namespace: str | None, name: str,
         obj: dict[str, Any]) -> None:
    """Put an object straight into the emulator's store (no HTTP)."""
    k.objects[(kmock.resource(*resource), namespace, name)] = obj


def stored(k: Any, plural: str, namespace: str | None, name: str) -> dict[str, Any]:
    group, version = ("", "v1")
    return dict(k.objects[(kmock.resource(group, version, plural), namespace, name)].raw)


@contextmanager
def hami_answers(k: Any) -> Iterator[None]:
    """Answer HAMi's bind handshake for kmock's pods as the device plugin would (bind-phase
    allocating → success), straight in the emulator's store. The real handshake, with the
    node lock and the device checks, is tested on the real apiserver (tests/integration/
    realkube); kmock tests only need the answer to check what Camp creates."""
    stop = threading.Event()
    pods = kmock.resource("", "v1", "pods")

    bindings = kmock.resource("", "v1", "bindings")

    def run() -> None:
        while not stop.is_set():
            # kmock stores a POSTed Binding as an object; the apiserver would set the pod's
            # nodeName from it (pods/binding). Do that, once per Binding.
            for key in [key for key in list(k.objects) if key[0] == bindings]:
                try:
                    target = dict(k.objects[key].raw).get("target") or {}
                    pod = dict(k.objects[(pods, key[1], key[2])].raw)
                except (KeyError, AttributeError, ValueError):
                    continue
                del k.objects[key]
                pod["spec"] = {**pod.get("spec", {}), "nodeName": target.get("name", "")}
                seed(k, ("", "v1", "pods"), key[1], key[2], pod)
            for key in [key for key in list(k.objects) if key[0] == pods]:
                try:
                    raw = dict(k.objects[key].raw)
                except (KeyError, AttributeError, ValueError):
                    continue
                ann = (raw.get("metadata") or {}).get("annotations") or {}
                # As HAMi's GetPendingPod: only a pod already bound to its node is answered.
                if ann.get("hami.io/bind-phase") == "allocating" and (raw.get("spec") or {}).get("nodeName"):
                    raw["metadata"] = {**raw["metadata"],
                                       "annotations": {**ann, "hami.io/bind-phase": "success"}}
                    seed(k, ("", "v1", "pods"), key[1], key[2], raw)
                    _release_lock(k, ann.get("hami.io/vgpu-node", ""), f",{key[1]},{key[2]}")
            stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def _release_lock(k: Any, node: str, owner: str) -> None:
    """HAMi's ReleaseNodeLock after a successful allocation: the node lock goes if ours."""
    key = (kmock.resource("", "v1", "nodes"), None, node)
    try:
        raw = dict(k.objects[key].raw)
    except (KeyError, AttributeError, ValueError):
        return
    ann = dict((raw.get("metadata") or {}).get("annotations") or {})
    if ann.get("hami.io/mutex.lock", "").endswith(owner):
        del ann["hami.io/mutex.lock"]
        raw["metadata"] = {**raw["metadata"], "annotations": ann}
        seed(k, ("", "v1", "nodes"), None, node, raw)
