"""Model services' Prometheus load source against a real Prometheus (Debian's ``prometheus``).

Each replica pod is stood in for by a small exporter serving vLLM's ``/metrics`` series
(``vllm:num_requests_running``/``waiting``, ``vllm:e2e_request_latency_seconds`` histogram),
discovered by Prometheus with the target labels Kubernetes discovery gives a pod
(``namespace``, ``pod``). The autoscaler reads them through Prometheus' HTTP API with the
default PromQL of ``workspaces.serving_load`` — the cluster has a Prometheus URL, so the
``auto`` source uses it instead of the simulated curve.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduling import services as scheduling
from scheduling.backends.metrics import query
from scheduling.models import Allocation, JobState
from scheduling.selectors import project_namespace_name
from tenants.models import AuditEvent
from tests.conftest import client_for
from tests.prometheus import Exporter, Prometheus, requires_prometheus, running_prometheus, wait_for
from workspaces import serving_load
from workspaces.models import ModelService
from workspaces.services import serving

from .conftest import advance

pytestmark = [pytest.mark.django_db, requires_prometheus]

INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 86400
nodes:
  - name: a100-0
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 2, memory_mib: 81920}
"""
BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5)
# Requests finishing per second per pod, by latency bucket (not cumulative); the last is +Inf.
PER_SECOND = (2.0, 3.0, 3.0, 1.0, 1.0, 0.0)


class VllmPod:
    """One replica's /metrics as vLLM serves it: gauges set by the test, counters and the
    latency histogram growing at a steady rate (so ``rate()`` sees a fixed distribution)."""

    def __init__(self) -> None:
        self.running = 0.0
        self.waiting = 0.0
        self.born = time.monotonic()
        self.exporter = Exporter()
        self.exporter.text = self.text

    def text(self) -> str:
        age = time.monotonic() - self.born
        labels = 'engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"'
        lines = ["# TYPE vllm:num_requests_running gauge",
                 f"vllm:num_requests_running{{{labels}}} {self.running}",
                 "# TYPE vllm:num_requests_waiting gauge",
                 f"vllm:num_requests_waiting{{{labels}}} {self.waiting}",
                 "# TYPE vllm:e2e_request_latency_seconds histogram"]
        cumulative = 0.0
        for le, per_second in zip((*[str(b) for b in BUCKETS], "+Inf"), PER_SECOND, strict=True):
            cumulative += per_second * age
            lines.append(f'vllm:e2e_request_latency_seconds_bucket{{{labels},le="{le}"}} {cumulative}')
        lines += [f"vllm:e2e_request_latency_seconds_count{{{labels}}} {cumulative}",
                  f"vllm:e2e_request_latency_seconds_sum{{{labels}}} {cumulative * 0.4}"]
        return "\n".join(lines) + "\n"


def _quantile(q: float) -> float:
    """The quantile of PER_SECOND's distribution by Prometheus' documented rule for
    ``histogram_quantile`` (linear interpolation within the bucket holding the rank)."""
    rank = q * sum(PER_SECOND)
    below, lower = 0.0, 0.0
    for upper, count in zip(BUCKETS, PER_SECOND, strict=False):
        if below + count >= rank:
            return lower + (upper - lower) * (rank - below) / count
        below, lower = below + count, upper
    return BUCKETS[-1]


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    serving_load._UNREACHABLE.clear()  # another test's port may be this one's
    with running_prometheus() as prometheus:
        yield prometheus


@pytest.fixture
def pods() -> Iterator[dict[str, VllmPod]]:
    made: dict[str, VllmPod] = {}
    yield made
    for pod in made.values():
        pod.exporter.close()


def _serve_pods(prom: Prometheus, svc: ModelService, pods: dict[str, VllmPod]) -> str:
    """A vLLM stand-in for every replica pod Camp placed, scraped with the pod's namespace
    and name; returns the namespace."""
    ns = project_namespace_name(cluster=svc.cluster, project=svc.project)
    placed = Allocation.objects.filter(job__service_replica__service=svc)
    for name in placed.values_list("pod_name", flat=True):
        pods.setdefault(name, VllmPod())
    prom.set_targets([(pod.exporter.port, {"namespace": ns, "pod": name}) for name, pod in pods.items()])
    return ns


def _cluster(world: Any, prom: Prometheus) -> Any:
    cluster = scheduling.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                        inventory=INVENTORY, prometheus_url=prom.url)
    scheduling.inventory_sync(cluster=cluster)
    return cluster


def _seen(prom: Prometheus, promql: str) -> float | None:
    rows = query(prom.url, promql)
    return float(rows[0]["value"][1]) if rows else None


