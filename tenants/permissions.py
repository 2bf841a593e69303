"""The ONE place where access is decided (DESIGN.md §5).

``can(user, action, obj)`` answers "may this user do this to this object"; for
``create`` the object is an unsaved instance carrying its tenant/project.
``restrict(queryset, user)`` narrows a queryset to what the user may see.
Portal views and API viewsets both use only these two. Callers look objects up
through ``restrict`` first, so an object outside a user's reach is a 404, and a
visible object the user may not change is a 403.

Roles are ordered: platform admin > tenant owner > project admin > project member;
each holds every right of the ones below it within its scope. An API token may
narrow its user to one project (at most project admin there) and to read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.contrib.auth.models import AnonymousUser
from django.db.models import Model, Q, QuerySet

from registry.models import ExternalRegistry, Image
from scheduling.models import Cluster, GpuDevice, Job, Node, NodePool, SchedulingDecision
from workspaces.models import (
    DevEnvironment,
    ModelService,
    Profile,
    SshKey,
    TrainingCheckpoint,
    TrainingJob,
    WorkspacePolicy,
)

from .models import (
    PROJECT_ROLES,
    ApiToken,
    AuditEvent,
    Membership,
    Project,
    Quota,
    QuotaScope,
    Role,
    Tenant,
    User,
)

VIEW, CREATE, CHANGE, DELETE = "view", "create", "change", "delete"
ACTIONS = (VIEW, CREATE, CHANGE, DELETE)

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class Scope:
    """What one authenticated principal reaches, computed once per request."""

    platform_admin: bool = False
    read_only: bool = False
    owner_tenants: frozenset[int] = frozenset()
    admin_projects: frozenset[int] = frozenset()
    member_projects: frozenset[int] = frozenset()
    # tenant id of every project above, so tenant-level reads need no query
    project_tenants: dict[int, int] = field(default_factory=dict)

    @property
    def projects(self) -> frozenset[int]:
        return self.admin_projects | self.member_projects

    @property
    def tenants(self) -> frozenset[int]:
        return self.owner_tenants | frozenset(self.project_tenants.values())

    def is_project_admin(self, project: Project) -> bool:
        return project.tenant_id in self.owner_tenants or project.pk in self.admin_projects

    def is_project_reader(self, project: Project) -> bool:
        return self.is_project_admin(project) or project.pk in self.member_projects


NO_ACCESS = Scope()


def scope_of(user: Any) -> Scope:
    """The user's reach, narrowed by the API token that authenticated the request."""
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return NO_ACCESS
    if not user.is_active:
        return NO_ACCESS
    cached = getattr(user, "_camp_scope", None)
    if cached is not None:
        return cached
    token: ApiToken | None = getattr(user, "camp_token", None)
    owner: set[int] = set()
    admin: set[int] = set()
    member: set[int] = set()
    project_tenants: dict[int, int] = {}
    for tenant_id, project_id, role in Membership.objects.filter(user=user).values_list(
        "tenant_id", "project_id", "role"
    ):
        if role == Role.TENANT_OWNER:
            owner.add(tenant_id)
        elif project_id is not None:
            (admin if role == Role.PROJECT_ADMIN else member).add(project_id)
            project_tenants[project_id] = tenant_id
    platform = user.platform_admin
    if token is not None and token.project_id is not None:
        # A project token acts only in its project, as project admin at most.
        project = token.project
        assert project is not None
        platform = False
        in_owned = project.tenant_id in owner
        narrowed_admin = {project.pk} if (in_owned or project.pk in admin) else set()
        narrowed_member = {project.pk} if project.pk in member else set()
        owner, admin, member = set(), narrowed_admin, narrowed_member - narrowed_admin
        project_tenants = {project.pk: project.tenant_id} if (admin or member) else {}
    scope = Scope(
        platform_admin=platform,
        read_only=bool(token is not None and token.read_only),
        owner_tenants=frozenset(owner),
        admin_projects=frozenset(admin),
        member_projects=frozenset(member - admin),
        project_tenants=project_tenants,
    )
    user._camp_scope = scope
    return scope


def forget_scope(user: Any) -> None:
    """Drop the cached scope after the user's memberships change within a request."""
    if hasattr(user, "_camp_scope"):
        del user._camp_scope


# --- can -------------------------------------------------------------------------------


def can(user: Any, action: str, obj: Model) -> bool:
    """May ``user`` perform ``action`` (view/create/change/delete) on ``obj``?"""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    scope = scope_of(user)
    if action != VIEW and scope.read_only:
        return False
    rule = _RULES.get(type(obj))
    if rule is None:
        return False
    if scope.platform_admin:
        return True
    return rule(user, scope, action, obj)


def _tenant_rule(user: User, scope: Scope, action: str, obj: Tenant) -> bool:
    # Only platform admins create, rename or delete tenants.
    return action == VIEW and obj.pk in scope.tenants


def _project_rule(user: User, scope: Scope, action: str, obj: Project) -> bool:
    if action == VIEW:
        return obj.tenant_id in scope.owner_tenants or obj.pk in scope.projects
    if action == CHANGE:
        return scope.is_project_admin(obj)
    return obj.tenant_id in scope.owner_tenants  # create / delete: tenant owner


