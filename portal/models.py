"""Observations for dashboards, showback and /metrics (append-only time series)."""

from django.conf import settings
from django.db import models


class ClusterSample(models.Model):
    """The state of one cluster at one moment (taken every USAGE_SAMPLE_SECONDS)."""

    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(db_index=True)
    interval_seconds = models.PositiveIntegerField()
    gpus_total = models.PositiveIntegerField()
    gpus_in_use = models.PositiveIntegerField(help_text="Cards holding at least one slice")
    gpu_share_allocated = models.FloatField(help_text="GPU-equivalents allocated (slices count their share)")
    gpu_memory_total_mib = models.PositiveBigIntegerField()
    gpu_memory_allocated_mib = models.PositiveBigIntegerField()
    utilization_percent = models.FloatField(null=True, blank=True, help_text="Mean measured GPU utilization")
    jobs_queued = models.PositiveIntegerField()
    jobs_running = models.PositiveIntegerField()
    wait_p50_seconds = models.FloatField(null=True, blank=True)
    wait_p95_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["at"]
        indexes = [models.Index(fields=["cluster", "at"], name="clustersample_cluster_at")]


class UsageSample(models.Model):
    """What one user's jobs in one project held at one moment: the basis of showback."""

    sample = models.ForeignKey(ClusterSample, on_delete=models.CASCADE, related_name="usage")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                             related_name="+")
    gpu_model = models.CharField(
        max_length=64, blank=True, default="",
        help_text="The model of the GPUs held (empty: no GPU); the price of an hour follows it.")
    gpu_share = models.FloatField()
    gpu_memory_mib = models.PositiveBigIntegerField()
    cpu_millicores = models.PositiveBigIntegerField()
    ram_mib = models.PositiveBigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["tenant", "project"], name="usagesample_tenant_project")]


class PriceKind(models.TextChoices):
    GPU = "gpu", "GPU-hour (one GPU of a model)"
    CPU = "cpu", "CPU core-hour"
    RAM = "ram", "RAM GiB-hour"


class Price(models.Model):
    """What an hour of a resource costs in showback, set by platform admins: a GPU-hour per
    GPU model (an A100-hour is not an L4-hour), a CPU core-hour, a RAM GiB-hour. Currency:
    ``SHOWBACK_CURRENCY``. A resource without a price costs nothing (and says so)."""

    kind = models.CharField(max_length=3, choices=PriceKind.choices)
    gpu_model = models.CharField(max_length=64, blank=True, default="",
                                 help_text="For kind gpu: the model as inventories name it (e.g. A100-80G).")
    per_hour = models.DecimalField(max_digits=12, decimal_places=4)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind", "gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "gpu_model"], name="price_kind_model_unique"),
            models.CheckConstraint(condition=models.Q(per_hour__gte=0), name="price_not_negative"),
            models.CheckConstraint(condition=models.Q(kind="gpu") | models.Q(gpu_model=""),
                                   name="price_model_only_for_gpu"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.gpu_model}".strip()


class CycleStat(models.Model):
    """One completed scheduling cycle (from scheduling.signals.cycle_finished)."""

    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    seconds = models.FloatField()
    admitted = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)
    rejected = models.PositiveIntegerField(default=0)
    preempting = models.PositiveIntegerField(default=0)


class DispatchError(models.Model):
    """A failed attempt to create a job's pods (from scheduling.signals.dispatch_failed)."""

    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.CASCADE, related_name="+")
    job_id = models.BigIntegerField()
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    message = models.CharField(max_length=500)


class DemoLoad(models.Model):
    """The demo's load generator (portal/demo.py): one row, made by ``seed_demo``. Platform
    admins pause and resume it from the home page (audited); it also stops by itself once
    ``DEMO_LOAD_MAX_HOURS`` have passed since it started, so a forgotten demo stops growing."""

    paused = models.BooleanField(default=False)
    started_at = models.DateTimeField(auto_now_add=True)
    launched = models.PositiveIntegerField(default=0, help_text="Workloads it has started (names them).")
    last_tick_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return "demo load (paused)" if self.paused else "demo load"
