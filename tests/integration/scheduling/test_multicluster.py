"""One pool across clusters (issue 16) on real PostgreSQL: two simulated clusters.

"east" is x86 with A100s, "west" is ARM with GH200s in another region. Floating jobs wait in
the global queue (no cluster) until the placement step binds them to the cluster where they
start soonest; the per-cluster cycle then admits them as any other job.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from registry import services as registry_services
from scheduling import services
from scheduling.engine import multicluster as M
from scheduling.models import Allocation, Cluster, Job, JobState, SchedulingDecision, SimulatedPod
from scheduling.services import placement as multicluster
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import gpu_group

pytestmark = pytest.mark.django_db

EAST = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: east-a100-{i}
    count: 2
    cpu_cores: 64
    ram_gib: 512
    labels: {kubernetes.io/arch: amd64}
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
"""

WEST = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: west-gh200-{i}
    count: 2
    cpu_cores: 72
    ram_gib: 480
    labels: {kubernetes.io/arch: arm64}
    gpus: {model: GH200-96G, count: 4, memory_mib: 98304}
"""


@pytest.fixture
def two(world: Any) -> tuple[Cluster, Cluster]:
    east = services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST,
                                   labels={"region": "eu-east", "arch": "amd64", "accelerator": "nvidia"})
    west = services.cluster_create(actor=world.admin, name="west", backend="simulated", inventory=WEST,
                                   labels={"region": "us-west", "arch": "arm64", "accelerator": "nvidia"})
    for c in (east, west):
        services.inventory_sync(cluster=c)
    return east, west


def x86_image(world: Any) -> None:
    registry_services.image_create(actor=world.admin, name="x86-only", variant="training",
                                   reference="registry.example/x86-only:1", architectures=["linux/amd64"])


def submit(world: Any, name: str, *, cluster: Any = None, choice: dict[str, Any] | None = None,
           **group: Any) -> Job:
    return services.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster,
                               cluster_choice=choice or {}, name=name, groups=[gpu_group(**group)])


def place_and_cycle(*clusters: Cluster) -> multicluster.PlacementSummary:
    summary = multicluster.placement_run()
    assert summary is not None
    for c in clusters:
        services.cycle_run(cluster=c)
    return summary


def refuse_pods(cluster: Cluster) -> None:
    """The cluster answers but refuses every pod Camp creates (the simulated backend's 422:
    the nodes Camp placed them on are no longer in its inventory)."""
    Cluster.objects.filter(pk=cluster.pk).update(inventory=cluster.inventory.replace("name: ", "name: gone-"))


def fill(world: Any, cluster: Cluster, gpus: int = 8) -> None:
    """Pinned jobs that take the cluster's GPUs (4 per node)."""
    for i in range(gpus // 4):
        submit(world, f"fill-{cluster.name}-{i}", cluster=cluster, gpu_count=4)
    services.cycle_run(cluster=cluster)


def test_an_any_cluster_job_waits_in_the_global_queue_then_goes_where_it_fits(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, east)
    job = submit(world, "anywhere", gpu_count=4)
    assert job.cluster_id is None and job.floating and job.state == JobState.QUEUED
    summary = place_and_cycle(east, west)
    assert summary.placed == [job.pk]
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING
    assert {a.node.name for a in Allocation.objects.filter(job=job)} <= {"west-gh200-0", "west-gh200-1"}
    placed = SchedulingDecision.objects.get(job=job, kind="placed")
    assert placed.cluster == west
    assert placed.reason.startswith("Placed on cluster west (fits now)")
    assert "cluster east:" in placed.reason  # why not the other one
    assert AuditEvent.objects.filter(action="job.placed", target_id=str(job.pk)).exists()


def test_an_image_without_the_clusters_arch_never_goes_there(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    x86_image(world)
    fill(world, east)
    job = submit(world, "x86", gpu_count=4, image="registry.example/x86-only:1")
    place_and_cycle(east, west)
    job.refresh_from_db()
    # West has free GPUs, but only arm64 nodes: the job queues on east, and says why, per cluster.
    assert job.cluster == east and job.state == JobState.QUEUED
    why = job.why_across_clusters
    assert why.startswith("cluster east: ") and "cluster west: the image has no arm64 variant" in why
    api = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert api["why_across_clusters"] == why
    assert "Other clusters:" in client_for(world.a.member).get(f"/scheduling/jobs/{job.pk}/").content.decode()
    # Room on east: it goes there (never to west).
    Job.objects.filter(name__startswith="fill-east").update(state=JobState.CANCELLED)
    for j in Job.objects.filter(name__startswith="fill-east"):
        services._release(j)
    place_and_cycle(east, west)
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.STARTING


def test_submit_rejects_a_choice_no_cluster_can_honour(world: Any, two: tuple[Cluster, Cluster]) -> None:
    x86_image(world)
    with pytest.raises(ValidationError) as err:
        submit(world, "bad-image", choice={"clusters": ["west"]}, image="registry.example/x86-only:1")
    assert "groups[0].image" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        submit(world, "bad-label", choice={"labels": {"region": "mars"}})
    assert "cluster_choice.labels" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        submit(world, "bad-name", choice={"clusters": ["nowhere"]})
    assert "cluster_choice.clusters" in err.value.message_dict


def test_labels_choose_the_region(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    job = submit(world, "eu-only", choice={"labels": {"region": "eu-east"}}, gpu_count=1)
    place_and_cycle(east, west)
    job.refresh_from_db()
    assert job.cluster == east


def test_a_dispatch_failure_sends_the_job_to_the_other_cluster(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    job = submit(world, "failover", choice={"prefer": {"region": "eu-east"}}, gpu_count=1)
    place_and_cycle(east, west)
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.STARTING  # locality breaks the tie
    # East answers but refuses its pods (422: its nodes are gone from the cluster). (An API
    # server that does not answer at all is no failure of the job: test_cluster_health.py.)
    refuse_pods(east)
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "failed"
    job.refresh_from_db()
    assert job.cluster_id is None and job.state == JobState.QUEUED  # back in the global queue
    assert not Allocation.objects.filter(job=job).exists()
    place_and_cycle(west)
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING
    assert services.job_dispatch(job_id=job.pk) == "created"
    assert SimulatedPod.objects.filter(cluster=west).exists()
    kinds = list(job.decisions.order_by("id").values_list("kind", "cluster__name"))
    assert ("unplaced", "east") in kinds and ("placed", "west") in kinds and ("admitted", "west") in kinds


def test_an_unreachable_cluster_takes_no_new_work_and_gives_back_its_queued_jobs(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, west)
    fill(world, east)
    queued = submit(world, "queued-on-east", choice={"prefer": {"region": "eu-east"}}, gpu_count=4)
    multicluster.placement_run()
    queued.refresh_from_db()
    assert queued.cluster == east  # bound (the shortest wait, or the tie-break), still queued
    services.cluster_reachability_record(cluster_id=east.pk, error="connection refused")
    queued.refresh_from_db()
    assert queued.cluster_id is None and queued.state == JobState.QUEUED
    assert "unreachable" in queued.reason
    # Capacity frees on east, but it is unreachable: nothing new goes there.
    for j in Job.objects.filter(name__startswith="fill-east"):
        Job.objects.filter(pk=j.pk).update(state=JobState.CANCELLED)
        services._release(j)
    fresh = submit(world, "fresh", gpu_count=1)
    multicluster.placement_run()
    for j in (queued, fresh):
        j.refresh_from_db()
        assert j.cluster_id != east.pk
    assert "cluster east: unreachable" in fresh.why_across_clusters
    pinned_running = Job.objects.filter(cluster=west, name__startswith="fill-west").count()
    assert pinned_running == 2  # running jobs stay where they are
    # The cluster page says so.
    page = client_for(world.admin).get("/scheduling/clusters/").content.decode()
    assert "takes no new work" in page


def test_why_pending_names_every_cluster(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, east)
    fill(world, west)
    job = submit(world, "big", gpu_count=4)
    multicluster.placement_run()
    job.refresh_from_db()
    # Both full: it is bound where the wait is shortest, or waits; either way both are named.
    text = job.reason if job.cluster_id is None else job.decisions.filter(kind="placed").get().reason
    assert "cluster east" in text or "cluster west" in text
    api = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert api["floating"] is True
    assert api["reason"] == Job.objects.get(pk=job.pk).reason


def test_the_api_submits_a_floating_job(world: Any, two: tuple[Cluster, Cluster]) -> None:
    client = client_for(world.a.member)
    body = {"name": "api-any", "project": world.a.project.pk, "groups": [gpu_group()],
            "cluster_choice": {"labels": {"accelerator": "nvidia"}}}
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["cluster"] is None and data["floating"] is True
    assert data["cluster_choice"] == {"labels": {"accelerator": "nvidia"}}
    bad = client.post("/api/v1/jobs/", {**body, "name": "api-bad",
                                        "cluster_choice": {"labels": {"region": "mars"}}}, format="json")
    assert bad.status_code == 400
    assert "cluster_choice.labels" in bad.json()
    both = client.post("/api/v1/jobs/", {**body, "name": "api-both", "cluster": "east",
                                         "cluster_choice": {"clusters": ["west"]}}, format="json")
    assert both.status_code == 400 and "cluster_choice" in both.json()


def test_a_job_is_never_bound_twice(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    job = submit(world, "once", gpu_count=1)
    stale = Job.objects.select_related("tenant", "project").get(pk=job.pk)
    assert multicluster._bind(job, east, "Placed on cluster east", "fits now")
    # A second placement step working from a stale read cannot bind it elsewhere.
    assert not multicluster._bind(stale, west, "Placed on cluster west", "fits now")
    job.refresh_from_db()
    assert job.cluster == east
    assert SchedulingDecision.objects.filter(job=job, kind="placed").count() == 1


@pytest.mark.django_db(transaction=True)
def test_camp_submit_cluster_option(world: Any, two: tuple[Cluster, Cluster], live_server: Any,
                                    tmp_path: Any) -> None:
    """``camp submit --cluster any | a,b | region=…``: the same file, placed three ways."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tenants import services as tenant_services

    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    project = f"{world.a.tenant.name}/{world.a.project.name}"
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    path = tmp_path / "job.yaml"

    def camp(name: str, where: str) -> subprocess.CompletedProcess[str]:
        path.write_text(f"kind: Job\nname: {name}\nproject: {project}\ncluster: east\n"
                        f"groups: [{{name: worker, gpu_count: 1}}]\n")
        args = ["submit", "-f", str(path), "--cluster", where]
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    for name, where, choice in (("j-any", "any", {}), ("j-set", "east,west", {"clusters": ["east", "west"]}),
                                ("j-eu", "region=eu-east", {"labels": {"region": "eu-east"}})):
        done = camp(name, where)
        assert done.returncode == 0, done.stdout + done.stderr
        job = Job.objects.get(name=name)
        assert job.floating and job.cluster_id is None and job.cluster_choice == choice
    pinned = camp("j-west", "west")
    assert pinned.returncode == 0 and Job.objects.filter(name="j-west", cluster__name="west").exists()
    bad = camp("j-mars", "region=mars")
    assert bad.returncode == 1 and "jobs[0].cluster_choice.labels" in bad.stdout + bad.stderr


@pytest.mark.django_db(transaction=True)
def test_racing_placement_steps_bind_each_job_once(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Two workers' placement steps at once (two connections): every floating job ends on one
    cluster with one ``placed`` decision, and no cluster is given more than it has."""
    import threading

    from django.db import connection

    jobs = [submit(world, f"race-{i}", gpu_count=4) for i in range(5)]  # 4 fit (2 clusters × 2 nodes)
    results: list[Any] = []

    def step() -> None:
        try:
            for _ in range(3):
                results.append(multicluster.placement_run())
        finally:
            connection.close()

    threads = [threading.Thread(target=step) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert any(r is not None for r in results)
    placed = SchedulingDecision.objects.filter(job__in=jobs, kind="placed")
    assert placed.count() == len({d.job_id for d in placed})  # never bound twice
    per_cluster: dict[str, int] = {}
    for j in Job.objects.filter(pk__in=[j.pk for j in jobs]).select_related("cluster"):
        if j.cluster is not None:
            per_cluster[j.cluster.name] = per_cluster.get(j.cluster.name, 0) + 1
    assert sum(per_cluster.values()) == 5  # the fifth is bound too, to wait where it starts soonest
    for c in two:
        services.cycle_run(cluster=c)
    running = Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.STARTING)
    assert running.count() == 4
    assert Allocation.objects.filter(job__in=jobs).values("job").distinct().count() == 4


class _OtherSession:
    """A second database session (another worker's cycle) holding a cluster's cycle lock.

    ``close`` unlocks before it disconnects: a session-level advisory lock of a closed
    connection is released only when the server's backend process has noticed the hang-up
    and exited, which under load came after the test's next placement step (that step then
    found the cluster still busy and bound nothing: issue 29). ``pg_advisory_unlock`` returns
    once the lock is free."""

    def __init__(self, cluster: Cluster) -> None:
        import psycopg
        from django.db import connection

        from scheduling.services.common import _CYCLE_LOCK_CLASS

        s = connection.settings_dict
        self.key = [_CYCLE_LOCK_CLASS, cluster.pk]
        self.conn = psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                                    dbname=s["NAME"], autocommit=True)
        self.conn.execute("SELECT pg_advisory_lock(%s, %s)", self.key)

    def close(self) -> None:
        try:
            row = self.conn.execute("SELECT pg_advisory_unlock(%s, %s)", self.key).fetchone()
            assert row is not None and row[0], "the other session did not hold the lock"
        finally:
            self.conn.close()


def _other_session_holds_cycle_lock(cluster: Cluster) -> _OtherSession:
    return _OtherSession(cluster)


def test_a_job_sent_back_and_bound_elsewhere_is_not_admitted_by_its_old_clusters_cycle(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: east's cycle reads floating J; east turns unreachable and J goes back to
    the global queue; J is bound to west; east's cycle then writes its decisions. J must not
    start with west as its cluster and an allocation on an east node."""
    from scheduling.services import cycle as cyc

    east, west = two
    fill(world, west)
    job = submit(world, "racer", gpu_count=4)
    assert multicluster.placement_run().placed == [job.pk]  # type: ignore[union-attr]
    job.refresh_from_db()
    assert job.cluster == east
    inputs, statuses = cyc._decide(east, None)  # east's cycle decided (J fits there) ...
    services.cluster_reachability_record(cluster_id=east.pk, error="connection refused")
    job.refresh_from_db()
    assert job.cluster_id is None
    for j in Job.objects.filter(cluster=west):  # ... west frees up, J is bound to west ...
        services.job_terminate(job_id=j.pk, reason="done")
        services.job_stop(job_id=j.pk)
    assert multicluster.placement_run().placed == [job.pk]  # type: ignore[union-attr]
    summary = cyc._persist(east, inputs, statuses)  # ... then east's cycle writes
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.QUEUED
    assert job.pk not in summary.admitted and not Allocation.objects.filter(job=job).exists()
    services.cycle_run(cluster=west)
    job.refresh_from_db()
    assert job.state == JobState.STARTING
    assert {a.node.name for a in Allocation.objects.filter(job=job)} <= {"west-gh200-0", "west-gh200-1"}


def test_unplacing_waits_for_the_old_clusters_running_cycle(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, west)
    fill(world, east)
    job = submit(world, "stays", choice={"prefer": {"region": "eu-east"}}, gpu_count=4)
    multicluster.placement_run()
    job.refresh_from_db()
    assert job.cluster == east
    other = _other_session_holds_cycle_lock(east)
    try:
        services.cluster_reachability_record(cluster_id=east.pk, error="connection refused")
        job.refresh_from_db()
        assert job.cluster == east  # east's cycle is running: left for a later tick
        assert not multicluster.job_unplace(job_id=job.pk, reason="test")
    finally:
        other.close()
    services.cluster_reachability_record(cluster_id=east.pk, error="connection refused")  # the next tick
    job.refresh_from_db()
    assert job.cluster_id is None and "unreachable" in job.reason


def test_another_tenants_catalog_never_restricts_my_jobs(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: globex recording a public image as arm64-only in its own catalog made
    acme's x86 job REJECTED, and acme's floating submit error revealed globex's record."""
    east, west = two
    ref = "docker.io/library/python:3.12"
    registry_services.image_create(actor=world.b.owner, name="mine", variant="training",
                                   tenant=world.b.tenant, reference=ref, architectures=["linux/arm64"])
    # A disabled platform record restricts nobody either.
    registry_services.image_create(actor=world.admin, name="old-python", variant="training", reference=ref,
                                   architectures=["linux/arm64"], enabled=False)
    pinned = submit(world, "pinned", cluster=east, gpu_count=1, image=ref)
    services.cycle_run(cluster=east)
    pinned.refresh_from_db()
    assert pinned.state == JobState.STARTING
    floating = submit(world, "float", choice={"clusters": ["east"]}, gpu_count=1, image=ref)  # accepted
    assert floating.floating
    # Globex's own jobs do follow globex's record: refused at submit, naming the architecture.
    with pytest.raises(ValidationError) as err:
        services.job_submit(actor=world.b.member, project=world.b.project,
                            cluster_choice={"clusters": ["east"]}, name="theirs",
                            groups=[gpu_group(gpu_count=1, image=ref)])
    assert "linux/arm64" in str(err.value.message_dict["groups[0].image"])
    # Pinned too (review rv finding 8: accepted, then rejected by the cycle), at submit.
    with pytest.raises(ValidationError) as err:
        services.job_submit(actor=world.b.member, project=world.b.project, cluster=east,
                            name="theirs-pinned", groups=[gpu_group(gpu_count=1, image=ref)])
    msg = str(err.value.message_dict["groups[0].image"])
    assert "linux/arm64" in msg and "cluster east has linux/amd64 nodes only" in msg
    assert not Job.objects.filter(name="theirs-pinned").exists()


@pytest.mark.django_db(transaction=True)
def test_images_catalogued_before_the_upgrade_restrict_no_job(world: Any) -> None:
    """Review finding: the migration filled existing images with ["linux/amd64"], so on an ARM
    cluster their existing jobs were rejected after the upgrade. Existing rows: unknown."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from scheduling import selectors

    before = ("registry", "0004_r4serve_inference_images")
    after = ("registry", "0005_r4multi_image_architectures")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps.get_model("registry", "Image")
    old.objects.create(scope="platform", name="old-arm-ready", reference="registry.example/old:1",
                       variant="training", framework="other")
    upgrade = MigrationExecutor(connection)
    upgrade.migrate([after])
    assert upgrade.loader.project_state([after]).apps.get_model("registry", "Image").objects.get(
        name="old-arm-ready").architectures == []
    # Then up to today's schema (later migrations add columns the current model reads).
    latest = MigrationExecutor(connection)
    latest.migrate(latest.loader.graph.leaf_nodes())
    from registry.models import Image

    image = Image.objects.get(name="old-arm-ready")
    assert image.architectures == []
    assert selectors.image_arches([(world.a.tenant.pk, world.a.project.pk, image.reference)]) == {}
    # Still editable (empty is a valid "unknown"); new images default to linux/amd64.
    registry_services.image_update(actor=world.admin, image=image, description="catalogued in 2025")
    new = registry_services.image_create(actor=world.admin, name="new", variant="training",
                                         reference="registry.example/new:1")
    assert new.architectures == ["linux/amd64"]


def test_a_cluster_limit_sends_a_floating_job_to_the_other_cluster(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: a floating job bound to a cluster whose cluster-level GPU limit it
    exceeds was REJECTED there instead of going to the other cluster."""
    from tenants import services as tenant_services

    east, west = two
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 2, "gpus_limit": 2})
    fill(world, west, gpus=4)  # west: one node busy, so east (all free) would rank first by free share
    job = submit(world, "big", gpu_count=4)
    place_and_cycle(east, west)
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING
    assert "cluster east: can never run there: asks 4 GPUs, more than the cluster's GPU limit there (2)" in (
        job.placement_note)


def test_a_cycle_sends_back_a_floating_job_it_can_never_run(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """The backstop: should a floating job reach a cluster whose cycle rejects it, it goes back
    to the global queue with that cluster refused, and another cluster runs it; when no
    cluster can, the placement step rejects it, naming each cluster."""
    from tenants import services as tenant_services

    east, west = two
    job = submit(world, "big", gpu_count=4)
    lonely = submit(world, "east-only", choice={"clusters": ["east"]}, gpu_count=4)
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 2, "gpus_limit": 2})
    for j in (job, lonely):  # bound before the limit was known to the placement step
        assert multicluster._bind(j, east, "Placed on cluster east", "fits now")
    summary = services.cycle_run(cluster=east)
    assert summary is not None and not summary.rejected and not summary.admitted
    for j in (job, lonely):
        j.refresh_from_db()
        assert j.state == JobState.QUEUED and j.cluster_id is None
        assert "cluster east cannot run it" in j.reason
    place_and_cycle(east, west)
    job.refresh_from_db()
    lonely.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING
    assert lonely.state == JobState.REJECTED and "cluster east: can never run there" in lonely.reason
    assert SchedulingDecision.objects.filter(job=lonely, kind="unplaced", cluster=east).exists()


def test_a_job_whose_victims_are_being_evicted_is_not_moved(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: the move rule moved a queued job that already had victims PREEMPTING
    for it on its cluster (victims killed for nothing)."""
    east, west = two
    for i in range(2):
        services.job_submit(actor=world.a.owner, project=world.a.other_project, cluster=east, name=f"low-{i}",
                            priority_class="batch", preemptible=True, groups=[gpu_group(gpu_count=4)])
    services.cycle_run(cluster=east)
    fill(world, west)
    Job.objects.filter(cluster__in=[east, west], state="starting").update(state="running")
    job = services.job_submit(actor=world.a.project_admin, project=world.a.project, cluster=None,
                              name="hi", priority_class="high", groups=[gpu_group(gpu_count=4)])
    multicluster.placement_run()
    job.refresh_from_db()
    assert job.cluster == east  # fits after preempting one job there; west is full
    assert services.cycle_run(cluster=east).preempting == [job.pk]  # type: ignore[union-attr]
    assert Job.objects.filter(preempted_by=job, state="preempting").count() == 1
    for j in Job.objects.filter(cluster=west, state="running"):  # west frees up meanwhile
        services.job_terminate(job_id=j.pk, reason="done")
        services.job_stop(job_id=j.pk)
    summary = multicluster.placement_run()
    assert summary is not None and not summary.moved
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.QUEUED


def test_dispatch_attempts_count_per_cluster(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: failover stopped at MAX_ATTEMPTS counted across clusters, so a job that
    had failed on other clusters failed for good at its first failure on a new one."""
    east, west = two
    job = submit(world, "wanderer", choice={"prefer": {"region": "eu-east"}}, gpu_count=1)
    place_and_cycle(east, west)
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.STARTING
    # Its earlier attempts were elsewhere (west's failures); east refuses its pods.
    Job.objects.filter(pk=job.pk).update(attempts=services.MAX_ATTEMPTS)
    refuse_pods(east)
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "failed"
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.cluster_id is None  # its first failure on east
    assert multicluster.dispatch_failures(job.cluster_choice, "east") == 1
    # East failing it MAX_ATTEMPTS times fails it for good.
    for n in range(2, services.MAX_ATTEMPTS + 1):
        Job.objects.filter(pk=job.pk).update(cluster=east)  # bound there again, and admitted
        services.cycle_run(cluster=east)
        assert Job.objects.get(pk=job.pk).state == JobState.STARTING
        assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "failed"
        job.refresh_from_db()
        assert job.state == (JobState.FAILED if n == services.MAX_ATTEMPTS else JobState.QUEUED)


def test_a_bulk_submit_of_floating_jobs_reads_the_clusters_once(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: checking each floating job's choice cost three or four queries a job."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def many(prefix: str, n: int) -> int:
        items = [{"project": world.a.project, "name": f"{prefix}-{i}", "cluster_choice": {"labels": {
            "accelerator": "nvidia"}}, "groups": [gpu_group(image="registry.example/x86-only:1")]}
            for i in range(n)]
        with CaptureQueriesContext(connection) as ctx:
            services.job_submit_many(actor=world.a.member, jobs=items)
        return len(ctx.captured_queries)

    x86_image(world)
    many("warm", 1)  # per-process caches (content types, ...) filled
    assert many("ten", 10) == many("forty", 40)


def test_the_admin_home_counts_the_global_queue(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: the admin home's waiting counts are per cluster, so floating jobs no
    cluster has taken yet were counted nowhere."""
    east, west = two
    Cluster.objects.update(unreachable_since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    for i in range(3):
        submit(world, f"float-{i}", gpu_count=1)
    multicluster.placement_run()
    assert Job.objects.filter(cluster__isnull=True, state=JobState.QUEUED).count() == 3
    page = client_for(world.admin).get("/").content.decode()
    assert "Global queue: <strong>3</strong> jobs submitted for any of several clusters" in page
    assert "Global queue" not in client_for(world.a.owner).get("/").content.decode()


WEST_BIG = WEST + """  - name: west-big-{i}
    count: 1
    cpu_cores: 72
    ram_gib: 480
    labels: {kubernetes.io/arch: arm64}
    gpus: {model: GH200-96G, count: 8, memory_mib: 98304}
"""


def set_inventory(world: Any, cluster: Cluster, inventory: str) -> None:
    services.cluster_update(actor=world.admin, cluster=cluster, inventory=inventory)
    services.inventory_sync(cluster=Cluster.objects.get(pk=cluster.pk))


def test_a_refusal_lapses_when_the_cluster_gains_a_node_big_enough(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """A cluster refused to a job is offered again once its nodes change: west's 8-GPU node
    was gone when its cycle ran (refused), east is unreachable, so the job waits; when west
    gets such a node again, the next placement step binds it there and it runs."""
    east, west = two
    set_inventory(world, west, WEST_BIG)
    job = submit(world, "eight", gpu_count=8)
    assert multicluster.placement_run().placed == [job.pk]  # type: ignore[union-attr]
    set_inventory(world, west, WEST)  # the big node leaves before west's cycle runs
    assert services.cycle_run(cluster=west).admitted == []  # type: ignore[union-attr]
    job.refresh_from_db()
    assert job.cluster_id is None and job.state == JobState.QUEUED
    assert job.cluster_choice["refused"]["west"]["why"].startswith("No node can ever fit")
    Cluster.objects.filter(pk=east.pk).update(unreachable_since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    for _ in range(2):  # the refusal holds while west is unchanged
        summary = multicluster.placement_run()
        assert summary is not None and summary.waiting == [job.pk] and not summary.rejected
    job.refresh_from_db()
    assert "cluster west: can never run there: No node can ever fit" in job.reason
    assert "found by its cycle at" in job.reason and "once its nodes or quotas change" in job.reason
    assert "cluster east: unreachable since" in job.reason
    set_inventory(world, west, WEST_BIG)
    summary = place_and_cycle(west)
    assert summary.placed == [job.pk]
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING
    assert {a.node.name for a in Allocation.objects.filter(job=job)} == {"west-big-0"}


def test_a_job_whose_refusal_rested_on_a_quota_since_raised_is_not_rejected(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """The rejection path: east was the only cluster this job may use and its cycle refused it
    (over east's GPU limit); once the limit is raised, the placement step does not reject it
    on that old refusal but places it on east."""
    from tenants import services as tenant_services

    east, west = two
    lonely = submit(world, "east-only", choice={"clusters": ["east"]}, gpu_count=4)
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 2, "gpus_limit": 2})
    assert multicluster._bind(lonely, east, "Placed on cluster east", "fits now")
    services.cycle_run(cluster=east)
    lonely.refresh_from_db()
    assert lonely.cluster_id is None and "east" in lonely.cluster_choice["refused"]
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 8, "gpus_limit": 8})
    summary = place_and_cycle(east)
    assert summary.placed == [lonely.pk] and not summary.rejected
    lonely.refresh_from_db()
    assert lonely.cluster == east and lonely.state == JobState.STARTING


def test_refusals_in_the_old_shape_are_still_honoured(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Jobs refused before fingerprints hold ``refused: {cluster: why}``: the cluster stays out
    (for the time bound after the job's last change), and the job says why."""
    east, west = two
    job = submit(world, "old", gpu_count=4)
    Job.objects.filter(pk=job.pk).update(cluster_choice={"refused": {"west": "No node can ever fit: old"}})
    Cluster.objects.filter(pk=east.pk).update(unreachable_since=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    summary = multicluster.placement_run()
    assert summary is not None and summary.waiting == [job.pk] and not summary.placed
    job.refresh_from_db()
    assert job.cluster_id is None
    assert "cluster west: can never run there: No node can ever fit: old" in job.reason
    # Long after the job last changed, the old refusal lapses: west (free) takes it.
    Job.objects.filter(pk=job.pk).update(
        updated_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=M.REFUSAL_MAX_AGE_S + 60))
    summary = place_and_cycle(west)
    assert summary.placed == [job.pk]
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.STARTING


def test_a_placement_step_writes_in_statements_that_do_not_grow_with_its_jobs(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding (bench/placement_step.py): a step bound each job in a transaction of its
    own (a commit, an audit seal and a live push each: 40 s for 500 jobs). Its binds, their
    decisions and audit events are now written together, each job still bound once."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def step(prefix: str, n: int) -> int:
        Job.objects.filter(state=JobState.QUEUED).update(state=JobState.CANCELLED)
        jobs = [submit(world, f"{prefix}-{i}", gpu_count=1) for i in range(n)]
        with CaptureQueriesContext(connection) as ctx:
            summary = multicluster.placement_run()
        assert summary is not None and sorted(summary.placed) == sorted(j.pk for j in jobs)
        assert SchedulingDecision.objects.filter(job__in=jobs, kind="placed").count() == n
        ids = [str(j.pk) for j in jobs]
        assert AuditEvent.objects.filter(action="job.placed", target_id__in=ids).count() == n
        assert Job.objects.filter(pk__in=[j.pk for j in jobs], cluster__isnull=True).count() == 0
        return len(ctx.captured_queries)

    step("warm", 2)
    assert step("ten", 10) == step("forty", 40)


def test_a_placement_step_goes_on_with_the_next_batch_within_its_time_budget(
        world: Any, two: tuple[Cluster, Cluster], monkeypatch: Any) -> None:
    """Review finding (r5-mb's bench): a burst of floating jobs waited tick after tick because a
    step took only the oldest PLACEMENT_BATCH jobs. A step now takes the batches behind while
    its time budget lasts; with none left, only the first batch is placed."""
    east, west = two
    monkeypatch.setattr(multicluster, "PLACEMENT_BATCH", 2)
    jobs = [submit(world, f"burst-{i}", gpu_count=1) for i in range(5)]
    monkeypatch.setattr(multicluster, "PLACEMENT_BUDGET_S", 0.0)
    summary = multicluster.placement_run()
    assert summary is not None and sorted(summary.placed) == [j.pk for j in jobs[:2]]
    monkeypatch.setattr(multicluster, "PLACEMENT_BUDGET_S", 60.0)
    summary = multicluster.placement_run()
    assert summary is not None and sorted(summary.placed) == [j.pk for j in jobs[2:]]
    assert not Job.objects.filter(pk__in=[j.pk for j in jobs], cluster__isnull=True).exists()
    # The batches share the step's trials: 5 single-GPU jobs, 16 free GPUs, each bound where it
    # fits now, the room of the earlier ones held (no more than 8 on either cluster).
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], cluster=east).count() <= 8


def test_a_quota_raised_while_a_cycle_decides_does_not_leave_a_stale_refusal(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: the refusal's quota stamp was read when it was written, not with the
    cycle's snapshot, so a limit raised between the two left a refusal that never lapsed (and
    the job rejected). The stamp is now the snapshot's: the next step places the job."""
    from scheduling.services import cycle as cyc
    from tenants import services as tenant_services

    east, west = two
    lonely = submit(world, "east-only", choice={"clusters": ["east"]}, gpu_count=4)
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 2, "gpus_limit": 2})
    assert multicluster._bind(lonely, east, "Placed on cluster east", "fits now")
    inputs, statuses = cyc._decide(east, None)
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                              values={"gpus_guaranteed": 8, "gpus_limit": 8})
    cyc._persist(east, inputs, statuses)
    lonely.refresh_from_db()
    assert lonely.cluster_id is None and "east" in lonely.cluster_choice["refused"]
    summary = place_and_cycle(east)
    assert summary.placed == [lonely.pk] and not summary.rejected
    lonely.refresh_from_db()
    assert lonely.cluster == east and lonely.state == JobState.STARTING


def test_a_step_binds_past_a_busy_cluster_and_writes_nothing_for_it(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: inside a step's one transaction, a busy cycle lock must cost only the
    jobs bound for that cluster (no decision, no audit event for them), and its lock must not
    be kept; the next step binds them."""
    east, west = two
    je = submit(world, "e", choice={"clusters": ["east"]}, gpu_count=1)
    jw = submit(world, "w", choice={"clusters": ["west"]}, gpu_count=1)
    other = _other_session_holds_cycle_lock(east)
    try:
        summary = multicluster.placement_run()
    finally:
        other.close()
    assert summary is not None and summary.placed == [jw.pk]
    je.refresh_from_db()
    assert je.cluster_id is None
    assert not SchedulingDecision.objects.filter(job=je, kind="placed").exists()
    assert not AuditEvent.objects.filter(action="job.placed", target_id=str(je.pk)).exists()
    summary = multicluster.placement_run()
    assert summary is not None and summary.placed == [je.pk]
    assert AuditEvent.objects.filter(action="job.placed", target_id=str(je.pk)).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_step_does_not_wait_for_a_job_another_transaction_holds(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding: a step holding its locks must never wait on a row another transaction
    holds (a user cancelling that job): the job is left for the next step, the others bound."""
    import psycopg
    from django.db import connection

    held = submit(world, "held", gpu_count=1)
    free = submit(world, "free", gpu_count=1)
    s = connection.settings_dict
    other = psycopg.connect(host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"],
                            dbname=s["NAME"])
    try:
        other.execute("SELECT id FROM scheduling_job WHERE id = %s FOR UPDATE", [held.pk])
        with connection.cursor() as cursor:  # a regression fails here instead of hanging
            cursor.execute("SET lock_timeout = '5s'")
        summary = multicluster.placement_run()
        assert summary is not None and summary.placed == [free.pk]
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    summary = multicluster.placement_run()
    assert summary is not None and summary.placed == [held.pk]


def test_why_across_clusters_names_each_cluster_once_and_follows_a_disabled_cluster(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding (rv 4): a bound job's why said "cluster east: Placed on cluster east
    (fits now); cluster west: fits now; cluster west: fits now", and still "fits now" for
    west once west was disabled (its note was written at bind time only)."""
    east, west = two
    job = submit(world, "bound-here", choice={"prefer": {"region": "eu-east"}}, gpu_count=1)
    multicluster.placement_run()  # bound to east; east's cycle has not run: still queued
    job.refresh_from_db()
    assert job.cluster == east and job.state == JobState.QUEUED
    client = client_for(world.a.member)
    why = client.get(f"/api/v1/jobs/{job.pk}/").json()["why_across_clusters"]
    assert why == "Placed on cluster east (fits now); cluster west: fits now"
    assert SchedulingDecision.objects.get(job=job, kind="placed").reason == why  # history: both
    services.cluster_update(actor=world.admin, cluster=west, enabled=False, verify=False)
    multicluster.placement_run()
    why = client.get(f"/api/v1/jobs/{job.pk}/").json()["why_across_clusters"]
    assert why == "Placed on cluster east (fits now); cluster west: disabled"
    # The job's page says it once too (its reason, then the other clusters).
    page = client_for(world.a.member).get(f"/scheduling/jobs/{job.pk}/").content.decode()
    assert page.count("cluster west: disabled") == 1 and "fits now; cluster west" not in page
    # West open again and full (work pinned there, admitted by its cycle). While the bind is
    # fresh and the job still fits now on east, the step does not probe west for it (issue 35:
    # nothing beats fits now) and its note stands; once older, the next step says what west is.
    services.cluster_update(actor=world.admin, cluster=west, enabled=True, verify=False)
    fill(world, west)
    multicluster.placement_run()
    job.refresh_from_db()
    assert job.placement_note == "cluster west: disabled"
    Job.objects.filter(pk=job.pk).update(
        updated_at=timezone.now() - dt.timedelta(seconds=multicluster.PLACEMENT_FRESH_S + 1))
    multicluster.placement_run()
    job.refresh_from_db()
    assert job.cluster == east
    assert job.placement_note.startswith("cluster west: ") and "fits now" not in job.placement_note
    assert job.why_across_clusters.count("cluster west") == 1


def test_a_job_back_from_a_failed_dispatch_says_each_cluster_once_and_reads_back_its_choice(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review findings (rv 4, 6): after a failed dispatch the why said the failure twice, and
    the API's ``cluster_choice`` read back the placement's bookkeeping (``failed``, with the
    API server's error text) which could not be posted again (400 Unknown key(s))."""
    east, west = two
    choice = {"prefer": {"region": "eu-east"}}
    job = submit(world, "failing-over", choice=choice, gpu_count=1)
    place_and_cycle(east, west)
    # East answers but refuses the pods (an API server that does not answer is no failure of
    # the job: test_cluster_health.py; the redaction of a server's error text: the redact test below).
    refuse_pods(east)
    assert services.job_dispatch(job_id=job.pk, final_attempt=True) == "failed"
    multicluster.placement_run()
    job.refresh_from_db()
    assert job.cluster == west and job.state == JobState.QUEUED
    client = client_for(world.a.member)
    data = client.get(f"/api/v1/jobs/{job.pk}/").json()
    assert data["why_across_clusters"].count("cluster east") == 1, data["why_across_clusters"]
    assert data["why_across_clusters"].startswith("Placed on cluster west (")
    assert data["cluster_choice"] == choice  # as given: no "failed"
    [setback] = data["cluster_setbacks"]
    assert setback["cluster"] == "east" and setback["kind"] == "dispatch-failed"
    assert setback["failures"] == 1 and setback["reason"] and setback["at"]
    assert "fp" not in str(data["cluster_setbacks"])
    # A copy of the job, posted with what was read back, is accepted.
    copy = {"name": "failing-over-2", "project": data["project"], "cluster": None,
            "cluster_choice": data["cluster_choice"], "groups": [gpu_group(gpu_count=1)]}
    response = client.post("/api/v1/jobs/", copy, format="json")
    assert response.status_code == 201, response.content
    # The bookkeeping the placement reads is still kept with the job.
    assert multicluster.dispatch_failures(Job.objects.get(pk=job.pk).cluster_choice, "east") == 1


def test_a_refusal_reads_back_as_a_setback_without_its_fingerprint(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    job = submit(world, "refused", gpu_count=1)
    multicluster.placement_run()
    job.refresh_from_db()
    where = job.cluster
    assert where is not None
    assert multicluster.job_unplace(job_id=job.pk, reason="no node fits it there",
                                    refused="no node has 9 GPUs", refused_fp=("f" * 20, "never-fits"))
    data = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert data["cluster_choice"] == {}
    [setback] = data["cluster_setbacks"]
    assert setback == {"cluster": where.name, "kind": "refused", "reason": "no node has 9 GPUs",
                       "failures": 0, "at": setback["at"]} and setback["at"]
    assert "f" * 20 not in str(data)


def test_error_texts_shown_to_users_carry_no_credentials() -> None:
    from scheduling.models import redact

    for text, secret in (
            ("Post https://camp:s3cret-pw@10.0.0.1:6443/api/v1/pods: x509", "s3cret-pw"),
            ("401 Unauthorized: Authorization: Bearer abcDEF123.456-xyz", "abcDEF123.456-xyz"),
            ("request failed: token=deadbeefcafe0123 rejected", "deadbeefcafe0123"),
            ("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJl was refused",
             "eyJzdWIiOiJzeXN0ZW0ifQ"),
            ("the key camp_AbCdEf0123456789xyz leaked", "camp_AbCdEf0123456789xyz")):
        shown = redact(text)
        assert secret not in shown and "[redacted]" in shown, shown
    assert redact("Kubernetes API unreachable at https://10.0.0.1:6443 (refused)") == (
        "Kubernetes API unreachable at https://10.0.0.1:6443 (refused)")
    assert len(redact("x" * 1000)) == 200


def test_no_cluster_may_be_named_any_and_any_means_floating(world: Any, two: tuple[Cluster, Cluster]) -> None:
    """Review finding (rv 9): "any" means "no one cluster" to the CLI; a cluster named so
    could not be pinned. It is refused as a name; the API reads "any" (any case) as null."""
    admin = client_for(world.admin)
    response = admin.post("/api/v1/clusters/", {"name": "any", "backend": "simulated", "inventory": EAST},
                          format="json")
    assert response.status_code == 400 and "any" in str(response.json()["name"]), response.content
    with pytest.raises(ValidationError) as err:
        services.cluster_create(actor=world.admin, name="any", backend="simulated", inventory=EAST)
    assert "name" in err.value.message_dict
    east, _ = two
    with pytest.raises(ValidationError) as err:
        services.cluster_update(actor=world.admin, cluster=east, name="any", verify=False)
    assert "name" in err.value.message_dict
    client = client_for(world.a.member)
    for i, word in enumerate(("any", "ANY", "Any")):
        body = {"name": f"api-any-{i}", "project": world.a.project.pk, "groups": [gpu_group()],
                "cluster": word}
        response = client.post("/api/v1/jobs/", body, format="json")
        assert response.status_code == 201, response.content
        assert response.json()["cluster"] is None and response.json()["floating"] is True


@pytest.mark.django_db(transaction=True)
def test_camp_shows_a_floating_plain_job(world: Any, two: tuple[Cluster, Cluster], live_server: Any,
                                         tmp_path: Any) -> None:
    """Review findings (rv 5, 9): ``camp why`` said "No training job or environment" of a
    ``kind: Job`` submitted with ``--cluster any``, ``camp ls`` left it out, and ``--cluster
    ANY`` was taken as a cluster's name."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tenants import services as tenant_services

    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    east, west = two
    path = tmp_path / "job.yaml"
    path.write_text(f"kind: Job\nname: floater\nproject: {world.a.tenant.name}/{world.a.project.name}\n"
                    "groups: [{name: worker, gpu_count: 1}]\n")
    done = camp("submit", "-f", str(path), "--cluster", "ANY")
    assert done.returncode == 0, done.stdout + done.stderr
    job = Job.objects.get(name="floater")
    assert job.floating and job.cluster_id is None
    Job.objects.filter(pk=job.pk).update(cluster_choice={"prefer": {"region": "eu-east"}})
    multicluster.placement_run()  # bound to east (its locality); east's cycle has not run
    services.cluster_update(actor=world.admin, cluster=west, enabled=False, verify=False)
    multicluster.placement_run()
    for ref in ("floater", f"job/{job.pk}"):
        why = camp("why", ref)
        assert why.returncode == 0, why.stdout + why.stderr
        assert why.stdout.splitlines()[0] == "floater: queued"
        assert "why: Placed on cluster east (fits now)" in why.stdout
        assert "clusters: Placed on cluster east (fits now); cluster west: disabled" in why.stdout
    listed = camp("ls")
    assert listed.returncode == 0, listed.stderr
    [row] = [line for line in listed.stdout.splitlines() if "floater" in line]
    assert row.split()[:3] == ["job", str(job.pk), "floater"] and "queued" in row
    assert "Placed on cluster east" in row
    logs = camp("logs", "floater")
    assert logs.returncode == 1 and "is a job" in logs.stderr
    missing = camp("why", "nowhere")
    assert missing.returncode == 1 and "No training job, environment or job nowhere" in missing.stderr
    stopped = camp("stop", "floater")
    assert stopped.returncode == 0 and stopped.stdout.strip() == "floater: cancelled", stopped.stdout
