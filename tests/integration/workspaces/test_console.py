"""Console pages for workloads and images: forms with field errors, lists, detail pages
with how to open, stop/start/delete; CSRF enforced; the ingress auth endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from registry.models import ExternalRegistry, Image
from workspaces import services
from workspaces.models import DevEnvironment, TrainingJob

from .conftest import advance

pytestmark = pytest.mark.django_db


def _login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def test_launch_form_shows_field_errors_then_launches(world: Any, sim_cluster: Any) -> None:
    c = _login(world.a.member)
    page = c.get("/workspaces/environments/new/")
    assert page.status_code == 200 and b"Launch a dev environment" in page.content
    bad = c.post("/workspaces/environments/new/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "Bad Name", "kind": "jupyter",
        "image_reference": "", "gpu_count": 1, "gpu_memory_mib": 0, "gpu_cores_percent": 0,
        "cpu_millicores": 1000, "ram_mib": 2048, "home_gib": 5})
    assert bad.status_code == 200
    text = bad.content.decode()
    assert "Choose an image from the catalog" in text  # the service's error, on the form
    jupyter = Image.objects.get(name="pytorch-jupyter")
    ok = c.post("/workspaces/environments/new/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "nb", "kind": "jupyter",
        "image": jupyter.pk, "gpu_count": 1, "gpu_memory_mib": 8000, "gpu_cores_percent": 20,
        "cpu_millicores": 1000, "ram_mib": 2048, "home_gib": 5, "env": "EPOCHS=3"})
    env = DevEnvironment.objects.get(name="nb")
    assert ok.status_code == 302 and ok["Location"] == f"/workspaces/environments/{env.pk}/"
    assert env.env == {"EPOCHS": "3"}
    advance(sim_cluster)
    detail = c.get(f"/workspaces/environments/{env.pk}/").content.decode()
    assert "Running" in detail and f"/ws/{env.pk}-nb/" in detail and "Open JupyterLab" in detail
    assert "Jupyter Server is running" in detail  # synthetic logs of the simulated pod
    listing = c.get("/workspaces/environments/").content.decode()
    assert "nb" in listing and "acme/acme-p1" in listing
    # Open: a redirect to the URL with a fresh token; the token is checked by the auth endpoint.
    opened = c.post(f"/workspaces/environments/{env.pk}/open/")
    assert opened.status_code == 302 and "camp_token=" in opened["Location"]
    token = opened["Location"].split("camp_token=")[1]
    anon = Client()
    path = f"/ws/{env.pk}-nb/lab?camp_token={token}"
    granted = anon.get(f"/workspaces/auth/{env.pk}/", HTTP_X_ORIGINAL_URI=path)
    assert granted.status_code == 200
    cookie = granted.cookies[f"camp_ws_{env.pk}"]
    assert cookie["httponly"] and cookie["path"] == f"/ws/{env.pk}-nb/"
    auth, api_path = f"/workspaces/auth/{env.pk}/", f"/ws/{env.pk}-nb/api"
    assert anon.get(auth, HTTP_X_ORIGINAL_URI=api_path).status_code == 200
    assert Client().get(f"/workspaces/auth/{env.pk}/",
                        HTTP_X_ORIGINAL_URI=f"/ws/{env.pk}-nb/?camp_token=guess").status_code == 401
    c.post(f"/workspaces/environments/{env.pk}/open/")  # a new link retires the old cookie too
    assert anon.get(auth, HTTP_X_ORIGINAL_URI=api_path).status_code == 401
    # Stop, start, delete from the page.
    assert c.post(f"/workspaces/environments/{env.pk}/stop/").status_code == 302
    advance(sim_cluster)
    assert "Start again" in c.get(f"/workspaces/environments/{env.pk}/").content.decode()
    assert c.post(f"/workspaces/environments/{env.pk}/start/").status_code == 302
    assert c.post(f"/workspaces/environments/{env.pk}/delete/").status_code == 302
    assert not DevEnvironment.objects.filter(pk=env.pk).exists()


def test_other_tenants_pages_are_404_and_forms_need_csrf(world: Any, sim_cluster: Any) -> None:
    env, _ = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000, ram_mib=1024)
    foreign = _login(world.b.owner)
    assert foreign.get(f"/workspaces/environments/{env.pk}/").status_code == 404
    assert foreign.post(f"/workspaces/environments/{env.pk}/stop/").status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(world.a.member)
    assert strict.post(f"/workspaces/environments/{env.pk}/stop/").status_code == 403
    assert DevEnvironment.objects.get(pk=env.pk).state == "queued"


def test_training_pages(world: Any, sim_cluster: Any) -> None:
    c = _login(world.a.member)
    assert c.get("/workspaces/training/new/").status_code == 200
    bad = c.post("/workspaces/training/new/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "ddp", "framework": "pytorch",
        "image_reference": "pytorch/pytorch:2.4", "workers": 2, "gpu_count": 1, "gpu_memory_mib": 0,
        "gpu_cores_percent": 0, "cpu_millicores": 1000, "ram_mib": 2048, "checkpoint_dir": "relative/dir",
        "checkpoint_volume_gib": 0, "retry_limit": 0, "priority_class": "normal", "command": "torchrun t.py"})
    assert "An absolute path inside the container." in bad.content.decode()
    ok = c.post("/workspaces/training/new/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "ddp", "framework": "pytorch",
        "image_reference": "pytorch/pytorch:2.4", "workers": 2, "gpu_count": 1, "gpu_memory_mib": 0,
        "gpu_cores_percent": 0, "cpu_millicores": 1000, "ram_mib": 2048, "checkpoint_dir": "/ckpt",
        "checkpoint_volume_gib": 0, "retry_limit": 0, "priority_class": "normal", "preemptible": "on",
        "command": "torchrun --nproc-per-node 1 train.py", "log_dir": "/logs"})
    t = TrainingJob.objects.get(name="ddp")
    assert ok.status_code == 302 and t.command == ["torchrun", "--nproc-per-node", "1", "train.py"]
    advance(sim_cluster)
    page = c.get(f"/workspaces/training/{t.pk}/").content.decode()
    assert "Running" in page and "rank 1 of 2" in page and "TensorBoard" in page
    assert f"ddp-{t.job.pk}-worker-1" in page
    assert "ddp" in c.get("/workspaces/training/").content.decode()
    assert c.post(f"/workspaces/training/{t.pk}/stop/").status_code == 302
    assert "Stopped by acme-member" in c.get(f"/workspaces/training/{t.pk}/").content.decode()


def test_registry_pages_never_show_the_password(world: Any) -> None:
    c = _login(world.a.owner)
    assert "quay.io/jupyter/pytorch-notebook" in c.get("/registry/images/").content.decode()
    resp = c.post("/registry/registries/", {"tenant": world.a.tenant.pk, "name": "ghcr", "server": "ghcr.io",
                                            "username": "bot", "password": "s3cret-pat"})
    assert resp.status_code == 302
    r = ExternalRegistry.objects.get(name="ghcr")
    assert r.has_credentials and "s3cret-pat" not in r.password_encrypted
    page = c.get("/registry/registries/").content.decode()
    assert "ghcr.io" in page and "s3cret-pat" not in page and "stored" in page
    bad = c.post("/registry/images/", {"tenant": world.a.tenant.pk, "name": "mine", "reference": "Bad Ref!",
                                       "variant": "training", "framework": "other"})
    assert "contains no spaces" in bad.content.decode()
    member = _login(world.a.member)
    denied = member.post("/registry/images/", {"tenant": world.a.tenant.pk, "name": "mine",
                                               "reference": "ghcr.io/acme/x:1", "variant": "training",
                                               "framework": "other"})
    assert denied.status_code == 403
