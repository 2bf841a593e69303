"""Writes for workloads (``<entity>_<action>``, keyword-only, explicit ``actor=``).

A dev environment or training job is a row here plus, per run, one generic
``scheduling.Job`` submitted through ``scheduling.services.job_submit`` — the same queue,
quotas, gang admission and preemption as any job. Actions taken by the platform itself
(idle culling, maximum runtime, a failed dependency) are audited with a named system
actor. Access tokens for notebook URLs are 256-bit random, shown once per link,
stored as SHA-256 only, accepted once and only within ``WORKSPACES_LINK_TTL_SECONDS``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Model, Q
from django.utils import timezone

from registry.models import Image, Variant
from registry.references import ReferenceError, parse_reference
from registry.services import images_for_project
from scheduling import services as scheduling
from scheduling.models import (
    FINAL_STATES,
    Cluster,
    DecisionKind,
    Job,
    JobState,
    PriorityClass,
    SchedulingDecision,
)
from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import Project, User

from .models import (
    DevEnvironment,
    EnvKind,
    Profile,
    SshKey,
    TrainingCheckpoint,
    TrainingFramework,
    TrainingJob,
    WorkspacePolicy,
)
from .quota import refuse_if_never_within_limits, refuse_if_over_storage
from .selectors import environment_url, policy_for
from .sshkeys import SshKeyError, parse_public_key

CULLER = "culler"  # actor_username of the platform's own workspace actions
ENV_FIELDS = (
    "name",
    "kind",
    "image_reference",
    "profile",
    "gpu_count",
    "gpu_memory_mib",
    "gpu_cores_percent",
    "exclusive",
    "gpu_models",
    "cpu_millicores",
    "ram_mib",
    "home_gib",
    "cluster",
)
TRAINING_FIELDS = (
    "name",
    "framework",
    "image_reference",
    "workers",
    "gpu_count",
    "gpu_memory_mib",
    "gpu_cores_percent",
    "exclusive",
    "gpu_models",
    "cpu_millicores",
    "ram_mib",
    "checkpoint_dir",
    "log_dir",
    "max_runtime_seconds",
    "retry_limit",
    "priority_class",
    "preemptible",
    "cluster",
)
POLICY_FIELDS = ("idle_minutes", "max_lifetime_hours", "warning_minutes", "storage_gib_limit")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Dev environments run until stopped; the simulated backend needs a finite duration.
ENV_DURATION_SECONDS = 30 * 24 * 3600
LAUNCHER = {"cpu_millicores": 1000, "ram_mib": 2048}


def _require(actor: Any, action: str, obj: Model) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _audit(
    action: str, obj: DevEnvironment | TrainingJob, *, actor: User | None = None, **extra: Any
) -> None:
    audit_record(
        actor=actor,
        actor_username=None if actor is not None else CULLER,
        action=action,
        target=obj,
        tenant=obj.tenant,
        project=obj.project,
        **extra,
    )


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


ACCESS_FIELDS = ["access_token_hash", "access_token_issued_at", "access_token_used_at", "access_nonce"]


def link_ttl_seconds() -> int:
    return int(getattr(settings, "WORKSPACES_LINK_TTL_SECONDS", 300))


def _issue_link(env: DevEnvironment) -> str:
    """A new one-time link token (returned; only its hash is kept) and a new cookie nonce, so
    every older link and cookie stops working. The caller saves ``ACCESS_FIELDS``."""
    token = secrets.token_urlsafe(32)
    env.access_token_hash = hash_token(token)
    env.access_token_issued_at = timezone.now()
    env.access_token_used_at = None
    env.access_nonce = secrets.token_urlsafe(32)
    return token


def _retire_access(env: DevEnvironment) -> None:
    """No link and no cookie opens it any more (a stop, the end of a run)."""
    env.access_token_hash = ""
    env.access_token_issued_at = None
    env.access_token_used_at = None
    env.access_nonce = ""


# --- shared validation ----------------------------------------------------------------------


def _clean_env(env: Any, field: str = "env") -> dict[str, str]:
    if env in (None, ""):
        return {}
    if not isinstance(env, dict):
        raise ValidationError({field: ["A mapping of variable names to values."]})
    if len(env) > 100:
        raise ValidationError({field: ["At most 100 variables."]})
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ValidationError({field: [f"{k!r} is not a valid variable name."]})
        if k.startswith("CAMP_"):
            raise ValidationError({field: [f"{k}: names starting with CAMP_ are set by the platform."]})
        if not isinstance(v, (str, int, float, bool)) or len(str(v)) > 4096:
            raise ValidationError({field: [f"{k}: a value of at most 4096 characters."]})
        out[k] = str(v)
    return out


def _resolve_image(
    *, project: Project, image: Image | None, image_reference: str, variant: str, variant_label: str
) -> tuple[Image | None, str]:
    """A catalog image the project may use, of the right variant; or a raw, valid reference."""
    if image is not None:
        if not images_for_project(project).filter(pk=image.pk).exists():
            raise ValidationError({"image": ["This image is not available to this project."]})
        if image.variant != variant:
            raise ValidationError(
                {"image": [f"Choose a {variant_label} image (this one is {image.get_variant_display()})."]}
            )
        return image, image.reference
    if not image_reference:
        raise ValidationError({"image": ["Choose an image from the catalog or give an image reference."]})
    try:
        parse_reference(image_reference)
    except ReferenceError as exc:
        raise ValidationError({"image_reference": [str(exc)]}) from exc
    return None, image_reference.strip()


def _clean_shape(data: dict[str, Any]) -> None:
    gpus, mem, cores = data["gpu_count"], data["gpu_memory_mib"], data["gpu_cores_percent"]
    if gpus < 0 or mem < 0 or cores < 0:
        raise ValidationError({"gpu_count": ["Amounts cannot be negative."]})
    if gpus == 0 and (mem or cores):
        raise ValidationError({"gpu_count": ["A GPU slice needs gpu_count ≥ 1."]})
    if cores > 100:
        raise ValidationError({"gpu_cores_percent": ["At most 100 (% of one GPU's compute)."]})
    if data["exclusive"] and (mem or cores):
        raise ValidationError({"exclusive": ["Whole cards take no memory or compute slice."]})
    if data["cpu_millicores"] < 100:
        raise ValidationError({"cpu_millicores": ["At least 100 (0.1 CPU core)."]})
    if data["ram_mib"] < 128:
        raise ValidationError({"ram_mib": ["At least 128 MiB."]})


def _clean_cluster(cluster: Cluster, actor: User) -> None:
    if not cluster.enabled or not permissions.can(actor, permissions.VIEW, cluster):
        raise ValidationError({"cluster": ["This cluster does not exist or is disabled."]})


_HOME_CLAIM = re.compile(r"ws-(\d+)-home")
_CHECKPOINT_CLAIM = re.compile(r"tr-(\d+)-ckpt")


def _clean_data_volume(actor: User, project: Project, name: str) -> None:
    """A data volume is a PVC of the project's namespace that the submitter may use: a data
    set, one of the project's checkpoint volumes, or the submitter's own home volume, never
    a colleague's home (it holds their files and credentials) nor another project's volume."""
    from scheduling.models import slug_validator

    try:
        slug_validator(name)
    except ValidationError as exc:
        raise ValidationError({"data_volume": ["The name of a PVC in the project's namespace."]}) from exc
    home = _HOME_CLAIM.fullmatch(name)
    if home:
        env = DevEnvironment.objects.filter(pk=int(home[1])).only("project_id", "owner_id").first()
        if env is None or env.project_id != project.pk or env.owner_id != actor.pk:
            raise ValidationError({"data_volume": [
                f"{name} is the home volume of another user's environment; you may mount only "
                f"your own home volume, your project's checkpoint volumes or data sets."]})
    ckpt = _CHECKPOINT_CLAIM.fullmatch(name)
    if ckpt and not TrainingJob.objects.filter(pk=int(ckpt[1]), project=project).exists():
        raise ValidationError({"data_volume": [
            f"{name} is not a checkpoint volume of this project."]})


def _save(obj: DevEnvironment | TrainingJob, message: str) -> None:
    try:
        obj.full_clean(
            exclude=["tenant", "project", "owner", "cluster", "job", "image", "profile"],
            validate_unique=False,
            validate_constraints=False,
        )
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError as exc:
        raise ValidationError({"name": [message]}) from exc


def _submit_run(
    *,
    actor: User,
    project: Project,
    cluster: Cluster,
    name: str,
    kind: str,
    groups: list[dict[str, Any]],
    **job: Any,
) -> Job:
    """One run = one scheduling Job; its name errors are the workload's name errors."""
    try:
        return scheduling.job_submit(
            actor=actor, project=project, cluster=cluster, name=name, kind=kind, groups=groups, **job
        )
    except ValidationError as exc:
        errors = dict(getattr(exc, "message_dict", {"__all__": exc.messages}))
        if "name" in errors:
            errors["name"] = [f"Its run would be named {name}, which is taken in this project."]
        raise ValidationError(errors) from exc


