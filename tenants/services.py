"""Writes for tenancy (HackSoft style: ``<entity>_<action>``, keyword-only, explicit actor).

Every service checks access through ``permissions.can`` (raising PermissionDenied),
validates (raising ValidationError keyed by field name), writes inside one
transaction together with its AuditEvent, and leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Sum
from django.utils import timezone

from . import extensions, permissions
from .audit import audit_record, snapshot
from .models import (
    RESOURCE_LABELS,
    RESOURCES,
    ApiToken,
    Membership,
    Project,
    Quota,
    QuotaScope,
    Role,
    Tenant,
    User,
)

TENANT_FIELDS = ("name", "display_name", "description")
PROJECT_FIELDS = ("tenant", "name", "display_name", "description")
MEMBERSHIP_FIELDS = ("user", "tenant", "project", "role")
QUOTA_FIELDS = (*(f"{r}_{kind}" for r in RESOURCES for kind in ("guaranteed", "limit")),
                "gpus_limit_all_clusters", "gpus_guaranteed_all_clusters",
                "gpu_memory_mib_limits_all_clusters")
CLASS_LIMITS = "gpu_memory_mib_limits_all_clusters"
_CLASS_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_MAX_CLASSES, _MAX_MIB = 64, 2**53 - 1  # a JSON number stays exact up to 2**53
USER_FIELDS = ("username", "email", "first_name", "last_name", "is_active", "is_platform_admin")
TOKEN_FIELDS = ("name", "prefix", "project", "read_only", "expires_at")


def require(actor: Any, action: str, obj: models.Model) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _full_clean(obj: models.Model, exclude: Iterable[str] = (), unique_field: str | None = None) -> None:
    """Model validation; a multi-column uniqueness error is reported on ``unique_field``."""
    try:
        obj.full_clean(exclude=list(exclude), validate_constraints=True)
    except ValidationError as exc:
        if unique_field and hasattr(exc, "error_dict") and "__all__" in exc.error_dict:
            errors = dict(exc.error_dict)
            errors.setdefault(unique_field, []).extend(errors.pop("__all__"))
            raise ValidationError(errors) from exc
        raise


def _save_or_field_error(obj: models.Model, field: str, message: str) -> None:
    """Save; a uniqueness race lost at the database becomes a field error, not a 500."""
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError as exc:
        raise ValidationError({field: [message]}) from exc


# --- tenants ---------------------------------------------------------------------------


@transaction.atomic
def tenant_create(*, actor: User, name: str, display_name: str = "", description: str = "") -> Tenant:
    tenant = Tenant(name=name, display_name=display_name, description=description)
    require(actor, permissions.CREATE, tenant)
    _full_clean(tenant)
    _save_or_field_error(tenant, "name", "A tenant with this name already exists.")
    audit_record(actor=actor, action="tenant.created", target=tenant, tenant=tenant,
                 after=snapshot(tenant, TENANT_FIELDS))
    return tenant


@transaction.atomic
def tenant_update(*, actor: User, tenant: Tenant, **changes: Any) -> Tenant:
    require(actor, permissions.CHANGE, tenant)
    before = snapshot(tenant, TENANT_FIELDS)
    _apply(tenant, changes, TENANT_FIELDS)
    _full_clean(tenant)
    _save_or_field_error(tenant, "name", "A tenant with this name already exists.")
    audit_record(actor=actor, action="tenant.updated", target=tenant, tenant=tenant,
                 before=before, after=snapshot(tenant, TENANT_FIELDS))
    return tenant


@transaction.atomic
def tenant_delete(*, actor: User, tenant: Tenant) -> None:
    require(actor, permissions.DELETE, tenant)
    before = snapshot(tenant, TENANT_FIELDS)
    audit_record(actor=actor, action="tenant.deleted", target=tenant, tenant=tenant, before=before)
    tenant.delete()


# --- projects --------------------------------------------------------------------------


@transaction.atomic
def project_create(
    *, actor: User, tenant: Tenant, name: str, display_name: str = "", description: str = ""
) -> Project:
    project = Project(tenant=tenant, name=name, display_name=display_name, description=description)
    require(actor, permissions.CREATE, project)
    _full_clean(project, unique_field="name")
    _save_or_field_error(project, "name", "This tenant already has a project with this name.")
    audit_record(actor=actor, action="project.created", target=project, tenant=tenant,
                 project=project, after=snapshot(project, PROJECT_FIELDS))
    return project


@transaction.atomic
def project_update(*, actor: User, project: Project, **changes: Any) -> Project:
    require(actor, permissions.CHANGE, project)
    if "tenant" in changes and changes["tenant"] != project.tenant:
        raise ValidationError({"tenant": ["A project cannot move to another tenant."]})
    changes.pop("tenant", None)
    before = snapshot(project, PROJECT_FIELDS)
    _apply(project, changes, PROJECT_FIELDS)
    _full_clean(project, unique_field="name")
    _save_or_field_error(project, "name", "This tenant already has a project with this name.")
    audit_record(actor=actor, action="project.updated", target=project, tenant=project.tenant,
                 project=project, before=before, after=snapshot(project, PROJECT_FIELDS))
    return project


@transaction.atomic
def project_delete(*, actor: User, project: Project) -> None:
    require(actor, permissions.DELETE, project)
    audit_record(actor=actor, action="project.deleted", target=project, tenant=project.tenant,
                 project=project, before=snapshot(project, PROJECT_FIELDS))
    project.delete()


# --- memberships -----------------------------------------------------------------------


@transaction.atomic
def membership_create(
    *, actor: User, user: User, tenant: Tenant, role: str, project: Project | None = None
) -> Membership:
    if project is not None and project.tenant_id != tenant.pk:
        raise ValidationError({"project": ["This project belongs to another tenant."]})
    membership = Membership(user=user, tenant=tenant, project=project, role=role)
    _check_role_scope(membership)
    require(actor, permissions.CREATE, membership)
    _full_clean(membership, unique_field="user")
    _save_or_field_error(membership, "user", "This user already has a role here.")
    permissions.forget_scope(user)
    audit_record(actor=actor, action="membership.created", target=membership, tenant=tenant,
                 project=project, after=snapshot(membership, MEMBERSHIP_FIELDS))
    return membership


@transaction.atomic
def membership_update(*, actor: User, membership: Membership, role: str) -> Membership:
    require(actor, permissions.CHANGE, membership)
    before = snapshot(membership, MEMBERSHIP_FIELDS)
    membership.role = role
    _check_role_scope(membership)
    # The new role must be one the actor may grant, too.
    require(actor, permissions.CHANGE, membership)
    _full_clean(membership)
    membership.save()
    permissions.forget_scope(membership.user)
    audit_record(actor=actor, action="membership.updated", target=membership,
                 tenant=membership.tenant, project=membership.project,
                 before=before, after=snapshot(membership, MEMBERSHIP_FIELDS))
    return membership


@transaction.atomic
def membership_delete(*, actor: User, membership: Membership) -> None:
    require(actor, permissions.DELETE, membership)
    audit_record(actor=actor, action="membership.deleted", target=membership,
                 tenant=membership.tenant, project=membership.project,
                 before=snapshot(membership, MEMBERSHIP_FIELDS))
    permissions.forget_scope(membership.user)
    membership.delete()


def _check_role_scope(membership: Membership) -> None:
    if membership.role not in Role.values:
        raise ValidationError({"role": [f"Choose one of: {', '.join(Role.values)}."]})
    if membership.role == Role.TENANT_OWNER and membership.project_id is not None:
        raise ValidationError({"role": ["Tenant owner is a tenant role: leave project empty."]})
    if membership.role != Role.TENANT_OWNER and membership.project_id is None:
        raise ValidationError({"project": ["Project roles need a project."]})


# --- quotas ----------------------------------------------------------------------------


def quota_target_of(quota: Quota) -> models.Model:
    target = quota.target()
    assert target is not None
    return target


@transaction.atomic
def quota_set(
    *,
    actor: User,
    scope: str,
    cluster: Any = None,
    tenant: Tenant | None = None,
    project: Project | None = None,
    values: dict[str, Any],
) -> Quota:
    """Create or replace the quota of one queue-tree node, validated against the tree.

    Rules: every amount ≥ 0; guaranteed ≤ limit; the children's guaranteed add up
    to at most the parent's guaranteed; a child's limit is at most the parent's
    limit. A level without a quota row constrains nothing below it.
    """
    # A field the scope does not use is refused by name, never dropped: a tenant or project
    # quota applies on every cluster (per-cluster parts of a tenant's GPUs are the
    # ``*_all_clusters`` amounts), so ``"scope": "tenant", "cluster": 1`` is a mistake to say.
    unused = {QuotaScope.PROJECT: ("cluster",), QuotaScope.TENANT: ("cluster", "project"),
              QuotaScope.CLUSTER: ("tenant", "project")}.get(scope, ())  # type: ignore[call-overload]
    given = {"cluster": cluster, "tenant": tenant, "project": project}
    if scope == QuotaScope.PROJECT and tenant is not None and project is not None and (
            tenant != project.tenant):
        raise ValidationError({"tenant": ["The project belongs to another tenant; leave tenant out."]})
    wrong = {f: [f"A {scope} quota has no {f}: it applies on every cluster." if f == "cluster" else
                 f"A {scope} quota has no {f}."] for f in unused if given[f] is not None}
    if wrong:
        raise ValidationError(wrong)
    if scope == QuotaScope.PROJECT:
        if project is None:
            raise ValidationError({"project": ["A project quota needs a project."]})
        tenant, cluster = project.tenant, None
    elif scope == QuotaScope.TENANT:
        if tenant is None:
            raise ValidationError({"tenant": ["A tenant quota needs a tenant."]})
        project, cluster = None, None
    elif scope == QuotaScope.CLUSTER:
        if cluster is None:
            raise ValidationError({"cluster": ["A cluster quota needs a cluster."]})
        tenant, project = None, None
    else:
        raise ValidationError({"scope": [f"Choose one of: {', '.join(QuotaScope.values)}."]})
    _lock_quota_tree()
    lookup = {"scope": scope, "cluster": cluster, "tenant": tenant, "project": project}
    quota = Quota.objects.select_for_update().filter(**lookup).first()
    creating = quota is None
    if quota is None:
        quota = Quota(**lookup)
    require(actor, permissions.CREATE if creating else permissions.CHANGE, quota)
    before = None if creating else snapshot(quota, QUOTA_FIELDS)
    unknown = set(values) - set(QUOTA_FIELDS)
    if unknown:
        raise ValidationError({name: ["Unknown quota field."] for name in sorted(unknown)})
    for name in QUOTA_FIELDS:
        if name in values:
            setattr(quota, name, values[name])
        elif creating and name.endswith("_guaranteed"):
            setattr(quota, name, 0)
    _full_clean(quota)
    _validate_quota_tree(quota)
    quota.save()
    audit_record(
        actor=actor, action="quota.created" if creating else "quota.updated", target=quota,
        tenant=tenant, project=project, target_repr=str(quota),
        before=before, after=snapshot(quota, QUOTA_FIELDS),
    )
    return quota


_QUOTA_LOCK_KEY = 0x43414D5051  # "CAMPQ"


def _lock_quota_tree() -> None:
    """Serialise quota changes: the tree rules read siblings, parents and children, so two
    concurrent changes could each pass and together break them. Quota edits are rare."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_QUOTA_LOCK_KEY])


