"""Scheduling API serializers: shape and type checks only; rules live in services."""

from __future__ import annotations

from typing import Any, cast

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from camp.serializers import FastRead, FieldsOnce, PrefetchedList
from tenants.api.serializers import VisiblePKField, resolved_once
from tenants.models import Project, Tenant

from ..models import (
    CHOICE_KEYS,
    CLUSTER_BULKY_FIELDS,
    Allocation,
    Backend,
    Cluster,
    ExternalPod,
    GpuDevice,
    Job,
    NamespaceBinding,
    Node,
    NodePool,
    PodGroup,
    PriorityClass,
    PriorityClassMapping,
    SchedulingDecision,
    is_any_cluster,
)
from ..selectors import reason_as_of


class ClusterSerializer(serializers.ModelSerializer[Cluster]):
    """Credentials are write-only: they are encrypted at rest and never returned."""

    backend = serializers.ChoiceField(choices=Backend.choices, default=Backend.SIMULATED)
    kubeconfig = serializers.CharField(write_only=True, required=False, allow_blank=True,
                                       trim_whitespace=False, style={"input_type": "password"})
    token = serializers.CharField(write_only=True, required=False, allow_blank=True,
                                  style={"input_type": "password"})
    ca_cert = serializers.CharField(write_only=True, required=False, allow_blank=True,
                                    trim_whitespace=False)
    has_credentials = serializers.BooleanField(read_only=True)
    watch_failing = serializers.BooleanField(
        read_only=True, help_text="The pod watcher's last error is newer than its last event.")

    class Meta:
        model = Cluster
        fields = ["id", "name", "display_name", "enabled", "backend", "placement_policy", "labels",
                  "api_server", "prometheus_url", "namespace_prefix", "inventory", "kubeconfig", "token",
                  "ca_cert",
                  "has_credentials", "last_inventory_at", "last_cycle_at", "last_error",
                  "unreachable_since", "retry_at", "failures", "watch_last_event_at", "watch_error",
                  "watch_error_since", "watch_failing", "created_at"]
        read_only_fields = ["id", "has_credentials", "last_inventory_at", "last_cycle_at",
                            "last_error", "unreachable_since", "retry_at", "failures",
                            "watch_last_event_at", "watch_error", "watch_error_since", "created_at"]
        validators: list[Any] = []


class GpuSerializer(serializers.ModelSerializer[GpuDevice]):
    class Meta:
        model = GpuDevice
        fields = ["index", "uuid", "model", "vendor", "memory_mib", "numa_node", "healthy",
                  "quarantined", "sharing", "max_sharers", "memory_allocated_mib", "cores_allocated",
                  "sharers", "exclusive_held", "utilization_percent", "memory_used_mib",
                  "utilization_at", "foreign_memory_mib", "foreign_cores", "foreign_sharers",
                  "foreign_exclusive"]
        # The foreign_* figures: held by pods Camp did not create (docs/KUBERNETES.md); which
        # pods is not shown here (they belong to no Camp tenant; the console shows admins).
        read_only_fields = fields


class NodeSerializer(serializers.ModelSerializer[Node]):
    cluster: serializers.SlugRelatedField[Cluster] = serializers.SlugRelatedField(
        slug_field="name", read_only=True)
    gpus = GpuSerializer(many=True, read_only=True)
    schedulable = serializers.BooleanField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "name", "cpu_millicores", "ram_mib", "max_pods", "labels", "taints",
                  "pool", "nvlink_islands", "ready", "cordoned", "present", "quarantined",
                  "quarantine_reason", "schedulable", "gpus", "updated_at"]
        read_only_fields = fields

    def to_representation(self, instance: Node) -> dict[str, Any]:
        data = super().to_representation(instance)
        hidden = self.context.get("hidden_pools")
        if hidden is None:
            from ..selectors import hidden_pools

            request = self.context.get("request")
            hidden = hidden_pools(request.user if request else None)
            cast(dict[str, Any], self.context)["hidden_pools"] = hidden  # once per response
        keys = hidden.get((instance.cluster_id, instance.pool))
        if keys is not None:
            # A dedicated pool the reader may not see: neither its name nor its selector.
            data["pool"] = ""
            data["labels"] = {k: v for k, v in (data["labels"] or {}).items() if k not in keys}
        return data