def _membership_rule(user: User, scope: Scope, action: str, obj: Membership) -> bool:
    if action == VIEW:
        if obj.project_id is None:
            return obj.tenant_id in scope.tenants
        return obj.tenant_id in scope.owner_tenants or obj.project_id in scope.projects
    if obj.tenant_id in scope.owner_tenants:
        return True
    # Project admins manage the project roles of their own project, never tenant owners.
    return (
        obj.project_id is not None
        and obj.role in PROJECT_ROLES
        and obj.project_id in scope.admin_projects
    )


def _quota_rule(user: User, scope: Scope, action: str, obj: Quota) -> bool:
    if action == VIEW:
        if obj.scope == QuotaScope.CLUSTER:
            return True
        if obj.scope == QuotaScope.TENANT:
            return obj.tenant_id in scope.tenants
        return obj.tenant_id in scope.owner_tenants or obj.project_id in scope.projects
    # Cluster and tenant quotas are the platform's to give; owners split theirs into projects.
    return obj.scope == QuotaScope.PROJECT and obj.tenant_id in scope.owner_tenants


def _token_rule(user: User, scope: Scope, action: str, obj: ApiToken) -> bool:
    if obj.user_id != user.pk:
        return False
    parent: ApiToken | None = getattr(user, "camp_token", None)
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


def _audit_rule(user: User, scope: Scope, action: str, obj: AuditEvent) -> bool:
    # The audit log is append-only: nobody changes or deletes it, only owners read.
    return action == VIEW and obj.tenant_id in scope.owner_tenants


def _user_rule(user: User, scope: Scope, action: str, obj: User) -> bool:
    if action == VIEW:
        return obj.pk == user.pk or restrict(User.objects.filter(pk=obj.pk), user).exists()
    return False  # accounts are managed by platform admins (and SSO)


def _infrastructure_rule(user: User, scope: Scope, action: str, obj: Model) -> bool:
    # Clusters, nodes and GPUs: every tenant member reads them; platform admins manage them.
    return action == VIEW and bool(scope.tenants)


def _pool_rule(user: User, scope: Scope, action: str, obj: NodePool) -> bool:
    # Shared pools are infrastructure every tenant member reads; a dedicated pool is seen
    # only by its tenants (its existence names who it serves). Platform admins manage them.
    if action != VIEW or not scope.tenants:
        return False
    return not obj.dedicated or (
        obj.pk is not None and obj.tenants.filter(pk__in=scope.tenants).exists())


def _job_rule(user: User, scope: Scope, action: str, obj: Job) -> bool:
    reader = obj.tenant_id in scope.owner_tenants or obj.project_id in scope.projects
    if action in (VIEW, CREATE):
        return reader  # every project member may submit to the project
    # change / delete (cancel): the job's owner, or a project admin and above.
    return (obj.tenant_id in scope.owner_tenants or obj.project_id in scope.admin_projects
            or (reader and obj.owner_id == user.pk))


def _decision_rule(user: User, scope: Scope, action: str, obj: SchedulingDecision) -> bool:
    return action == VIEW and _job_rule(user, scope, VIEW, obj.job)


def _catalog_rule(user: User, scope: Scope, action: str, obj: Image | ExternalRegistry) -> bool:
    # Images and registries belong to the platform (admins manage, every tenant member reads),
    # a tenant (its owners manage) or a project (its admins manage, its members read).
    if obj.scope == "platform":
        return action == VIEW and bool(scope.tenants)
    if obj.scope == "tenant":
        return obj.tenant_id in (scope.tenants if action == VIEW else scope.owner_tenants)
    if obj.tenant_id in scope.owner_tenants:
        return True
    return obj.project_id in (scope.projects if action == VIEW else scope.admin_projects)


def _profile_rule(user: User, scope: Scope, action: str, obj: Profile) -> bool:
    # Profiles are the platform's; an unrestricted one is for everyone, a restricted one only
    # for the tenants and projects it names (and the owners of those projects' tenants).
    if action != VIEW or not scope.tenants or obj.pk is None:
        return False
    return restrict(Profile.objects.filter(pk=obj.pk), user).exists()


def _workspace_policy_rule(user: User, scope: Scope, action: str, obj: WorkspacePolicy) -> bool:
    if action == VIEW:
        return obj.tenant_id in scope.owner_tenants or obj.project_id in scope.projects
    return obj.tenant_id in scope.owner_tenants or obj.project_id in scope.admin_projects


def _checkpoint_rule(user: User, scope: Scope, action: str, obj: TrainingCheckpoint) -> bool:
    return action == VIEW and _job_rule(user, scope, VIEW, obj.training)  # type: ignore[arg-type]


def _ssh_key_rule(user: User, scope: Scope, action: str, obj: SshKey) -> bool:
    # A user's SSH keys are theirs alone (platform admins, handled in can(), see all).
    return obj.user_id == user.pk and action in (VIEW, CREATE, DELETE)


