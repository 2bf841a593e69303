"""Workloads on the real services and the simulated backend (PostgreSQL, no mocks)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from registry.models import Image
from scheduling.models import SimulatedPod
from tenants import services as tenant_services
from tenants.models import AuditEvent, Quota
from workspaces import services
from workspaces.models import DevEnvironment, TrainingJob

from .conftest import advance

pytestmark = pytest.mark.django_db


def _jupyter(world: Any, cluster: Any, name: str = "nb", **kw: Any) -> tuple[DevEnvironment, str]:
    kw.setdefault("image", Image.objects.get(name="pytorch-jupyter"))
    kw.setdefault("kind", "jupyter")
    kw.setdefault("gpu_count", 1)
    kw.setdefault("gpu_memory_mib", 10000)
    kw.setdefault("gpu_cores_percent", 25)
    return services.environment_launch(actor=world.a.member, project=world.a.project, cluster=cluster,
                                       name=name, **kw)


def _audit_actions(obj: Any) -> list[str]:
    return list(AuditEvent.objects.filter(target_id=str(obj.pk), target_type=obj._meta.label_lower)
                .order_by("id").values_list("action", flat=True))


def test_jupyter_launch_runs_with_url_and_hashed_token(world: Any, sim_cluster: Any) -> None:
    env, token = _jupyter(world, sim_cluster)
    assert env.state == "queued" and len(token) >= 43
    assert env.access_token_hash != token and services.token_matches(env, token)
    advance(sim_cluster)
    env.refresh_from_db()
    assert env.state == "running"
    pod = SimulatedPod.objects.get(name=env.job.allocations.get().pod_name)
    assert pod.annotations["camp.io/env"]["CAMP_WORKLOAD"] == "jupyter"
    assert pod.labels["camp.io/workspace"] == str(env.pk)
    url = services.environment_open(actor=world.a.member, env=env)
    # A simulated cluster runs no JupyterLab: the link is Camp's own page saying so.
    assert url.startswith(f"http://localhost:8000/workspaces/simulated/ws/{env.pk}-nb/?camp_token=")
    env.refresh_from_db()
    assert not services.token_matches(env, token)  # a new link retires the old one
    assert services.token_matches(env, url.split("camp_token=")[1])
    with pytest.raises(PermissionDenied):
        services.environment_open(actor=world.a.project_admin, env=env)  # only the owner


def test_stop_start_keeps_volume_and_delete(world: Any, sim_cluster: Any) -> None:
    env, _ = _jupyter(world, sim_cluster)
    advance(sim_cluster)
    first_job = DevEnvironment.objects.get(pk=env.pk).job
    services.environment_stop(actor=world.a.member, env=env)
    advance(sim_cluster)
    env.refresh_from_db()
    assert env.state == "stopped" and env.stop_reason == "Stopped by acme-member"
    with pytest.raises(ValidationError) as exc:
        services.environment_stop(actor=world.a.member, env=env)
    assert "already stopped" in str(exc.value)
    services.environment_start(actor=world.a.member, env=env)
    advance(sim_cluster)
    env.refresh_from_db()
    assert env.state == "running" and env.runs == 2 and env.job != first_job
    assert env.home_claim == f"ws-{env.pk}-home"  # same volume name on every run
    services.environment_delete(actor=world.a.project_admin, env=env)
    assert not DevEnvironment.objects.filter(pk=env.pk).exists()
    assert _audit_actions(env) == ["environment.launched", "environment.stopped", "environment.started",
                                   "environment.deleted"]


def test_idle_culling_warns_then_stops(world: Any, sim_cluster: Any) -> None:
    services.workspace_policy_set(actor=world.a.project_admin, project=world.a.project,
                                  idle_minutes=30, warning_minutes=10)
    env, _ = _jupyter(world, sim_cluster)
    advance(sim_cluster)
    now = timezone.now()
    assert services.environments_cull(now=now + dt.timedelta(minutes=10)) == {"warned": [], "culled": []}
    result = services.environments_cull(now=now + dt.timedelta(minutes=21))
    assert result["warned"] == [env.pk]
    env.refresh_from_db()
    assert "will be stopped at" in env.cull_warning and "no activity for 30 minutes" in env.cull_warning
    assert env.state == "running"
    result = services.environments_cull(now=now + dt.timedelta(minutes=32))
    assert result["culled"] == [env.pk]
    advance(sim_cluster)
    env.refresh_from_db()
    assert env.state == "stopped" and env.stop_reason.startswith("Stopped by idle culling")
    assert env.job.reason.startswith("Stopped by idle culling")
    events = AuditEvent.objects.filter(target_id=str(env.pk), action__startswith="environment.cull")
    assert [(e.action, e.actor_username) for e in events.order_by("id")] == [
        ("environment.cull_warned", "culler"), ("environment.culled", "culler")]
    services.environment_start(actor=world.a.member, env=env)  # a culled environment starts again
    assert DevEnvironment.objects.get(pk=env.pk).state == "queued"


def test_activity_withdraws_the_warning(world: Any, sim_cluster: Any) -> None:
    env, _ = _jupyter(world, sim_cluster)
    advance(sim_cluster)
    later = timezone.now() + dt.timedelta(minutes=55)
    assert services.environments_cull(now=later)["warned"] == [env.pk]
    services.environment_touch(env_id=env.pk, at=later)
    env.refresh_from_db()
    assert env.cull_warning == ""
    assert services.environments_cull(now=later + dt.timedelta(minutes=20)) == {"warned": [], "culled": []}


def test_quota_refuses_a_request_that_never_fits_naming_the_resource(world: Any, sim_cluster: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_limit": 8})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_limit": 2})
    with pytest.raises(ValidationError) as exc:
        services.training_submit(actor=world.a.member, project=world.a.project, cluster=sim_cluster,
                                 name="big", framework="pytorch", image_reference="pytorch/pytorch:2",
                                 workers=4, gpu_count=1)
    errors = exc.value.message_dict
    assert list(errors) == ["gpu_count"]
    assert "4 GPU" in errors["gpu_count"][0] and "GPU limit of 2" in errors["gpu_count"][0]
    assert not TrainingJob.objects.exists()
    assert Quota.objects.filter(project=world.a.project).exists()


def test_bad_input_names_each_field(world: Any, sim_cluster: Any) -> None:
    cases = [
        ({"kind": "emacs"}, "kind"),
        ({"image_reference": "UPPER/Case:tag", "image": None}, "image_reference"),
        ({"gpu_count": 0, "gpu_memory_mib": 100}, "gpu_count"),
        ({"env": {"CAMP_X": "1"}}, "env"),
        ({"kind": "ssh", "image": Image.objects.get(name="pytorch-ssh"), "ssh_public_keys": "nope"},
         "ssh_public_keys"),
        ({"image": Image.objects.get(name="pytorch-training")}, "image"),
        ({"home_gib": 0}, "home_gib"),
    ]
    for kw, field in cases:
        with pytest.raises(ValidationError) as exc:
            _jupyter(world, sim_cluster, name="bad", **kw)
        assert field in exc.value.message_dict, (kw, exc.value.message_dict)


def test_open_on_a_simulated_cluster_lands_on_camps_own_page_and_counts_as_activity(
        world: Any, sim_cluster: Any) -> None:
    """The demo's Open used to lead to workspaces.camp.local, which does not resolve (issue 32):
    it now lands on Camp's page that says the cluster is simulated and what opens on a real one,
    spends the link as a real cluster does, and withdraws a culling warning."""
    from django.test import Client

    env, _ = _jupyter(world, sim_cluster)
    advance(sim_cluster)
    later = timezone.now() + dt.timedelta(minutes=55)
    assert services.environments_cull(now=later)["warned"] == [env.pk]
    url = services.environment_open(actor=world.a.member, env=env)
    path = url.removeprefix("http://localhost:8000")
    DevEnvironment.objects.filter(pk=env.pk).update(cull_warning="idle", last_activity_at=None)
    owner = Client()
    owner.force_login(world.a.member)
    page = owner.get(path)
    assert page.status_code == 200
    text = page.content.decode()
    assert "simulated cluster" in text and f"https://workspaces.camp.local/ws/{env.pk}-nb/" in text
    env.refresh_from_db()
    assert env.cull_warning == "" and env.last_activity_at is not None
    assert env.access_token_used_at is not None  # the one-time link is spent
    colleague = Client()
    colleague.force_login(world.a.project_admin)
    assert colleague.get(path).status_code == 403  # only the owner opens it
    stranger = Client()
    stranger.force_login(world.b.member)
    assert stranger.get(path).status_code == 404
