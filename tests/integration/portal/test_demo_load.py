"""The living demo's load generator: it launches notebooks and training jobs as the demo's
users through the normal services (audited, within quota), bursts, leads to preemptions on a
full cluster, prunes its own finished work so the database stays bounded, and does nothing
while a platform admin has paused it (pausing is audited; others cannot)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from portal import demo
from portal.models import DemoLoad
from scheduling.models import DecisionKind, Job, SchedulingDecision
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.integration.workspaces.conftest import (
    advance,
    sim_cluster,  # noqa: F401 (fixture)
)
from workspaces import services
from workspaces.models import DevEnvironment, TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo_world(world: Any, sim_cluster: Any) -> Any:  # noqa: F811
    for side in (world.a, world.b):
        tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=side.tenant,
                                  values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(12)})
        tenant_services.quota_set(actor=side.owner, scope="project", project=side.project,
                                  values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(12)})
    services.profile_create(actor=world.admin, name="a100-quarter", gpu_model="A100-80G", gpu_count=1,
                            gpu_memory_mib=20480, gpu_cores_percent=25, cpu_millicores=1000, ram_mib=2048)
    services.profile_create(actor=world.admin, name="a100-2", gpu_model="A100-80G", gpu_count=2,
                            cpu_millicores=1000, ram_mib=2048)
    DemoLoad.objects.create()
    return sim_cluster


def test_ticks_keep_load_going_through_the_services(world: Any, demo_world: Any) -> None:
    start = timezone.now()
    for i in range(8):
        demo.tick(now=start + dt.timedelta(seconds=15 * i), seed=i)
        advance(demo_world, rounds=1)
    envs = DevEnvironment.objects.filter(name__startswith="demo-")
    trainings = TrainingJob.objects.filter(name__startswith="demo-")
    assert envs.count() >= 4 and trainings.count() >= 6
    assert Job.objects.filter(name__startswith="demo-", state="running").exists()
    # as the demo's users, through the audited services, never as the platform admin
    launched = AuditEvent.objects.filter(action__in=["environment.launched", "training.submitted"])
    assert launched.count() == envs.count() + trainings.count()
    assert not launched.filter(actor_username=world.admin.username).exists()
    # within quota: a burst (the first minute) asks for more than fits, so work waits
    assert Job.objects.filter(name__startswith="demo-", state="queued").exists()
    assert DemoLoad.objects.get().launched == envs.count() + trainings.count()
    kinds = set(SchedulingDecision.objects.values_list("kind", flat=True))
    assert DecisionKind.ADMITTED in kinds


def test_paused_does_nothing_and_only_admins_pause_with_audit(world: Any, demo_world: Any) -> None:
    member = Client()
    member.force_login(world.a.member)
    assert member.post("/admin/demo-load/", {"paused": "1"}).status_code == 403
    assert DemoLoad.objects.get().paused is False
    admin = Client()
    admin.force_login(world.admin)
    assert "Pause the demo load" in admin.get("/").content.decode()
    assert admin.post("/admin/demo-load/", {"paused": "1"}).status_code == 302
    assert DemoLoad.objects.get().paused is True
    event = AuditEvent.objects.get(action="demo_load.paused")
    assert event.actor_username == world.admin.username and event.before == {"paused": False}
    assert demo.tick(seed=1) == {"paused": True}
    assert not DevEnvironment.objects.exists() and not TrainingJob.objects.exists()
    assert "Resume the demo load" in admin.get("/").content.decode()
    assert "demo load" not in member.get("/").content.decode().lower()


def test_it_prunes_its_own_finished_work(world: Any, demo_world: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(demo, "KEEP", 2)
    monkeypatch.setattr(demo, "KEEP_RUNS", 3)
    mine = TrainingJob.objects.none()
    for i in range(6):
        t = services.training_submit(actor=world.a.member, project=world.a.project, cluster=demo_world,
                                     name=f"demo-train-{i}", framework="pytorch",
                                     image_reference="pytorch/pytorch:2.4", gpu_count=0,
                                     cpu_millicores=500, ram_mib=512)
        services.training_stop(actor=world.a.member, training=t)
    kept = services.training_submit(actor=world.a.member, project=world.a.project, cluster=demo_world,
                                    name="not-the-demos", framework="pytorch",
                                    image_reference="pytorch/pytorch:2.4", gpu_count=0,
                                    cpu_millicores=500, ram_mib=512)
    services.training_stop(actor=world.a.member, training=kept)
    advance(demo_world, rounds=1)
    assert demo._prune() > 0
    mine = TrainingJob.objects.filter(name__startswith="demo-")
    assert mine.count() == 2
    assert Job.objects.filter(name__startswith="demo-").count() <= 3
    assert TrainingJob.objects.filter(name="not-the-demos").exists()  # not its own: untouched
    assert AuditEvent.objects.filter(action="training.deleted").count() == 4


def test_it_holds_back_while_the_worker_is_behind(world: Any, demo_world: Any) -> None:
    from scheduling.models import Job, JobState

    demo.tick(seed=1)
    now = timezone.now()
    started = Job.objects.filter(name__startswith="demo-")
    assert started.exists()
    # runs admitted long ago but never started: the worker has not dispatched them
    started.update(state=JobState.STARTING, admitted_at=now - dt.timedelta(minutes=5))
    before = DevEnvironment.objects.count() + TrainingJob.objects.count()
    assert started.count() >= demo.BACKLOG
    assert demo.tick(now=now, seed=2)["throttled"] is True
    assert DevEnvironment.objects.count() + TrainingJob.objects.count() == before


WEST = """
start_delay_seconds: 0
default_duration_seconds: 300
nodes:
  - name: gh200-{i}
    count: 2
    cpu_cores: 72
    ram_gib: 480
    labels: {kubernetes.io/arch: arm64}
    gpus: {model: GH200-96G, count: 4, memory_mib: 98304}
"""


def test_a_share_of_its_trainings_floats_and_keeps_the_second_cluster_busy(
        world: Any, demo_world: Any) -> None:
    """Review rv finding 7: every demo training was pinned to the first simulated cluster, so the
    ARM cluster idled once the seeded floating jobs ended. Now some name no cluster (any, or a
    label of the second cluster's) and the placement step puts some of them there."""
    from scheduling import services as scheduling
    from scheduling.services import placement

    west = scheduling.cluster_create(actor=world.admin, name="sim-west", backend="simulated", inventory=WEST,
                                     labels={"region": "us-west", "arch": "arm64"})
    scheduling.inventory_sync(cluster=west)
    start = timezone.now()
    floated = 0
    for i in range(10):
        floated += demo.tick(now=start + dt.timedelta(seconds=15 * i), seed=i)["floating"]
        placement.placement_run()
        for c in (demo_world, west):
            advance(c, rounds=1)
    trainings = TrainingJob.objects.filter(name__startswith="demo-")
    floating = trainings.filter(cluster__isnull=True)
    assert floated == floating.count() > 0 and trainings.filter(cluster=demo_world).exists()
    assert {tuple(t.cluster_choice.get("labels", {}).items()) for t in floating} & {
        (("region", "us-west"),), (("arch", "arm64"),)}  # some by the second cluster's labels
    # Their runs went to both clusters, and some run on the ARM one.
    runs = Job.objects.filter(name__startswith="demo-train", floating=True)
    assert runs.filter(cluster=west, state__in=["starting", "running"]).exists()
    assert not runs.filter(state="rejected").exists()
    assert Job.objects.filter(name__startswith="demo-", cluster=demo_world).exists()
