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

Each app declares, next to its models (``<app>/access.py``, registered from its
``AppConfig.ready()``), how a row reaches its tenant/project and owner and who may do
what: one declarative rule per model (``ProjectScoped``, ``TenantScoped``,
``PlatformOnly``, ``OwnedBy``, ``Tiered``, ``Internal``; ``Special`` for the truly
unusual) from which
both the ``can`` answer and the ``restrict`` filter are derived. This module imports no
app above tenancy; a model nobody registered is an error, never a silent "no".
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db.models import Model, Q, QuerySet

from .models import ApiToken, Membership, Project, Role, User

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
    # unordered: the default ordering (tenant, project and user names) joined three tables
    # into every request's scope read for an order nothing here depends on
    for tenant_id, project_id, role in Membership.objects.filter(user=user).order_by().values_list(
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


# --- who may act ------------------------------------------------------------------------


class Who(enum.Enum):
    """Who, below platform admin, may take an action on a row (platform admins pass every
    registered rule). Read against the row's own tenant and project."""

    EVERYONE = "every signed-in principal"
    TENANT_MEMBER = "anyone with a role in the row's tenant (platform rows: in any tenant)"
    PROJECT_MEMBER = "the row's project members and admins, and its tenant's owners"
    PROJECT_ADMIN = "the row's project admins and its tenant's owners"
    TENANT_OWNER = "the row's tenant's owners"
    NOBODY = "platform admins only"


EVERYONE = Who.EVERYONE
TENANT_MEMBER = Who.TENANT_MEMBER
PROJECT_MEMBER = Who.PROJECT_MEMBER
PROJECT_ADMIN = Who.PROJECT_ADMIN
TENANT_OWNER = Who.TENANT_OWNER
NOBODY = Who.NOBODY

# A rule's path to the row itself (a Tenant is its own tenant, a Project its own project).
SELF = "pk"


class UnregisteredModel(LookupError):
    """``can``/``restrict`` was asked about a model no app registered an access rule for."""


# --- the registry ---------------------------------------------------------------------


class Checker:
    """A rule bound to one model: answers ``can`` for an object and ``restrict`` as a Q."""

    # Platform admins pass every rule except Internal's (nobody acts on those through can).
    admins_act: bool = True

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        raise NotImplementedError

    def visible(self, scope: Scope, user: Any) -> Q | None:
        """The rows ``user`` may view, or None for none (platform admins never get here)."""
        raise NotImplementedError


class Rule:
    """A declaration of how a model's rows reach their tenant/project and who may act."""

    def bind(self, model: type[Model]) -> Checker:
        raise NotImplementedError


@dataclass(frozen=True)
class _Registered:
    rule: Rule
    checker: Checker


_REGISTRY: dict[type[Model], _Registered] = {}


def register(model: type[Model], rule: Rule) -> None:
    """Register ``rule`` as the access rule of ``model`` (call from ``AppConfig.ready()``).

    Field paths are checked here, so a misspelt path fails at start-up, not per request.
    Registering the same rule again is a no-op; a different one is a configuration error.
    """
    existing = _REGISTRY.get(model)
    if existing is not None:
        if existing.rule == rule:
            return
        raise ImproperlyConfigured(f"{model._meta.label} already has an access rule.")
    _REGISTRY[model] = _Registered(rule, rule.bind(model))


def registered_models() -> frozenset[type[Model]]:
    return frozenset(_REGISTRY)


def rule_of(model: type[Model]) -> Rule:
    """The rule registered for ``model`` (UnregisteredModel if none)."""
    _checker(model)
    return _REGISTRY[model].rule


def _checker(model: type[Model]) -> Checker:
    entry = _REGISTRY.get(model)
    if entry is None:
        raise UnregisteredModel(
            f"No access rule is registered for {model._meta.label}: declare one in "
            f"{model._meta.app_label}/access.py and register it from the app's "
            "AppConfig.ready() (docs/ARCHITECTURE.md, 'Access rules')."
        )
    return entry.checker


# --- paths from a row to its tenant / project / owner --------------------------------------


@dataclass(frozen=True)
class _Path:
    """A declared path such as ``"project"`` or ``"training__tenant"``, resolved against the
    model: the relations to follow in Python, the id attribute at the end, and the ORM lookup."""

    hops: tuple[str, ...]
    attname: str
    lookup: str

    @classmethod
    def resolve(cls, model: type[Model], path: str) -> _Path:
        if path == SELF:
            return cls((), "pk", "pk")
        *hops, last = path.split("__")
        opts = model._meta
        for hop in hops:
            rel = _field(model, opts, hop, path)
            if not (rel.many_to_one or rel.one_to_one) or not rel.concrete:
                raise ImproperlyConfigured(f"{model._meta.label}: {path!r} must follow "
                                           "foreign keys only (one row per row).")
            opts = rel.related_model._meta  # type: ignore[union-attr]
        end = _field(model, opts, last, path)
        if not (end.many_to_one or end.one_to_one) or not end.concrete:
            raise ImproperlyConfigured(f"{model._meta.label}: {path!r} must end in a foreign key.")
        attname: str = end.attname  # type: ignore[union-attr]
        return cls(tuple(hops), attname, "__".join([*hops, attname]))

    def value(self, obj: Any) -> Any:
        for hop in self.hops:
            obj = getattr(obj, hop)
            if obj is None:
                return None
        return getattr(obj, self.attname)

    def among(self, ids: Any) -> Q:
        return Q(**{f"{self.lookup}__in": ids})


def _field(model: type[Model], opts: Any, name: str, path: str) -> Any:
    try:
        return opts.get_field(name)
    except FieldDoesNotExist as exc:
        raise ImproperlyConfigured(f"{model._meta.label}: access path {path!r} names no "
                                   f"field {name!r} of {opts.label}.") from exc


def _check_who(model: type[Model], rule: Rule, allowed: frozenset[Who], **given: Who) -> None:
    for action, who in given.items():
        if who not in allowed:
            raise ImproperlyConfigured(
                f"{model._meta.label}: {type(rule).__name__} cannot grant {action} to {who.name}.")


# --- the declarative rules --------------------------------------------------------------
# Hand-written on purpose: django-rules answers only the instance check and
# django-guardian stores per-object grants; bridgekeeper derives both a check and a Q from
# one rule but is not a dependency, and would still need Camp's role order, token narrowing
# and once-per-request Scope around it. This vocabulary is those few cases and no more.


@dataclass(frozen=True)
class PlatformOnly(Rule):
    """Rows of the platform itself (clusters, nodes, GPUs): platform admins manage them,
    ``view`` says who else reads them (EVERYONE, TENANT_MEMBER = anyone in some tenant,
    or NOBODY)."""

    view: Who = TENANT_MEMBER

    def bind(self, model: type[Model]) -> Checker:
        _check_who(model, self, frozenset({EVERYONE, TENANT_MEMBER, NOBODY}), view=self.view)
        return _PlatformChecker(self.view)


@dataclass(frozen=True)
class _PlatformChecker(Checker):
    view: Who

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        return action == VIEW and self._reads(scope)

    def visible(self, scope: Scope, user: Any) -> Q | None:
        return Q() if self._reads(scope) else None

    def _reads(self, scope: Scope) -> bool:
        return self.view is EVERYONE or (self.view is TENANT_MEMBER and bool(scope.tenants))


@dataclass(frozen=True)
class TenantScoped(Rule):
    """Rows that belong to one tenant, reached through ``tenant`` (a foreign-key path, or
    SELF for the Tenant itself). Each action names who may take it: EVERYONE,
    TENANT_MEMBER, TENANT_OWNER or NOBODY."""

    tenant: str = "tenant"
    view: Who = TENANT_MEMBER
    create: Who = NOBODY
    change: Who = NOBODY
    delete: Who = NOBODY

    def bind(self, model: type[Model]) -> Checker:
        _check_who(model, self, frozenset({EVERYONE, TENANT_MEMBER, TENANT_OWNER, NOBODY}),
                   view=self.view, create=self.create, change=self.change, delete=self.delete)
        return _TenantChecker(self, _Path.resolve(model, self.tenant))


@dataclass(frozen=True)
class _TenantChecker(Checker):
    rule: TenantScoped
    tenant: _Path

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        who: Who = getattr(self.rule, action)
        if who is EVERYONE or who is NOBODY:
            return who is EVERYONE
        return self.tenant.value(obj) in _tenants_for(who, scope)

    def visible(self, scope: Scope, user: Any) -> Q | None:
        who = self.rule.view
        if who is EVERYONE or who is NOBODY:
            return Q() if who is EVERYONE else None
        return self.tenant.among(_tenants_for(who, scope))


def _tenants_for(who: Who, scope: Scope) -> frozenset[int]:
    return scope.owner_tenants if who is TENANT_OWNER else scope.tenants


@dataclass(frozen=True)
class ProjectScoped(Rule):
    """Rows that belong to one project, reached through ``project`` and ``tenant`` (foreign-key
    paths such as ``"job__project"``; ``project=SELF`` for the Project itself). Each action
    names who may take it: EVERYONE, PROJECT_MEMBER, PROJECT_ADMIN, TENANT_OWNER or NOBODY.
    ``owner`` (a path to a user) and ``owner_may`` let the row's owner, while a project
    member, also take those actions (a member cancels their own job, not another's)."""

    project: str = "project"
    tenant: str = "tenant"
    view: Who = PROJECT_MEMBER
    create: Who = NOBODY
    change: Who = NOBODY
    delete: Who = NOBODY
    owner: str | None = None
    owner_may: tuple[str, ...] = ()

    def bind(self, model: type[Model]) -> Checker:
        _check_who(model, self,
                   frozenset({EVERYONE, PROJECT_MEMBER, PROJECT_ADMIN, TENANT_OWNER, NOBODY}),
                   view=self.view, create=self.create, change=self.change, delete=self.delete)
        if set(self.owner_may) - {CREATE, CHANGE, DELETE} or (self.owner_may and not self.owner):
            raise ImproperlyConfigured(f"{model._meta.label}: owner_may takes create/change/"
                                       "delete and needs owner= (owners see what members see).")
        return _ProjectChecker(self, _Path.resolve(model, self.tenant),
                               _Path.resolve(model, self.project),
                               _Path.resolve(model, self.owner) if self.owner else None)


@dataclass(frozen=True)
class _ProjectChecker(Checker):
    rule: ProjectScoped
    tenant: _Path
    project: _Path
    owner: _Path | None

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        who: Who = getattr(self.rule, action)
        if who is EVERYONE:
            return True
        # NOBODY never reads the row (an unsaved one may not reach its project yet).
        if who is not NOBODY and self._reaches(who, scope, obj):
            return True
        pk = getattr(user, "pk", None)
        return (action in self.rule.owner_may and self.owner is not None and pk is not None
                and self._reaches(PROJECT_MEMBER, scope, obj) and self.owner.value(obj) == pk)

    def _reaches(self, who: Who, scope: Scope, obj: Any) -> bool:
        if self.tenant.value(obj) in scope.owner_tenants:
            return True
        if who is TENANT_OWNER:
            return False
        projects = scope.admin_projects if who is PROJECT_ADMIN else scope.projects
        return self.project.value(obj) in projects

    def visible(self, scope: Scope, user: Any) -> Q | None:
        who = self.rule.view
        if who is EVERYONE or who is NOBODY:
            return Q() if who is EVERYONE else None
        q = self.tenant.among(scope.owner_tenants)
        if who is TENANT_OWNER:
            return q
        return q | self.project.among(scope.admin_projects if who is PROJECT_ADMIN
                                      else scope.projects)


@dataclass(frozen=True)
class OwnedBy(Rule):
    """Rows private to one user (``user``, a foreign-key path): only that user takes the
    actions in ``may``."""

    user: str = "user"
    may: tuple[str, ...] = (VIEW, CREATE, CHANGE, DELETE)

    def bind(self, model: type[Model]) -> Checker:
        return _OwnedChecker(self, _Path.resolve(model, self.user))


@dataclass(frozen=True)
class _OwnedChecker(Checker):
    rule: OwnedBy
    user: _Path

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        pk = getattr(user, "pk", None)
        return pk is not None and self.user.value(obj) == pk and action in self.rule.may

    def visible(self, scope: Scope, user: Any) -> Q | None:
        return Q(**{self.user.lookup: user.pk}) if VIEW in self.rule.may else None


@dataclass(frozen=True)
class Tiered(Rule):
    """Rows whose ``field`` says at which level they live (an image of the platform, of a
    tenant or of a project): one rule per value. A row with any other value is nobody's."""

    field: str
    tiers: Mapping[str, Rule]

    def bind(self, model: type[Model]) -> Checker:
        _field(model, model._meta, self.field, self.field)
        return _TieredChecker(self.field, {value: rule.bind(model)
                                           for value, rule in self.tiers.items()})


@dataclass(frozen=True)
class _TieredChecker(Checker):
    field: str
    tiers: Mapping[str, Checker]

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        tier = self.tiers.get(getattr(obj, self.field))
        return tier is not None and tier.allows(user, scope, action, obj)

    def visible(self, scope: Scope, user: Any) -> Q | None:
        parts = [(value, checker.visible(scope, user)) for value, checker in self.tiers.items()]
        qs = [Q(**{self.field: value}) & q for value, q in parts if q is not None]
        return functools.reduce(lambda a, b: a | b, qs) if qs else None


@dataclass(frozen=True)
class Internal(Rule):
    """Rows only Camp's own code touches (scheduler bookkeeping, statistics, caches), shown
    to users, if at all, through a row whose rule is checked (a job's pod groups through the
    job). ``can`` answers no to everyone, platform admins too; ``restrict`` leaves platform
    admins every row (as for any model) and everyone else none. ``reason`` says why."""

    reason: str

    def bind(self, model: type[Model]) -> Checker:
        return _InternalChecker()


class _InternalChecker(Checker):
    admins_act = False

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        return False

    def visible(self, scope: Scope, user: Any) -> Q | None:
        return None


@dataclass(frozen=True)
class Special(Rule):
    """The escape hatch, for a model whose reach no rule above describes (many-to-many
    reach, role-dependent rows). ``visible(scope, user)`` gives the rows the user may view;
    ``can(user, scope, action, obj)``, if given, answers ``can`` — without it a user may only
    view, and only a saved row that ``visible`` includes (one query)."""

    visible: Callable[[Scope, Any], Q | None]
    can: Callable[[Any, Scope, str, Any], bool] | None = None

    def bind(self, model: type[Model]) -> Checker:
        return _SpecialChecker(self)


@dataclass(frozen=True)
class _SpecialChecker(Checker):
    rule: Special

    def allows(self, user: Any, scope: Scope, action: str, obj: Any) -> bool:
        if self.rule.can is not None:
            return self.rule.can(user, scope, action, obj)
        return action == VIEW and row_visible(user, obj)

    def visible(self, scope: Scope, user: Any) -> Q | None:
        return self.rule.visible(scope, user)


def row_visible(user: Any, obj: Model) -> bool:
    """Is the saved ``obj`` among the rows ``restrict`` leaves ``user``? (one query)"""
    return obj.pk is not None and restrict(type(obj)._default_manager.filter(pk=obj.pk),
                                           user).exists()


# --- can ---------------------------------------------------------------------------------


def can(user: Any, action: str, obj: Model) -> bool:
    """May ``user`` perform ``action`` (view/create/change/delete) on ``obj``?"""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if not isinstance(obj, Model):
        raise TypeError(f"can() takes a model instance, not {type(obj).__name__}")
    checker = _checker(type(obj))
    scope = scope_of(user)
    if scope is NO_ACCESS:
        return False  # anonymous or inactive: nothing, whatever a rule would say of a row
    if action != VIEW and scope.read_only:
        return False
    if scope.platform_admin and checker.admins_act:
        return True
    return checker.allows(user, scope, action, obj)


def acts_as_platform_admin(user: Any, action: str = VIEW) -> bool:
    """May ``user`` take a platform-wide ``action`` that no model row carries (pausing the
    demo load, the platform's pages)? Read from the request's scope, so a platform admin's
    project-scoped token is not a platform admin and a read-only one only reads. Services
    ask this (or ``can``), never ``user.platform_admin`` (tests/unit/test_access_layering.py)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    scope = scope_of(user)
    return scope.platform_admin and (action == VIEW or not scope.read_only)


# --- restrict ----------------------------------------------------------------------------


def restrict(queryset: QuerySet[M], user: Any) -> QuerySet[M]:
    """Narrow ``queryset`` to the rows ``user`` may view."""
    model = queryset.model
    checker = _checker(model)
    scope = scope_of(user)
    if scope is NO_ACCESS:
        return queryset.none()
    if scope.platform_admin:
        return queryset
    q = checker.visible(scope, user)
    if q is None:
        return queryset.none()
    # DISTINCT only where the condition joins a many-valued relation (a row could match
    # twice): on jobs or audit events it would sort every visible row before LIMIT, and
    # count them the same way, where an index gives the first page directly.
    if any(_many_valued(model, lookup) for lookup in _lookups(q)):
        return queryset.filter(q).distinct()
    return queryset.filter(q)


def _lookups(q: Q) -> Iterator[str]:
    for child in q.children:
        if isinstance(child, Q):
            yield from _lookups(child)
        elif isinstance(child, tuple):
            yield child[0]


@functools.cache
def _many_valued(model: type[Model], lookup: str) -> bool:
    """Does ``lookup`` (e.g. ``memberships__tenant_id__in``) cross a to-many relation?"""
    opts = model._meta
    for part in lookup.split("__"):
        try:
            rel = opts.pk if part == "pk" else opts.get_field(part)
        except FieldDoesNotExist:
            return False  # a lookup such as "in" or "isnull": the path ended
        if rel is None or not rel.is_relation:
            return False
        if rel.many_to_many or rel.one_to_many:
            return True
        opts = rel.related_model._meta  # type: ignore[union-attr]
    return False

def actor_of(request: Any) -> User:
    """The authenticated user of a request, typed for services (login is required upstream)."""
    user = request.user
    if not isinstance(user, User) or not user.is_authenticated:
        from django.core.exceptions import PermissionDenied

        raise PermissionDenied("Authentication required.")
    return user
