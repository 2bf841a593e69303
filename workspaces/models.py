"""Workloads built on the generic scheduling Job (DESIGN.md §1): dev environments
(JupyterLab, VS Code, SSH) and distributed training jobs, admin-defined profiles, and the
per-project workspace policy (idle culling, lifetime, storage).

Each run of a workload is one ``scheduling.Job`` (with its pod groups); the workload row
links its current run. The scheduler decides where and when; this app decides what the
pods look like (scheduling/extensions.py) and what happens around them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from scheduling.models import JobState, PriorityClass, preemptible_default, slug_validator


class EnvKind(models.TextChoices):
    JUPYTER = "jupyter", "JupyterLab"
    VSCODE = "vscode", "VS Code (code-server)"
    SSH = "ssh", "SSH"


class TrainingFramework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch DDP (torchrun)"
    DEEPSPEED = "deepspeed", "DeepSpeed"
    MPI = "mpi", "MPI (mpirun / Horovod)"
    TENSORFLOW = "tensorflow", "TensorFlow (TF_CONFIG)"


# Frameworks started by a launcher pod that reaches the workers (hostfile + ssh/mpirun).
LAUNCHER_FRAMEWORKS = frozenset({TrainingFramework.DEEPSPEED, TrainingFramework.MPI})


def _state_of(job_state: str | None) -> str:
    states: dict[str | None, str] = {
        None: "stopped",
        JobState.QUEUED: "queued",
        JobState.STARTING: "starting",
        JobState.PREEMPTING: "starting",
        JobState.RUNNING: "running",
        JobState.SUCCEEDED: "succeeded",
        JobState.CANCELLED: "stopped",
        JobState.FAILED: "failed",
        JobState.REJECTED: "failed",
    }
    return states.get(job_state, "stopped")


class WorkspacePolicy(models.Model):
    """Per-project rules for dev environments (no row: the defaults in settings)."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    project = models.OneToOneField("tenants.Project", on_delete=models.CASCADE,
                                   related_name="workspace_policy")
    idle_minutes = models.PositiveIntegerField(
        null=True, blank=True, default=60, validators=[MinValueValidator(5)],
        help_text="Stop an environment after this long without activity (empty: never).")
    max_lifetime_hours = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Stop an environment this long after it started, active or not (empty: no limit).")
    warning_minutes = models.PositiveIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(24 * 60)],
        help_text="How long before stopping the owner is warned.")
    storage_gib_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Home and checkpoint volumes of the project, GiB (empty: no limit).")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"workspace policy of {self.project}"


