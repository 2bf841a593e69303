"""Scheduling data: clusters, their inventory, jobs, allocations and decisions.

The database, not the scheduler's memory, is the source of truth for what is
allocated: every GPU keeps running totals of the slices given out, guarded by
CHECK constraints, and every grant is a row. Two workers racing to give the same
slice away cannot both commit (DESIGN.md §2, step 4).
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import F, Q

from tenants.validators import slug_validator  # re-exported: workspaces and registry use it


class Backend(models.TextChoices):
    SIMULATED = "simulated", "Simulated (built-in)"
    KUBERNETES = "kubernetes", "Kubernetes"


class PlacementPolicy(models.TextChoices):
    """Scheduler policy per cluster; the engine's policies (scheduling/engine/policies.py)."""

    FRAGMENTATION = "fragmentation", "Fragmentation-aware (default, densest)"
    BINPACK = "binpack", "Binpack nodes and cards"
    SPREAD = "spread", "Spread over nodes and cards"
    BINPACK_SPREAD = "binpack-spread", "Binpack nodes, spread over cards"
    SPREAD_BINPACK = "spread-binpack", "Spread over nodes, binpack cards"


RESERVED_CLUSTER_NAME = "any"
"""Not a cluster's name: the CLI's ``--cluster any`` and the API's ``"cluster": "any"`` mean no
one cluster (a floating job), in any case."""


def is_any_cluster(value: object) -> bool:
    return isinstance(value, str) and value.strip().casefold() == RESERVED_CLUSTER_NAME


def not_reserved_cluster_name(value: str) -> None:
    from django.core.exceptions import ValidationError

    if is_any_cluster(value):
        raise ValidationError('"any" cannot name a cluster: Camp reads --cluster any (and "cluster": '
                              '"any") as "no one cluster, place it where it starts soonest".',
                              code="reserved")


WATCH_HEARTBEAT_SECONDS = 5
"""The pod watcher (camp_watch) writes its heartbeat this often."""
WATCH_HEARTBEAT_STALE_SECONDS = 3 * WATCH_HEARTBEAT_SECONDS
"""A heartbeat older than this: the watcher is gone (killed, hung) and reads unhealthy."""


class Installation(models.Model):
    """This Camp installation's identity, generated once and kept (one row): everything Camp
    creates in a cluster carries it (``camp.io/installation``), so two installations sharing a
    cluster (staging and production) only ever touch their own. ``CAMP_INSTALLATION_ID``
    overrides it."""

    uid = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)


_INSTALLATION: dict[str, str] = {}


def installation_id() -> str:
    """This installation's identity: ``CAMP_INSTALLATION_ID`` if set, else the one generated
    at first use and kept in the database (row 1 of ``Installation``; the primary key makes
    a concurrent first use agree on one)."""
    configured = str(getattr(settings, "CAMP_INSTALLATION_ID", "") or "")
    if configured:
        return configured
    if "uid" not in _INSTALLATION:
        import uuid

        row, _ = Installation.objects.get_or_create(pk=1, defaults={"uid": uuid.uuid4().hex})
        _INSTALLATION["uid"] = row.uid
    return _INSTALLATION["uid"]


CLUSTER_BULKY_FIELDS = ("inventory", "credentials_encrypted")
"""A cluster's columns no list of its jobs needs: a simulated cluster's inventory YAML (175 KB
for the openb trace's 1,213 nodes) and the encrypted credentials."""


def without_cluster_bulk(rows: Any, *paths: str) -> Any:
    """``rows`` (a queryset that selects related clusters along ``paths``, e.g. "cluster" or
    "job__cluster") with ``CLUSTER_BULKY_FIELDS`` left unread (read on first use). A page of
    50 jobs with their cluster read the openb inventory 50 times — 8.7 MB from PostgreSQL and
    two fifths of the page's CPU — and the placement step 500 times a batch (issue 35)."""
    return rows.defer(*(f"{path}__{f}" for path in paths for f in CLUSTER_BULKY_FIELDS))