def _validate_quota_tree(quota: Quota) -> None:
    errors: dict[str, list[str]] = {}
    glim = quota.gpus_limit_all_clusters
    if glim is not None:
        if quota.scope == QuotaScope.CLUSTER:
            errors["gpus_limit_all_clusters"] = [
                "Only tenant and project quotas have a limit across all clusters."]
        elif glim < quota.gpus_guaranteed:
            errors["gpus_limit_all_clusters"] = [
                f"Below the per-cluster GPU guarantee ({_num(quota.gpus_guaranteed)}): at least that, "
                f"or lower gpus_guaranteed first."]
    for r in RESOURCES:
        g, lim = getattr(quota, f"{r}_guaranteed"), getattr(quota, f"{r}_limit")
        if lim is not None and g > lim:
            errors.setdefault(f"{r}_guaranteed", []).append(
                f"Guaranteed {RESOURCE_LABELS[r]} ({g}) is above the limit ({lim})."
            )
    parent_totals, parent_name = _parent_totals(quota)
    siblings = _siblings(quota)
    children = _children(quota)
    for r in RESOURCES:
        g_field, l_field = f"{r}_guaranteed", f"{r}_limit"
        g, lim = getattr(quota, g_field), getattr(quota, l_field)
        if parent_totals is not None:
            parent_g, parent_l = parent_totals[g_field], parent_totals[l_field]
            sib = siblings.aggregate(s=Sum(g_field))["s"] or 0
            if g + sib > parent_g:
                errors.setdefault(g_field, []).append(
                    f"{parent_name} guarantees {parent_g} {RESOURCE_LABELS[r]}; with this value "
                    f"its children would be guaranteed {g + sib} in all."
                )
            if parent_l is not None and (lim is None or lim > parent_l):
                if lim is not None:
                    errors.setdefault(l_field, []).append(
                        f"Above the {parent_name.lower()} limit of {parent_l} {RESOURCE_LABELS[r]}."
                    )
        if children is not None:
            child_g = children.aggregate(s=Sum(g_field))["s"] or 0
            if g < child_g:
                errors.setdefault(g_field, []).append(
                    f"Below what is already guaranteed to the level beneath ({child_g} "
                    f"{RESOURCE_LABELS[r]} in all); lower those first."
                )
            if lim is not None:
                child_max = children.exclude(**{f"{l_field}__isnull": True}).aggregate(
                    m=models.Max(l_field))["m"]
                if child_max is not None and child_max > lim:
                    errors.setdefault(l_field, []).append(
                        f"Below a limit already given beneath ({child_max} {RESOURCE_LABELS[r]})."
                    )
    if glim is not None and "gpus_limit_all_clusters" not in errors:
        # As for the per-cluster limits: a project's is at most its tenant's.
        parent_glim = parent_totals.get("gpus_limit_all_clusters") if parent_totals else None
        if parent_glim is not None and glim > parent_glim:
            errors["gpus_limit_all_clusters"] = [
                f"Above the tenant's GPU limit across all clusters ({parent_glim})."]
        if children is not None:
            child_max = children.aggregate(m=models.Max("gpus_limit_all_clusters"))["m"]
            if child_max is not None and child_max > glim:
                errors["gpus_limit_all_clusters"] = [
                    f"Below a project's GPU limit across all clusters ({child_max}); lower it first."]
    _validate_all_cluster_guarantee(quota, parent_totals, siblings, children, errors)
    _validate_platform_guarantee(quota, parent_totals, siblings, errors)
    _validate_class_limits(quota, parent_totals, children, errors)
    if errors:
        raise ValidationError(errors)