def test_prometheus_load_scales_a_service_and_latency_reaches_the_api(world: Any, prom: Prometheus,
                                                                      pods: dict[str, VllmPod]) -> None:
    cluster = _cluster(world, prom)
    svc = serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="chat",
        image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-7B-Instruct",
        gpu_memory_mib=20480, gpu_cores_percent=30, cpu_millicores=2000, ram_mib=8192,
        min_replicas=1, max_replicas=5, autoscale_metric="concurrency", autoscale_target=8,
        # the simulated curve would ask for 3 replicas at any hour: Prometheus is read instead
        load_profile={"base": 24, "peak": 24, "burst": 0})
    advance(cluster)
    ns = _serve_pods(prom, svc, pods)
    (first,) = pods.values()
    first.running, first.waiting = 3, 1
    pod_selector = f'{{namespace="{ns}"}}'
    wait_for(lambda: _seen(prom, f"sum(vllm:num_requests_running{pod_selector})") == 3, "3 running requests")
    svc = serving.model_service_autoscale(service=svc)
    assert (svc.load, svc.desired_replicas, svc.load_error) == (4.0, 1, "")

    # Traffic rises: 20 running + 6 waiting on the one replica → ceil(26 / 8) = 4 replicas.
    first.running, first.waiting = 20, 6
    wait_for(lambda: _seen(prom, f"sum(vllm:num_requests_waiting{pod_selector})") == 6, "6 waiting requests")
    svc = serving.model_service_autoscale(service=svc)
    assert (svc.load, svc.desired_replicas) == (26.0, 4)
    event = AuditEvent.objects.filter(action="service.scaled", actor_username="autoscaler").latest("id")
    assert event.after["desired_replicas"] == 4 and "load 26 concurrent requests" in event.after["reason"]
    advance(cluster)
    assert [r.job.state for r in svc.replicas.filter(removed_reason="").select_related("job")] \
        == [JobState.RUNNING] * 4

    # Latency p50/p95 from the histogram, as the API shows them.
    _serve_pods(prom, svc, pods)
    wait_for(lambda: _seen(prom, 'count(up{job="pods"} == 1)') == 4, "4 replica pods scraped")
    time.sleep(2.5)  # two scrapes of each new pod, so rate() covers every pod
    svc = serving.model_service_autoscale(service=svc)
    assert svc.latency_p50_seconds == pytest.approx(_quantile(0.5), rel=0.02)
    assert svc.latency_p95_seconds == pytest.approx(_quantile(0.95), rel=0.02)
    body = client_for(world.a.member).get(f"/api/v1/services/{svc.pk}/").json()
    assert body["latency_p50_seconds"] == pytest.approx(_quantile(0.5), rel=0.02)
    assert body["latency_p95_seconds"] == pytest.approx(_quantile(0.95), rel=0.02)
    page = client_for(world.a.member).get(f"/workspaces/services/{svc.pk}/").content.decode()
    assert f"p50 {_quantile(0.5) * 1000:.0f} ms" in page


def test_prometheus_silent_or_down_holds_the_replicas_and_says_why(world: Any, prom: Prometheus,
                                                                   pods: dict[str, VllmPod]) -> None:
    cluster = _cluster(world, prom)
    svc = serving.model_service_create(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="chat",
        image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-7B-Instruct",
        gpu_memory_mib=20480, gpu_cores_percent=30, min_replicas=1, max_replicas=4, autoscale_target=8,
        scale_to_zero_seconds=60, scale_down_delay_seconds=0)
    advance(cluster)
    _serve_pods(prom, svc, pods)
    (first,) = pods.values()
    first.running = 17  # → ceil(17 / 8) = 3 replicas
    wait_for(lambda: _seen(prom, "sum(vllm:num_requests_running)") == 17, "17 running requests")
    svc = serving.model_service_autoscale(service=svc)
    assert svc.desired_replicas == 3
    advance(cluster)

    # The servers' series vanish (targets gone): no reading is not a zero — held at 3, not
    # scaled down (no stabilisation window here) nor to zero (its idle window is 60 s).
    prom.set_targets([])
    wait_for(lambda: _seen(prom, "sum(vllm:num_requests_running)") is None, "the series gone")
    svc = serving.model_service_autoscale(service=svc)
    assert svc.desired_replicas == 3 and svc.load_error.startswith("Prometheus has no series for sum(")
    assert svc.latency_p50_seconds is None

    # Prometheus itself goes down: held, and the reason is on the API and the pages.
    prom.stop()
    svc = serving.model_service_autoscale(service=svc)
    assert svc.desired_replicas == 3 and f"Prometheus at {prom.url} did not answer" in svc.load_error
    assert not AuditEvent.objects.filter(action="service.scaled", after__desired_replicas__lt=3).exists()
    advance(cluster)
    assert svc.replicas.filter(removed_reason="", job__state=JobState.RUNNING).count() == 3
    body = client_for(world.a.member).get(f"/api/v1/services/{svc.pk}/").json()
    assert (body["desired_replicas"], body["load_error"]) == (3, svc.load_error)
    assert body["latency_p50_seconds"] is None and body["latency_p95_seconds"] is None
    page = client_for(world.a.member).get(f"/workspaces/services/{svc.pk}/").content.decode()
    assert "Replicas held:" in page and "did not answer" in page and "<strong>Latency:</strong> —" in page
    listing = client_for(world.a.member).get("/workspaces/services/").content.decode()
    assert "replicas held: Prometheus at" in listing


def test_a_hung_prometheus_is_asked_once_per_tick_not_once_per_service(world: Any) -> None:
    """A Prometheus that accepts connections and never answers: the first service's read
    times out, and the tick's other services hold at once with the same reason instead of
    each waiting for the timeout again."""
    accepted: list[socket.socket] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_and_say_nothing() -> None:
        try:
            while True:
                accepted.append(listener.accept()[0])
        except OSError:  # the listener closed: the test is over
            return

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    serving_load._UNREACHABLE.clear()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        cluster = scheduling.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                            inventory=INVENTORY, prometheus_url=url)
        scheduling.inventory_sync(cluster=cluster)
        made = [serving.model_service_create(
            actor=world.a.member, project=world.a.project, cluster=cluster, name=name,
            image_reference="docker.io/vllm/vllm-openai:v0.6.3", model_source="hf://Qwen/Qwen2.5-7B-Instruct",
            gpu_memory_mib=20480, gpu_cores_percent=30, min_replicas=1, max_replicas=3)
            for name in ("a", "b", "c")]
        advance(cluster)
        assert serving.model_services_autoscale() == {"services": 3, "failed": 0, "gone": 0}
        errors = {ModelService.objects.get(pk=s.pk).load_error for s in made}
        assert len(errors) == 1 and f"Prometheus at {url} did not answer" in errors.pop()
        assert len(accepted) == 1
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