class Cluster(models.Model):
    name = models.CharField(max_length=63, unique=True,
                            validators=[slug_validator, not_reserved_cluster_name])
    display_name = models.CharField(max_length=200, blank=True)
    enabled = models.BooleanField(default=True)
    backend = models.CharField(max_length=16, choices=Backend.choices, default=Backend.SIMULATED)
    api_server = models.URLField(
        blank=True, help_text="Kubernetes API server URL (empty: the one in the kubeconfig)."
    )
    # Fernet-encrypted JSON {"kubeconfig": ..., "token": ..., "ca_cert": ...}; never shown back.
    credentials_encrypted = models.TextField(blank=True, editable=False)
    inventory = models.TextField(
        blank=True, help_text="Simulated clusters: the YAML inventory (nodes, GPUs, topology)."
    )
    prometheus_url = models.URLField(blank=True, help_text="Optional utilisation feed (DCGM / HAMi).")
    namespace_prefix = models.CharField(max_length=20, default="camp", validators=[slug_validator])
    labels = models.JSONField(
        default=dict, blank=True,
        help_text="What a job may select this cluster by (one pool across clusters): e.g. "
                  '{"region": "eu-west", "arch": "arm64", "accelerator": "nvidia"}.')
    placement_policy = models.CharField(
        max_length=20, choices=PlacementPolicy.choices, default=PlacementPolicy.FRAGMENTATION,
        help_text="How the scheduler chooses nodes and cards on this cluster.",
    )
    last_inventory_at = models.DateTimeField(null=True, blank=True)
    last_cycle_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    # Reachability (reconcile): while the API server does not answer, the cluster is skipped
    # until ``retry_at`` (exponential backoff per cluster), so it never holds up the others.
    unreachable_since = models.DateTimeField(null=True, blank=True)
    retry_at = models.DateTimeField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)
    # The pod watcher's health (camp_watch): its last event, and its current error if any.
    watch_last_event_at = models.DateTimeField(null=True, blank=True)
    watch_error = models.CharField(max_length=500, blank=True)
    watch_error_since = models.DateTimeField(null=True, blank=True)
    watch_heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="The pod watcher's last sign of life (every few seconds).")
    # The cluster's identity (its kube-system namespace's UID), read at registration: the same
    # cluster is registered once (services.cluster_create), whatever its endpoint.
    kube_system_uid = models.CharField(max_length=64, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            # One registration per cluster (services.cluster_create says so in words first).
            models.UniqueConstraint(fields=["kube_system_uid"], condition=~Q(kube_system_uid=""),
                                    name="cluster_registered_once"),
        ]

    def __str__(self) -> str:
        return self.display_name or self.name

    @property
    def has_credentials(self) -> bool:
        return bool(self.credentials_encrypted)

    @property
    def watch_failing(self) -> bool:
        """The watcher's last error is newer than its last event."""
        return self.watch_error_since is not None and (
            self.watch_last_event_at is None or self.watch_error_since > self.watch_last_event_at)

    @property
    def watch_healthy(self) -> bool:
        """A watcher is alive (its heartbeat younger than ``WATCH_HEARTBEAT_STALE_SECONDS``: a
        killed one reads unhealthy within that) and not failing."""
        from django.utils import timezone

        beat = self.watch_heartbeat_at
        return beat is not None and not self.watch_failing and (
            timezone.now() - beat).total_seconds() < WATCH_HEARTBEAT_STALE_SECONDS

    @property
    def reachable(self) -> bool:
        return self.unreachable_since is None


