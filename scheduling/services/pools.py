"""Node pools: create, update, delete, and assigning nodes to pools by selector."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import User

from .. import selectors
from ..models import (
    Cluster,
    Node,
    NodePool,
)
from .common import _require, request_cycle

# --- node pools ----------------------------------------------------------------------------

POOL_FIELDS = ("name", "selector", "dedicated")


def _pool_snapshot(pool: NodePool) -> dict[str, Any]:
    data = snapshot(pool, POOL_FIELDS)
    data["cluster"] = pool.cluster.name
    data["tenants"] = sorted(t.name for t in pool.tenants.all()) if pool.pk else []
    return data


def _validate_pool(pool: NodePool, tenants: list[Any]) -> None:
    sel = pool.selector
    if not isinstance(sel, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k for k, v in sel.items()):
        raise ValidationError({"selector": ["A mapping of node label names to values."]})
    if pool.dedicated and not tenants:
        raise ValidationError({"tenants": ["A dedicated pool needs at least one tenant."]})
    if not pool.dedicated and tenants:
        raise ValidationError({"tenants": ["Only dedicated pools name tenants."]})
    try:
        pool.full_clean(exclude=["cluster"], validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc


def pools_assign(*, cluster: Cluster) -> int:
    """Recompute which pool every node of ``cluster`` belongs to (after pools change).
    Dedication applies to new placements; jobs already running stay where they are."""
    pools = selectors.pools_in_order(cluster)
    changed = 0
    for node in Node.objects.filter(cluster=cluster).only("pk", "labels", "pool"):
        pool = selectors.pool_of(dict(node.labels), pools)
        if pool != node.pool:
            Node.objects.filter(pk=node.pk).update(pool=pool)
            changed += 1
    return changed


def _save_pool(pool: NodePool, tenants: list[Any]) -> None:
    try:
        with transaction.atomic():
            pool.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["This cluster already has a pool with this name."]}) from exc
    pool.tenants.set(tenants)
    pools_assign(cluster=pool.cluster)
    request_cycle(pool.cluster_id)


@transaction.atomic
def nodepool_create(*, actor: User, cluster: Cluster, name: str, selector: dict[str, str],
                    dedicated: bool = False, tenants: list[Any] | None = None) -> NodePool:
    """A pool of the nodes whose labels match ``selector``; a dedicated one places only the
    jobs of ``tenants``, a shared one everyone's."""
    pool = NodePool(cluster=cluster, name=name, selector=selector, dedicated=dedicated)
    _require(actor, permissions.CREATE, pool)
    tenants = list(tenants or [])
    _validate_pool(pool, tenants)
    _save_pool(pool, tenants)
    audit_record(actor=actor, action="nodepool.created", target=pool, after=_pool_snapshot(pool))
    return pool


@transaction.atomic
def nodepool_update(*, actor: User, pool: NodePool, tenants: list[Any] | None = None,
                    **changes: Any) -> NodePool:
    _require(actor, permissions.CHANGE, pool)
    before = _pool_snapshot(pool)
    for key, value in changes.items():
        if key not in POOL_FIELDS:
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(pool, key, value)
    new_tenants = list(tenants) if tenants is not None else list(pool.tenants.all())
    if not pool.dedicated and tenants is None:
        new_tenants = []
    _validate_pool(pool, new_tenants)
    _save_pool(pool, new_tenants)
    audit_record(actor=actor, action="nodepool.updated", target=pool, before=before,
                 after=_pool_snapshot(pool))
    return pool


@transaction.atomic
def nodepool_delete(*, actor: User, pool: NodePool) -> None:
    _require(actor, permissions.DELETE, pool)
    audit_record(actor=actor, action="nodepool.deleted", target=pool, before=_pool_snapshot(pool))
    cluster = pool.cluster
    pool.delete()
    pools_assign(cluster=cluster)
    request_cycle(cluster.pk)
