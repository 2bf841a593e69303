"""Following a workload's logs: every pod of its current run, merged into one async stream
that an ASGI response (``StreamingHttpResponse`` over an async iterator) can send as it
comes, bounded in time.

Each pod is followed by the cluster backend's blocking ``follow_pod_logs`` in a thread
of its own (the Kubernetes client reads a socket; the simulated backend polls its
table), which hands lines to the event loop. Pods that appear later (a queued job
starting, a requeued job's next attempt) are picked up by a poll of the run's
allocations. The stream ends when the time limit is reached, or when the run is over
and every follower has finished; a client that goes away sets the followers' stop flag.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from scheduling.backends import backend_for
from scheduling.backends.base import BackendError
from scheduling.models import Job
from scheduling.services import namespace_spec

HEARTBEAT_SECONDS = 10.0
DEFAULT_TIMEOUT = 300
MAX_TIMEOUT = 3600


@dataclass(frozen=True)
class LogLine:
    pod: str
    role: str
    text: str


@dataclass(frozen=True)
class End:
    reason: str


@dataclass(frozen=True)
class _Done:
    key: tuple[str, int]


def _run_pods(job_id: int, pod: str) -> tuple[bool, int, list[tuple[str, str]], Any, str]:
    """(run over?, attempt, [(pod, role)], cluster, namespace) of the run now."""
    job = Job.objects.select_related("cluster", "tenant", "project").filter(pk=job_id).first()
    if job is None:  # deleted meanwhile
        return True, 0, [], None, ""
    allocs = job.allocations.select_related("group").order_by("group_id", "replica")
    pods = [(a.pod_name, a.group.name) for a in allocs if not pod or a.pod_name == pod]
    if job.cluster is None:  # a floating job still in the global queue: no pods anywhere yet
        return job.is_final, job.attempts, [], None, ""
    return job.is_final, job.attempts, pods, job.cluster, namespace_spec(job, job.cluster).name


def _run_pods_released(job_id: int, pod: str) -> tuple[bool, int, list[tuple[str, str]], Any, str]:
    """``_run_pods``, then this thread's connection back to its pool: a stream runs for up to
    an hour, and a pooled connection held by it is one fewer for every other request — 8 open
    log panels would have held a web process's whole pool (issue 35)."""
    try:
        return _run_pods(job_id, pod)
    finally:
        connections.close_all()


def _follow_pod(
    loop: asyncio.AbstractEventLoop,
    queue: asyncio.Queue[Any],
    cluster: Any,
    namespace: str,
    pod: str,
    role: str,
    key: tuple[str, int],
    tail: int,
    seconds: float,
    stop: threading.Event,
) -> None:
    """Thread body: one pod's lines onto the loop's queue, then a done marker."""

    def put(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            stop.set()

    try:
        backend = backend_for(cluster)
        for text in backend.follow_pod_logs(
            namespace, pod, tail_lines=tail, timeout_seconds=seconds, stop=stop
        ):
            put(LogLine(pod, role, text))
            if stop.is_set():
                break
    except BackendError as exc:
        put(LogLine(pod, role, f"(logs unavailable: {exc})"))
    finally:
        connections.close_all()  # this thread's own database connections
        put(_Done(key))


async def follow_job_logs(
    job: Job | None, *, pod: str = "", tail: int = 50, timeout: float = DEFAULT_TIMEOUT, poll: float = 1.0
) -> AsyncIterator[Any]:
    """``LogLine``s of the run's pods as they are written (``None`` after a quiet spell, for
    keep-alives), then one ``End`` saying why the stream stopped."""
    if job is None:
        yield End("not started (waiting for its dependencies)")
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    stop = threading.Event()
    started: set[tuple[str, int]] = set()
    running: set[tuple[str, int]] = set()
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while True:
            final, attempt, pods, cluster, namespace = await sync_to_async(_run_pods_released)(job.pk, pod)
            for name, role in pods:
                key = (name, attempt)
                if key in started:
                    continue
                started.add(key)
                running.add(key)
                threading.Thread(
                    target=_follow_pod,
                    name=f"logs-{name}",
                    daemon=True,
                    args=(
                        loop,
                        queue,
                        cluster,
                        namespace,
                        name,
                        role,
                        key,
                        tail,
                        max(1.0, deadline - time.monotonic()),
                        stop,
                    ),
                ).start()
            tick = min(deadline, time.monotonic() + poll)
            while (left := tick - time.monotonic()) > 0:
                try:
                    item = await asyncio.wait_for(queue.get(), timeout=left)
                except TimeoutError:
                    break
                if isinstance(item, _Done):
                    running.discard(item.key)
                    continue
                quiet_since = time.monotonic()
                yield item
            if time.monotonic() >= deadline:
                yield End("time limit reached")
                return
            if final and not running and queue.empty():
                yield End("the run has ended" if started else "no pods (the run has ended)")
                return
            if time.monotonic() - quiet_since >= HEARTBEAT_SECONDS:
                quiet_since = time.monotonic()
                yield None
    finally:
        stop.set()


def sse(item: Any) -> bytes:
    """One Server-Sent Event: ``log`` (JSON pod, role, line), ``end`` (reason) or a comment."""
    if item is None:
        return b": keep-alive\n\n"
    if isinstance(item, End):
        return f"event: end\ndata: {json.dumps({'reason': item.reason})}\n\n".encode()
    data = json.dumps({"pod": item.pod, "role": item.role, "line": item.text})
    return f"event: log\ndata: {data}\n\n".encode()


def plain(item: Any) -> bytes:
    """One line of ``text/plain``: ``[pod] line``; the end as a last ``# …`` line."""
    if item is None:
        return b""
    if isinstance(item, End):
        return f"# end: {item.reason}\n".encode()
    return f"[{item.pod}] {item.text}\n".encode()


async def encoded(job: Job | None, *, fmt: str, **kwargs: Any) -> AsyncIterator[bytes]:
    render = sse if fmt == "sse" else plain
    # The request's connection (authentication, the job's lookup) back to the pool before the
    # stream starts: the request's thread holds it until the stream ends otherwise.
    await sync_to_async(connections.close_all)()
    if fmt == "sse":
        yield b"retry: 10000\n\n"
    async for item in follow_job_logs(job, **kwargs):
        chunk = render(item)
        if chunk:
            yield chunk
