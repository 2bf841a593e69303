"""Logs followed as they are written, over real HTTP: Camp under uvicorn (the ASGI server
of production: the StreamingHttpResponse's async iterator is sent chunk by chunk) on the
simulated backend, read by ``requests`` and by the ``camp logs -f`` subprocess; the
Kubernetes backend's follow against kmock serving ``pods/<name>/log`` as a chunked stream;
and ``DELETE /api/v1/training-jobs/<id>/`` with ``camp rm``.

What is not real: the simulated clock. The pod's start is moved back so that a step line
falls due a second after the stream opens, and its end a few seconds later.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from django.conf import settings
from django.utils import timezone

from scheduling import services as scheduling_services
from scheduling.backends.base import LineCursor, split_lines
from scheduling.models import Job, JobState, SimulatedPod
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.e2e.test_live import asgi_server  # noqa: F401 (the uvicorn fixture)
from tests.integration.scheduling.kmockserver import kmock_server
from workspaces import services
from workspaces.models import TrainingJob

from .conftest import advance

pytestmark = pytest.mark.django_db(transaction=True)


def _running_job(world: Any, cluster: Any, name: str = "train") -> TrainingJob:
    t = services.training_submit(
        actor=world.a.member,
        project=world.a.project,
        cluster=cluster,
        name=name,
        framework="pytorch",
        image_reference="pytorch/pytorch:2",
        workers=2,
        gpu_count=1,
        cpu_millicores=1000,
        ram_mib=1024,
        duration_seconds=3600,
    )
    advance(cluster)
    t.refresh_from_db()
    assert t.state == "running", t.state
    return t


def _pods(t: TrainingJob) -> Any:
    assert t.job is not None
    return SimulatedPod.objects.filter(name__in=t.job.allocations.values_list("pod_name", flat=True))


def _sse(response: requests.Response) -> Iterator[tuple[str, dict[str, Any], float]]:
    event = ""
    for raw in response.iter_lines(chunk_size=None):  # type: ignore[call-overload]
        line = raw.decode()
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: ") and event:
            yield event, json.loads(line[6:]), time.monotonic()


def _token(user: Any) -> dict[str, str]:
    _, token = tenant_services.token_create(actor=user, name="logs")
    return {"Authorization": f"Bearer {token}"}


def test_follow_streams_new_lines_then_ends_with_the_run(
    world: Any,
    sim_cluster: Any,
    asgi_server: str,  # noqa: F811
) -> None:
    t = _running_job(world, sim_cluster)
    now = timezone.now()
    # 19.5 simulated steps done (a step line every 10): "step 20" is written ~0.5 s from now,
    # and the pods finish 3 s from now.
    _pods(t).update(start_at=now - dt.timedelta(seconds=19.5), finish_at=now + dt.timedelta(seconds=3))
    url = f"{asgi_server}/api/v1/training-jobs/{t.pk}/logs/"
    headers = {**_token(world.a.member), "Accept": "text/event-stream"}

    def read() -> tuple[list[tuple[str, dict[str, Any], float]], float, str]:
        opened = time.monotonic()
        with requests.get(
            url, params={"follow": "true", "tail": 5, "timeout": 30}, headers=headers, stream=True, timeout=40
        ) as r:
            assert r.status_code == 200, r.text
            return list(_sse(r)), opened, r.headers["Content-Type"]

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(read)
        time.sleep(3.5)
        # The worker's reconcile notices the finished pods: the run is over.
        deadline = time.monotonic() + 15
        while Job.objects.get(pk=t.job_id).state != JobState.SUCCEEDED:
            assert time.monotonic() < deadline, "the run did not end"
            scheduling_services.cluster_reconcile(cluster=sim_cluster)
            time.sleep(0.2)
        events, opened, content_type = future.result(timeout=30)
    assert content_type == "text/event-stream"
    logs = [(e["pod"], e["line"], at) for kind, e, at in events if kind == "log"]
    worker0 = f"train-{t.job_id}-worker-0"
    lines0 = [line for pod, line, _ in logs if pod == worker0]
    assert any("started on node" in line for line in lines0) and any("step 10 " in line for line in lines0)
    # A line written after the stream opened arrived while it was open, not at its end.
    step20 = next(at for pod, line, at in logs if pod == worker0 and " step 20 " in line)
    end_at = next(at for kind, _, at in events if kind == "end")
    assert step20 - opened < 2.5 and end_at - step20 > 1
    assert lines0[-1].endswith(" done") and len(lines0) == len(set(lines0))
    assert {pod for pod, _, _ in logs} == {worker0, f"train-{t.job_id}-worker-1"}
    assert events[-1][0] == "end" and events[-1][1] == {"reason": "the run has ended"}


def test_follow_plain_text_isolation_and_bad_input(world: Any, sim_cluster: Any, asgi_server: str) -> None:  # noqa: F811
    t = _running_job(world, sim_cluster)
    url = f"{asgi_server}/api/v1/training-jobs/{t.pk}/logs/"
    started = time.monotonic()
    r = requests.get(
        url,
        params={"follow": "true", "timeout": 2, "pod": f"train-{t.job_id}-worker-1"},
        headers=_token(world.a.member),
        timeout=20,
    )
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    lines = r.text.splitlines()
    assert lines[0].startswith(f"[train-{t.job_id}-worker-1] ") and "rank 1 of 2" in r.text
    assert lines[-1] == "# end: time limit reached" and 2 <= time.monotonic() - started < 8
    # Other tenants' workloads are 404, as for every workload endpoint; bad input is a 400.
    for user in (world.b.owner, world.outsider):
        got = requests.get(url, params={"follow": "true"}, headers=_token(user), timeout=20)
        assert got.status_code == 404, got.text
    assert requests.get(url, params={"follow": "true"}, timeout=20).status_code == 401
    for params, field in (
        ({"timeout": 0}, "timeout"),
        ({"timeout": "x"}, "timeout"),
        ({"tail": "x"}, "tail"),
    ):
        got = requests.get(
            url, params={"follow": "true", **params}, headers=_token(world.a.member), timeout=20
        )
        assert got.status_code == 400 and field in got.json(), got.text
    env_url = f"{asgi_server}/api/v1/environments/999999/logs/"
    assert (
        requests.get(
            env_url, params={"follow": "true"}, headers=_token(world.a.member), timeout=20
        ).status_code
        == 404
    )


def _camp(server: str, token: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAMP_URL": server, "CAMP_TOKEN": token, "CAMP_CONFIG": "/nonexistent/camp.json"}
    return subprocess.run(
        [sys.executable, "-m", "camp_cli", *args],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_follows_and_removes(world: Any, sim_cluster: Any, asgi_server: str) -> None:  # noqa: F811
    t = _running_job(world, sim_cluster)
    _pods(t).update(start_at=timezone.now() - dt.timedelta(seconds=9.5))
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    started = time.monotonic()
    proc = _camp(asgi_server, token, "logs", "-f", "train", "--timeout", "3", "--tail", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 3 <= time.monotonic() - started < 20
    out = proc.stdout.splitlines()
    assert any(line.startswith(f"train-{t.job_id}-worker-0 | ") and " step 10 " in line for line in out)
    assert "-- time limit reached" in proc.stderr
    proc = _camp(asgi_server, token, "rm", "train")
    assert proc.returncode == 0 and f"training job train (#{t.pk}) deleted" in proc.stdout, proc.stderr
    assert not TrainingJob.objects.filter(pk=t.pk).exists()
    job = Job.objects.get(pk=t.job_id)
    assert job.state == JobState.CANCELLED and "Deleted by acme-member" in job.reason
    event = AuditEvent.objects.get(action="training.deleted")
    assert (event.actor_username, event.target_id, event.before["state"]) == (
        "acme-member",
        str(t.pk),
        "running",
    )
    proc = _camp(asgi_server, token, "rm", "train")
    assert proc.returncode == 1 and "No training job, environment or job train" in proc.stderr


def test_delete_api_permissions_and_dependants(world: Any, sim_cluster: Any) -> None:
    from tests.conftest import client_for

    first = services.training_submit(
        actor=world.a.project_admin,
        project=world.a.project,
        cluster=sim_cluster,
        name="first",
        framework="pytorch",
        image_reference="pytorch/pytorch:2",
        cpu_millicores=1000,
        ram_mib=1024,
    )
    then = services.training_submit(
        actor=world.a.project_admin,
        project=world.a.project,
        cluster=sim_cluster,
        name="then",
        framework="pytorch",
        image_reference="pytorch/pytorch:2",
        cpu_millicores=1000,
        ram_mib=1024,
        depends_on=[first],
    )
    assert client_for(world.a.member).delete(f"/api/v1/training-jobs/{first.pk}/").status_code == 403
    assert client_for(world.b.owner).delete(f"/api/v1/training-jobs/{first.pk}/").status_code == 404
    assert client_for(world.a.project_admin).delete(f"/api/v1/training-jobs/{first.pk}/").status_code == 204
    assert Job.objects.get(pk=first.job_id).state == JobState.CANCELLED  # it was queued: stopped
    then.refresh_from_db()
    assert then.state == "failed" and then.blocked_reason.startswith("Dependency first was deleted")
    assert services.training_sync(training=then) == "idle"  # never released
    assert AuditEvent.objects.filter(action="training.dependency_failed", target_id=str(then.pk)).exists()


# --- Kubernetes: the official client's follow against kmock ----------------------------------


def test_kubernetes_follow_streams_and_reconnects_without_duplicates() -> None:
    """kmock has no pod log store of its own, but serves any payload for a path, including
    an async generator as a chunked stream: that is the Kubernetes API's follow stream."""
    from kubernetes import client as k8s

    from scheduling.backends.kubernetes import KubernetesBackend

    calls: list[int] = []

    async def stream() -> Any:
        calls.append(1)
        yield b"2026-01-01T10:00:00.1Z epoch 1\n2026-01-01T10:00:00.25Z ep"
        await asyncio.sleep(0.3)
        yield b"och 2\n"
        if len(calls) == 1:
            await asyncio.sleep(3)  # silent past the read timeout: the client reconnects
        else:
            yield b"2026-01-01T10:00:01Z epoch 3\n"

    with kmock_server() as k:
        k["get /api/v1/namespaces/ns/pods/trainer/log"] << (lambda: stream())
        cfg = k8s.Configuration()
        cfg.host = str(k.url).rstrip("/")
        backend = KubernetesBackend(k8s.ApiClient(cfg), backoff=0.05)
        backend.FOLLOW_READ_SECONDS = 1.0
        started = time.monotonic()
        got = [
            (line, round(time.monotonic() - started, 1))
            for line in backend.follow_pod_logs(
                "ns", "trainer", tail_lines=20, timeout_seconds=10, stop=threading.Event()
            )
        ]
        requests_seen = list(k["get /api/v1/namespaces/ns/pods/trainer/log"])
        assert (
            list(
                backend.follow_pod_logs("ns", "gone", tail_lines=5, timeout_seconds=2, stop=threading.Event())
            )
            == []
        )
    assert [line for line, _ in got] == [
        "2026-01-01T10:00:00.1Z epoch 1",
        "2026-01-01T10:00:00.25Z epoch 2",
        "2026-01-01T10:00:01Z epoch 3",
    ]
    assert got[1][1] - got[0][1] >= 0.2  # streamed as written, not read to the end first
    first, second = (dict(r.params) for r in requests_seen[:2])
    assert (first["follow"], first["tailLines"], first["timestamps"], first["container"]) == (
        "True",
        "20",
        "True",
        "main",
    )
    assert "sinceSeconds" in second and "tailLines" not in second