def _num(value: Any) -> str:
    """A GPU count as people write it: 24, 2.5 (not 24.00)."""
    return f"{Decimal(str(value)).normalize():f}"


def _validate_all_cluster_guarantee(quota: Quota, parent_totals: dict[str, Any] | None,
                                    siblings: models.QuerySet[Quota],
                                    children: models.QuerySet[Quota] | None,
                                    errors: dict[str, list[str]]) -> None:
    """``gpus_guaranteed_all_clusters``, mirroring the per-cluster guarantee's rules: tenant
    and project quotas only; ≥ 0 (the field's validator); at most the GPU limit across all
    clusters; the projects' together at most their tenant's (a tenant quota without one
    guarantees none across all clusters), the tenants' together at most what the enabled
    clusters guarantee; a tenant's not below what its projects are guaranteed."""
    field, g = "gpus_guaranteed_all_clusters", quota.gpus_guaranteed_all_clusters
    if field in errors:
        return
    if g is None:
        if children is not None and children.filter(**{f"{field}__gt": 0}).exists():
            errors[field] = ["Its projects have guarantees across all clusters; lower those first."]
        return
    if quota.scope == QuotaScope.CLUSTER:
        errors[field] = ["Only tenant and project quotas have a guarantee across all clusters."]
        return
    glim = quota.gpus_limit_all_clusters
    if glim is not None and quota.gpus_guaranteed + g > glim:
        # The per-cluster guarantee and this cluster's part (up to all of it) are guaranteed
        # together on one cluster: more than the limit across all clusters could never be held.
        per, room = _num(quota.gpus_guaranteed), glim - quota.gpus_guaranteed
        if room < 0:  # the limit is below the per-cluster guarantee itself: no value fits
            errors[field] = [f"The GPU limit across all clusters ({_num(glim)}) is below the per-cluster "
                             f"GPU guarantee ({per}), so no guarantee across all clusters fits: raise "
                             f"gpus_limit_all_clusters to at least {_num(quota.gpus_guaranteed + g)} "
                             f"({per} per cluster + {_num(g)} across all clusters) first, or lower "
                             f"gpus_guaranteed."]
        else:
            errors[field] = [f"With the per-cluster GPU guarantee ({per}), above the GPU limit across "
                             f"all clusters ({_num(glim)}): at most {_num(room)}, or raise "
                             f"gpus_limit_all_clusters first."]
        return
    if parent_totals is None and quota.scope == QuotaScope.PROJECT and g > 0:
        # No tenant quota: the tenant guarantees nothing across all clusters (else a tenant
        # owner could give a project any guarantee, bounded by no tenant and no platform).
        errors[field] = ["The tenant has no quota, so it guarantees 0 GPUs across all clusters; "
                         "a platform admin gives the tenant a quota first."]
        return
    if parent_totals is not None:
        key = field if quota.scope == QuotaScope.PROJECT else "gpus_guaranteed"
        parent_g = parent_totals.get(key) or 0
        sib = siblings.aggregate(s=Sum(field))["s"] or 0
        if g + sib > parent_g:
            whose = ("The tenant guarantees" if quota.scope == QuotaScope.PROJECT
                     else "The platform's clusters guarantee")
            errors[field] = [f"{whose} {parent_g} GPUs across all clusters; with this value its "
                             f"{'projects' if quota.scope == QuotaScope.PROJECT else 'tenants'} "
                             f"would be guaranteed {g + sib} in all."]
            return
    if children is not None:
        child_g = children.aggregate(s=Sum(field))["s"] or 0
        if g < child_g:
            errors[field] = [f"Below what its projects are guaranteed across all clusters "
                             f"({child_g} GPUs in all); lower those first."]


