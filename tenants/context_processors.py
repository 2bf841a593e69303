"""Console context: the tenants and projects the user can switch between."""

from __future__ import annotations

from typing import Any

from django.conf import settings
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
    # Without Redis the channel layer cannot reach the worker: poll more often (static/live.js).
    in_memory = "InMemory" in settings.CHANNEL_LAYERS["default"]["BACKEND"]
    return {
        "live_poll_ms": 3000 if in_memory else 15000,
        "nav_tenants": tenants,
        "nav_projects": projects,
        "nav_scope": scope,
        "nav_owned_tenants": [t for t in tenants if t.pk in scope.owner_tenants or scope.platform_admin],
    }
