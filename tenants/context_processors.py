"""Console context: the tenants and projects the user can switch between."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from .models import Project, Tenant
from .permissions import restrict, scope_of


def console(request: HttpRequest) -> dict[str, Any]:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    scope = scope_of(user)
    tenants = list(restrict(Tenant.objects.all(), user))
    projects = list(restrict(Project.objects.select_related("tenant"), user))
    return {
        "nav_tenants": tenants,
        "nav_projects": projects,
        "nav_scope": scope,
        "nav_owned_tenants": [t for t in tenants if t.pk in scope.owner_tenants or scope.platform_admin],
    }