def test_line_splitting_and_cursor() -> None:
    assert list(split_lines([b"a\nb", b"c\r\n", b"", b"d\xff"])) == ["a", "bc", "d\ufffd"]
    cursor = LineCursor()
    first = ["2026-01-01T00:00:00.5Z x", "2026-01-01T00:00:00.5Z y", "2026-01-01T00:00:01Z z"]
    assert cursor.new(first) == first
    # Kubernetes trims trailing zeros: times compare as numbers (.45 is before .5).
    assert cursor.new(
        [
            "2026-01-01T00:00:00.45Z old",
            "2026-01-01T00:00:01Z z",
            "2026-01-01T00:00:01Z z2",
            "2026-01-01T00:00:02.1Z w",
        ]
    ) == ["2026-01-01T00:00:01Z z2", "2026-01-01T00:00:02.1Z w"]
    since = cursor.since_seconds(dt.datetime(2026, 1, 1, 0, 0, 12, tzinfo=dt.UTC).timestamp())
    assert since == 12


def test_kubernetes_follow_of_a_removed_container_prints_no_kubelet_error() -> None:
    """Issue 28 finding 9: the kubelet answers a removed container's log with its own error
    in the stream; it is not a line of the container's output (every one of those carries
    the kubelet's timestamp), and the stream is over: not reopened, not printed."""
    from kubernetes import client as k8s

    from scheduling.backends.kubernetes import KubernetesBackend

    error = ('unable to retrieve container logs for containerd://3f2a: rpc error: code = NotFound '
             'desc = an error occurred when try to find container "3f2a": not found')

    async def stream() -> Any:
        yield b"2026-01-01T10:00:00.1Z last words\n"
        yield error.encode() + b"\n"

    with kmock_server() as k:
        k["get /api/v1/namespaces/ns/pods/trainer/log"] << (lambda: stream())
        cfg = k8s.Configuration()
        cfg.host = str(k.url).rstrip("/")
        backend = KubernetesBackend(k8s.ApiClient(cfg), backoff=0.05)
        got = list(backend.follow_pod_logs("ns", "trainer", tail_lines=20, timeout_seconds=10,
                                           stop=threading.Event()))
        assert got == ["2026-01-01T10:00:00.1Z last words"]
        assert len(list(k["get /api/v1/namespaces/ns/pods/trainer/log"])) == 1
        k["get /api/v1/namespaces/ns/pods/done/log"] << (
            b"2026-01-01T10:00:00.1Z one\n2026-01-01T10:00:00.2Z two\n" + error.encode())
        assert backend.pod_logs("ns", "done") == "2026-01-01T10:00:00.1Z one\n2026-01-01T10:00:00.2Z two"
