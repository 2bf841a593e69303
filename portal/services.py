"""Writes for the portal: periodic usage samples (the system acts; nothing to audit) and the
prices of showback (set by platform admins, audited)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from scheduling.models import Allocation, Cluster, JobState
from tenants import permissions
from tenants.audit import audit_record

from . import selectors
from .models import ClusterSample, CycleStat, DispatchError, Price, PriceKind, UsageSample


@transaction.atomic
def usage_sample_record(*, cluster: Cluster, now: dt.datetime | None = None,
                        interval_seconds: int | None = None) -> ClusterSample:
    """Record the cluster's state and who holds what, for charts and showback."""
    now = now or timezone.now()
    interval = interval_seconds or settings.USAGE_SAMPLE_SECONDS
    state = selectors.cluster_now(cluster)
    sample = ClusterSample.objects.create(
        cluster=cluster, at=now, interval_seconds=interval,
        gpus_total=state.gpus_total, gpus_in_use=state.gpus_in_use,
        gpu_share_allocated=state.gpu_share_allocated,
        gpu_memory_total_mib=state.gpu_memory_total_mib,
        gpu_memory_allocated_mib=state.gpu_memory_allocated_mib,
        utilization_percent=state.utilization_percent,
        jobs_queued=state.jobs_by_state.get(JobState.QUEUED, 0),
        jobs_running=state.jobs_by_state.get(JobState.RUNNING, 0),
        wait_p50_seconds=selectors.percentile(state.wait_seconds, 50),
        wait_p95_seconds=selectors.percentile(state.wait_seconds, 95),
    )
    held = selectors.held_by(Allocation.objects.filter(cluster=cluster), by_model=True)
    UsageSample.objects.bulk_create([
        UsageSample(sample=sample, tenant_id=tenant_id, project_id=project_id, user_id=user_id,
                    gpu_model=model or "", gpu_share=h.gpus, gpu_memory_mib=h.gpu_memory_mib,
                    cpu_millicores=round(h.cpu_cores * 1000), ram_mib=h.ram_mib)
        for (tenant_id, project_id, user_id, model), h in held.items()
    ])
    return sample


def samples_prune(*, older_than: dt.timedelta) -> int:
    """Drop observations older than the retention period."""
    cutoff = timezone.now() - older_than
    deleted, _ = ClusterSample.objects.filter(at__lt=cutoff).delete()
    CycleStat.objects.filter(at__lt=cutoff).delete()
    DispatchError.objects.filter(at__lt=cutoff).delete()
    return deleted


MAX_PRICE = Decimal("1000000")


@transaction.atomic
def price_set(*, actor: Any, kind: str, per_hour: Any, gpu_model: str = "") -> Price:
    """Set what an hour of a resource costs in showback (a GPU-hour per GPU model, a CPU
    core-hour, a RAM GiB-hour); platform admins only; audited with the old and new price."""
    if kind not in PriceKind.values:
        raise ValidationError({"kind": [f"One of {', '.join(PriceKind.values)}."]})
    gpu_model = (gpu_model or "").strip()
    if kind == PriceKind.GPU and not gpu_model:
        raise ValidationError({"gpu_model": ["Name the GPU model this price is for (e.g. A100-80G)."]})
    if kind != PriceKind.GPU and gpu_model:
        raise ValidationError({"gpu_model": ["Only a GPU price names a GPU model."]})
    if len(gpu_model) > 64:
        raise ValidationError({"gpu_model": ["At most 64 characters."]})
    try:
        amount = Decimal(str(per_hour))
    except (InvalidOperation, ValueError) as exc:
        raise ValidationError({"per_hour": ["A number, e.g. 2.50."]}) from exc
    if not amount.is_finite() or amount < 0 or amount > MAX_PRICE:
        raise ValidationError({"per_hour": [f"Between 0 and {MAX_PRICE}."]})
    amount = amount.quantize(Decimal("0.0001"))
    price = Price.objects.select_for_update().filter(kind=kind, gpu_model=gpu_model).first()
    if not permissions.can(actor, permissions.CHANGE if price else permissions.CREATE,
                           price or Price(kind=kind, gpu_model=gpu_model, per_hour=amount)):
        raise PermissionDenied("Platform admins set prices.")
    before = {"per_hour": str(price.per_hour)} if price else None
    if price is None:
        price = Price.objects.create(kind=kind, gpu_model=gpu_model, per_hour=amount)
    else:
        price.per_hour = amount
        price.save(update_fields=["per_hour", "updated_at"])
    audit_record(actor=actor, action="price.set", target=price, before=before,
                 after={"kind": kind, "gpu_model": gpu_model, "per_hour": str(amount),
                        "currency": settings.SHOWBACK_CURRENCY})
    return price


@transaction.atomic
def price_delete(*, actor: Any, price: Price) -> None:
    if not permissions.can(actor, permissions.DELETE, price):
        raise PermissionDenied("Platform admins set prices.")
    audit_record(actor=actor, action="price.deleted", target=price,
                 before={"kind": price.kind, "gpu_model": price.gpu_model, "per_hour": str(price.per_hour)})
    price.delete()