class ProjectNamespace(models.Model):
    """The namespace of one project on one cluster: stored, so that its name is chosen once
    and never changes (its volumes stay where they are), and unique per cluster by a
    constraint. New names embed the project's id (``services.namespace_spec``), so two
    projects never share one, whatever their tenants' and projects' names."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="namespaces")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=63, validators=[slug_validator])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "project"], name="namespace_one_per_project"),
            models.UniqueConstraint(fields=["cluster", "name"], name="namespace_unique_name"),
        ]

    def __str__(self) -> str:
        return self.name


class NodePool(models.Model):
    """Nodes selected by labels; dedicated pools serve only their tenants."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=63, validators=[slug_validator])
    selector = models.JSONField(default=dict, blank=True, help_text="Node labels, all must match.")
    dedicated = models.BooleanField(default=False)
    tenants = models.ManyToManyField("tenants.Tenant", blank=True, related_name="node_pools")

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="nodepool_unique_name")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=253)
    cpu_millicores = models.PositiveIntegerField(default=0)
    ram_mib = models.PositiveBigIntegerField(default=0)
    max_pods = models.PositiveIntegerField(default=110)
    labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)
    pool = models.CharField(max_length=63, blank=True)
    nvlink_islands = models.JSONField(default=list, blank=True, help_text="Lists of GPU indices.")
    ready = models.BooleanField(default=True)
    not_ready_since = models.DateTimeField(
        null=True, blank=True,
        help_text="When its Ready condition left True (the condition's lastTransitionTime): jobs "
                  "there are rescheduled once CAMP_NODE_NOT_READY_TOLERATION_SECONDS have passed.")
    cordoned = models.BooleanField(default=False)
    present = models.BooleanField(default=True, help_text="Seen in the last inventory sync.")
    quarantined = models.BooleanField(default=False)
    quarantine_reason = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_name_in_cluster")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def schedulable(self) -> bool:
        return self.ready and self.present and not self.cordoned and not self.quarantined


