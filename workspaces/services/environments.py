"""Dev environments: launch, stop, start, delete, open, and activity touches."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from registry.models import Image, Variant
from scheduling import services as scheduling
from scheduling.models import (
    Cluster,
    Job,
    PriorityClass,
)
from tenants import permissions
from tenants.audit import snapshot
from tenants.models import Project, User

from ..kinds import WorkloadKind, kind_check, kind_run, register_kind
from ..models import (
    DevEnvironment,
    EnvKind,
    Profile,
    SshKey,
)
from ..pods import environment_of_job, environment_specs
from ..quota import refuse_if_over_storage
from ..selectors import environment_url, policy_for
from .access import ACCESS_FIELDS, _clean_ssh_keys, _issue_link, _retire_access
from .common import (
    ENV_DURATION_SECONDS,
    ENV_FIELDS,
    _audit,
    _clean_cluster,
    _clean_env,
    _clean_shape,
    _require,
    _resolve_image,
    _save,
    enqueue_on_commit,
    refuse_unrunnable,
)
from .policies import _check_profile

# --- dev environments -----------------------------------------------------------------------

VARIANT_OF = {EnvKind.JUPYTER: Variant.JUPYTER, EnvKind.VSCODE: Variant.VSCODE, EnvKind.SSH: Variant.SSH}


def _env_group(env: DevEnvironment) -> dict[str, Any]:
    return {
        "name": env.kind,
        "replicas": 1,
        "gpu_count": env.gpu_count,
        "gpu_memory_mib": env.gpu_memory_mib,
        "gpu_cores_percent": env.gpu_cores_percent,
        "exclusive": env.exclusive,
        "gpu_models": list(env.gpu_models or []),
        "cpu_millicores": env.cpu_millicores,
        "ram_mib": env.ram_mib,
        "image": env.image_reference,
        "env": dict(env.env),
    }


def _env_job_options(env: DevEnvironment) -> dict[str, Any]:
    policy = policy_for(env.project)
    lifetime = policy.max_lifetime_hours * 3600 if policy.max_lifetime_hours else ENV_DURATION_SECONDS
    return {"priority_class": PriorityClass.NORMAL, "preemptible": False,
            "duration_seconds": min(lifetime, ENV_DURATION_SECONDS)}


def _refuse_unrunnable(env: DevEnvironment) -> None:
    """An image with no variant for its cluster's nodes, or a preset's GPU model none of them has."""
    refuse_unrunnable(cluster=env.cluster, groups=[_env_group(env)], project=env.project, fields={
        "groups[0].image": "image" if env.image_id else "image_reference", "groups[0].gpu_models": "profile"})


ENVIRONMENT_KIND = register_kind(WorkloadKind(
    name="environment", job_kinds=tuple(EnvKind.values), job_kind_of=lambda env: env.kind,
    groups=lambda env: [_env_group(env)], job_options=_env_job_options,
    row_of_job=environment_of_job, specs=environment_specs,
))


def _start_run(actor: User, env: DevEnvironment) -> Job:
    env.runs += 1
    job = kind_run(ENVIRONMENT_KIND, actor=actor, row=env, name=f"{env.name[:34]}-{env.runs}")
    env.job = job
    env.stop_reason = ""
    env.cull_warning = ""
    env.cull_at = None
    env.last_activity_at = None
    env.save()
    return job


@transaction.atomic
def environment_launch(
    *,
    actor: User,
    project: Project,
    cluster: Cluster,
    name: str,
    kind: str,
    image: Image | None = None,
    image_reference: str = "",
    profile: Profile | None = None,
    gpu_count: int = 0,
    gpu_memory_mib: int = 0,
    gpu_cores_percent: int = 0,
    exclusive: bool = False,
    cpu_millicores: int = 2000,
    ram_mib: int = 8192,
    home_gib: int = 10,
    env: dict[str, Any] | None = None,
    ssh_public_keys: str = "",
) -> tuple[DevEnvironment, str]:
    """Create an environment and queue its first run. Returns it and its access token
    (shown once; only its hash is kept)."""
    if kind not in EnvKind.values:
        raise ValidationError({"kind": [f"Choose one of: {', '.join(EnvKind.values)}."]})
    row = DevEnvironment(
        tenant=project.tenant, project=project, owner=actor, cluster=cluster, name=name, kind=kind
    )
    _require(actor, permissions.CREATE, row)
    _clean_cluster(cluster, actor)
    shape = {
        "gpu_count": gpu_count,
        "gpu_memory_mib": gpu_memory_mib,
        "gpu_cores_percent": gpu_cores_percent,
        "exclusive": exclusive,
        "cpu_millicores": cpu_millicores,
        "ram_mib": ram_mib,
        "home_gib": home_gib,
    }
    if profile is not None:
        _check_profile(actor, profile, project)
        shape = {k: getattr(profile, k) for k in shape}
        row.gpu_models = [profile.gpu_model] if profile.gpu_model else []
        if image is None and not image_reference:
            image = profile.image
    _clean_shape(shape)
    if shape["home_gib"] < 1 or shape["home_gib"] > 10240:
        raise ValidationError({"home_gib": ["Between 1 and 10240 GiB."]})
    label = EnvKind(kind).label
    row.image, row.image_reference = _resolve_image(
        project=project,
        image=image,
        image_reference=image_reference,
        variant=VARIANT_OF[EnvKind(kind)],
        variant_label=label,
    )
    row.profile = profile
    for k, v in shape.items():
        setattr(row, k, v)
    row.env = _clean_env(env)
    row.ssh_public_keys = _clean_ssh_keys(ssh_public_keys)
    if kind == EnvKind.SSH and not row.ssh_public_keys and not SshKey.objects.filter(user=actor).exists():
        raise ValidationError({"ssh_public_keys": [
            "An SSH environment needs a public key: add one to your SSH keys (or give one here)."]})
    kind_check(ENVIRONMENT_KIND, project=project, cluster=cluster, row=row)
    _refuse_unrunnable(row)
    refuse_if_over_storage(project=project, extra_gib=row.home_gib, field="home_gib")
    token = _issue_link(row)
    _save(row, "This project already has an environment with this name.")
    _start_run(actor, row)
    _audit("environment.launched", row, actor=actor, after=snapshot(row, ENV_FIELDS))
    return row, token


ACTIVE = ("queued", "starting", "running")


@transaction.atomic
def environment_stop(*, actor: User, env: DevEnvironment) -> DevEnvironment:
    env = (
        DevEnvironment.objects.select_for_update(of=("self",))
        .select_related("job", "tenant", "project")
        .get(pk=env.pk)
    )
    _require(actor, permissions.CHANGE, env)
    if env.state not in ACTIVE or env.job is None:
        raise ValidationError({"state": [f"The environment is already {env.state}."]})
    scheduling.job_terminate(
        job_id=env.job.pk, reason=f"Stopped by {actor.get_username()}", by=actor.get_username()
    )
    env.stop_reason = f"Stopped by {actor.get_username()}"
    env.cull_warning, env.cull_at = "", None
    _retire_access(env)
    env.save(update_fields=["stop_reason", "cull_warning", "cull_at", *ACCESS_FIELDS, "updated_at"])
    env.job.refresh_from_db()
    _audit("environment.stopped", env, actor=actor, after={"state": env.state})
    return env


def _locked_env(pk: int) -> DevEnvironment:
    """The environment row, locked for this transaction, with what the services read."""
    return (
        DevEnvironment.objects.select_for_update(of=("self",))
        .select_related("job", "tenant", "project", "cluster")
        .get(pk=pk)
    )


@transaction.atomic
def environment_start(*, actor: User, env: DevEnvironment) -> DevEnvironment:
    """Start a stopped (or failed) environment again, on the same home volume."""
    env = _locked_env(env.pk)
    _require(actor, permissions.CHANGE, env)
    if env.state in ACTIVE:
        raise ValidationError({"state": [f"The environment is already {env.state}."]})
    _clean_cluster(env.cluster, actor)
    kind_check(ENVIRONMENT_KIND, project=env.project, cluster=env.cluster, row=env)
    _refuse_unrunnable(env)
    _retire_access(env)  # a new run is opened with a new link (saved by _start_run)
    _start_run(actor, env)
    _audit("environment.started", env, actor=actor, after={"run": env.runs})
    return env


@transaction.atomic
def environment_delete(*, actor: User, env: DevEnvironment) -> None:
    """Stop it if needed, then remove it and its objects, home volume included."""
    env = _locked_env(env.pk)
    _require(actor, permissions.DELETE, env)
    if env.job is not None and not env.job.is_final:
        scheduling.job_terminate(
            job_id=env.job.pk, reason=f"Deleted by {actor.get_username()}", by=actor.get_username()
        )
    from ..pods import environment_objects

    ns, objects = environment_objects(env)
    _audit("environment.deleted", env, actor=actor, before=snapshot(env, ENV_FIELDS))
    cluster_id = env.cluster_id
    env.delete()
    enqueue_on_commit("delete_objects", cluster_id, ns, objects)


@transaction.atomic
def environment_open(*, actor: User, env: DevEnvironment) -> str:
    """A fresh link with a new one-time token (the previous link stops working). Only the
    owner opens an environment: the link acts as them inside it."""
    env = (
        DevEnvironment.objects.select_for_update(of=("self",))
        .select_related("tenant", "project", "job")
        .get(pk=env.pk)
    )
    if not permissions.can(actor, permissions.VIEW, env) or env.owner_id != actor.pk:
        raise PermissionDenied("Only its owner opens an environment.")
    if env.kind == EnvKind.SSH:
        raise ValidationError({"kind": ["An SSH environment is opened with ssh (see its page)."]})
    token = _issue_link(env)
    env.last_activity_at = timezone.now()
    env.cull_warning, env.cull_at = "", None
    env.save(update_fields=[*ACCESS_FIELDS, "last_activity_at", "cull_warning", "cull_at", "updated_at"])
    _audit("environment.opened", env, actor=actor)
    return f"{environment_url(env)}?camp_token={token}"


def environment_touch(*, env_id: int, at: dt.datetime | None = None) -> None:
    """Activity seen (a request through the proxy, or the in-pod agent's report): push the
    idle deadline back and withdraw a pending culling warning."""
    DevEnvironment.objects.filter(pk=env_id).update(
        last_activity_at=at or timezone.now(), cull_warning="", cull_at=None
    )