# --- workspace policy -----------------------------------------------------------------------


@transaction.atomic
def workspace_policy_set(*, actor: User, project: Project, **values: Any) -> WorkspacePolicy:
    policy = policy_for(project)
    _require(actor, permissions.CHANGE if policy.pk else permissions.CREATE, policy)
    before = snapshot(policy, POLICY_FIELDS) if policy.pk else None
    for key, value in values.items():
        if key not in POLICY_FIELDS:
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(policy, key, value)
    try:
        policy.full_clean(exclude=["tenant", "project"], validate_unique=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    policy.save()
    audit_record(
        actor=actor,
        action="workspace_policy.updated",
        target=policy,
        tenant=project.tenant,
        project=project,
        before=before,
        after=snapshot(policy, POLICY_FIELDS),
    )
    return policy


# --- profiles -------------------------------------------------------------------------------

PROFILE_FIELDS = (
    "name",
    "display_name",
    "description",
    "image",
    "gpu_model",
    "gpu_count",
    "gpu_memory_mib",
    "gpu_cores_percent",
    "exclusive",
    "cpu_millicores",
    "ram_mib",
    "home_gib",
    "enabled",
)


@transaction.atomic
def profile_create(
    *,
    actor: User,
    name: str,
    tenants: list[Any] | None = None,
    projects: list[Any] | None = None,
    **fields: Any,
) -> Profile:
    profile = Profile(name=name, **fields)
    if not actor.platform_admin:
        raise PermissionDenied("Only platform admins define profiles.")
    return _profile_save(actor, profile, tenants, projects, "profile.created", None)


@transaction.atomic
def profile_update(
    *,
    actor: User,
    profile: Profile,
    tenants: list[Any] | None = None,
    projects: list[Any] | None = None,
    **changes: Any,
) -> Profile:
    _require(actor, permissions.CHANGE, profile)
    before = _profile_snapshot(profile)
    for key, value in changes.items():
        if key not in PROFILE_FIELDS:
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(profile, key, value)
    return _profile_save(actor, profile, tenants, projects, "profile.updated", before)


def _profile_snapshot(p: Profile) -> dict[str, Any]:
    data = snapshot(p, PROFILE_FIELDS)
    if p.pk:
        data["tenants"] = sorted(p.tenants.values_list("name", flat=True))
        data["projects"] = sorted(str(x) for x in p.projects.all())
    return data


def _profile_save(
    actor: User,
    profile: Profile,
    tenants: list[Any] | None,
    projects: list[Any] | None,
    action: str,
    before: dict[str, Any] | None,
) -> Profile:
    _clean_shape(
        {
            k: getattr(profile, k)
            for k in (
                "gpu_count",
                "gpu_memory_mib",
                "gpu_cores_percent",
                "exclusive",
                "cpu_millicores",
                "ram_mib",
            )
        }
    )
    if profile.image is not None and profile.image.scope != "platform":
        raise ValidationError({"image": ["A profile uses a platform image (profiles serve many tenants)."]})
    try:
        profile.full_clean(validate_unique=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    try:
        with transaction.atomic():
            profile.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["A profile with this name already exists."]}) from exc
    if tenants is not None:
        profile.tenants.set(tenants)
    if projects is not None:
        profile.projects.set(projects)
    audit_record(actor=actor, action=action, target=profile, before=before, after=_profile_snapshot(profile))
    return profile


