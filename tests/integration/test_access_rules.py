"""The access-rule registry (tenants/permissions.py): every model a user can reach has a
rule, declared by the app that owns it, and a model without one is a loud error.

What each rule allows is the permission matrix's job (test_permission_matrix.py); these
tests pin the registry around it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model
from rest_framework import serializers

from tenants import permissions
from tenants.permissions import (
    PROJECT_ADMIN,
    VIEW,
    PlatformOnly,
    ProjectScoped,
    TenantScoped,
    UnregisteredModel,
    can,
    registered_models,
    restrict,
)

CAMP_APPS = ("tenants", "scheduling", "workspaces", "registry", "portal")


def _serializer_classes() -> set[type[serializers.BaseSerializer[Any]]]:
    """Every ModelSerializer Camp defines (viewsets' own, their actions', nested ones)."""
    found: set[type[serializers.BaseSerializer[Any]]] = set()
    todo: list[type[Any]] = [serializers.ModelSerializer]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] in CAMP_APPS:
                found.add(sub)
    return found


def _api_models() -> dict[type[Model], str]:
    """Each model the REST API exposes, with where it was found: the router's viewsets
    (their ``model``, ``queryset`` and serializer) and every Camp ModelSerializer."""
    from camp.api_urls import router

    exposed: dict[type[Model], str] = {}
    for prefix, viewset, _ in router.registry:
        for attr in ("model", "queryset"):
            value = getattr(viewset, attr, None)
            model = getattr(value, "model", value)
            if isinstance(model, type) and issubclass(model, Model):
                exposed.setdefault(model, f"/api/v1/{prefix}/ ({viewset.__name__}.{attr})")
        serializer = getattr(viewset, "serializer_class", None)
        meta = getattr(serializer, "Meta", None)
        if meta is not None and getattr(meta, "model", None) is not None:
            exposed.setdefault(meta.model, f"/api/v1/{prefix}/ ({serializer.__name__})")
    for serializer in _serializer_classes():
        meta = getattr(serializer, "Meta", None)
        if meta is not None and getattr(meta, "model", None) is not None:
            exposed.setdefault(meta.model, f"{serializer.__module__}.{serializer.__name__}")
    return exposed


def test_every_model_the_api_exposes_has_a_rule() -> None:
    exposed = _api_models()
    # The walk reaches top-level resources and the ones nested in them.
    from scheduling.models import Allocation, Job, PodGroup
    from workspaces.models import TrainingCheckpoint

    assert {Job, PodGroup, Allocation, TrainingCheckpoint} <= set(exposed)
    missing = {m._meta.label: where for m, where in exposed.items() if m not in registered_models()}
    assert missing == {}


def test_every_model_of_camps_apps_has_a_rule() -> None:
    """The portal pages, services and the API reach rows of every Camp app; each model
    is declared, even those only shown as aggregates (their rule says whose they are)."""
    models = [m for app in CAMP_APPS for m in apps.get_app_config(app).get_models()]
    assert len(models) > 20
    assert sorted(m._meta.label for m in models if m not in registered_models()) == []


def test_an_unregistered_model_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduling.models import Job

    monkeypatch.delitem(permissions._REGISTRY, Job)
    for call in (lambda: can(AnonymousUser(), VIEW, Job()),
                 lambda: restrict(Job.objects.all(), AnonymousUser())):
        with pytest.raises(UnregisteredModel, match=r"scheduling\.Job.*scheduling/access\.py"):
            call()


def test_a_misdeclared_rule_fails_when_it_is_registered() -> None:
    from scheduling.models import Job

    with pytest.raises(ImproperlyConfigured, match="'projekt'"):
        ProjectScoped(project="projekt").bind(Job)
    with pytest.raises(ImproperlyConfigured, match="foreign key"):
        ProjectScoped(project="name").bind(Job)
    with pytest.raises(ImproperlyConfigured, match="PROJECT_ADMIN"):
        TenantScoped(change=PROJECT_ADMIN).bind(Job)
    with pytest.raises(ImproperlyConfigured, match="owner_may"):
        ProjectScoped(owner_may=("change",)).bind(Job)
    # A second, different rule for a model is a conflict; the same one again is harmless
    # (an AppConfig.ready() that runs twice).
    with pytest.raises(ImproperlyConfigured, match="already has an access rule"):
        permissions.register(Job, PlatformOnly())
    permissions.register(Job, permissions.rule_of(Job))


@pytest.mark.django_db
def test_distinct_only_where_the_rule_crosses_a_to_many_relation(world: Any) -> None:
    """A row reached through a many-valued relation could match twice, so those rules
    (pools via their tenants, profiles via theirs, users via memberships) are DISTINCT; the
    others are not, so list pages read in index order (test_api_scale.py)."""
    from scheduling.models import Job, NodePool, SchedulingDecision
    from tenants.models import AuditEvent, Project, User
    from workspaces.models import Profile, TrainingCheckpoint

    def distinct(model: type[Model]) -> bool:
        return restrict(model._default_manager.all(), world.a.member).query.distinct

    assert {m.__name__: distinct(m) for m in (NodePool, Profile, User, Job, SchedulingDecision,
                                               TrainingCheckpoint, AuditEvent, Project)} == {
        "NodePool": True, "Profile": True, "User": True, "Job": False,
        "SchedulingDecision": False, "TrainingCheckpoint": False, "AuditEvent": False,
        "Project": False}


def test_can_takes_a_model_instance() -> None:
    with pytest.raises(TypeError, match="model instance"):
        can(AnonymousUser(), VIEW, "a job")  # type: ignore[arg-type]


@pytest.mark.django_db
def test_an_anonymous_principal_may_do_nothing(world: Any) -> None:
    """An unsaved row with no owner must not match an anonymous user's missing id."""
    from tenants.models import ApiToken, Quota, QuotaScope
    from workspaces.models import SshKey

    anonymous = AnonymousUser()
    for action in ("view", "create", "delete"):
        assert not can(anonymous, action, SshKey())
        assert not can(anonymous, action, ApiToken())
    assert not can(anonymous, VIEW, Quota(scope=QuotaScope.CLUSTER))
    assert can(world.a.member, "create", SshKey(user=world.a.member))


@pytest.mark.django_db
def test_internal_rows_are_nobodys_through_can_and_admins_through_restrict(world: Any) -> None:
    """Scheduler bookkeeping and statistics: no one acts on them through ``can`` (platform
    admins neither); ``restrict`` leaves platform admins every row, others none."""
    from portal.models import DemoLoad
    from scheduling.models import PodGroup

    DemoLoad.objects.create()
    for user in (world.admin, world.a.owner, world.a.member):
        for action in ("view", "create", "change", "delete"):
            assert not can(user, action, DemoLoad.objects.get()), (user, action)
            assert not can(user, action, PodGroup()), (user, action)
    assert restrict(DemoLoad.objects.all(), world.admin).count() == 1
    assert restrict(DemoLoad.objects.all(), world.a.owner).count() == 0