class Profile(models.Model):
    """An admin-defined compute preset: a shape (and optionally an image and a GPU model)
    users launch environments with, and training jobs use per worker ("workers × preset").
    Limited to chosen tenants and/or projects; with neither, everyone may use it."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    image = models.ForeignKey("registry.Image", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="profiles")
    gpu_model = models.CharField(
        max_length=100, blank=True,
        help_text="The GPU model this preset runs on, as the inventory names it (e.g. A100-80G); "
                  "empty: any model.")
    gpu_count = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(16)])
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    gpu_cores_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    exclusive = models.BooleanField(default=False)
    cpu_millicores = models.PositiveIntegerField(default=2000, validators=[MinValueValidator(100)])
    ram_mib = models.PositiveIntegerField(default=8192, validators=[MinValueValidator(128)])
    home_gib = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])
    tenants = models.ManyToManyField("tenants.Tenant", blank=True, related_name="+")
    projects = models.ManyToManyField("tenants.Project", blank=True, related_name="+")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name


class DevEnvironment(models.Model):
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="environments")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="environments")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="environments")
    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=40, validators=[slug_validator])
    kind = models.CharField(max_length=10, choices=EnvKind.choices)
    profile = models.ForeignKey(Profile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    image = models.ForeignKey("registry.Image", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    image_reference = models.CharField(max_length=512)
    gpu_count = models.PositiveSmallIntegerField(default=0)
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    gpu_cores_percent = models.PositiveSmallIntegerField(default=0)
    exclusive = models.BooleanField(default=False)
    gpu_models = models.JSONField(default=list, blank=True,
                                  help_text="Allowed GPU models (from its preset); empty: any.")
    cpu_millicores = models.PositiveIntegerField(default=2000)
    ram_mib = models.PositiveIntegerField(default=8192)
    home_gib = models.PositiveIntegerField(default=10)
    env = models.JSONField(default=dict, blank=True)
    ssh_public_keys = models.TextField(blank=True)
    job = models.ForeignKey("scheduling.Job", on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="+", help_text="The current (or last) run.")
    runs = models.PositiveIntegerField(default=0)
    # The open link: SHA-256 of its one-time token, when it was issued and when it was
    # spent. Spending it sets a cookie bound to ``access_nonce``, which a new link, a stop
    # or the end of a run replaces (empty: no cookie is valid).
    access_token_hash = models.CharField(max_length=64, blank=True)
    access_token_issued_at = models.DateTimeField(null=True, blank=True)
    access_token_used_at = models.DateTimeField(null=True, blank=True)
    access_nonce = models.CharField(max_length=64, blank=True)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    cull_warning = models.CharField(max_length=300, blank=True)
    cull_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="devenv_unique_name_in_project",
                                    violation_error_message="This project already has an environment "
                                                            "with this name."),
        ]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}" if self.project_id else self.name

    @property
    def state(self) -> str:
        """queued → starting → running → stopped / failed (from the current run)."""
        state = _state_of(self.job.state if self.job_id and self.job else None)
        return "stopped" if state == "succeeded" else state

    @property
    def slug(self) -> str:
        return f"{self.pk}-{self.name}"

    @property
    def service_name(self) -> str:
        return f"ws-{self.pk}"

    @property
    def home_claim(self) -> str:
        return f"ws-{self.pk}-home"


class TrainingJob(models.Model):
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="trainings")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="trainings")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                              related_name="trainings")
    cluster = models.ForeignKey(
        "scheduling.Cluster", on_delete=models.PROTECT, related_name="+", null=True, blank=True,
        help_text="The one cluster it runs on; empty: it floats — each run is placed by Camp among "
                  "the clusters cluster_choice allows, and its cluster is its run's (Job.cluster).")
    cluster_choice = models.JSONField(
        default=dict, blank=True,
        help_text='Floating only: {"clusters": [names]} and/or {"labels": {key: value}} (all must '
                  "match); empty: any cluster the project may use. Every run is submitted with it.")
    name = models.CharField(max_length=32, validators=[slug_validator])
    framework = models.CharField(max_length=12, choices=TrainingFramework.choices)
    image = models.ForeignKey("registry.Image", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    image_reference = models.CharField(max_length=512)
    workers = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1),
                                                                      MaxValueValidator(128)])
    gpu_count = models.PositiveSmallIntegerField(default=1, help_text="GPUs per worker")
    gpu_memory_mib = models.PositiveIntegerField(default=0, help_text="Per GPU; 0: whole cards")
    gpu_cores_percent = models.PositiveSmallIntegerField(default=0)
    exclusive = models.BooleanField(default=False)
    gpu_models = models.JSONField(default=list, blank=True)
    cpu_millicores = models.PositiveIntegerField(default=4000, help_text="Per worker")
    ram_mib = models.PositiveIntegerField(default=16384, help_text="Per worker")
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    data_volume = models.CharField(max_length=253, blank=True,
                                   help_text="An existing PVC with the data set, mounted read-only at /data.")
    checkpoint_dir = models.CharField(max_length=255, blank=True,
                                      help_text="Where the job writes checkpoints; empty: none.")
    checkpoint_every = models.PositiveIntegerField(default=100,
                                                   help_text="Steps between checkpoints (a hint).")
    checkpoint_volume_gib = models.PositiveIntegerField(default=0,
                                                        help_text="A PVC for checkpoint_dir; 0: none.")
    log_dir = models.CharField(max_length=255, blank=True, help_text="TensorBoard log directory.")
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    retry_limit = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(10)])
    priority_class = models.CharField(max_length=20, choices=PriorityClass.choices,
                                      default=PriorityClass.NORMAL)
    preemptible = models.BooleanField(default=preemptible_default(PriorityClass.NORMAL, workload="training"))
    duration_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Expected run time (the simulated backend runs this long).")
    depends_on = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="dependants")
    job = models.ForeignKey("scheduling.Job", on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="+", help_text="The current (or last) run.")
    blocked_reason = models.CharField(max_length=300, blank=True)
    failed_dependency = models.BooleanField(default=False)
    retries = models.PositiveSmallIntegerField(default=0)
    restarts = models.PositiveIntegerField(default=0, help_text="Requeues after preemption or node loss")
    lost_gpu_seconds = models.FloatField(default=0)
    seen_decision_id = models.BigIntegerField(default=0)
    stop_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="training_unique_name_in_project",
                                    violation_error_message="This project already has a training job "
                                                            "with this name."),
        ]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}" if self.project_id else self.name

    @property
    def state(self) -> str:
        if self.job_id is None:
            return "failed" if self.failed_dependency else "waiting"
        return _state_of(self.job.state if self.job else None)

    @property
    def has_launcher(self) -> bool:
        return self.framework in LAUNCHER_FRAMEWORKS

    @property
    def floating(self) -> bool:
        """Launched for any cluster, a set or labels rather than one named cluster."""
        return self.cluster_id is None

    @property
    def run_cluster(self) -> Any:
        """Where it runs: its one cluster, or for a floating job its current run's cluster
        (None while the run waits in the global queue, or before its first run)."""
        if self.cluster_id is not None:
            return self.cluster
        job = self.job if self.job_id else None
        return job.cluster if job is not None else None


class TrainingCheckpoint(models.Model):
    """A checkpoint the job reported (a ``CAMP_CHECKPOINT`` log line of rank 0, or the API)."""

    training = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveBigIntegerField()
    path = models.CharField(max_length=500)
    written_at = models.DateTimeField()
    attempt = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-step", "-id"]
        constraints = [models.UniqueConstraint(fields=["training", "path"], name="checkpoint_unique_path")]

    def __str__(self) -> str:
        return self.path


class SshKey(models.Model):
    """A user's OpenSSH public key (workspaces/sshkeys.py validates it). SSH environments
    authorise their owner's keys, plus any given for one environment."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    name = models.CharField(max_length=100)
    key_type = models.CharField(max_length=40)
    public_key = models.TextField(help_text="The normalised line: type, base64 data, comment.")
    fingerprint = models.CharField(max_length=60, help_text="OpenSSH's SHA256 fingerprint.")
    bits = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["user_id", "name", "id"]
        verbose_name = "SSH key"
        constraints = [
            models.UniqueConstraint(fields=["user", "fingerprint"], name="sshkey_unique_per_user",
                                    violation_error_message="You already added this key."),
            models.UniqueConstraint(fields=["user", "name"], name="sshkey_unique_name_per_user",
                                    violation_error_message="You already have a key with this name."),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.fingerprint})"