@transaction.atomic
def profile_delete(*, actor: User, profile: Profile) -> None:
    _require(actor, permissions.DELETE, profile)
    audit_record(actor=actor, action="profile.deleted", target=profile, before=_profile_snapshot(profile))
    profile.delete()


# --- dev environments -----------------------------------------------------------------------

VARIANT_OF = {EnvKind.JUPYTER: Variant.JUPYTER, EnvKind.VSCODE: Variant.VSCODE, EnvKind.SSH: Variant.SSH}


def _clean_ssh_keys(text: str) -> str:
    """Keys given for one environment: the same rules as the user's key store."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(lines) > 20:
        raise ValidationError({"ssh_public_keys": ["At most 20 keys."]})
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(parse_public_key(line).line)
        except SshKeyError as exc:
            raise ValidationError({"ssh_public_keys": [f"Line {n}: {exc}"]}) from exc
    return "\n".join(out)


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


def _start_run(actor: User, env: DevEnvironment) -> Job:
    env.runs += 1
    policy = policy_for(env.project)
    lifetime = policy.max_lifetime_hours * 3600 if policy.max_lifetime_hours else ENV_DURATION_SECONDS
    job = _submit_run(
        actor=actor,
        project=env.project,
        cluster=env.cluster,
        name=f"{env.name[:34]}-{env.runs}",
        kind=env.kind,
        groups=[_env_group(env)],
        priority_class=PriorityClass.NORMAL,
        preemptible=False,
        duration_seconds=min(lifetime, ENV_DURATION_SECONDS),
    )
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
    refuse_if_never_within_limits(project=project, cluster=cluster, groups=[_env_group(row)])
    refuse_if_over_storage(project=project, extra_gib=row.home_gib, field="home_gib")
    token = _issue_link(row)
    _save(row, "This project already has an environment with this name.")
    _start_run(actor, row)
    _audit("environment.launched", row, actor=actor, after=snapshot(row, ENV_FIELDS))
    return row, token


def _check_profile(actor: User, profile: Profile, project: Project) -> None:
    """A preset the actor may use, enabled and offered to the project (else a field error)."""
    if (
        not profile.enabled
        or not permissions.can(actor, permissions.VIEW, profile)
        or not (permissions.restrict(Profile.objects.filter(pk=profile.pk), actor).exists())
    ):
        raise ValidationError({"profile": ["This profile does not exist or is not offered to you."]})
    if not _profile_allows(profile, project):
        raise ValidationError({"profile": ["This profile is not offered to this project."]})


def _profile_allows(profile: Profile, project: Project) -> bool:
    tenants = set(profile.tenants.values_list("pk", flat=True))
    projects = set(profile.projects.values_list("pk", flat=True))
    if not tenants and not projects:
        return True
    return project.tenant_id in tenants or project.pk in projects


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
    refuse_if_never_within_limits(project=env.project, cluster=env.cluster, groups=[_env_group(env)])
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
    from .pods import environment_objects
    from .tasks import delete_objects

    ns, objects = environment_objects(env)
    _audit("environment.deleted", env, actor=actor, before=snapshot(env, ENV_FIELDS))
    cluster_id = env.cluster_id
    env.delete()
    delete_objects.delay_on_commit(cluster_id, ns, objects)


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


def token_matches(env: DevEnvironment, token: str) -> bool:
    """Is ``token`` the current link's (spent or not, fresh or not)?"""
    return bool(env.access_token_hash) and secrets.compare_digest(env.access_token_hash, hash_token(token))