class GpuDevice(models.Model):
    """One physical GPU, with running totals of what is given out (guarded by constraints)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=100)
    model = models.CharField(max_length=100)
    vendor = models.CharField(max_length=30, default="NVIDIA")
    memory_mib = models.PositiveIntegerField()
    numa_node = models.PositiveSmallIntegerField(default=0)
    healthy = models.BooleanField(default=True)
    sharing = models.CharField(max_length=20, default="shareable")  # engine SharingMode values
    templates = models.JSONField(default=list, blank=True, help_text="[{name, memory_mib, cores}]")
    max_sharers = models.PositiveSmallIntegerField(default=10)
    quarantined = models.BooleanField(default=False)
    # What is allocated now: maintained in the same transaction as the Allocation rows.
    memory_allocated_mib = models.IntegerField(default=0)
    cores_allocated = models.IntegerField(default=0)
    sharers = models.IntegerField(default=0)
    exclusive_held = models.BooleanField(default=False)
    # Held by pods Camp did not create (kept by the inventory sync from the cluster's pods;
    # docs/KUBERNETES.md): not Camp's to give out, so subtracted in every cycle's snapshot.
    foreign_memory_mib = models.IntegerField(default=0)
    foreign_cores = models.IntegerField(default=0)
    foreign_sharers = models.IntegerField(default=0)
    foreign_exclusive = models.BooleanField(
        default=False, help_text="The whole card is taken by a pod Camp did not create.")
    foreign_pods = models.JSONField(default=list, blank=True, help_text="namespace/name of those pods.")
    # The optional utilisation feed (Prometheus: DCGM exporter or HAMi's monitor).
    utilization_percent = models.FloatField(null=True, blank=True)
    memory_used_mib = models.IntegerField(null=True, blank=True)
    utilization_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_on_node"),
            models.CheckConstraint(
                condition=Q(memory_allocated_mib__gte=0)
                & Q(memory_allocated_mib__lte=F("memory_mib")),
                name="gpu_memory_never_overallocated",
            ),
            models.CheckConstraint(
                condition=Q(cores_allocated__gte=0) & Q(cores_allocated__lte=100),
                name="gpu_cores_never_overallocated",
            ),
            models.CheckConstraint(
                condition=Q(sharers__gte=0) & Q(sharers__lte=F("max_sharers")),
                name="gpu_sharers_within_max",
            ),
            models.CheckConstraint(
                condition=Q(exclusive_held=False) | Q(sharers__lte=1),
                name="gpu_exclusive_means_alone",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"

    @property
    def usable(self) -> bool:
        return self.healthy and not self.quarantined


class JobState(models.TextChoices):
    QUEUED = "queued", "Queued"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    PREEMPTING = "preempting", "Preempting"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    REJECTED = "rejected", "Rejected"


ACTIVE_STATES = (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)
FINAL_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)


class PriorityClass(models.TextChoices):
    """From protected inference to preemptible batch (DESIGN.md §3)."""

    INFERENCE = "inference", "Inference (protected)"
    HIGH = "high", "High"
    NORMAL = "normal", "Normal"
    BATCH = "batch", "Batch (preemptible)"


class JobAffinityChoice(models.TextChoices):
    """The engine's ``JobAffinity`` (scheduling/engine/model.py) as a model field's choices."""

    NONE = "none", "None"
    SAME_NODE = "same-node", "All pods on one node"
    DISTINCT_NODES = "distinct-nodes", "Every pod on its own node"


PRIORITY_VALUES = {"inference": 1000, "high": 100, "normal": 50, "batch": 10}

PREEMPTIBLE_BY_DEFAULT: dict[str, frozenset[str]] = {
    "job": frozenset({PriorityClass.BATCH}),
    "training": frozenset({PriorityClass.NORMAL, PriorityClass.BATCH}),
}
"""The priority classes whose runs are preemptible unless the submitter says otherwise, per
workload (a training job checkpoints and resumes, so its normal runs may yield too; every other
workload — jobs through the API, environments, model services — only at batch)."""


def preemptible_default(priority_class: str, *, workload: str = "job") -> bool:
    """The one preemptible default (issue 29): the job API, the training service, the workload
    kinds' never-fits check and the models' field defaults all take it from here."""
    return priority_class in PREEMPTIBLE_BY_DEFAULT.get(workload, PREEMPTIBLE_BY_DEFAULT["job"])
# The non-preemptible allowlist: these classes are never victims.
NON_PREEMPTIBLE_CLASSES = frozenset({"inference"})


class Job(models.Model):
    """A generic workload: one or more pod groups admitted together (a gang) or pod by pod."""

    # No single-column index on tenant, project, owner or cluster (db_index=False): an index
    # of Meta leads with each (job_tenant_newest, job_project_newest / the unique name,
    # job_owner_newest, job_cluster_state), so Django's default foreign-key index only cost
    # writes — every submit and every state change maintained 17 indexes (issue 35).
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="jobs",
                               db_index=False)
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, related_name="jobs",
                                db_index=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="jobs",
        db_index=False,
    )
    # Null while a floating job waits in the global queue (no cluster chosen yet); set when
    # the placement step binds it to one cluster (scheduling/multicluster.py), so a job is
    # never in two clusters: one column, changed by conditional updates only.
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="jobs",
                                null=True, blank=True, db_index=False)
    floating = models.BooleanField(
        default=False, help_text="Submitted without one named cluster: Camp chooses among "
                                 "the clusters its choice allows (and may choose again).")
    cluster_choice = models.JSONField(
        default=dict, blank=True,
        help_text='A floating job\'s allowed clusters: {"clusters": [names]} and/or '
                  '{"labels": {key: value}}; empty means any cluster the project may use.')
    placement_note = models.CharField(
        max_length=500, blank=True,
        help_text="Floating jobs: why not the other clusters, as of the last placement step.")
    name = models.CharField(max_length=40, validators=[slug_validator])
    kind = models.CharField(max_length=20, default="batch", help_text="batch, pytorch, mpi, ...")
    priority_class = models.CharField(
        max_length=20, choices=PriorityClass.choices, default=PriorityClass.NORMAL
    )
    priority = models.IntegerField(default=50)
    preemptible = models.BooleanField(default=preemptible_default(PriorityClass.NORMAL))
    checkpoint_capable = models.BooleanField(default=False)
    gang = models.BooleanField(default=True)
    mixed_gpu_models = models.BooleanField(
        default=False, help_text="Its pods may run on GPUs of different models (by default all of "
                                 "a job's GPUs are of one model).")
    affinity = models.CharField(
        max_length=16, choices=JobAffinityChoice.choices, default="none",
        help_text="Where its pods go relative to each other: none, same-node (all on one node: a "
                  "model service's draft and target) or distinct-nodes.")
    duration_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Expected run time (the simulated backend runs this long)."
    )
    state = models.CharField(max_length=12, choices=JobState.choices, default=JobState.QUEUED)
    reason = models.CharField(max_length=500, blank=True)
    reason_kind = models.CharField(max_length=20, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    queue_length = models.PositiveIntegerField(null=True, blank=True)
    preempted_by = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    attempts = models.PositiveIntegerField(default=0)
    namespace = models.CharField(
        max_length=63, blank=True,
        help_text="The namespace its pods were created in (set at admission).")
    last_checkpoint = models.CharField(max_length=500, blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        # The API's filters and its default order (newest first): first pages are index
        # scans at 100,000 jobs (docs/BENCHMARKS.md).
        indexes = [
            models.Index(fields=["cluster", "state"], name="job_cluster_state"),
            # The global queue: floating jobs not placed yet (a small partial index).
            models.Index(fields=["submitted_at", "id"], name="job_global_queue",
                         condition=Q(cluster__isnull=True, state="queued")),
            models.Index(fields=["-submitted_at", "-id"], name="job_newest"),
            models.Index(fields=["project", "state", "-submitted_at", "-id"],
                         name="job_project_state_newest"),
            models.Index(fields=["project", "-submitted_at", "-id"], name="job_project_newest"),
            models.Index(fields=["tenant", "-submitted_at", "-id"], name="job_tenant_newest"),
            models.Index(fields=["state", "-submitted_at", "-id"], name="job_state_newest"),
            models.Index(fields=["owner", "-submitted_at", "-id"], name="job_owner_newest"),
            # issue 13, round 3: a tenant's jobs in one state (the owner's usual view) and one
            # cluster's jobs (a platform admin's), page by page, by cursor too.
            models.Index(fields=["tenant", "state", "-submitted_at", "-id"], name="job_tenant_state_newest"),
            models.Index(fields=["cluster", "-submitted_at", "-id"], name="job_cluster_newest"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], name="job_unique_name_in_project",
                violation_error_message="This project already has a job with this name.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}" if self.project_id else self.name

    @property
    def engine_name(self) -> str:
        return str(self.pk)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def why_across_clusters(self) -> str:
        """A floating job's why, each cluster named once: its own cluster's answer (once
        placed) and why not the others (e.g. "cluster east: no GPU free; cluster west: the
        image has no arm64 variant"). The note on the others is refreshed by each placement
        step while the job waits bound (services/placement.py ``_kept``)."""
        if not self.floating:
            return ""
        cluster = self.cluster
        if cluster is None:
            return self.reason
        if self.reason_kind == "placed":  # "Placed on cluster X (…)": it names the cluster itself
            own = self.reason
        else:
            own = f"cluster {cluster}: {self.reason}" if self.reason else f"cluster {cluster}"
        return f"{own}; {self.placement_note}" if self.placement_note else own

    @property
    def user_cluster_choice(self) -> dict[str, object]:
        """``cluster_choice`` as the user gave it (clusters, labels, prefer): without the
        placement's bookkeeping kept beside it (``failed``, ``refused``)."""
        return {k: v for k, v in (self.cluster_choice or {}).items() if k in CHOICE_KEYS}

    @property
    def cluster_setbacks(self) -> list[dict[str, object]]:
        """The clusters a floating job was sent back from, oldest first: ``dispatch-failed``
        (its pods could not be created there: that cluster is avoided for a while) or
        ``refused`` (that cluster's cycle found it can never run there), with when, how many
        failures there and a short reason (credentials in a client's error text redacted; no
        fingerprints)."""
        choice = self.cluster_choice or {}
        out: list[dict[str, object]] = []
        for name, entry in (choice.get("failed") or {}).items():
            if isinstance(entry, list | tuple) and len(entry) >= 2:
                count = entry[2] if len(entry) > 2 and isinstance(entry[2], int) else 1
                out.append({"cluster": str(name), "kind": "dispatch-failed", "at": str(entry[0]),
                            "reason": redact(str(entry[1])), "failures": count})
        for name, entry in (choice.get("refused") or {}).items():
            why, at = (entry.get("why", ""), entry.get("at")) if isinstance(entry, dict) else (entry, None)
            out.append({"cluster": str(name), "kind": "refused", "at": str(at) if at else None,
                        "reason": redact(str(why)), "failures": 0})
        return sorted(out, key=lambda x: str(x["at"] or ""))

    @property
    def placed_cluster(self) -> Cluster:
        """The job's cluster, where it must have one (admitted, with pods): a floating job is
        bound to a cluster before its cluster's cycle can admit it."""
        cluster = self.cluster
        if cluster is None:
            raise ValueError(f"job {self.pk} is in the global queue: it has no cluster yet")
        return cluster

    @property
    def placed_cluster_id(self) -> int:
        if self.cluster_id is None:
            raise ValueError(f"job {self.pk} is in the global queue: it has no cluster yet")
        return self.cluster_id


CHOICE_KEYS = ("clusters", "labels", "prefer")
"""A floating job's choice as users give it (``Job.cluster_choice`` keeps bookkeeping beside)."""

_SECRETS = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 [redacted]"),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+(?::[^/\s@]*)?@"), r"\1[redacted]@"),
    (re.compile(r"(?i)\b(token|password|passwd|secret|api[_-]?key|authorization)([\"']?\s*[:=]\s*[\"']?)"
                r"[^\s,;\"'&]+"), r"\1\2[redacted]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), "[redacted]"),  # a JWT
    (re.compile(r"\bcamp_[A-Za-z0-9_-]{8,}"), "[redacted]"),  # a Camp API token
)