def _validate_platform_guarantee(quota: Quota, parent_totals: dict[str, Any] | None,
                                 siblings: models.QuerySet[Quota], errors: dict[str, list[str]]) -> None:
    """The tenants' GPU guarantees per cluster and across all clusters together stay within
    what the enabled clusters guarantee (each is checked alone above; together they must not
    promise the same GPUs twice): a per-cluster guarantee holds on EACH enabled cluster, so
    what the guarantees across all clusters may share is, cluster by cluster, what is left of
    that cluster's guarantee once every tenant's per-cluster guarantee is taken off
    (Σ G ≤ Σ_clusters max(0, guarantee_c − Σ g)). Named on the field raised: the per-cluster
    guarantee when only it grew, else the one across all clusters."""
    field = "gpus_guaranteed_all_clusters"
    if quota.scope != QuotaScope.TENANT or parent_totals is None or field in errors \
            or "gpus_guaranteed" in errors:
        return
    g, big_g = quota.gpus_guaranteed, quota.gpus_guaranteed_all_clusters or 0
    sib = siblings.aggregate(a=Sum("gpus_guaranteed"), b=Sum(field))
    all_g, all_big_g = g + (sib["a"] or 0), big_g + (sib["b"] or 0)
    if not all_big_g:
        return  # per-cluster guarantees only: the per-cluster rule above
    clusters = list(Quota.objects.filter(scope=QuotaScope.CLUSTER, cluster__enabled=True)
                    .values_list("gpus_guaranteed", flat=True))
    rest = sum(max(Decimal(0), c - all_g) for c in clusters)
    if all_big_g <= rest:
        return
    platform = parent_totals.get("gpus_guaranteed") or 0
    total = all_g * len(clusters) + all_big_g
    old = (Quota.objects.filter(pk=quota.pk).values_list("gpus_guaranteed", field).first()
           if quota.pk else None)
    name = "gpus_guaranteed" if old is not None and g > old[0] and big_g <= (old[1] or 0) else field
    errors[name] = [f"The platform's clusters guarantee {platform} GPUs; with this value the tenants "
                    f"would be guaranteed {total} in all (their per-cluster guarantees, {all_g} "
                    f"on each of the {len(clusters)} enabled clusters, and {all_big_g} across all "
                    f"clusters: at most {rest} are left for these)."]