_RULES: dict[type[Model], Any] = {
    Tenant: _tenant_rule,
    Project: _project_rule,
    Membership: _membership_rule,
    Quota: _quota_rule,
    ApiToken: _token_rule,
    AuditEvent: _audit_rule,
    User: _user_rule,
    Cluster: _infrastructure_rule,
    Node: _infrastructure_rule,
    GpuDevice: _infrastructure_rule,
    NodePool: _pool_rule,
    Job: _job_rule,
    SchedulingDecision: _decision_rule,
    Image: _catalog_rule,
    ExternalRegistry: _catalog_rule,
    Profile: _profile_rule,
    WorkspacePolicy: _workspace_policy_rule,
    # Workloads follow the job rule: project members see and launch; the owner or a
    # project admin stops and deletes.
    DevEnvironment: _job_rule,
    TrainingJob: _job_rule,
    TrainingCheckpoint: _checkpoint_rule,
    SshKey: _ssh_key_rule,
    # --- r4serve: model services (issue 15) follow the job rule like the other workload
    # kinds. One block, converted to a per-app registration at merge (issue 14).
    ModelService: _job_rule,
    # --- end r4serve
}


# --- restrict --------------------------------------------------------------------------


def restrict(queryset: QuerySet[M], user: Any) -> QuerySet[M]:
    """Narrow ``queryset`` to the rows ``user`` may view."""
    scope = scope_of(user)
    model = queryset.model
    if scope is NO_ACCESS:
        return queryset.none()
    if model is ApiToken:
        # Tokens are private to their user, even from platform admins' listings.
        return queryset.filter(user_id=user.pk) if not scope.platform_admin else queryset
    if scope.platform_admin:
        return queryset
    q = _visible_q(model, scope, user)
    if q is None:
        return queryset.none()
    # DISTINCT only where the condition joins a many-valued relation (a row could match
    # twice): on jobs or audit events it would sort every visible row before LIMIT, and
    # count them the same way, where an index gives the first page directly.
    return queryset.filter(q).distinct() if model in _MANY_VALUED_RULES else queryset.filter(q)


# The models whose visibility condition joins a many-valued relation (see _visible_q).
_MANY_VALUED_RULES: frozenset[type[Model]] = frozenset({NodePool, Profile, User})


def _visible_q(model: type[Model], scope: Scope, user: User) -> Q | None:
    tenants, projects, owner = scope.tenants, scope.projects, scope.owner_tenants
    if model is Tenant:
        return Q(pk__in=tenants)
    if model is Project:
        return Q(tenant_id__in=owner) | Q(pk__in=projects)
    if model is Membership:
        return (
            Q(tenant_id__in=owner)
            | Q(project_id__in=projects)
            | Q(project__isnull=True, tenant_id__in=tenants)
        )
    if model is Quota:
        return (
            Q(scope=QuotaScope.CLUSTER)
            | Q(scope=QuotaScope.TENANT, tenant_id__in=tenants)
            | Q(scope=QuotaScope.PROJECT, tenant_id__in=owner)
            | Q(scope=QuotaScope.PROJECT, project_id__in=projects)
        )
    if model is AuditEvent:
        return Q(tenant_id__in=owner)
    if model in (Cluster, Node, GpuDevice):
        return Q() if tenants else None
    if model is NodePool:
        if not tenants:
            return None
        return Q(dedicated=False) | Q(tenants__in=tenants)
    if model is Job:
        return Q(tenant_id__in=owner) | Q(project_id__in=projects)
    if model is SchedulingDecision:
        return Q(job__tenant_id__in=owner) | Q(job__project_id__in=projects)
    if model in (Image, ExternalRegistry):
        return (
            (Q(scope="platform") if tenants else Q(pk__in=[]))
            | Q(scope="tenant", tenant_id__in=tenants)
            | Q(scope="project", tenant_id__in=owner)
            | Q(scope="project", project_id__in=projects)
        )
    if model is Profile:
        if not tenants:
            return None
        return (
            Q(tenants__isnull=True, projects__isnull=True)
            | Q(tenants__in=tenants)
            | Q(projects__in=projects)
            | Q(projects__tenant_id__in=owner)
        )
    if model in (WorkspacePolicy, DevEnvironment, TrainingJob):
        return Q(tenant_id__in=owner) | Q(project_id__in=projects)
    if model is ModelService:  # r4serve: model services (issue 15), as the workload kinds above
        return Q(tenant_id__in=owner) | Q(project_id__in=projects)
    if model is SshKey:
        return Q(user_id=user.pk)
    if model is TrainingCheckpoint:
        return Q(training__tenant_id__in=owner) | Q(training__project_id__in=projects)
    if model is User:
        return (
            Q(pk=user.pk)
            | Q(memberships__tenant_id__in=owner)
            | Q(memberships__project_id__in=projects)
            | Q(memberships__project__isnull=True, memberships__tenant_id__in=tenants)
        )
    return None


def actor_of(request: Any) -> User:
    """The authenticated user of a request, typed for services (login is required upstream)."""
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        from django.core.exceptions import PermissionDenied

        raise PermissionDenied("Authentication required.")
    return user
