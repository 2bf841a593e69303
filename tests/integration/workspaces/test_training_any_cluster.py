"""Training jobs launched for any cluster, a set of clusters or cluster labels (issue 16), on
real PostgreSQL with two simulated clusters ("east": x86 A100s in eu-east, "west": ARM GH200s
in us-west): the portal form, the API, ``camp submit --cluster``, cluster-bound volumes, runs
after the first, the cluster delete guard and tenant isolation."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.utils import timezone

from scheduling import services as scheduling
from scheduling.models import Cluster, Job, JobState, SimulatedPod
from scheduling.services import placement
from tenants.models import AuditEvent
from tests.conftest import client_for
from tests.integration.scheduling.test_multicluster import fill, two, x86_image
from workspaces import services
from workspaces.models import TrainingJob

from .conftest import advance

pytestmark = pytest.mark.django_db
__all__ = ["two"]  # the fixture, imported for pytest

FORM = {"framework": "pytorch", "image_reference": "pytorch/pytorch:2.4", "workers": 2, "gpu_count": 1,
        "gpu_memory_mib": 0, "gpu_cores_percent": 0, "cpu_millicores": 1000, "ram_mib": 2048,
        "checkpoint_dir": "/ckpt", "checkpoint_volume_gib": 0, "retry_limit": 0,
        "priority_class": "normal", "preemptible": "on", "command": "torchrun train.py",
        "duration_seconds": 3600}
API = {"framework": "pytorch", "image_reference": "pytorch/pytorch:2.4", "workers": 2, "gpu_count": 1,
       "cpu_millicores": 1000, "ram_mib": 2048, "duration_seconds": 3600}


def _login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _place(*clusters: Cluster) -> None:
    assert placement.placement_run() is not None
    for c in clusters:
        advance(c)


def test_the_form_launches_for_any_cluster_and_the_page_follows_it_there(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    fill(world, east)  # east has no GPU free: the job must go west
    c = _login(world.a.member)
    form = c.get("/workspaces/training/new/").content.decode()
    assert "Any cluster" in form and '<option value="east"' in form and '<option value="west"' in form
    assert "region=us-west" in form  # the labels the user's clusters have, as a hint
    ok = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "",
                                              "name": "anywhere"})
    assert ok.status_code == 302, ok.content.decode()[:2000]
    t = TrainingJob.objects.get(name="anywhere")
    assert t.cluster is None and t.floating and t.cluster_choice == {}
    assert t.job is not None and t.job.floating and t.job.cluster_id is None
    page = c.get(f"/workspaces/training/{t.pk}/").content.decode()
    assert "Waiting for a cluster:" in page and "in the global queue" in page and "any cluster" in page
    event = AuditEvent.objects.get(action="training.submitted", target_id=str(t.pk))
    assert event.after["cluster"] is None and event.after["cluster_choice"] == {}

    _place(east, west)
    t.refresh_from_db()
    assert t.job is not None and t.job.cluster == west and t.run_cluster == west
    page = c.get(f"/workspaces/training/{t.pk}/").content.decode()
    assert "on cluster <strong>west</strong>" in page and "chosen by Camp" in page
    assert "Other clusters:" in page and "cluster east:" in page
    assert "Running" in page and "rank 1 of 2" in page  # its pods run, with logs, on west
    listed = c.get("/workspaces/training/").content.decode()
    assert "west <span class=\"muted small\">(chosen by Camp)</span>" in listed
    # The API lists it under the cluster it runs on.
    api = client_for(world.a.member)
    assert [x["name"] for x in api.get(f"/api/v1/training-jobs/?cluster={west.pk}").json()["results"]] \
        == ["anywhere"]
    assert api.get(f"/api/v1/training-jobs/?cluster={east.pk}").json()["results"] == []
    # Deleting it records where it ran.
    assert api.delete(f"/api/v1/training-jobs/{t.pk}/").status_code == 204
    gone = AuditEvent.objects.get(action="training.deleted", target_id=str(t.pk))
    assert gone.before["ran_on"] == ["west"] and gone.before["cluster"] is None


def test_the_form_takes_labels_and_names_a_bad_one(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    c = _login(world.a.member)
    bad = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "",
                                               "cluster_labels": "region=mars", "name": "mars"})
    assert bad.status_code == 200 and "No enabled cluster matches this choice." in bad.content.decode()
    both = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "east",
                                                "cluster_labels": "region=eu-east", "name": "both"})
    assert both.status_code == 200 and "pick Any cluster to use it" in both.content.decode()
    in_set = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "",
                                                  "cluster_set": ["west"], "name": "in-set"})
    assert in_set.status_code == 302
    assert TrainingJob.objects.get(name="in-set").cluster_choice == {"clusters": ["west"]}
    ok = c.post("/workspaces/training/new/", {**FORM, "project": world.a.project.pk, "cluster": "",
                                              "cluster_labels": "region=eu-east", "name": "eu"})
    assert ok.status_code == 302
    t = TrainingJob.objects.get(name="eu")
    assert t.cluster_choice == {"labels": {"region": "eu-east"}}
    assert not TrainingJob.objects.filter(name__in=["mars", "both"]).exists()
    _place(east, west)
    t.refresh_from_db()
    assert t.run_cluster == east


def test_the_api_round_trip_with_a_label_choice(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    api = client_for(world.a.member)
    body = {**API, "project": world.a.project.pk, "name": "api-west",
            "cluster_choice": {"labels": {"region": "us-west"}}}
    made = api.post("/api/v1/training-jobs/", body, format="json")
    assert made.status_code == 201, made.content
    data = made.json()
    assert data["cluster"] is None and data["floating"] is True
    assert data["cluster_choice"] == {"labels": {"region": "us-west"}}
    run = Job.objects.get(pk=data["run"]["id"])
    assert run.floating and run.cluster_choice == {"labels": {"region": "us-west"}}
    why = api.get(f"/api/v1/training-jobs/{data['id']}/why/").json()
    assert why["state"] == "queued" and "global queue" in why["hint"]
    _place(east, west)
    data = api.get(f"/api/v1/training-jobs/{data['id']}/").json()
    assert data["cluster"] == "west" and data["floating"] is True
    assert data["why_across_clusters"].startswith("cluster west")
    assert "cluster east: does not have region=us-west" in data["why_across_clusters"]
    # Pinned still works, and the run is pinned too.
    pinned = api.post("/api/v1/training-jobs/", {**API, "project": world.a.project.pk, "name": "api-east",
                                                  "cluster": "east"}, format="json").json()
    assert pinned["cluster"] == "east" and pinned["floating"] is False
    assert Job.objects.get(pk=pinned["run"]["id"]).cluster == east


def test_the_api_names_the_field_of_a_choice_no_cluster_can_honour(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from registry.models import Image

    api = client_for(world.a.member)

    def post(name: str, **extra: Any) -> Any:
        return api.post("/api/v1/training-jobs/", {**API, "project": world.a.project.pk, "name": name,
                                                   **extra}, format="json")

    bad = post("mars", cluster_choice={"labels": {"region": "mars"}})
    assert bad.status_code == 400 and "cluster_choice.labels" in bad.json()
    nowhere = post("nowhere", cluster_choice={"clusters": ["east", "nowhere"]})
    assert nowhere.status_code == 400 and "nowhere" in str(nowhere.json()["cluster_choice.clusters"])
    both = post("both", cluster="east", cluster_choice={"clusters": ["west"]})
    assert both.status_code == 400 and "cluster_choice" in both.json()
    x86_image(world)
    image = Image.objects.get(name="x86-only")
    arm = post("arm", image=image.pk, image_reference="", cluster_choice={"clusters": ["west"]})
    assert arm.status_code == 400 and "linux/amd64" in str(arm.json()["image"])
    not_names = post("ints", cluster_choice={"clusters": [1]})
    assert not_names.status_code == 400
    assert not_names.json()["cluster_choice.clusters"] == ["A list of cluster names."]
    assert not TrainingJob.objects.exists() and not Job.objects.exists()
    # An empty choice beside a named cluster is no choice: it is pinned.
    pinned = post("pinned", cluster="east", cluster_choice={"clusters": []})
    assert pinned.status_code == 201 and pinned.json()["floating"] is False


def test_a_run_still_in_the_global_queue_shows_logs_stops_and_deletes(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    api = client_for(world.a.member)
    made = api.post("/api/v1/training-jobs/", {**API, "project": world.a.project.pk, "name": "unplaced",
                                               "cluster_choice": {"clusters": ["east", "west"]}},
                    format="json").json()
    assert made["cluster"] is None and made["state"] == "queued"
    assert api.get(f"/api/v1/training-jobs/{made['id']}/logs/").json() == []
    page = _login(world.a.member).get(f"/workspaces/training/{made['id']}/").content.decode()
    assert "Waiting for a cluster:" in page and "clusters east, west" in page
    stopped = api.post(f"/api/v1/training-jobs/{made['id']}/stop/")
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert Job.objects.get(pk=made["run"]["id"]).state == JobState.CANCELLED
    assert api.delete(f"/api/v1/training-jobs/{made['id']}/").status_code == 204
    gone = AuditEvent.objects.get(action="training.deleted", target_id=str(made["id"]))
    assert gone.before["cluster"] is None and gone.before["cluster_choice"] == {"clusters": ["east", "west"]}


def test_the_quota_pre_check_refuses_only_what_no_allowed_cluster_could_ever_start(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    from tenants import services as tenant_services

    east, west = two
    tenant_services.quota_set(actor=world.admin, scope="cluster", cluster=east, values={"gpus_limit": 2})

    def launch(name: str, **where: Any) -> TrainingJob:
        return services.training_submit(actor=world.a.member, project=world.a.project, name=name,
                                        framework="pytorch", image_reference="pytorch/pytorch:2.4",
                                        workers=4, gpu_count=1, cpu_millicores=1000, ram_mib=2048, **where)

    with pytest.raises(ValidationError) as err:
        launch("east-only", cluster_choice={"clusters": ["east"]})
    assert "GPU limit of 2" in err.value.message_dict["gpu_count"][0]
    with pytest.raises(ValidationError) as err:  # only east has A100s: "any" cluster is east here
        launch("a100s", gpu_models=["A100-80G"])
    assert "GPU limit of 2" in err.value.message_dict["gpu_count"][0]
    t = launch("anywhere")  # four GPUs can never start on east, but can on west
    _place(east, west)
    t.refresh_from_db()
    assert t.run_cluster == west


def test_a_cluster_bound_volume_needs_a_named_cluster(world: Any, two: tuple[Cluster, Cluster]) -> None:
    api = client_for(world.a.member)
    base = {**API, "project": world.a.project.pk}
    data = api.post("/api/v1/training-jobs/", {**base, "name": "data", "data_volume": "imagenet"},
                    format="json")
    assert data.status_code == 400 and "name that cluster" in str(data.json()["data_volume"])
    ckpt = api.post("/api/v1/training-jobs/", {**base, "name": "ckpt", "checkpoint_dir": "/ckpt",
                                               "checkpoint_volume_gib": 10,
                                               "cluster_choice": {"labels": {"region": "eu-east"}}},
                    format="json")
    assert ckpt.status_code == 400 and "checkpoint_volume_gib" in ckpt.json()
    pinned = api.post("/api/v1/training-jobs/", {**base, "name": "data", "data_volume": "imagenet",
                                                 "cluster": "east"}, format="json")
    assert pinned.status_code == 201, pinned.content
    form = _login(world.a.member).post("/workspaces/training/new/", {
        **FORM, "project": world.a.project.pk, "cluster": "", "name": "form-data", "data_volume": "imagenet"})
    assert "name that cluster to mount it" in form.content.decode()


def _fail_run(t: TrainingJob) -> Job:
    """Its current run's pods fail (the simulated cluster reports it at the next reconcile)."""
    t.refresh_from_db()
    job = t.job
    assert job is not None and job.cluster is not None and job.state == JobState.RUNNING
    SimulatedPod.objects.filter(cluster=job.cluster, name__startswith=f"{job.name}-{job.pk}-").update(
        fail=True, finish_at=timezone.now() - dt.timedelta(seconds=1))
    advance(job.cluster)
    job.refresh_from_db()
    assert job.state == JobState.FAILED
    return job