def redact(text: str, limit: int = 200) -> str:
    """An error text fit to show a cluster's user: bearer/basic credentials, a URL's user and
    password, ``token=…``-like pairs, JWTs and Camp tokens replaced; at most ``limit`` chars."""
    for pattern, repl in _SECRETS:
        text = pattern.sub(repl, text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class PodGroup(models.Model):
    """``replicas`` identical pods of one role (worker, launcher, ...) of a job."""

    # Indexed by the unique (job, name) constraint, which leads with it (see Job.tenant).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="groups", db_index=False)
    name = models.CharField(max_length=20, validators=[slug_validator], default="worker")
    replicas = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(256)]
    )
    gpu_count = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(64)])
    gpu_memory_mib = models.PositiveIntegerField(default=0)
    gpu_cores_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    exclusive = models.BooleanField(default=False)
    gpu_models = models.JSONField(default=list, blank=True)
    cpu_millicores = models.PositiveIntegerField(default=1000)
    ram_mib = models.PositiveIntegerField(default=1024)
    image = models.CharField(max_length=255, default="busybox")
    command = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="podgroup_unique_name_in_job")
        ]

    def __str__(self) -> str:
        return f"{self.job_id}/{self.name}×{self.replicas}"


class PodPhase(models.TextChoices):
    PENDING = "pending", "Pending"  # allocated, not created yet
    CREATED = "created", "Created"  # created in the cluster, not running yet
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    GONE = "gone", "Gone"