# --- model services (inference) ---------------------------------------------------------------


class ModelSourceKind(models.TextChoices):
    IMAGE = "image", "Baked into the image"
    VOLUME = "volume", "A path on a volume (PVC) of the project"
    URI = "uri", "A URI the server downloads (hf://, s3://, https://)"


class AutoscaleMetric(models.TextChoices):
    CONCURRENCY = "concurrency", "Concurrent requests per replica"
    RPS = "rps", "Requests per second per replica"
    GPU_UTIL = "gpu_util", "GPU utilisation % per replica"


class ServiceStatus(models.TextChoices):
    PENDING = "pending", "Pending (no replica ready)"
    READY = "ready", "Ready"
    DEGRADED = "degraded", "Degraded (fewer ready replicas than desired)"
    ROLLING = "rolling", "Rolling out a new revision"
    IDLE = "idle", "Scaled to zero"
    BLOCKED = "blocked", "Blocked (a replica was rejected)"


class ModelService(models.Model):
    """An online model server (vLLM, Triton, TGI, ...): ``desired_replicas`` identical
    replicas behind one Service. Each replica is one ``scheduling.Job`` of kind ``service``
    (``ServiceReplica``), so queueing, quotas, preemption, fractional placement and
    why-pending are the scheduler's; the autoscaler (workspaces/services/serving.py) only decides how
    many replicas there should be."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="model_services")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="model_services")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                              related_name="model_services")
    cluster = models.ForeignKey("scheduling.Cluster", on_delete=models.PROTECT, related_name="+")
    # Replica jobs are named <name>-r<revision>-<n> (a job name has at most 40 characters).
    name = models.CharField(max_length=24, validators=[slug_validator])
    image = models.ForeignKey("registry.Image", on_delete=models.SET_NULL, null=True, blank=True,
                              related_name="+")
    image_reference = models.CharField(max_length=512)
    model_source_kind = models.CharField(max_length=10, choices=ModelSourceKind.choices,
                                         default=ModelSourceKind.URI)
    model_source = models.CharField(
        max_length=500, blank=True,
        help_text="What to serve: a URI (hf://org/model), or a path in the image, or "
                  "<pvc>:<path> for a volume; given to the server as CAMP_MODEL.")
    port = models.PositiveIntegerField(default=8000, validators=[MinValueValidator(1),
                                                                 MaxValueValidator(65535)])
    health_path = models.CharField(max_length=200, default="/health")
    args = models.JSONField(default=list, blank=True, help_text="The server's arguments.")
    env = models.JSONField(default=dict, blank=True)
    # Per replica. Fractional by default: a slice of one card.
    gpu_count = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(16)])
    gpu_memory_mib = models.PositiveIntegerField(default=20480, help_text="Per GPU; 0: whole cards")
    gpu_cores_percent = models.PositiveSmallIntegerField(default=30, validators=[MaxValueValidator(100)])
    exclusive = models.BooleanField(default=False)
    gpu_models = models.JSONField(default=list, blank=True)
    cpu_millicores = models.PositiveIntegerField(default=2000)
    ram_mib = models.PositiveIntegerField(default=16384)
    min_replicas = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(64)])
    max_replicas = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(64)],
                                                    help_text="0 stops the service.")
    autoscale_metric = models.CharField(max_length=12, choices=AutoscaleMetric.choices,
                                        default=AutoscaleMetric.CONCURRENCY)
    autoscale_target = models.FloatField(default=8.0, validators=[MinValueValidator(0.01)],
                                         help_text="Per replica: requests, requests/s or GPU %.")
    scale_down_delay_seconds = models.PositiveIntegerField(
        default=300, help_text="Stabilisation window: scale down to the largest recommendation "
                               "of this window (scale-up is immediate).")
    scale_to_zero_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Scale to zero after this long without requests (empty: never).")
    load_profile = models.JSONField(
        default=dict, blank=True,
        help_text="Simulated load (no Prometheus): base, peak, peak_hour, burst_every_minutes, burst.")
    priority_class = models.CharField(max_length=20, choices=PriorityClass.choices,
                                      default=PriorityClass.INFERENCE)
    preemptible = models.BooleanField(default=preemptible_default(PriorityClass.INFERENCE))
    companions = models.JSONField(
        default=list, blank=True,
        help_text="Model servers run beside the main one in every replica, on the same node (a "
                  "speculative-decoding draft): name, image_reference, model_source, args, env, port, "
                  "health_path, gpu_count, gpu_memory_mib, gpu_cores_percent, cpu_millicores, ram_mib.")
    ingress_host = models.CharField(
        max_length=253, blank=True,
        help_text="On Kubernetes, an Ingress routes this host name to the service (empty: none).")
    api_key_hash = models.CharField(
        max_length=64, blank=True,
        help_text="SHA-256 of the service's API key: callers through the Ingress send the key "
                  "(Authorization: Bearer …); the key itself is shown once and never stored.")
    api_key_created_at = models.DateTimeField(null=True, blank=True)
    revision = models.PositiveIntegerField(default=1)
    desired_replicas = models.PositiveSmallIntegerField(default=1)
    ready_replicas = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=10, choices=ServiceStatus.choices, default=ServiceStatus.PENDING)
    status_reason = models.CharField(max_length=300, blank=True)
    load = models.FloatField(default=0.0, help_text="The last load read by the autoscaler.")
    load_at = models.DateTimeField(null=True, blank=True)
    load_error = models.CharField(
        max_length=300, blank=True,
        help_text="Why the last autoscaler step read no load (replicas held); empty when it read one.")
    latency_p50_seconds = models.FloatField(
        null=True, blank=True, help_text="Median request latency at the last autoscaler step (Prometheus).")
    latency_p95_seconds = models.FloatField(
        null=True, blank=True, help_text="95th percentile request latency at the last autoscaler step.")
    idle_since = models.DateTimeField(null=True, blank=True)
    recommendations = models.JSONField(
        default=list, blank=True, help_text="[epoch seconds, replicas] of the stabilisation window.")
    replica_seq = models.PositiveIntegerField(default=0, help_text="The last replica number used.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="modelservice_unique_name_in_project",
                                    violation_error_message="This project already has a model service "
                                                            "with this name."),
            models.CheckConstraint(condition=models.Q(min_replicas__lte=models.F("max_replicas")),
                                   name="modelservice_min_le_max"),
        ]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}" if self.project_id else self.name

    @property
    def latency_text(self) -> str:
        """``p50 120 ms · p95 480 ms`` from the last autoscaler step, ``—`` when unknown."""
        def fmt(seconds: float | None) -> str:
            if seconds is None:
                return "—"
            return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"

        if self.latency_p50_seconds is None and self.latency_p95_seconds is None:
            return "—"
        return f"p50 {fmt(self.latency_p50_seconds)} · p95 {fmt(self.latency_p95_seconds)}"

    @property
    def service_name(self) -> str:
        """The Kubernetes Service (ClusterIP) in the project's namespace."""
        return f"svc-{self.pk}-{self.name}"


class ServiceReplica(models.Model):
    """One replica of a model service = one scheduling Job (kind ``service``). Rows stay
    after the job ends (history: which revision, why it was removed)."""

    service = models.ForeignKey(ModelService, on_delete=models.CASCADE, related_name="replicas")
    job = models.OneToOneField("scheduling.Job", on_delete=models.CASCADE, related_name="service_replica")
    revision = models.PositiveIntegerField()
    number = models.PositiveIntegerField()
    spec = models.JSONField(default=dict, blank=True,
                            help_text="Its revision's server settings (args, env, model, port, health path).")
    removed_reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["service_id", "number"]
        constraints = [models.UniqueConstraint(fields=["service", "number"], name="replica_unique_number")]

    def __str__(self) -> str:
        return f"{self.service_id}#{self.number} (r{self.revision})"