class NodePoolSerializer(serializers.ModelSerializer[NodePool]):
    """A pool: the nodes whose labels match ``selector``. A dedicated pool places only its
    tenants' jobs; a shared one everyone's."""

    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    selector = serializers.DictField(child=serializers.CharField(max_length=63), required=False,
                                     default=dict)
    tenants = serializers.SlugRelatedField(slug_field="name", many=True, required=False,
                                           queryset=Tenant.objects.all())
    nodes = serializers.SerializerMethodField()

    class Meta:
        model = NodePool
        fields = ["id", "cluster", "name", "selector", "dedicated", "tenants", "nodes"]
        read_only_fields = ["id", "nodes"]
        validators: list[Any] = []

    def get_nodes(self, pool: NodePool) -> list[str]:
        """Names of the nodes currently in the pool."""
        return list(Node.objects.filter(cluster_id=pool.cluster_id, pool=pool.name, present=True)
                    .order_by("name").values_list("name", flat=True))

    def to_representation(self, instance: NodePool) -> dict[str, Any]:
        data = super().to_representation(instance)
        from tenants.permissions import restrict

        request = self.context.get("request")
        # Only the tenants the reader may see: a pool never names its other tenants.
        visible = set(restrict(Tenant.objects.all(), request.user if request else None)
                      .values_list("name", flat=True))
        data["tenants"] = [t for t in data["tenants"] if t in visible]
        return data


class QuarantineSerializer(serializers.Serializer[Any]):
    quarantined = serializers.BooleanField()
    reason = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class PodGroupSerializer(FastRead, serializers.ModelSerializer[PodGroup]):
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=100), required=False,
                                       max_length=20)
    command = serializers.ListField(child=serializers.CharField(max_length=4096), required=False,
                                    max_length=100)
    env = serializers.DictField(child=serializers.CharField(max_length=4096), required=False)

    class Meta:
        model = PodGroup
        fields = ["name", "replicas", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive",
                  "gpu_models", "cpu_millicores", "ram_mib", "image", "command", "env"]
        validators: list[Any] = []
        list_serializer_class = PrefetchedList

    ENV_MASK = "********"

    def to_representation(self, instance: PodGroup) -> dict[str, Any]:
        """Environment values often carry secrets: only those who may change the job (its
        owner, project admins and above) see them; other readers get the names."""
        data = super().to_representation(instance)
        request = self.context.get("request")
        if data.get("env") and isinstance(instance, PodGroup):
            from tenants.permissions import CHANGE, can

            if request is None or not can(request.user, CHANGE, instance.job):
                data["env"] = dict.fromkeys(data["env"], self.ENV_MASK)
        return data


class SliceBriefSerializer(FieldsOnce, serializers.Serializer[Any]):
    gpu = serializers.IntegerField(source="gpu.index")
    uuid = serializers.CharField(source="gpu.uuid")
    model = serializers.CharField(source="gpu.model")
    memory_mib = serializers.IntegerField()
    cores_percent = serializers.IntegerField()
    exclusive = serializers.BooleanField()

    class Meta:
        list_serializer_class = PrefetchedList


class AllocationSerializer(FastRead, serializers.ModelSerializer[Allocation]):
    node = serializers.CharField(source="node.name")
    role = serializers.CharField(source="group.name")
    slices = SliceBriefSerializer(many=True)

    class Meta:
        model = Allocation
        fields = ["pod_name", "role", "replica", "node", "phase", "cpu_millicores", "ram_mib", "slices"]
        read_only_fields = fields
        list_serializer_class = PrefetchedList


def visible_jobs(context: Any, ids: Any) -> set[int]:
    """Which of the job ``ids`` the request's user may see (cached in the serializer context
    across one response): another project's or tenant's preemptor or victim is not named."""
    cache = context.get("visible_jobs") if isinstance(context, dict) else None
    if cache is None:
        cache = {}
        if isinstance(context, dict):
            context["visible_jobs"] = cache
    wanted = {int(i) for i in ids if i is not None}
    unknown = wanted - cache.keys()
    if unknown:
        from tenants.permissions import restrict

        request = context.get("request")
        seen = set(restrict(Job.objects.filter(pk__in=unknown), request.user if request else None)
                   .values_list("pk", flat=True))
        cache.update({i: i in seen for i in unknown})
    return {i for i in wanted if cache[i]}