def _validate_class_limits(quota: Quota, parent_totals: dict[str, Any] | None,
                           children: models.QuerySet[Quota] | None,
                           errors: dict[str, list[str]]) -> None:
    """``gpu_memory_mib_limits_all_clusters``: {GPU model class: MiB ≥ 0}, tenant and project
    quotas only; a class the inventory knows (any well-formed name while no GPU is known);
    a project's at most its tenant's for the same class; a tenant's not below a project's."""
    limits = quota.gpu_memory_mib_limits_all_clusters
    if limits in (None, {}):
        quota.gpu_memory_mib_limits_all_clusters = {}
        limits = {}
    problems: list[str] = []
    if not isinstance(limits, dict):
        errors[CLASS_LIMITS] = ["Give a map of GPU model class to GPU memory (MiB)."]
        return
    if limits and quota.scope == QuotaScope.CLUSTER:
        errors[CLASS_LIMITS] = ["Only tenant and project quotas have limits across all clusters."]
        return
    if len(limits) > _MAX_CLASSES:
        errors[CLASS_LIMITS] = [f"At most {_MAX_CLASSES} GPU model classes."]
        return
    known = extensions.gpu_model_classes()
    for name, mib in limits.items():
        if not isinstance(name, str) or not _CLASS_NAME.match(name):
            problems.append(f"{name!r} is not a GPU model class name.")
        elif known and name not in known:
            problems.append(f"Unknown GPU model class {name!r}; the clusters have: "
                            f"{', '.join(sorted(known))}.")
        elif isinstance(mib, bool) or not isinstance(mib, int) or not 0 <= mib <= _MAX_MIB:
            problems.append(f"{name}: give whole MiB, from 0 to {_MAX_MIB}.")
    if not problems and quota.scope == QuotaScope.PROJECT and parent_totals is not None:
        parent = parent_totals.get(CLASS_LIMITS) or {}
        problems += [f"{name}: above the tenant's limit across all clusters ({parent[name]} MiB)."
                     for name, mib in limits.items() if name in parent and mib > parent[name]]
    if not problems and children is not None:
        for child in children.exclude(**{CLASS_LIMITS: {}}).values_list(CLASS_LIMITS, flat=True):
            problems += [f"{name}: below a project's limit across all clusters ({child[name]} MiB); "
                         "lower it first." for name, mib in limits.items()
                         if name in (child or {}) and child[name] > mib]
    if problems:
        errors[CLASS_LIMITS] = sorted(set(problems))


