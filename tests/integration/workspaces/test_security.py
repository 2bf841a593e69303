"""Security review findings on workloads: the environment link is one-time, short-lived and
re-checked against the owner's access on every request; environment variables (often
secrets) are shown only to those who may change the workload; creates honour
Idempotency-Key."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import Client

from registry.models import Image
from tenants import services as tenant_services
from tenants.models import IdempotencyRecord, Membership, Role
from tests.conftest import client_for, make_user
from workspaces import services
from workspaces.models import DevEnvironment, SshKey, TrainingJob

from .conftest import advance
from .test_ssh_keys import public_key

pytestmark = pytest.mark.django_db



def _running_env(world: Any, cluster: Any, name: str = "nb", **kw: Any) -> DevEnvironment:
    env, _ = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=cluster, name=name, kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000, ram_mib=1024, **kw)
    advance(cluster)
    env.refresh_from_db()
    assert env.state == "running"
    return env


def _auth(client: Client, env: DevEnvironment, token: str = "") -> int:
    uri = f"/ws/{env.pk}-{env.name}/lab" + (f"?camp_token={token}" if token else "")
    return client.get(f"/workspaces/auth/{env.pk}/", HTTP_X_ORIGINAL_URI=uri).status_code


def _link(world: Any, env: DevEnvironment) -> str:
    return services.environment_open(actor=world.a.member, env=env).split("camp_token=")[1]


# --- 1. the link is one-time, short-lived, and access is re-checked on every request ----------


def test_link_token_is_accepted_once_then_only_the_cookie_works(
    world: Any, sim_cluster: Any, settings: Any
) -> None:
    settings.SESSION_COOKIE_SECURE = True  # as in production: the cookie is Secure even behind a proxy
    env = _running_env(world, sim_cluster)
    token = _link(world, env)
    first, second = Client(), Client()
    r = first.get(f"/workspaces/auth/{env.pk}/", HTTP_X_ORIGINAL_URI=f"/ws/{env.pk}-nb/?camp_token={token}")
    assert r.status_code == 200
    cookie = r.cookies[f"camp_ws_{env.pk}"]
    assert cookie["httponly"] and cookie["secure"] and cookie["path"] == f"/ws/{env.pk}-nb/"
    assert token not in cookie.value
    # The same link from another browser is refused: it was used.
    assert _auth(second, env, token) == 401
    # The first browser goes on with its cookie (a reload still carrying the used token too).
    assert _auth(first, env) == 200 and _auth(first, env, token) == 200
    row = DevEnvironment.objects.get(pk=env.pk)
    assert row.access_token_used_at is not None and token not in str(row.__dict__)


def test_link_older_than_the_ttl_is_refused(world: Any, sim_cluster: Any, settings: Any) -> None:
    settings.WORKSPACES_LINK_TTL_SECONDS = 300
    env = _running_env(world, sim_cluster)
    token = _link(world, env)
    DevEnvironment.objects.filter(pk=env.pk).update(
        access_token_issued_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=301))
    assert _auth(Client(), env, token) == 401
    fresh = _link(world, env)
    DevEnvironment.objects.filter(pk=env.pk).update(
        access_token_issued_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=200))
    assert _auth(Client(), env, fresh) == 200


def test_link_for_an_environment_not_running_is_refused_and_not_spent(
    world: Any, sim_cluster: Any
) -> None:
    env, token = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000, ram_mib=1024)
    assert _auth(Client(), env, token) == 401  # queued: nothing to reach yet
    advance(sim_cluster)
    assert _auth(Client(), env, token) == 200  # the launch link still works once it runs


def test_owner_losing_access_closes_link_and_cookie(world: Any, sim_cluster: Any) -> None:
    env = _running_env(world, sim_cluster)
    browser = Client()
    assert _auth(browser, env, _link(world, env)) == 200
    unused = _link(world, env)  # rotates the cookie nonce: the old cookie stops working
    assert _auth(browser, env) == 401
    assert _auth(browser, env, unused) == 200
    membership = Membership.objects.get(user=world.a.member, project=world.a.project)
    tenant_services.membership_delete(actor=world.a.owner, membership=membership)
    assert _auth(browser, env) == 401
    assert _auth(Client(), env, _link_as_admin(world, env)) == 401


def _link_as_admin(world: Any, env: DevEnvironment) -> str:
    """A link minted directly (the owner can no longer mint one through the service)."""
    env = DevEnvironment.objects.get(pk=env.pk)
    token = services._issue_link(env)
    env.save()
    return token


def test_deactivated_owner_is_refused(world: Any, sim_cluster: Any) -> None:
    env = _running_env(world, sim_cluster)
    browser = Client()
    assert _auth(browser, env, _link(world, env)) == 200
    spare = _link_as_admin(world, env)
    world.a.member.is_active = False
    world.a.member.save(update_fields=["is_active"])
    assert _auth(browser, env) == 401
    assert _auth(Client(), env, spare) == 401


def test_stopping_rotates_the_nonce(world: Any, sim_cluster: Any) -> None:
    env = _running_env(world, sim_cluster)
    browser = Client()
    assert _auth(browser, env, _link(world, env)) == 200
    services.environment_stop(actor=world.a.member, env=env)
    advance(sim_cluster)
    assert _auth(browser, env) == 401
    services.environment_start(actor=world.a.member, env=DevEnvironment.objects.get(pk=env.pk))
    advance(sim_cluster)
    assert DevEnvironment.objects.get(pk=env.pk).state == "running"
    assert _auth(browser, env) == 401  # the cookie of the last run does not come back to life


def test_a_failed_run_retires_access_on_the_next_tick(world: Any, sim_cluster: Any) -> None:
    from scheduling.models import Job, JobState

    env = _running_env(world, sim_cluster)
    browser = Client()
    assert _auth(browser, env, _link(world, env)) == 200
    Job.objects.filter(pk=env.job_id).update(state=JobState.FAILED)
    assert _auth(browser, env) == 401  # not running
    services.environments_retire_access()
    row = DevEnvironment.objects.get(pk=env.pk)
    assert row.access_nonce == "" and row.access_token_hash == ""


# --- 2. environment variables: values only for those who may change the workload -------------


def _second_member(world: Any) -> Any:
    other = make_user("acme-member2")
    tenant_services.membership_create(actor=world.a.owner, user=other, tenant=world.a.tenant,
                                      project=world.a.project, role=Role.PROJECT_MEMBER)
    return other


def test_environment_env_values_hidden_from_other_members(world: Any, sim_cluster: Any) -> None:
    env, _ = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), cpu_millicores=1000, ram_mib=1024,
        env={"HF_TOKEN": "hf_s3cret", "EPOCHS": "3"})
    other = _second_member(world)
    for user in (world.a.member, world.a.project_admin, world.a.owner, world.admin):
        body = client_for(user).get(f"/api/v1/environments/{env.pk}/").json()
        assert body["env"] == {"HF_TOKEN": "hf_s3cret", "EPOCHS": "3"}, user
    seen = client_for(other).get(f"/api/v1/environments/{env.pk}/")
    assert seen.status_code == 200 and "hf_s3cret" not in seen.content.decode()
    assert sorted(seen.json()["env"]) == ["EPOCHS", "HF_TOKEN"]
    listing = client_for(other).get("/api/v1/environments/").content.decode()
    assert "hf_s3cret" not in listing and "HF_TOKEN" in listing
    page = Client()
    page.force_login(other)
    assert "hf_s3cret" not in page.get(f"/workspaces/environments/{env.pk}/").content.decode()


def test_training_env_values_hidden_from_other_members(world: Any, sim_cluster: Any) -> None:
    owner = client_for(world.a.member)
    r = owner.post("/api/v1/training-jobs/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "ddp", "framework": "pytorch",
        "image": Image.objects.get(name="pytorch-training").pk, "workers": 1, "gpu_count": 1,
        "cpu_millicores": 1000, "ram_mib": 1024, "env": {"WANDB_API_KEY": "wb_s3cret"}}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["env"] == {"WANDB_API_KEY": "wb_s3cret"}
    t = TrainingJob.objects.get(name="ddp")
    assert client_for(world.a.project_admin).get(
        f"/api/v1/training-jobs/{t.pk}/").json()["env"] == {"WANDB_API_KEY": "wb_s3cret"}
    other = _second_member(world)
    seen = client_for(other).get(f"/api/v1/training-jobs/{t.pk}/")
    assert seen.status_code == 200 and "wb_s3cret" not in seen.content.decode()
    assert list(seen.json()["env"]) == ["WANDB_API_KEY"]
    assert "wb_s3cret" not in client_for(other).get("/api/v1/training-jobs/").content.decode()
    page = Client()
    page.force_login(other)
    assert "wb_s3cret" not in page.get(f"/workspaces/training/{t.pk}/").content.decode()


# --- 3. Idempotency-Key on every workload create ----------------------------------------------


def test_environment_create_honours_idempotency_key_and_never_stores_the_link(
    world: Any, sim_cluster: Any
) -> None:
    c = client_for(world.a.member)
    body = {"project": world.a.project.pk, "cluster": "sim", "name": "nb", "kind": "jupyter",
            "image": Image.objects.get(name="pytorch-jupyter").pk, "cpu_millicores": 1000,
            "ram_mib": 1024, "env": {"HF_TOKEN": "hf_s3cret"}}
    first = c.post("/api/v1/environments/", body, format="json", HTTP_IDEMPOTENCY_KEY="env-1")
    assert first.status_code == 201, first.content
    url = first.json()["access_url"]
    assert "camp_token=" in url
    token = url.split("camp_token=")[1]
    record = IdempotencyRecord.objects.get(key="env-1")
    stored = str(record.response_body)
    assert token not in stored and "hf_s3cret" not in stored
    replay = c.post("/api/v1/environments/", body, format="json", HTTP_IDEMPOTENCY_KEY="env-1")
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"] and replay.json()["access_url"] is None
    assert DevEnvironment.objects.filter(name="nb").count() == 1
    changed = c.post("/api/v1/environments/", {**body, "ram_mib": 2048}, format="json",
                     HTTP_IDEMPOTENCY_KEY="env-1")
    assert changed.status_code == 422


def test_training_create_honours_idempotency_key(world: Any, sim_cluster: Any) -> None:
    c = client_for(world.a.member)
    body = {"project": world.a.project.pk, "cluster": "sim", "name": "ddp", "framework": "pytorch",
            "image": Image.objects.get(name="pytorch-training").pk, "workers": 1, "gpu_count": 1,
            "cpu_millicores": 1000, "ram_mib": 1024, "env": {"WANDB_API_KEY": "wb_s3cret"}}
    first = c.post("/api/v1/training-jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    replay = c.post("/api/v1/training-jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="t-1")
    assert first.status_code == replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["id"] == first.json()["id"]
    assert TrainingJob.objects.filter(name="ddp").count() == 1
    assert "wb_s3cret" not in str(IdempotencyRecord.objects.get(key="t-1").response_body)


def test_ssh_key_and_profile_creates_honour_idempotency_key(world: Any) -> None:
    c = client_for(world.a.member)
    key = public_key()
    first = c.post("/api/v1/ssh-keys/", {"public_key": key}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    replay = c.post("/api/v1/ssh-keys/", {"public_key": key}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201, first.content
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert SshKey.objects.filter(user=world.a.member).count() == 1
    admin = client_for(world.admin)
    body = {"name": "small", "cpu_millicores": 1000, "ram_mib": 1024, "home_gib": 5}
    p1 = admin.post("/api/v1/profiles/", body, format="json", HTTP_IDEMPOTENCY_KEY="p-1")
    p2 = admin.post("/api/v1/profiles/", body, format="json", HTTP_IDEMPOTENCY_KEY="p-1")
    assert p1.status_code == 201, p1.content
    assert p2.status_code == 201 and p2["Idempotent-Replayed"] == "true"
    assert p2.json()["id"] == p1.json()["id"]