class Allocation(models.Model):
    """One pod of an admitted job on its node: the CPU/RAM it holds and (via GpuSlice) its GPUs.

    A row exists exactly while the resources are held; releasing deletes it.
    """

    # Indexed by the unique constraints, which lead with them (see Job.tenant).
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="allocations",
                                db_index=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations", db_index=False)
    group = models.ForeignKey(PodGroup, on_delete=models.CASCADE, related_name="allocations")
    replica = models.PositiveSmallIntegerField()
    pod_name = models.CharField(max_length=63)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    cpu_millicores = models.PositiveIntegerField(default=0)
    ram_mib = models.PositiveIntegerField(default=0)
    phase = models.CharField(max_length=10, choices=PodPhase.choices, default=PodPhase.PENDING)
    ready = models.BooleanField(default=False, help_text="The pod's Ready condition, as last seen.")
    message = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "group_id", "replica"]
        constraints = [
            models.UniqueConstraint(fields=["job", "group", "replica"], name="allocation_one_per_pod"),
            models.UniqueConstraint(fields=["cluster", "pod_name"], name="allocation_unique_pod_name"),
        ]

    def __str__(self) -> str:
        return f"{self.pod_name} on {self.node_id}"


class PodLogTail(models.Model):
    """The last lines of one pod's log, kept when the pod is stopped or ends (issue 28:
    Kubernetes forgets a deleted pod's log, and pods go as soon as a job ends). Bounded
    (``LOG_TAIL_LINES`` lines, ``LOG_TAIL_BYTES`` characters: the end is kept), one row per
    pod of each attempt, readable by whoever may read the job (its tenant's)."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="log_tails")
    attempt = models.PositiveIntegerField()
    pod_name = models.CharField(max_length=63)
    role = models.CharField(max_length=63, blank=True)
    text = models.TextField(blank=True)
    captured_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["job_id", "attempt", "pod_name"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "pod_name"], name="podlogtail_one_per_pod"),
        ]

    def __str__(self) -> str:
        return f"{self.pod_name} (attempt {self.attempt})"


LOG_TAIL_LINES = 200
LOG_TAIL_BYTES = 64 * 1024


class GpuSlice(models.Model):
    """One GPU slice granted to one container of an allocated pod."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="slices")
    gpu = models.ForeignKey(GpuDevice, on_delete=models.PROTECT, related_name="slices")
    container = models.PositiveSmallIntegerField(default=0)
    memory_mib = models.PositiveIntegerField()
    cores_percent = models.PositiveSmallIntegerField(validators=[MaxValueValidator(100)])
    exclusive = models.BooleanField(default=False)

    class Meta:
        ordering = ["allocation_id", "container", "gpu_id"]
        constraints = [
            # A pod never holds the same card twice in one container.
            models.UniqueConstraint(
                fields=["allocation", "container", "gpu"], name="slice_unique_per_container"
            ),
        ]