def environment_link_redeem(*, env_id: int, token: str) -> str | None:
    """Spend a link token: accepted once, within ``WORKSPACES_LINK_TTL_SECONDS`` of being
    issued. Returns the environment's cookie nonce, or None. The row lock makes two
    concurrent requests with the same link spend it at most once. The caller has checked
    that the owner may still reach the environment and that it runs."""
    if not token:
        return None
    now = timezone.now()
    with transaction.atomic():
        env = DevEnvironment.objects.select_for_update().filter(pk=env_id).first()
        if (
            env is None
            or not env.access_nonce
            or env.access_token_used_at is not None
            or env.access_token_issued_at is None
            or now - env.access_token_issued_at > dt.timedelta(seconds=link_ttl_seconds())
            or not token_matches(env, token)
        ):
            return None
        env.access_token_used_at = now
        env.save(update_fields=["access_token_used_at"])
        return env.access_nonce


def environments_retire_access() -> int:
    """Environments whose run has ended (failed, lost, finished) without a stop through
    Camp: retire their link and cookies, so a later run needs a new link."""
    return (
        DevEnvironment.objects.exclude(access_nonce="", access_token_hash="")
        .filter(Q(job__isnull=True) | Q(job__state__in=FINAL_STATES))
        .update(access_token_hash="", access_token_issued_at=None, access_token_used_at=None,
                access_nonce="")
    )


# --- idle culling ---------------------------------------------------------------------------


def _cull_deadline(env: DevEnvironment, policy: WorkspacePolicy) -> tuple[dt.datetime | None, str]:
    job = env.job
    assert job is not None
    started = job.started_at or job.admitted_at or job.submitted_at
    deadlines: list[tuple[dt.datetime, str]] = []
    if policy.idle_minutes:
        since = max(filter(None, [env.last_activity_at, started]))
        deadlines.append(
            (
                since + dt.timedelta(minutes=policy.idle_minutes),
                f"no activity for {policy.idle_minutes} minutes",
            )
        )
    if policy.max_lifetime_hours:
        deadlines.append(
            (
                started + dt.timedelta(hours=policy.max_lifetime_hours),
                f"its maximum lifetime of {policy.max_lifetime_hours} h",
            )
        )
    if not deadlines:
        return None, ""
    return min(deadlines)