def test_a_retry_floats_again_and_no_cluster_with_one_of_its_runs_can_go(
        world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    t = services.training_submit(actor=world.a.member, project=world.a.project, name="retry",
                                 framework="pytorch", image_reference="pytorch/pytorch:2.4", workers=1,
                                 gpu_count=1, cpu_millicores=1000, ram_mib=2048, retry_limit=2,
                                 cluster_choice={"clusters": ["east", "west"]})
    _place(east, west)
    t.refresh_from_db()
    assert t.job is not None and t.job.cluster is not None
    there = t.job.cluster
    other = west if there == east else east
    with pytest.raises(ValidationError) as err:
        scheduling.cluster_delete(actor=world.admin, cluster=there)
    assert "1 job and 1 training job still use this cluster" in str(err.value)
    first = _fail_run(t)
    assert services.training_sync(training=t) == "retried"
    t.refresh_from_db()
    assert t.job is not None and t.job.pk != first.pk
    assert t.job.floating and t.job.cluster_id is None
    assert t.job.cluster_choice == {"clusters": ["east", "west"]}
    assert t.run_cluster is None
    page = _login(world.a.member).get(f"/workspaces/training/{t.pk}/").content.decode()
    assert "in the global queue" in page
    # Its first run (and with it restarts and lost GPU time) stays: the cluster cannot go.
    with pytest.raises(ValidationError) as err:
        scheduling.cluster_delete(actor=world.admin, cluster=there)
    assert "1 training job still uses this cluster" in str(err.value)
    assert Job.objects.filter(pk=first.pk).exists()
    # A cluster of its set is disabled: the next run leaves it out of its choice ...
    _place(east, west)
    _fail_run(t)
    scheduling.cluster_update(actor=world.admin, cluster=there, enabled=False)
    assert services.training_sync(training=t) == "retried"
    t.refresh_from_db()
    assert t.job is not None and t.job.cluster_choice == {"clusters": [other.name]}
    assert t.cluster_choice == {"clusters": ["east", "west"]}  # what was asked is kept
    _place(other)
    t.refresh_from_db()
    assert t.run_cluster == other
    # ... and when none is left, the training job ends saying why (audited), not failing every tick.
    t.retry_limit = 3
    t.save(update_fields=["retry_limit"])
    _fail_run(t)
    scheduling.cluster_update(actor=world.admin, cluster=other, enabled=False)
    assert services.training_sync(training=t) == "refused"
    t.refresh_from_db()
    assert "None of its clusters (east, west) is enabled any more." in t.stop_reason
    assert AuditEvent.objects.filter(action="training.run_refused", target_id=str(t.pk)).exists()
    from workspaces.tasks import workspaces_tick

    assert workspaces_tick.run()["trainings"] == 0  # nothing left for the tick to retry
    page = _login(world.a.member).get(f"/workspaces/training/{t.pk}/").content.decode()
    assert "None of its clusters" in page


def test_a_floating_job_released_by_its_dependency_floats(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    common: dict[str, Any] = {"actor": world.a.member, "project": world.a.project, "framework": "pytorch",
                              "image_reference": "pytorch/pytorch:2.4", "workers": 1, "gpu_count": 1,
                              "cpu_millicores": 1000, "ram_mib": 2048}
    prep = services.training_submit(name="prep", cluster=east, **common)
    main = services.training_submit(name="main", depends_on=[prep],
                                    cluster_choice={"labels": {"region": "us-west"}}, **common)
    assert main.job is None and main.state == "waiting"
    page = _login(world.a.member).get(f"/workspaces/training/{main.pk}/").content.decode()
    assert "for clusters labelled region=us-west" in page
    advance(east)
    prep.refresh_from_db()
    assert prep.job is not None and prep.job.state == JobState.RUNNING
    SimulatedPod.objects.filter(cluster=east, name__startswith=f"prep-{prep.job.pk}-").update(
        finish_at=timezone.now() - dt.timedelta(seconds=1))
    advance(east)
    assert services.training_sync(training=main) == "submitted"
    main.refresh_from_db()
    assert main.job is not None and main.job.floating and main.job.cluster_id is None
    _place(east, west)
    main.refresh_from_db()
    assert main.run_cluster == west


def test_tenants_see_and_pick_only_what_they_may_use(world: Any, two: tuple[Cluster, Cluster]) -> None:
    east, west = two
    theirs = services.training_submit(actor=world.a.member, project=world.a.project, name="acme-any",
                                      framework="pytorch", image_reference="pytorch/pytorch:2.4",
                                      workers=1, gpu_count=1, cpu_millicores=1000, ram_mib=2048)
    _place(east, west)
    theirs.refresh_from_db()
    assert theirs.job is not None and theirs.job.cluster_id is not None
    other = client_for(world.b.member)
    # Another tenant's floating job is not listed, not even by the cluster it runs on, nor shown.
    assert other.get(f"/api/v1/training-jobs/?cluster={theirs.job.cluster_id}").json()["results"] == []
    assert other.get(f"/api/v1/training-jobs/{theirs.pk}/").status_code == 404
    assert _login(world.b.member).get(f"/workspaces/training/{theirs.pk}/").status_code == 404
    # ... nor launched into its project.
    into = other.post("/api/v1/training-jobs/", {**API, "project": world.a.project.pk, "name": "x"},
                      format="json")
    assert into.status_code == 400 and "project" in into.json()
    # A disabled cluster is neither offered nor accepted, by name or in a set.
    scheduling.cluster_update(actor=world.admin, cluster=west, enabled=False)
    form = _login(world.b.member).get("/workspaces/training/new/").content.decode()
    assert '<option value="east"' in form and '<option value="west"' not in form
    assert world.a.project.name not in form
    named = other.post("/api/v1/training-jobs/", {**API, "project": world.b.project.pk, "name": "w",
                                                  "cluster": "west"}, format="json")
    assert named.status_code == 400 and "cluster" in named.json()
    in_set = other.post("/api/v1/training-jobs/", {**API, "project": world.b.project.pk, "name": "w",
                                                   "cluster_choice": {"clusters": ["west"]}}, format="json")
    assert in_set.status_code == 400 and "cluster_choice.clusters" in in_set.json()
    # Someone in no tenant is offered no cluster at all.
    bare = _login(world.outsider).get("/workspaces/training/new/").content.decode()
    assert '<option value="east"' not in bare


@pytest.mark.django_db(transaction=True)
def test_camp_submit_cluster_option_floats_a_training_job(world: Any, two: tuple[Cluster, Cluster],
                                                          live_server: Any, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tenants import services as tenant_services

    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    project = f"{world.a.tenant.name}/{world.a.project.name}"
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    path = tmp_path / "train.yaml"

    def camp(name: str, where: str) -> subprocess.CompletedProcess[str]:
        path.write_text(f"kind: TrainingJob\nname: {name}\nproject: {project}\ncluster: east\n"
                        f"framework: pytorch\nimage_reference: pytorch/pytorch:2.4\nworkers: 1\n"
                        f"gpu_count: 1\ncpu_millicores: 1000\nram_mib: 2048\n")
        args = ["submit", "-f", str(path), "--cluster", where]
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)

    for name, where, choice in (("t-any", "any", {}), ("t-set", "east,west", {"clusters": ["east", "west"]}),
                                ("t-us", "region=us-west", {"labels": {"region": "us-west"}})):
        done = camp(name, where)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"training job {name}" in done.stdout
        t = TrainingJob.objects.get(name=name)
        assert t.cluster is None and t.cluster_choice == choice
        assert t.job is not None and t.job.floating and t.job.cluster_choice == choice
    pinned = camp("t-west", "west")
    assert pinned.returncode == 0 and "on west" in pinned.stdout
    assert TrainingJob.objects.get(name="t-west").cluster.name == "west"
    bad = camp("t-mars", "region=mars")
    assert bad.returncode == 1 and "cluster_choice.labels" in bad.stdout + bad.stderr
