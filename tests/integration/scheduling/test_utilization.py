"""The optional utilisation feed against a real Prometheus (Debian's ``prometheus``).

Prometheus runs on a spare 127.0.0.1 port and scrapes, every second, a small exporter this
test serves: DCGM-exporter series (``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_FB_USED``) for
one node and HAMi vGPU-monitor series (``HostCoreUtilization``, ``HostGPUMemoryUsage``)
for the other, labelled as those exporters label them. Camp then reads them through
Prometheus' HTTP query API exactly as in production. The exporter is the only stand-in:
there are no GPUs here to run the real exporters on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from scheduling import services, tasks
from scheduling.backends.metrics import gpu_samples
from scheduling.models import GpuDevice, JobState
from tests.conftest import client_for
from tests.prometheus import Exporter, requires_prometheus, running_prometheus

from .conftest import SMALL_INVENTORY, submit

pytestmark = [pytest.mark.django_db, requires_prometheus]


@pytest.fixture(scope="module")
def prom() -> Iterator[tuple[str, Exporter]]:
    exporter = Exporter()
    try:
        with running_prometheus([exporter.port]) as prometheus:
            yield prometheus.url, exporter
    finally:
        exporter.close()


def _series(node: str, load: dict[int, float]) -> str:
    """Exporter text for ``node``'s GPUs: DCGM-exporter style for a100-0, HAMi's for others."""
    lines = []
    for g in GpuDevice.objects.filter(node__name=node).order_by("index"):
        util = load.get(g.index, 0.0)
        used = int(util * 800)  # MiB
        if node == "a100-0":
            labels = (f'gpu="{g.index}",UUID="{g.uuid}",device="nvidia{g.index}",'
                      f'modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}"')
            lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}",
                      f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}"]
        else:
            labels = f'deviceidx="{g.index}",deviceuuid="{g.uuid}",zone="vGPU"'
            lines += [f"HostCoreUtilization{{{labels}}} {util}",
                      f"HostGPUMemoryUsage{{{labels}}} {used * 1024 * 1024:.6e}"]
    return "\n".join(lines)


def _publish(url: str, exporter: Exporter, text: str, expect: int) -> None:
    """Serve ``text`` and wait until Prometheus has scraped it (``expect`` GPUs visible)."""
    exporter.text = "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + text + "\n"
    deadline = time.monotonic() + 30
    want = {line.rsplit(" ", 1)[0] for line in text.splitlines() if line}
    while True:
        samples = gpu_samples(url)
        if len(samples) == expect:
            seen = {(s.uuid, s.utilization_percent) for s in samples}
            # the newest values are in (each published line's value is what we read back)
            values = {line.split("}", 1)[0].split('UUID="' if "UUID" in line else 'deviceuuid="')[1]
                      .split('"')[0]: float(line.rsplit(" ", 1)[1])
                      for line in text.splitlines() if "UTIL" in line or "CoreUtil" in line}
            if {(u, v) for u, v in values.items()} <= seen:
                return
        assert time.monotonic() < deadline, f"prometheus never showed {len(want)} series"
        time.sleep(0.3)


@pytest.fixture
def cluster(world: Any, prom: tuple[str, Exporter]) -> Any:
    url, _ = prom
    c = services.cluster_create(actor=world.admin, name="sim", inventory=SMALL_INVENTORY,
                                prometheus_url=url)
    services.inventory_sync(cluster=c)
    return c


def test_feed_reads_dcgm_and_hami_metrics_into_gpus(world: Any, prom: Any, cluster: Any) -> None:
    url, exporter = prom
    _publish(url, exporter, _series("a100-0", {0: 93.0, 1: 40.0}) + "\n"
             + _series("a100-1", {2: 7.5}), expect=8)
    assert tasks.cluster_utilization_sync(cluster.pk) == {"matched": 8, "cleared": 0, "unmatched": 0}
    a0 = {g.index: g for g in GpuDevice.objects.filter(node__name="a100-0")}
    assert (a0[0].utilization_percent, a0[0].memory_used_mib) == (93.0, 93 * 800)  # DCGM: MiB
    assert a0[1].utilization_percent == 40.0
    a1 = {g.index: g for g in GpuDevice.objects.filter(node__name="a100-1")}
    assert (a1[2].utilization_percent, a1[2].memory_used_mib) == (7.5, 6000)  # HAMi: bytes
    assert GpuDevice.objects.get(node__name="l4-0", index=0).utilization_at is None

    node = next(n for n in client_for(world.a.member).get("/api/v1/nodes/").json()["results"]
                if n["name"] == "a100-0")
    assert node["gpus"][0]["utilization_percent"] == 93.0
    assert node["gpus"][0]["memory_used_mib"] == 74400
    page = client_for(world.a.member).get("/scheduling/clusters/sim/nodes/").content.decode()
    assert "93% busy · 72.7 GiB used" in page

    # a100-1's exporter goes away: Prometheus marks its series stale, Camp forgets them
    _publish(url, exporter, _series("a100-0", {0: 93.0, 1: 40.0}), expect=4)
    result = services.utilization_sync(cluster=cluster)
    assert (result.matched, result.cleared) == (4, 4)
    assert GpuDevice.objects.get(node__name="a100-1", index=2).utilization_percent is None


def test_placement_avoids_busy_cards(world: Any, prom: Any, cluster: Any) -> None:
    url, exporter = prom
    # where would a one-GPU job go with no metrics?
    probe = submit(world, cluster, "probe", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=cluster)
    first = probe.allocations.get().node.name
    services.job_cancel(actor=world.a.member, job=probe)
    services.job_stop(job_id=probe.pk)
    other = "a100-1" if first == "a100-0" else "a100-0"
    # that node's cards are busy with work Camp did not place (e.g. outside the platform)
    _publish(url, exporter, _series(first, dict.fromkeys(range(4), 97.0)) + "\n"
             + _series(other, dict.fromkeys(range(4), 3.0)), expect=8)
    services.utilization_sync(cluster=cluster)
    job = submit(world, cluster, "job", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    assert job.state == JobState.STARTING and job.allocations.get().node.name == other
