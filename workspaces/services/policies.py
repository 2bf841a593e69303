"""The project's workspace policy and the launch profiles (presets) admins offer."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import Project, User

from ..models import (
    Profile,
    WorkspacePolicy,
)
from ..selectors import policy_for
from .common import POLICY_FIELDS, _clean_shape, _require

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
    # The access rule decides (platform admins only, and not through a project-scoped or
    # read-only token): a preset is offered to every tenant.
    _require(actor, permissions.CREATE, profile)
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
