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