def environments_cull(*, now: dt.datetime | None = None) -> dict[str, list[int]]:
    """One culling pass. Rule: a running environment past its policy's idle or lifetime
    deadline is stopped — but only after its owner has been warned for ``warning_minutes``
    (the warning shows on its page and in the API). It keeps its home volume."""
    now = now or timezone.now()
    warned: list[int] = []
    culled: list[int] = []
    running = DevEnvironment.objects.filter(job__state=JobState.RUNNING).select_related(
        "job", "tenant", "project"
    )
    for env in running:
        policy = policy_for(env.project)
        due, why = _cull_deadline(env, policy)
        if due is None:
            continue
        warn_from = due - dt.timedelta(minutes=policy.warning_minutes)
        if now < warn_from:
            if env.cull_warning:
                DevEnvironment.objects.filter(pk=env.pk).update(cull_warning="", cull_at=None)
            continue
        with transaction.atomic():
            env = (
                DevEnvironment.objects.select_for_update(of=("self",))
                .select_related("job", "tenant", "project")
                .get(pk=env.pk)
            )
            if env.job is None or env.job.state != JobState.RUNNING:
                continue
            if not env.cull_warning or env.cull_at is None:
                # Warn first; never stop sooner than warning_minutes after the warning.
                cull_at = max(due, now + dt.timedelta(minutes=policy.warning_minutes))
                env.cull_at = cull_at
                env.cull_warning = (
                    f"This environment will be stopped at {cull_at:%Y-%m-%d %H:%M} UTC "
                    f"({why}) unless it is used. Its home volume is kept."
                )
                env.save(update_fields=["cull_at", "cull_warning", "updated_at"])
                _audit("environment.cull_warned", env, after={"cull_at": cull_at.isoformat(), "why": why})
                warned.append(env.pk)
            elif now >= env.cull_at:
                reason = f"Stopped by idle culling: {why}"
                scheduling.job_terminate(job_id=env.job.pk, reason=reason, by=CULLER)
                env.stop_reason = reason
                env.cull_warning, env.cull_at = "", None
                _retire_access(env)
                env.save(update_fields=["stop_reason", "cull_warning", "cull_at", *ACCESS_FIELDS,
                                        "updated_at"])
                _audit("environment.culled", env, after={"reason": reason})
                culled.append(env.pk)
    return {"warned": warned, "culled": culled}


# --- training jobs --------------------------------------------------------------------------


def _training_groups(t: TrainingJob) -> list[dict[str, Any]]:
    worker = {
        "name": "worker",
        "replicas": t.workers,
        "gpu_count": t.gpu_count,
        "gpu_memory_mib": t.gpu_memory_mib,
        "gpu_cores_percent": t.gpu_cores_percent,
        "exclusive": t.exclusive,
        "gpu_models": list(t.gpu_models or []),
        "cpu_millicores": t.cpu_millicores,
        "ram_mib": t.ram_mib,
        "image": t.image_reference,
        "command": [str(c) for c in t.command or []],
        "env": dict(t.env),
    }
    if not t.has_launcher:
        return [worker]
    launcher = {
        "name": "launcher",
        "replicas": 1,
        "gpu_count": 0,
        "image": t.image_reference,
        "command": [str(c) for c in t.command or []],
        "env": dict(t.env),
        **LAUNCHER,
    }
    worker["command"] = []  # workers wait for the launcher (sshd / the MPI daemon)
    return [launcher, worker]


def _training_run(actor: User, t: TrainingJob, name: str) -> Job:
    job = _submit_run(
        actor=actor,
        project=t.project,
        cluster=t.cluster,
        name=name,
        kind=t.framework,
        groups=_training_groups(t),
        priority_class=t.priority_class,
        preemptible=t.preemptible,
        checkpoint_capable=bool(t.checkpoint_dir),
        gang=True,
        duration_seconds=t.duration_seconds,
    )
    latest = t.checkpoints.order_by("-step", "-id").first() if t.pk else None
    if latest is not None:  # a retry resumes from the latest checkpoint too
        Job.objects.filter(pk=job.pk).update(last_checkpoint=latest.path)
    t.job = job
    t.blocked_reason = ""
    t.save(update_fields=["job", "blocked_reason", "updated_at"])
    return job