def _parent_totals(quota: Quota) -> tuple[dict[str, Any] | None, str]:
    if quota.scope == QuotaScope.PROJECT:
        parent = Quota.objects.filter(scope=QuotaScope.TENANT, tenant=quota.tenant).first()
        if parent is None:
            return None, ""
        return {f: getattr(parent, f) for f in QUOTA_FIELDS}, "The tenant"
    if quota.scope == QuotaScope.TENANT:
        clusters = list(Quota.objects.filter(scope=QuotaScope.CLUSTER, cluster__enabled=True))
        if not clusters:
            return None, ""
        totals: dict[str, Any] = {}
        for r in RESOURCES:
            totals[f"{r}_guaranteed"] = sum(getattr(c, f"{r}_guaranteed") for c in clusters)
            limits = [getattr(c, f"{r}_limit") for c in clusters]
            totals[f"{r}_limit"] = None if any(v is None for v in limits) else sum(limits)
        return totals, "The platform's clusters"
    return None, ""


def _siblings(quota: Quota) -> models.QuerySet[Quota]:
    if quota.scope == QuotaScope.PROJECT:
        qs = Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=quota.tenant)
    elif quota.scope == QuotaScope.TENANT:
        qs = Quota.objects.filter(scope=QuotaScope.TENANT)
    else:
        qs = Quota.objects.filter(scope=QuotaScope.CLUSTER)
    return qs.exclude(pk=quota.pk) if quota.pk else qs


def _children(quota: Quota) -> models.QuerySet[Quota] | None:
    if quota.scope == QuotaScope.TENANT:
        return Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=quota.tenant)
    if quota.scope == QuotaScope.CLUSTER:
        # Tenants draw on all enabled clusters together; checked against their sum.
        return None
    return None


@transaction.atomic
def quota_delete(*, actor: User, quota: Quota) -> None:
    require(actor, permissions.DELETE, quota)
    _lock_quota_tree()
    if quota.scope == QuotaScope.TENANT and _children(quota).exists():  # type: ignore[union-attr]
        raise ValidationError({"scope": ["Remove the project quotas of this tenant first."]})
    audit_record(actor=actor, action="quota.deleted", target=quota, tenant=quota.tenant,
                 project=quota.project, target_repr=str(quota),
                 before=snapshot(quota, QUOTA_FIELDS))
    quota.delete()


# --- API tokens ------------------------------------------------------------------------

TOKEN_PREFIX = "camp_"  # noqa: S105 (a public marker, not a secret)


def hash_token(plaintext: str) -> str:
    # A token carries 256 random bits, so a fast hash suffices (as GitHub and
    # Django REST Knox do); slow KDFs only matter for guessable secrets.
    return hashlib.sha256(plaintext.encode()).hexdigest()