class DecisionKind(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    PLACED = "placed", "Placed on a cluster"
    UNPLACED = "unplaced", "Back to the global queue"
    ADMITTED = "admitted", "Admitted"
    WAITING = "waiting", "Waiting"
    PREEMPTING = "preempting", "Preempting others"
    PREEMPTED = "preempted", "Preempted"
    REQUEUED = "requeued", "Requeued"
    REJECTED = "rejected", "Rejected"
    STARTED = "started", "Started"
    FINISHED = "finished", "Finished"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


class SchedulingDecision(models.Model):
    """What happened to a job and why, in order: the per-job history the API exposes."""

    # Indexed by decision_job_latest, which leads with it (see Job.tenant).
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="decisions", db_index=False)
    # Null for a floating job's decisions taken before any cluster was chosen.
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+",
                                null=True, blank=True)
    kind = models.CharField(max_length=12, choices=DecisionKind.choices)
    reason = models.CharField(max_length=500, blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    placement = models.JSONField(null=True, blank=True)
    victims = models.JSONField(default=list, blank=True)
    preemptor = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="+")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["job", "-id"], name="decision_job_latest")]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.kind}"


class SimulatedPod(models.Model):
    """A pod of the simulated backend. Kept in the database so that web, worker and beat
    processes see the same simulated cluster."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=63)
    node = models.CharField(max_length=253)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)
    start_at = models.DateTimeField()
    finish_at = models.DateTimeField(null=True, blank=True)
    fail = models.BooleanField(default=False)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="simpod_unique")
        ]


EXTERNAL_KIND = "external"
"""``Job.kind`` of a job made from pods Camp did not create (issue 34): pods naming Camp's
scheduler in a namespace bound to a project (``NamespaceBinding``)."""


class NamespaceBinding(models.Model):
    """A Kubernetes namespace Camp did not create, bound by a project admin to that project
    (issue 34): pods there that name Camp's scheduler become the project's ``external`` jobs.
    Recorded on the namespace too, by labels Camp owns (``camp.io/bound-project-id``,
    ``camp.io/installation``), so one namespace is bound to one project of one installation.
    Deleting the row (unbinding) stops new admissions; running pods are left alone."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="bindings")
    namespace = models.CharField(max_length=63, validators=[slug_validator])
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE,
                                related_name="namespace_bindings")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster__name", "namespace"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "namespace"], name="namespace_bound_once"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.namespace}"