@transaction.atomic
def training_submit(
    *,
    actor: User,
    project: Project,
    cluster: Cluster,
    name: str,
    framework: str,
    image: Image | None = None,
    image_reference: str = "",
    workers: int = 1,
    gpu_count: int = 1,
    gpu_memory_mib: int = 0,
    gpu_cores_percent: int = 0,
    exclusive: bool = False,
    gpu_models: list[str] | None = None,
    cpu_millicores: int = 4000,
    ram_mib: int = 16384,
    command: list[str] | None = None,
    env: dict[str, Any] | None = None,
    data_volume: str = "",
    checkpoint_dir: str = "",
    checkpoint_every: int = 100,
    checkpoint_volume_gib: int = 0,
    log_dir: str = "",
    max_runtime_seconds: int | None = None,
    retry_limit: int = 0,
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    duration_seconds: int | None = None,
    depends_on: list[TrainingJob] | None = None,
    profile: Profile | None = None,
) -> TrainingJob:
    """Create a training job: a gang of ``workers`` (plus a launcher for DeepSpeed and MPI),
    submitted now, or once every job it depends on has succeeded. With a compute preset
    (``profile``) each worker takes the preset's shape and GPU model ("workers × preset")."""
    if profile is not None:
        _check_profile(actor, profile, project)
        gpu_count, gpu_memory_mib = profile.gpu_count, profile.gpu_memory_mib
        gpu_cores_percent, exclusive = profile.gpu_cores_percent, profile.exclusive
        cpu_millicores, ram_mib = profile.cpu_millicores, profile.ram_mib
        gpu_models = [profile.gpu_model] if profile.gpu_model else []
    if framework not in TrainingFramework.values:
        raise ValidationError({"framework": [f"Choose one of: {', '.join(TrainingFramework.values)}."]})
    if priority_class not in PriorityClass.values:
        raise ValidationError({"priority_class": [f"Choose one of: {', '.join(PriorityClass.values)}."]})
    if preemptible is None:
        preemptible = priority_class in (PriorityClass.NORMAL, PriorityClass.BATCH)
    t = TrainingJob(
        tenant=project.tenant,
        project=project,
        owner=actor,
        cluster=cluster,
        name=name,
        framework=framework,
        workers=workers,
        gpu_count=gpu_count,
        gpu_memory_mib=gpu_memory_mib,
        gpu_cores_percent=gpu_cores_percent,
        exclusive=exclusive,
        gpu_models=list(gpu_models or []),
        cpu_millicores=cpu_millicores,
        ram_mib=ram_mib,
        command=list(command or []),
        data_volume=data_volume,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        checkpoint_volume_gib=checkpoint_volume_gib,
        log_dir=log_dir,
        max_runtime_seconds=max_runtime_seconds,
        retry_limit=retry_limit,
        priority_class=priority_class,
        preemptible=preemptible,
        duration_seconds=duration_seconds,
    )
    _require(actor, permissions.CREATE, t)
    _clean_cluster(cluster, actor)
    if not 1 <= workers <= 128:
        raise ValidationError({"workers": ["Between 1 and 128 workers."]})
    _clean_shape(
        {
            "gpu_count": gpu_count,
            "gpu_memory_mib": gpu_memory_mib,
            "gpu_cores_percent": gpu_cores_percent,
            "exclusive": exclusive,
            "cpu_millicores": cpu_millicores,
            "ram_mib": ram_mib,
        }
    )
    if checkpoint_dir and not checkpoint_dir.startswith("/"):
        raise ValidationError({"checkpoint_dir": ["An absolute path inside the container."]})
    if log_dir and not log_dir.startswith("/"):
        raise ValidationError({"log_dir": ["An absolute path inside the container."]})
    if checkpoint_volume_gib and not checkpoint_dir:
        raise ValidationError({"checkpoint_volume_gib": ["A checkpoint volume needs a checkpoint_dir."]})
    if data_volume:
        _clean_data_volume(actor, project, data_volume)
    t.image, t.image_reference = _resolve_image(
        project=project,
        image=image,
        image_reference=image_reference,
        variant=Variant.TRAINING,
        variant_label="training",
    )
    t.env = _clean_env(env)
    deps = list(depends_on or [])
    for d in deps:
        if d.project_id != project.pk:
            raise ValidationError({"depends_on": ["Dependencies must be training jobs of the same project."]})
        if d.state in ("failed", "stopped"):
            raise ValidationError({"depends_on": [f"{d.name} has already {d.state}; it will never succeed."]})
    refuse_if_never_within_limits(project=project, cluster=cluster, groups=_training_groups(t))
    refuse_if_over_storage(project=project, extra_gib=checkpoint_volume_gib, field="checkpoint_volume_gib")
    _save(t, "This project already has a training job with this name.")
    if deps:
        t.depends_on.set(deps)
    pending = [d.name for d in deps if d.state != "succeeded"]
    if pending:
        t.blocked_reason = f"Waiting for {', '.join(pending)} to succeed"
        t.save(update_fields=["blocked_reason"])
    else:
        _training_run(actor, t, t.name)
    _audit(
        "training.submitted",
        t,
        actor=actor,
        after={**snapshot(t, TRAINING_FIELDS), "depends_on": [d.pk for d in deps],
               **({"preset": profile.name} if profile is not None else {})},
    )
    return t


@transaction.atomic
def training_stop(*, actor: User, training: TrainingJob) -> TrainingJob:
    t = (
        TrainingJob.objects.select_for_update(no_key=True, of=("self",))
        .select_related("job", "tenant", "project")
        .get(pk=training.pk)
    )
    _require(actor, permissions.CHANGE, t)
    if t.state not in ("waiting", "queued", "starting", "running"):
        raise ValidationError({"state": [f"The training job is already {t.state}."]})
    reason = f"Stopped by {actor.get_username()}"
    if t.job is not None:
        scheduling.job_terminate(job_id=t.job.pk, reason=reason, by=actor.get_username())
    t.stop_reason = reason
    t.blocked_reason = ""
    t.save(update_fields=["stop_reason", "blocked_reason", "updated_at"])
    _audit("training.stopped", t, actor=actor, after={"reason": reason})
    return t


