"""Access rules of the workloads users launch (tenants/permissions.py explains the rules).

Registered from ``WorkspacesConfig.ready()``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from scheduling.access import JOB_RULE
from tenants.permissions import (
    CREATE,
    DELETE,
    PROJECT_ADMIN,
    PROJECT_MEMBER,
    VIEW,
    OwnedBy,
    ProjectScoped,
    Scope,
    Special,
    register,
)

from .models import (
    DevEnvironment,
    ModelService,
    Profile,
    ServiceReplica,
    SshKey,
    TrainingCheckpoint,
    TrainingJob,
    WorkspacePolicy,
)


def _profile_visible(scope: Scope, user: Any) -> Q | None:
    # Profiles are the platform's; an unrestricted one is for everyone, a restricted one only
    # for the tenants and projects it names (and the owners of those projects' tenants).
    if not scope.tenants:
        return None
    return (Q(tenants__isnull=True, projects__isnull=True) | Q(tenants__in=scope.tenants)
            | Q(projects__in=scope.projects) | Q(projects__tenant_id__in=scope.owner_tenants))


def register_rules() -> None:
    # Only viewing; ``can`` asks whether the saved row is among the visible ones.
    register(Profile, Special(visible=_profile_visible))
    register(WorkspacePolicy, ProjectScoped(view=PROJECT_MEMBER, create=PROJECT_ADMIN,
                                            change=PROJECT_ADMIN, delete=PROJECT_ADMIN))
    # Workloads follow the job rule: project members see and launch; the owner or a
    # project admin stops and deletes.
    register(DevEnvironment, JOB_RULE)
    register(TrainingJob, JOB_RULE)
    register(ModelService, JOB_RULE)
    # A service's replicas are read by whoever reads the service; only its services write them.
    register(ServiceReplica, ProjectScoped(project="service__project", tenant="service__tenant",
                                           view=PROJECT_MEMBER))
    # Checkpoints are read by whoever reads their training job; the trainer writes them.
    register(TrainingCheckpoint, ProjectScoped(project="training__project",
                                               tenant="training__tenant", view=PROJECT_MEMBER))
    # A user's SSH keys are theirs alone (platform admins, as everywhere, see all).
    register(SshKey, OwnedBy(user="user", may=(VIEW, CREATE, DELETE)))