KUBE_NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    "A Kubernetes object name: lowercase letters, digits, '-' and '.', starting and ending "
    "with a letter or digit.")


class PriorityClassMapping(models.Model):
    """Which of Camp's priority classes an external pod gets for its Kubernetes PriorityClass
    (issue 34), one table per cluster (PriorityClasses are cluster-wide objects), set by
    platform admins. A PriorityClass with no row keeps the rule of ``external_priority``: a
    Camp class of the same name, else normal."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="priority_mappings")
    kube_priority_class = models.CharField(
        max_length=253, validators=[KUBE_NAME_VALIDATOR],
        help_text="The pods' spec.priorityClassName (a PriorityClass of the cluster).")
    priority_class = models.CharField(max_length=16, choices=PriorityClass.choices,
                                      help_text="Camp's class for those pods.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["cluster__name", "kube_priority_class"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "kube_priority_class"], name="priority_mapped_once"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.kube_priority_class}"


class ExternalPod(models.Model):
    """One pod of an ``external`` job: the Kubernetes pod it stands for (its UID, so a new pod
    of the same name is another job), and which replica of the job's pod group it is."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="external_pods")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64)
    replica = models.PositiveIntegerField(default=0)
    owner_kind = models.CharField(max_length=63, blank=True)
    owner_name = models.CharField(max_length=253, blank=True)
    service_account = models.CharField(max_length=253, blank=True)
    pod_group = models.CharField(max_length=253, blank=True)
    told = models.CharField(max_length=500, blank=True,
                            help_text="The reason last written on the pod (Event and condition).")

    class Meta:
        ordering = ["job_id", "replica"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="external_pod_once"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ExternalWorkload(models.Model):
    """A ``batch/v1`` Job Camp admits as Kueue does (issue 34): labelled for a queue, created
    suspended, un-suspended when its Camp job is admitted (whose pods, made by the Job
    controller then, become that job's ``ExternalPod`` rows), suspended again if preempted.
    ``job`` is its current Camp job: a Job that needs more pods after one ends (further
    completions, a retry) is queued again as a new one. A labelled Job Camp does not admit (its
    namespace not bound, an ask refused) has a row without a job: what it was told."""

    job = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="external_workloads",
                            help_text="Its current Camp job (none while Camp refuses it).")
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="+")
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    uid = models.CharField(max_length=64)
    queue_name = models.CharField(max_length=253, blank=True,
                                  help_text="The queue its label names (Kueue's LocalQueue name).")
    told = models.CharField(max_length=500, blank=True,
                            help_text="The reason of the Event last written on the Job.")
    resumed_at = models.DateTimeField(
        null=True, blank=True, help_text="When Camp last un-suspended it (its pods are awaited from then).")

    class Meta:
        ordering = ["cluster_id", "namespace", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="external_workload_once"),
        ]

    def __str__(self) -> str:
        return f"Job {self.namespace}/{self.name}"