@transaction.atomic
def training_delete(*, actor: User, training: TrainingJob) -> None:
    """Delete a training job: stop its run if it is not over, fail the jobs still waiting
    for it (a deleted dependency will never succeed), remove its checkpoint volume. The
    audit record keeps what it was; its scheduling runs stay in the job history."""
    t = (
        TrainingJob.objects.select_for_update(no_key=True, of=("self",))
        .select_related("job", "tenant", "project", "cluster")
        .get(pk=training.pk)
    )
    _require(actor, permissions.DELETE, t)
    by = actor.get_username()
    if t.job is not None and not t.job.is_final:
        scheduling.job_terminate(job_id=t.job.pk, reason=f"Deleted by {by}", by=by)
    waiting = t.dependants.filter(job__isnull=True, failed_dependency=False, stop_reason="")
    for d in waiting.select_related("tenant", "project"):
        reason = f"Dependency {t.name} was deleted; this job will not run"
        TrainingJob.objects.filter(pk=d.pk).update(failed_dependency=True, blocked_reason=reason)
        _audit("training.dependency_failed", d, actor=actor, after={"reason": reason})
    _audit(
        "training.deleted",
        t,
        actor=actor,
        before={**snapshot(t, TRAINING_FIELDS), "state": t.state, "run": t.job_id},
    )
    # The checkpoint volume outlives runs (pods.py); TensorBoard objects go with the run.
    objects = [("PersistentVolumeClaim", f"tr-{t.pk}-ckpt")] if t.checkpoint_volume_gib else []
    from .selectors import namespace_spec_for

    ns, cluster_id = namespace_spec_for(t), t.cluster_id
    t.delete()
    if objects:
        from .tasks import delete_objects

        delete_objects.delay_on_commit(cluster_id, ns, objects)


CHECKPOINT_LINE = re.compile(r"^(?:(\S+Z) )?CAMP_CHECKPOINT step=(\d+) path=(\S+)\s*$")


def training_report_checkpoint(
    *, training: TrainingJob, step: int, path: str, at: dt.datetime | None = None, actor: User | None = None
) -> bool:
    """Record a checkpoint (idempotent per path); the next run resumes from the latest."""
    if actor is not None:
        _require(actor, permissions.CHANGE, training)
    if not path.startswith("/") or len(path) > 500:
        raise ValidationError({"path": ["An absolute path of at most 500 characters."]})
    job = training.job
    _, made = TrainingCheckpoint.objects.get_or_create(
        training=training,
        path=path,
        defaults={"step": step, "written_at": at or timezone.now(), "attempt": job.attempts if job else 0},
    )
    latest = training.checkpoints.order_by("-step", "-id").first()
    if job is not None and latest is not None and job.last_checkpoint != latest.path:
        Job.objects.filter(pk=job.pk).update(last_checkpoint=latest.path)
    return made


def _scan_checkpoints(t: TrainingJob) -> None:
    """Read rank 0's log for ``CAMP_CHECKPOINT step=<n> path=<p>`` lines."""
    from .selectors import job_logs

    if not t.checkpoint_dir or t.job is None:
        return
    for log in job_logs(t.job, tail=500):
        if log.role != "worker" or not log.pod.endswith("-worker-0"):
            continue
        for line in log.text.splitlines():
            m = CHECKPOINT_LINE.match(line.strip())
            if m:
                at = (
                    dt.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
                    if m.group(1)
                    else None
                )
                training_report_checkpoint(training=t, step=int(m.group(2)), path=m.group(3), at=at)


def _gpu_share(t: TrainingJob) -> float:
    per_gpu = t.gpu_cores_percent / 100 if t.gpu_cores_percent else 1.0
    return t.workers * t.gpu_count * per_gpu


def _account(t: TrainingJob) -> None:
    """Restarts and GPU time lost, recomputed from the runs' histories (idempotent): each
    preemption loses the GPU time since the later of the attempt's start and its last
    checkpoint before the preemption."""
    if t.job is None:
        return
    checkpoints = sorted(t.checkpoints.values_list("written_at", flat=True))
    restarts, lost = 0, 0.0
    jobs = Job.objects.filter(project=t.project, name__in=_run_names(t))
    started: dt.datetime | None = None
    for d in SchedulingDecision.objects.filter(job__in=jobs).order_by("id"):
        if d.kind == DecisionKind.STARTED:
            started = d.created_at
        elif d.kind == DecisionKind.PREEMPTED and started is not None:
            since = max([started, *[c for c in checkpoints if started <= c <= d.created_at]])
            lost += max(0.0, (d.created_at - since).total_seconds()) * _gpu_share(t)
            started = None
        elif d.kind == DecisionKind.REQUEUED:
            restarts += 1
    if (restarts, round(lost, 1)) != (t.restarts, round(t.lost_gpu_seconds, 1)):
        TrainingJob.objects.filter(pk=t.pk).update(restarts=restarts, lost_gpu_seconds=lost)
        t.restarts, t.lost_gpu_seconds = restarts, lost


