"""Access rules of tenancy's own models (tenants/permissions.py explains the rules).

Registered from ``TenantsConfig.ready()``; the apps above register theirs the same way.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from .models import (
    PROJECT_ROLES,
    ApiToken,
    AuditEvent,
    IdempotencyRecord,
    Membership,
    OidcSession,
    Project,
    Quota,
    QuotaScope,
    Tenant,
    User,
)
from .permissions import (
    CREATE,
    DELETE,
    EVERYONE,
    NOBODY,
    PROJECT_ADMIN,
    PROJECT_MEMBER,
    SELF,
    TENANT_MEMBER,
    TENANT_OWNER,
    VIEW,
    Internal,
    PlatformOnly,
    ProjectScoped,
    Scope,
    Special,
    TenantScoped,
    Tiered,
    register,
    row_visible,
)


def _membership_visible(scope: Scope, user: Any) -> Q:
    return (Q(tenant_id__in=scope.owner_tenants) | Q(project_id__in=scope.projects)
            | Q(project__isnull=True, tenant_id__in=scope.tenants))


def _membership_can(user: Any, scope: Scope, action: str, obj: Membership) -> bool:
    if action == VIEW:
        if obj.project_id is None:
            return obj.tenant_id in scope.tenants
        return obj.tenant_id in scope.owner_tenants or obj.project_id in scope.projects
    if obj.tenant_id in scope.owner_tenants:
        return True
    # Project admins manage the project roles of their own project, never tenant owners.
    return (obj.project_id is not None and obj.role in PROJECT_ROLES
            and obj.project_id in scope.admin_projects)


def _token_visible(scope: Scope, user: Any) -> Q:
    # Tokens are private to their user (platform admins, as everywhere, see all); a
    # project-scoped token reaches only the user's tokens of that same project.
    q = Q(user_id=user.pk)
    parent: ApiToken | None = getattr(user, "camp_token", None)
    if parent is not None and parent.project_id is not None:
        q &= Q(project_id=parent.project_id)
    return q


def _token_can(user: Any, scope: Scope, action: str, obj: ApiToken) -> bool:
    if user.pk is None or obj.user_id != user.pk:
        return False
    parent: ApiToken | None = getattr(user, "camp_token", None)
    if parent is not None and parent.project_id is not None and obj.project_id != parent.project_id:
        return False  # a project token acts on its own project's tokens only
    if action == CREATE and parent is not None and not _no_broader(obj, parent):
        return False
    if action == CREATE and obj.project_id is not None:
        return obj.project_id in scope.projects or (
            obj.project is not None and obj.project.tenant_id in scope.owner_tenants
        )
    return action in (VIEW, CREATE, DELETE)


def _no_broader(new: ApiToken, parent: ApiToken) -> bool:
    """A token may only mint tokens no broader than itself: same project narrowing,
    read-only if it is, and expiring no later than it does."""
    if parent.project_id is not None and new.project_id != parent.project_id:
        return False
    if parent.read_only and not new.read_only:
        return False
    if parent.expires_at is not None and (new.expires_at is None or new.expires_at > parent.expires_at):
        return False
    return True


def _user_visible(scope: Scope, user: Any) -> Q:
    # Oneself, and everyone holding a role where the user reads memberships.
    return (Q(pk=user.pk) | Q(memberships__tenant_id__in=scope.owner_tenants)
            | Q(memberships__project_id__in=scope.projects)
            | Q(memberships__project__isnull=True, memberships__tenant_id__in=scope.tenants))


def _user_can(user: Any, scope: Scope, action: str, obj: User) -> bool:
    if action == VIEW:
        return obj.pk == user.pk or row_visible(user, obj)
    return False  # accounts are managed by platform admins (and SSO)


def register_rules() -> None:
    # Only platform admins create, rename or delete tenants.
    register(Tenant, TenantScoped(tenant=SELF, view=TENANT_MEMBER))
    # Owners create and delete projects; project admins change theirs.
    register(Project, ProjectScoped(project=SELF, view=PROJECT_MEMBER, create=TENANT_OWNER,
                                    change=PROJECT_ADMIN, delete=TENANT_OWNER))
    register(Membership, Special(visible=_membership_visible, can=_membership_can))
    # Cluster and tenant quotas are the platform's to give; owners split theirs into projects.
    register(Quota, Tiered("scope", {
        QuotaScope.CLUSTER: PlatformOnly(view=EVERYONE),
        QuotaScope.TENANT: TenantScoped(view=TENANT_MEMBER),
        QuotaScope.PROJECT: ProjectScoped(view=PROJECT_MEMBER, create=TENANT_OWNER,
                                          change=TENANT_OWNER, delete=TENANT_OWNER),
    }))
    register(ApiToken, Special(visible=_token_visible, can=_token_can))
    # The audit log is append-only: nobody changes or deletes it, only owners read.
    register(AuditEvent, TenantScoped(view=TENANT_OWNER, create=NOBODY, change=NOBODY,
                                      delete=NOBODY))
    register(User, Special(visible=_user_visible, can=_user_can))
    register(IdempotencyRecord, Internal("the API's replay cache for Idempotency-Key"))
    register(OidcSession, Internal("which OpenID provider session a Camp session belongs to "
                                   "(back-channel logout, tenants/sso/backchannel.py)"))
    # SCIM provisioning credentials: the platform's own, platform admins only.
    from .scim.models import ScimGroup, ScimProvider, ScimToken, ScimUser

    register(ScimProvider, PlatformOnly(view=NOBODY))
    register(ScimToken, PlatformOnly(view=NOBODY))
    for model in (ScimUser, ScimGroup):
        register(model, Internal("written by the identity provider through /scim/v2 only"))