class DecisionListSerializer(serializers.ListSerializer[SchedulingDecision]):
    """Asks once per page which named jobs the reader may see."""

    def to_representation(self, data: Any) -> list[Any]:
        rows = list(data.all() if hasattr(data, "all") else data)
        visible_jobs(self.context, [i for d in rows for i in (
            d.preemptor_id, *[v for v in d.victims or [] if isinstance(v, int)])])
        return super().to_representation(rows)


class DecisionSerializer(FastRead, serializers.ModelSerializer[SchedulingDecision]):
    """``preemptor`` and ``victims`` list only the jobs the reader may see."""

    preemptor: serializers.PrimaryKeyRelatedField[Job] = serializers.PrimaryKeyRelatedField(
        read_only=True, allow_null=True)

    class Meta:
        model = SchedulingDecision
        fields = ["id", "kind", "reason", "queue_position", "placement", "victims", "preemptor",
                  "created_at"]
        read_only_fields = fields
        list_serializer_class = DecisionListSerializer

    def to_representation(self, instance: SchedulingDecision) -> dict[str, Any]:
        data = super().to_representation(instance)
        victims = [v for v in (data.get("victims") or []) if isinstance(v, int)]
        if instance.preemptor_id is None and not victims:
            return data
        seen = visible_jobs(self.context, [instance.preemptor_id, *victims])
        if data.get("preemptor") not in seen:
            data["preemptor"] = None
        if data.get("victims"):
            data["victims"] = [v for v in victims if v in seen]
        return data


class JobListSerializer(serializers.ListSerializer[Job]):
    """Asks once per page which preemptors and victims the reader may see, instead of once
    per job."""

    def to_representation(self, data: Any) -> list[Any]:
        jobs = list(data.all() if hasattr(data, "all") else data)
        ids: list[int | None] = []
        for job in jobs:
            ids.append(job.preempted_by_id)
            for d in getattr(job, "latest_decisions", None) or []:
                ids.extend([d.preemptor_id, *[v for v in d.victims or [] if isinstance(v, int)]])
        visible_jobs(self.context, ids)
        return super().to_representation(jobs)


class VisibleClusterField(serializers.SlugRelatedField[Cluster]):
    """An enabled cluster the user may see, by name (others read as "does not exist").
    Decided per request, so it also works for the items of a list (bulk submit)."""

    def get_queryset(self) -> Any:
        from tenants.permissions import restrict

        request = self.context.get("request")
        # not its inventory YAML or credentials (read on first use): a submit to a simulated
        # openb-sized cluster decoded 175 KB it never looks at (issue 35)
        return restrict(Cluster.objects.filter(enabled=True).defer(*CLUSTER_BULKY_FIELDS),
                        request.user if request else None)

    def to_internal_value(self, data: Any) -> Any:
        if self.allow_null and is_any_cluster(data):
            return None  # "any" (in any case): no one cluster, as the CLI's --cluster any
        return resolved_once(self, data, super().to_internal_value)


class ClusterChoiceField(serializers.JSONField):
    """A floating job's choice: read back as the user gave it (``Job.user_cluster_choice``),
    without the placement's bookkeeping (that is ``cluster_setbacks``)."""

    def to_representation(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: v for k, v in value.items() if k in CHOICE_KEYS}


class ClusterSetbackSerializer(serializers.Serializer[Any]):
    cluster = serializers.CharField()
    kind = serializers.ChoiceField(
        choices=["dispatch-failed", "refused"],
        help_text="dispatch-failed: its pods could not be created there (that cluster is "
                  "avoided for a while); refused: that cluster's cycle found it can never run there.")
    at = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(help_text="Short; credentials in the error text are redacted.")
    failures = serializers.IntegerField(help_text="Failed dispatches there (0 for a refusal).")


class NamespaceBindingSerializer(serializers.ModelSerializer[NamespaceBinding]):
    """A Kubernetes namespace Camp did not create, bound to a project (issue 34): pods there
    that name Camp's scheduler are queued as the project's ``external`` jobs."""

    cluster = VisibleClusterField(slug_field="name", queryset=Cluster.objects.all())
    project = VisiblePKField(queryset=Project.objects.select_related("tenant"))
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)

    class Meta:
        model = NamespaceBinding
        fields = ["id", "cluster", "namespace", "project", "tenant", "created_by", "created_at"]
        read_only_fields = ["id", "tenant", "created_by", "created_at"]
        validators: list[Any] = []