def _run_names(t: TrainingJob) -> list[str]:
    return [t.name] + [f"{t.name[:30]}-retry{n}" for n in range(1, t.retries + 1)]


def training_sync(*, training: TrainingJob, now: dt.datetime | None = None) -> str:
    """Advance one training job: dependencies, checkpoints, accounting, maximum runtime and
    retries. Idempotent; the workspaces tick calls it for every unfinished job."""
    now = now or timezone.now()
    t = TrainingJob.objects.select_related("job", "tenant", "project", "cluster", "owner").get(pk=training.pk)
    if t.job is None:
        if t.failed_dependency or t.stop_reason:
            return "idle"
        deps = list(t.depends_on.select_related("job"))
        failed = [d for d in deps if d.state in ("failed", "stopped")]
        if failed:
            with transaction.atomic():
                reason = f"Dependency {failed[0].name} {failed[0].state}; this job will not run"
                TrainingJob.objects.filter(pk=t.pk).update(failed_dependency=True, blocked_reason=reason)
                _audit("training.dependency_failed", t, after={"reason": reason})
            return "dependency-failed"
        if all(d.state == "succeeded" for d in deps) and t.owner is not None:
            with transaction.atomic():
                _training_run(t.owner, t, t.name)
                _audit("training.released", t, after={"dependencies": [d.name for d in deps]})
            return "submitted"
        pending = ", ".join(d.name for d in deps if d.state != "succeeded")
        TrainingJob.objects.filter(pk=t.pk).update(blocked_reason=f"Waiting for {pending} to succeed")
        return "waiting"
    job = t.job
    if job.state == JobState.RUNNING:
        _scan_checkpoints(t)
        if (
            t.max_runtime_seconds
            and job.started_at
            and (now - job.started_at).total_seconds() > t.max_runtime_seconds
        ):
            with transaction.atomic():
                reason = f"Exceeded its maximum runtime of {t.max_runtime_seconds} s"
                scheduling.job_terminate(job_id=job.pk, reason=reason, by=CULLER)
                TrainingJob.objects.filter(pk=t.pk).update(stop_reason=reason)
                _audit("training.timed_out", t, after={"reason": reason})
            return "timed-out"
    _account(t)
    if job.state == JobState.FAILED and t.retries < t.retry_limit and t.owner is not None:
        with transaction.atomic():
            locked = TrainingJob.objects.select_for_update(no_key=True, of=("self",)).get(pk=t.pk)
            if locked.job_id != job.pk:
                return "retried"
            locked.retries += 1
            locked.save(update_fields=["retries"])
            t.retries = locked.retries
            _training_run(t.owner, t, f"{t.name[:30]}-retry{t.retries}")
            _audit("training.retried", t, after={"retry": t.retries, "after": job.reason})
        return "retried"
    return job.state


# --- SSH keys ---------------------------------------------------------------------------------

MAX_SSH_KEYS = 50


@transaction.atomic
def ssh_key_add(*, actor: User, name: str, public_key: str) -> SshKey:
    """Store one of ``actor``'s OpenSSH public keys (validated; fingerprint kept). SSH
    environments of theirs authorise it from their next start."""
    try:
        parsed = parse_public_key(public_key)
    except SshKeyError as exc:
        raise ValidationError({"public_key": [str(exc)]}) from exc
    name = (name or "").strip() or parsed.comment[:100] or parsed.key_type
    key = SshKey(user=actor, name=name[:100], key_type=parsed.key_type, public_key=parsed.line,
                 fingerprint=parsed.fingerprint, bits=parsed.bits)
    _require(actor, permissions.CREATE, key)
    User.objects.select_for_update(no_key=True).filter(pk=actor.pk).first()  # serialise the count check
    if SshKey.objects.filter(user=actor).count() >= MAX_SSH_KEYS:
        raise ValidationError({"public_key": [f"At most {MAX_SSH_KEYS} keys per user."]})
    if SshKey.objects.filter(user=actor, fingerprint=parsed.fingerprint).exists():
        raise ValidationError({"public_key": ["You already added this key."]})
    if SshKey.objects.filter(user=actor, name=key.name).exists():
        raise ValidationError({"name": ["You already have a key with this name."]})
    key.save()
    audit_record(actor=actor, action="ssh_key.added", target=key, after=snapshot(key, SSH_KEY_FIELDS))
    return key


@transaction.atomic
def ssh_key_delete(*, actor: User, key: SshKey) -> None:
    _require(actor, permissions.DELETE, key)
    audit_record(actor=actor, action="ssh_key.deleted", target=key, before=snapshot(key, SSH_KEY_FIELDS))
    key.delete()


SSH_KEY_FIELDS = ("user", "name", "key_type", "bits", "fingerprint")
