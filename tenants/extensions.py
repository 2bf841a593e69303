"""Extension points through which the apps above tenancy add to its pages.

Tenancy is the ground floor: it imports no app above it. Where a tenancy page shows what
those apps know (the console home's workloads, quota left, owner and admin panels, all
from ``portal``), the app registers a provider here from its ``AppConfig.ready()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HomeContext = Callable[[Any], "dict[str, Any]"]

_home_context: list[HomeContext] = []


def register_home_context(provider: HomeContext) -> HomeContext:
    """Register ``provider(user) -> dict`` whose keys join the console home's template
    context. Registering twice is a no-op."""
    if provider not in _home_context:
        _home_context.append(provider)
    return provider


def home_context(user: Any) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for provider in _home_context:
        context.update(provider(user))
    return context
