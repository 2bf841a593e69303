"""Extension points through which the apps above tenancy add to it.

Tenancy is the ground floor: it imports no app above it. Where tenancy shows or refers to
what those apps own, the app registers it here from its ``AppConfig.ready()``:

- the console home's sections (workloads, quota left, owner and admin panels: ``portal``),
  each a template included in ``console/home.html`` with the context its provider gives;
- the model cluster quotas attach to (``scheduling.Cluster``), for the quota pages and API;
- the GPU model classes the inventory knows, against which quota memory limits per class
  across all clusters are checked, and what a tenant or project holds on all clusters, for
  the quota pages (``scheduling``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model

HomeContext = Callable[[Any], "dict[str, Any]"]

_home_sections: list[tuple[str, HomeContext]] = []
_cluster_model: list[type[Model]] = []
_gpu_model_classes: list[Callable[[], set[str]]] = []
_all_cluster_held: list[Callable[[int, int | None], dict[str, Any]]] = []


def register_home_section(template: str, provider: HomeContext) -> None:
    """Show ``template`` on the console home, rendered with the keys of ``provider(user)``
    added to the page's context. Registering the same pair twice is a no-op."""
    if (template, provider) not in _home_sections:
        _home_sections.append((template, provider))


def home_context(user: Any) -> dict[str, Any]:
    """The console home's extra context: every provider's keys, and ``home_sections``, the
    templates to include in order."""
    context: dict[str, Any] = {"home_sections": [t for t, _ in _home_sections]}
    for _, provider in _home_sections:
        context.update(provider(user))
    return context


def register_cluster_model(model: type[Model]) -> None:
    if _cluster_model and _cluster_model[0] is not model:
        raise ImproperlyConfigured("A cluster model is already registered.")
    _cluster_model[:] = [model]


def cluster_model() -> type[Model]:
    """The model cluster quotas attach to (``Quota.cluster``), as its app registered it."""
    if not _cluster_model:
        raise ImproperlyConfigured("No cluster model is registered (scheduling's "
                                   "AppConfig.ready() registers it).")
    return _cluster_model[0]


def register_gpu_model_classes(provider: Callable[[], set[str]]) -> None:
    """``provider()`` returns the GPU model classes known in the inventory (e.g. "A100-80G")."""
    _gpu_model_classes[:] = [provider]


def gpu_model_classes() -> set[str]:
    """The GPU model classes the inventory knows; empty when no app registered them."""
    return _gpu_model_classes[0]() if _gpu_model_classes else set()


def register_all_cluster_held(provider: Callable[[int, int | None], dict[str, Any]]) -> None:
    """``provider(tenant_id, project_id or None)`` → ``{"gpus": float, "memory": {class: MiB}}``
    held on all clusters together; with a GPU guarantee across all clusters also ``"split"``
    ({cluster name: part}) and ``"guarantee_left"`` ((GPUs left, guarantee))."""
    _all_cluster_held[:] = [provider]


def all_cluster_held(tenant_id: int, project_id: int | None) -> dict[str, Any]:
    if not _all_cluster_held:
        return {"gpus": 0.0, "memory": {}, "split": {}}
    return _all_cluster_held[0](tenant_id, project_id)


_guarantee_warnings: list[Callable[[int | None], list[str]]] = []


def register_guarantee_warnings(provider: Callable[[int | None], list[str]]) -> None:
    """``provider(tenant_id or None)`` → the GPU guarantees the clusters cannot honour, in
    sentences (those concerning the tenant, or all)."""
    _guarantee_warnings[:] = [provider]


def guarantee_warnings(tenant_id: int | None = None) -> list[str]:
    return _guarantee_warnings[0](tenant_id) if _guarantee_warnings else []


_guarantee_view: list[Callable[[int, int | None], list[Any]]] = []


def register_guarantee_view(provider: Callable[[int, int | None], list[Any]]) -> None:
    """``provider(tenant_id, project_id or None)`` → rows of the quota-by-cluster view (per
    cluster, then all clusters together: what can be given beside the guarantee and limit)."""
    _guarantee_view[:] = [provider]


def guarantee_view(tenant_id: int, project_id: int | None = None) -> list[Any]:
    return _guarantee_view[0](tenant_id, project_id) if _guarantee_view else []