class PriorityClassMappingSerializer(serializers.ModelSerializer[PriorityClassMapping]):
    """Which of Camp's priority classes the external pods of a cluster get for their Kubernetes
    PriorityClass (issue 34). Without a row: a Camp class of the same name, else normal."""

    cluster = VisibleClusterField(slug_field="name", queryset=Cluster.objects.all())
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None)

    class Meta:
        model = PriorityClassMapping
        fields = ["id", "cluster", "kube_priority_class", "priority_class", "created_by", "updated_at"]
        read_only_fields = ["id", "created_by", "updated_at"]
        validators: list[Any] = []


class ExternalPodSerializer(FastRead, serializers.ModelSerializer[ExternalPod]):
    class Meta:
        model = ExternalPod
        fields = ["namespace", "name", "uid", "owner_kind", "owner_name", "service_account", "pod_group"]
        read_only_fields = fields


class KubernetesJobSerializer(serializers.Serializer[Any]):
    kind = serializers.CharField(help_text="Job (batch/v1).")
    namespace = serializers.CharField()
    name = serializers.CharField()
    queue_name = serializers.CharField(help_text="The queue its label names (Kueue's LocalQueue).")


class JobSerializer(FastRead, serializers.ModelSerializer[Job]):
    project = VisiblePKField(queryset=Project.objects.select_related("tenant"))
    cluster = VisibleClusterField(
        slug_field="name", queryset=Cluster.objects.all(), required=False, allow_null=True,
        help_text="The one cluster to run on. Leave it out (or null) for a floating job: Camp "
                  "places it on the cluster where it starts soonest among those "
                  '``cluster_choice`` allows (null while it waits in the global queue). "any" '
                  "(in any case) is taken as null: no cluster may be named any.")
    cluster_choice = ClusterChoiceField(
        required=False, default=dict,
        help_text='Floating jobs only: {"clusters": ["a", "b"]} and/or {"labels": {"region": '
                  '"eu-west"}} (all must match) and {"prefer": {...}} (data locality, a '
                  "tie-break); empty: any cluster the project may use. Read back as given, so "
                  "it can be posted again.")
    cluster_setbacks = serializers.SerializerMethodField(
        help_text="Floating jobs: the clusters it was sent back from (its pods could not be "
                  "created there, or that cluster found it can never run there), oldest first.")
    why_across_clusters = serializers.CharField(
        read_only=True, help_text="Floating jobs: why it waits, cluster by cluster (its own "
                                  "cluster's answer once placed, and why not the others).")
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True, default=None)
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, default="normal")
    preemptible = serializers.BooleanField(required=False, allow_null=True, default=None)
    groups = PodGroupSerializer(many=True)
    allocations = AllocationSerializer(many=True, read_only=True)
    last_decision = serializers.SerializerMethodField()
    reason_as_of = serializers.SerializerMethodField(
        help_text="A waiting job: when its reason was computed (its cluster's last cycle; with "
                  "no cluster yet, its last change); null otherwise.")
    reason_stale = serializers.SerializerMethodField(
        help_text="A waiting job: its reason may be out of date (its cluster has not recomputed "
                  "it within SCHEDULER_REASON_STALE_SECONDS, or takes no new work).")
    kubernetes_pods = serializers.SerializerMethodField(
        help_text="External jobs (kind external): the Kubernetes pods they stand for, with their "
                  "owner (Job, ReplicaSet), service account and pod group; empty for Camp's own.")
    kubernetes_job = serializers.SerializerMethodField(
        help_text="An external job that admits a batch/v1 Job labelled for a queue (Kueue's "
                  "admission): that Job; null otherwise.")

    class Meta:
        model = Job
        fields = ["id", "name", "tenant", "project", "cluster", "floating", "cluster_choice",
                  "cluster_setbacks", "owner",
                  "kind", "priority_class",
                  "priority", "preemptible", "checkpoint_capable", "gang", "mixed_gpu_models", "affinity",
                  "duration_seconds",
                  "groups", "state", "reason", "reason_kind", "reason_as_of", "reason_stale",
                  "why_across_clusters", "queue_position", "queue_length",
                  "preempted_by", "attempts", "submitted_at", "admitted_at", "started_at",
                  "finished_at", "allocations", "last_decision", "kubernetes_pods", "kubernetes_job"]
        read_only_fields = ["id", "tenant", "owner", "floating", "priority", "state", "reason", "reason_kind",
                            "queue_position", "queue_length", "preempted_by", "attempts",
                            "submitted_at", "admitted_at", "started_at", "finished_at"]
        validators: list[Any] = []
        list_serializer_class = JobListSerializer

    @extend_schema_field(ClusterSetbackSerializer(many=True))
    def get_cluster_setbacks(self, job: Job) -> list[dict[str, Any]]:
        return job.cluster_setbacks

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_reason_as_of(self, job: Job) -> Any:
        as_of = reason_as_of(job)[0]
        return None if as_of is None else serializers.DateTimeField().to_representation(as_of)

    def get_reason_stale(self, job: Job) -> bool:
        return reason_as_of(job)[1]

    @extend_schema_field(ExternalPodSerializer(many=True))
    def get_kubernetes_pods(self, job: Job) -> list[dict[str, Any]]:
        # Only an external job has pods of its own to show: Camp's own jobs cost no query (a list
        # page prefetches the external jobs' pods in one, ``JobViewSet.paginate_queryset``).
        if job.kind != "external":
            return []
        return cast(list[dict[str, Any]], ExternalPodSerializer(job.external_pods.all(), many=True).data)

    @extend_schema_field(KubernetesJobSerializer(allow_null=True))
    def get_kubernetes_job(self, job: Job) -> dict[str, Any] | None:
        if job.kind != "external":
            return None
        w = next(iter(job.external_workloads.all()), None)  # prefetched with the pods on a list page
        return None if w is None else {"kind": "Job", "namespace": w.namespace, "name": w.name,
                                       "queue_name": w.queue_name}

    def get_last_decision(self, job: Job) -> dict[str, Any] | None:
        latest = getattr(job, "latest_decisions", None)  # prefetched by the list (one query)
        if latest is None and "decisions" in getattr(job, "_prefetched_objects_cache", {}):
            latest = sorted(job.decisions.all(), key=lambda d: d.pk, reverse=True)  # a new job's
        d = latest[0] if latest else None if latest is not None else job.decisions.order_by("-id").first()
        if d is None:
            return None
        # One DecisionSerializer for the whole page: building a serializer's fields costs
        # about a millisecond, which per job was two thirds of a page's serialisation.
        child = self.__dict__.get("_decision_serializer")
        if child is None:
            child = self.__dict__["_decision_serializer"] = DecisionSerializer(context=self.context)
        return child.to_representation(d)

    def to_representation(self, instance: Job) -> dict[str, Any]:
        data = super().to_representation(instance)
        if instance.preempted_by_id is not None and instance.preempted_by_id not in visible_jobs(
                self.context, [instance.preempted_by_id]):
            data["preempted_by"] = None  # another project's or tenant's job is not named
        return data


class JobBulkSerializer(serializers.Serializer[Any]):
    """A bulk submit: the jobs, each as for ``POST /jobs/``."""

    jobs = JobSerializer(many=True)


class JobBriefSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    name = serializers.CharField()
    project = serializers.IntegerField(source="project_id")
    state = serializers.CharField()


class JobBulkResultSerializer(serializers.Serializer[Any]):
    count = serializers.IntegerField()
    jobs = JobBriefSerializer(many=True)


def flat_errors(errors: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested errors as ``{"jobs[3].groups[0].gpu_count": [...]}``, the way services
    name fields, so one item's problem is named whichever layer found it."""
    out: dict[str, list[str]] = {}
    if isinstance(errors, dict):
        for key, value in errors.items():
            if isinstance(key, int):  # a list's errors by item index
                name = f"{prefix}[{key}]"
            else:
                name = f"{prefix}.{key}" if prefix else str(key)
            out.update(flat_errors(value, name))
    elif isinstance(errors, list) and all(isinstance(e, str) for e in errors):
        if errors:
            out[prefix or "non_field_errors"] = [str(e) for e in errors]
    elif isinstance(errors, list):
        for i, value in enumerate(errors):
            out.update(flat_errors(value, f"{prefix}[{i}]"))
    return out