@transaction.atomic
def token_create(
    *,
    actor: User,
    name: str,
    project: Project | None = None,
    read_only: bool = False,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """Create a token for ``actor``; returns the row and the plaintext, shown only once."""
    if not name.strip():
        raise ValidationError({"name": ["Give the token a name."]})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": ["The expiry must be in the future."]})
    public = secrets.token_hex(4)
    plaintext = f"{TOKEN_PREFIX}{public}_{secrets.token_urlsafe(32)}"
    token = ApiToken(
        user=actor, name=name.strip(), prefix=f"{TOKEN_PREFIX}{public}",
        key_hash=hash_token(plaintext), project=project, read_only=read_only,
        expires_at=expires_at,
    )
    require(actor, permissions.CREATE, token)
    _full_clean(token)
    token.save()
    audit_record(actor=actor, action="token.created", target=token,
                 tenant=project.tenant if project else None, project=project,
                 after=snapshot(token, TOKEN_FIELDS))
    return token, plaintext


@transaction.atomic
def token_revoke(*, actor: User, token: ApiToken) -> ApiToken:
    require(actor, permissions.DELETE, token)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action="token.revoked", target=token,
                     tenant=token.project.tenant if token.project else None,
                     project=token.project, before=snapshot(token, TOKEN_FIELDS))
    return token


def token_authenticate(plaintext: str) -> ApiToken | None:
    """The live token for ``plaintext``, or None (unknown, revoked, expired, inactive user)."""
    if not plaintext.startswith(TOKEN_PREFIX):
        return None
    # key_hash is unique: no ORDER BY (``first()`` would add Meta.ordering's, whose compiling
    # hashes every selected column of the four tables, on every API request).
    token = next(iter(
        ApiToken.objects.select_related("user", "project__tenant")
        .filter(key_hash=hash_token(plaintext)).order_by()[:1]), None)
    now = timezone.now()
    if token is None or token.revoked_at is not None or not token.user.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    # Record use at most once a minute: a hot token must not write on every request.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


# --- users -----------------------------------------------------------------------------


@transaction.atomic
def user_create(
    *,
    actor: User,
    username: str,
    password: str | None,
    email: str = "",
    first_name: str = "",
    last_name: str = "",
    is_platform_admin: bool = False,
) -> User:
    from django.contrib.auth.password_validation import validate_password

    user = User(username=username, email=email, first_name=first_name, last_name=last_name,
                is_platform_admin=is_platform_admin)
    require(actor, permissions.CREATE, user)
    _full_clean(user, exclude=["password"])
    if password:
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise ValidationError({"password": exc.messages}) from exc
        user.set_password(password)
    else:
        user.set_unusable_password()
    _save_or_field_error(user, "username", "A user with that username already exists.")
    audit_record(actor=actor, action="user.created", target=user, after=snapshot(user, USER_FIELDS))
    return user


@transaction.atomic
def user_update(*, actor: User, user: User, **changes: Any) -> User:
    require(actor, permissions.CHANGE, user)
    if user.pk == actor.pk and changes.get("is_platform_admin") is False:
        raise ValidationError({"is_platform_admin": ["You cannot remove your own admin role."]})
    if user.pk == actor.pk and changes.get("is_active") is False:
        raise ValidationError({"is_active": ["You cannot deactivate yourself."]})
    before = snapshot(user, USER_FIELDS)
    password = changes.pop("password", None)
    _apply(user, changes, USER_FIELDS)
    _full_clean(user, exclude=["password"])
    if password:
        from django.contrib.auth.password_validation import validate_password

        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise ValidationError({"password": exc.messages}) from exc
        user.set_password(password)
    _save_or_field_error(user, "username", "A user with that username already exists.")
    after = snapshot(user, USER_FIELDS)
    if password:
        after["password"] = "(changed)"  # noqa: S105 (audit marker; the password is never recorded)
    audit_record(actor=actor, action="user.updated", target=user, before=before, after=after)
    return user


def _apply(obj: models.Model, changes: dict[str, Any], allowed: Iterable[str]) -> None:
    allowed = set(allowed)
    for name, value in changes.items():
        if name not in allowed:
            raise ValidationError({name: ["This field cannot be changed."]})
        setattr(obj, name, value)


def decimal_or_none(value: Any) -> Decimal | None:
    return None if value in (None, "") else Decimal(str(value))
