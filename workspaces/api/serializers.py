"""Workload API serializers: shape and type checks only; rules live in services."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from registry.models import Image
from scheduling.models import Cluster, PriorityClass, is_any_cluster
from tenants.api.serializers import VisiblePKField
from tenants.models import Project, Tenant

from .. import selectors
from ..models import (
    AutoscaleMetric,
    DevEnvironment,
    EnvKind,
    ModelService,
    ModelSourceKind,
    Profile,
    SshKey,
    TrainingCheckpoint,
    TrainingFramework,
    TrainingJob,
)
from ..models import WorkspacePolicy as Policy


class ClusterNameField(serializers.SlugRelatedField):  # type: ignore[type-arg]
    """A cluster by name, among the enabled clusters the user may see."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(slug_field="name", queryset=Cluster.objects.filter(enabled=True), **kwargs)

    def get_queryset(self) -> Any:
        from tenants.permissions import restrict

        request = self.context.get("request")
        return restrict(Cluster.objects.filter(enabled=True), request.user if request else None)

    def to_internal_value(self, data: Any) -> Any:
        if self.allow_null and is_any_cluster(data):
            return None  # "any" (in any case): a floating workload, as the CLI's --cluster any
        return super().to_internal_value(data)


class RunSerializer(serializers.Serializer[Any]):
    """The workload's current run: its scheduling job, and why it waits."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    reason = serializers.CharField()
    queue_position = serializers.IntegerField(allow_null=True)
    queue_length = serializers.IntegerField(allow_null=True)
    attempts = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)


ENV_HELP = (f"Environment variables. Values are shown only to the workload's owner and project admins "
            f"and above; others see the names with values replaced by {selectors.ENV_MASK!r}.")


# Environment variables often hold secrets: their values go only to those who may change the
# workload (selectors.env_for); without a request, nobody. (A comment, not a docstring: drf-
# spectacular would put a docstring into the schema of every serializer using the mixin.)
class MaskedEnvMixin:

    context: dict[str, Any]

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)  # type: ignore[misc]
        if "env" in data:
            request = self.context.get("request")
            data["env"] = selectors.env_for(getattr(request, "user", None), instance)
        return data


class EnvironmentSerializer(MaskedEnvMixin, serializers.ModelSerializer[DevEnvironment]):
    project = VisiblePKField(queryset=Project.objects.all())
    cluster = ClusterNameField()
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    project_name = serializers.CharField(source="project.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    kind = serializers.ChoiceField(choices=EnvKind.choices)
    image = VisiblePKField(queryset=Image.objects.all(), required=False, allow_null=True)
    profile = VisiblePKField(queryset=Profile.objects.all(), required=False, allow_null=True)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False, help_text=ENV_HELP)
    ssh_public_keys = serializers.CharField(required=False, allow_blank=True, max_length=65536)
    state = serializers.CharField(read_only=True)
    run = RunSerializer(source="job", read_only=True, allow_null=True)
    how_to_open = serializers.SerializerMethodField()
    access_url = serializers.SerializerMethodField(
        help_text="Only in the response that created the environment: a link with its one-time token.")

    class Meta:
        model = DevEnvironment
        fields = ["id", "name", "tenant", "project", "project_name", "cluster", "owner", "kind", "profile",
                  "image", "image_reference", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive",
                  "gpu_models", "cpu_millicores", "ram_mib", "home_gib", "env", "ssh_public_keys", "state",
                  "run",
                  "runs", "last_activity_at", "cull_warning", "cull_at", "stop_reason", "how_to_open",
                  "access_url", "created_at"]
        read_only_fields = ["id", "runs", "gpu_models", "last_activity_at", "cull_warning", "cull_at",
                            "stop_reason", "created_at"]
        extra_kwargs = {"image_reference": {"required": False, "allow_blank": True}}
        validators: list[Any] = []

    def get_how_to_open(self, env: DevEnvironment) -> dict[str, str]:
        return selectors.how_to_open(env)

    def get_access_url(self, env: DevEnvironment) -> str | None:
        token = self.context.get("access_token")
        return f"{selectors.environment_url(env)}?camp_token={token}" if token else None


class TrainingSerializer(MaskedEnvMixin, serializers.ModelSerializer[TrainingJob]):
    project = VisiblePKField(queryset=Project.objects.all())
    cluster = ClusterNameField(
        required=False, allow_null=True,
        help_text="The one cluster to run on. Leave it out (or null) for a floating training job: "
                  "each run is placed on the cluster where it starts soonest among those "
                  "``cluster_choice`` allows. Read back: the cluster it runs on (a floating job's "
                  "run's; null while that run waits in the global queue).")
    cluster_choice = serializers.JSONField(
        required=False, default=dict,
        help_text='Floating training jobs only: {"clusters": ["a", "b"]} and/or {"labels": '
                  '{"region": "eu-west"}} (all must match) and {"prefer": {...}} (data locality, a '
                  "tie-break); empty: any cluster the project may use. Not with a data_volume or a "
                  "checkpoint volume (they live on one cluster).")
    floating = serializers.BooleanField(read_only=True, help_text="Launched without one named cluster.")
    why_across_clusters = serializers.SerializerMethodField(
        help_text="Floating training jobs: why its run waits, cluster by cluster (its own "
                  "cluster's answer once placed, and why not the others).")
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    project_name = serializers.CharField(source="project.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True, default=None)
    framework = serializers.ChoiceField(choices=TrainingFramework.choices)
    image = VisiblePKField(queryset=Image.objects.all(), required=False, allow_null=True)
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, default="normal")
    preemptible = serializers.BooleanField(required=False, allow_null=True, default=None)
    command = serializers.ListField(child=serializers.CharField(max_length=4096), required=False,
                                    max_length=100)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False, help_text=ENV_HELP)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=100), required=False,
                                       max_length=20)
    depends_on = VisiblePKField(queryset=TrainingJob.objects.all(), many=True, required=False)
    profile = VisiblePKField(
        queryset=Profile.objects.all(), required=False, allow_null=True, write_only=True,
        help_text="A compute preset: each worker takes its shape and GPU model (the shape fields "
                  "given beside it are ignored).")
    state = serializers.CharField(read_only=True)
    run = RunSerializer(source="job", read_only=True, allow_null=True)
    last_checkpoint = serializers.SerializerMethodField()
    tensorboard_url = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = ["id", "name", "tenant", "project", "project_name", "cluster", "cluster_choice", "floating",
                  "why_across_clusters", "owner", "framework", "image", "image_reference", "workers",
                  "gpu_count", "gpu_memory_mib", "gpu_cores_percent",
                  "exclusive", "gpu_models", "cpu_millicores", "ram_mib", "command", "env", "data_volume",
                  "checkpoint_dir", "checkpoint_every", "checkpoint_volume_gib", "log_dir",
                  "max_runtime_seconds", "retry_limit", "priority_class", "preemptible",
                  "duration_seconds", "depends_on", "profile", "state", "run", "blocked_reason", "retries",
                  "restarts", "lost_gpu_seconds", "last_checkpoint", "tensorboard_url", "stop_reason",
                  "created_at"]
        read_only_fields = ["id", "blocked_reason", "retries", "restarts", "lost_gpu_seconds",
                            "stop_reason", "created_at"]
        extra_kwargs = {"image_reference": {"required": False, "allow_blank": True}}
        validators: list[Any] = []

    def get_why_across_clusters(self, t: TrainingJob) -> str:
        return t.job.why_across_clusters if t.job_id and t.job is not None else ""

    def to_representation(self, instance: TrainingJob) -> dict[str, Any]:
        data = super().to_representation(instance)
        cluster = instance.run_cluster
        data["cluster"] = cluster.name if cluster is not None else None
        return data

    def get_last_checkpoint(self, t: TrainingJob) -> dict[str, Any] | None:
        c = t.checkpoints.order_by("-step", "-id").first()
        return {"step": c.step, "path": c.path, "written_at": c.written_at} if c else None

    def get_tensorboard_url(self, t: TrainingJob) -> str | None:
        return selectors.tensorboard_url(t) or None


class CheckpointSerializer(serializers.ModelSerializer[TrainingCheckpoint]):
    class Meta:
        model = TrainingCheckpoint
        fields = ["step", "path", "written_at", "attempt"]
        read_only_fields = ["written_at", "attempt"]


class LogSerializer(serializers.Serializer[Any]):
    pod = serializers.CharField()
    role = serializers.CharField()
    text = serializers.CharField()


class WhySerializer(serializers.Serializer[Any]):
    state = serializers.CharField()
    reason = serializers.CharField()
    reason_kind = serializers.CharField(required=False)
    queue_position = serializers.IntegerField(allow_null=True)
    queue_length = serializers.IntegerField(allow_null=True)
    hint = serializers.CharField()
    as_of = serializers.DateTimeField(
        allow_null=True, required=False, help_text="When the reason was computed (a waiting job).")
    stale = serializers.BooleanField(
        required=False, help_text="The reason may be out of date (its cluster has not recomputed it).")
    why_across_clusters = serializers.CharField(
        required=False, help_text="A floating run's why, cluster by cluster (empty: one named cluster).")


class OpenSerializer(serializers.Serializer[Any]):
    url = serializers.CharField()


class ProfileSerializer(serializers.ModelSerializer[Profile]):
    image = VisiblePKField(queryset=Image.objects.all(), required=False, allow_null=True)
    tenants = VisiblePKField(queryset=Tenant.objects.all(), many=True, required=False)
    projects = VisiblePKField(queryset=Project.objects.all(), many=True, required=False)

    class Meta:
        model = Profile
        fields = ["id", "name", "display_name", "description", "image", "gpu_model", "gpu_count",
                  "gpu_memory_mib",
                  "gpu_cores_percent", "exclusive", "cpu_millicores", "ram_mib", "home_gib", "tenants",
                  "projects", "enabled", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators: list[Any] = []


class PolicySerializer(serializers.ModelSerializer[Policy]):
    project = VisiblePKField(queryset=Project.objects.all())

    class Meta:
        model = Policy
        fields = ["id", "project", "idle_minutes", "max_lifetime_hours", "warning_minutes",
                  "storage_gib_limit", "updated_at"]
        read_only_fields = ["id", "updated_at"]
        validators: list[Any] = []


class SshKeySerializer(serializers.ModelSerializer[SshKey]):
    user = serializers.CharField(source="user.username", read_only=True)
    name = serializers.CharField(max_length=100, required=False, allow_blank=True,
                                 help_text="Defaults to the key's comment.")
    public_key = serializers.CharField(max_length=20000, trim_whitespace=True,
                                       help_text="One OpenSSH public key line (ssh-ed25519, ecdsa-sha2-*, "
                                                 "ssh-rsa of at least 2048 bits).")

    class Meta:
        model = SshKey
        fields = ["id", "user", "name", "public_key", "key_type", "bits", "fingerprint", "created_at"]
        read_only_fields = ["id", "key_type", "bits", "fingerprint", "created_at"]
        validators: list[Any] = []


# --- model services ----------------------------------------------------------------------------


class ReplicaSerializer(serializers.Serializer[Any]):
    """One replica: its number, revision and scheduling job (why it waits, if it does)."""

    number = serializers.IntegerField()
    revision = serializers.IntegerField()
    job = RunSerializer()
    removed_reason = serializers.CharField()


class CompanionSerializer(serializers.Serializer[Any]):
    """A model server run beside the main one in every replica, on the same node (a
    speculative-decoding draft). Checked by the service function (errors name
    ``companions[<i>].<field>``); omitted fields take the defaults shown."""

    name = serializers.CharField(max_length=16, help_text="A DNS label, unique in the service.")
    image = serializers.CharField(required=False, max_length=100,
                                  help_text="A catalog image (id or name) instead of image_reference.")
    image_reference = serializers.CharField(required=False, allow_blank=True, max_length=512)
    model_source = serializers.CharField(required=False, allow_blank=True, max_length=500,
                                         help_text="Given to the server as CAMP_MODEL.")
    args = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                 required=False, max_length=100)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False, help_text=ENV_HELP)
    port = serializers.IntegerField(required=False, help_text="Container port http (default 8001).")
    health_path = serializers.CharField(required=False, allow_blank=True, max_length=200,
                                        help_text="Readiness path (empty: the port accepting connections).")
    gpu_count = serializers.IntegerField(required=False, help_text="Default 1.")
    gpu_memory_mib = serializers.IntegerField(required=False, help_text="Per GPU (default 10240).")
    gpu_cores_percent = serializers.IntegerField(required=False, help_text="Per GPU (default 20).")
    cpu_millicores = serializers.IntegerField(required=False, help_text="Default 1000.")
    ram_mib = serializers.IntegerField(required=False, help_text="Default 8192.")


class ModelServiceSerializer(MaskedEnvMixin, serializers.ModelSerializer[ModelService]):
    project = VisiblePKField(queryset=Project.objects.all())
    cluster = ClusterNameField()
    tenant = serializers.CharField(source="tenant.name", read_only=True)
    project_name = serializers.CharField(source="project.name", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True, default=None)
    image = VisiblePKField(queryset=Image.objects.all(), required=False, allow_null=True,
                           help_text="An inference image of the catalog (vLLM, Triton, TGI, ...).")
    model_source_kind = serializers.ChoiceField(choices=ModelSourceKind.choices, default="uri")
    autoscale_metric = serializers.ChoiceField(choices=AutoscaleMetric.choices, default="concurrency")
    priority_class = serializers.ChoiceField(choices=PriorityClass.choices, default="inference")
    args = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                 required=False, max_length=100)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False, help_text=ENV_HELP)
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=100), required=False,
                                       max_length=20)
    load_profile = serializers.DictField(child=serializers.FloatField(min_value=0), required=False,
                                         help_text="Simulated load: base, peak, peak_hour, "
                                                   "burst_every_minutes, burst_minutes, burst.")
    companions = CompanionSerializer(many=True, required=False, help_text=(
        "Model servers served beside the main one in every replica, all on one node (draft + "
        "target of speculative decoding); the main server finds each at CAMP_COMPANION_<NAME>_URL."))
    ingress_host = serializers.CharField(
        required=False, allow_blank=True, max_length=253,
        help_text="On Kubernetes, an Ingress routes this host to the service. Set at creation.")
    replicas = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()
    external_endpoint = serializers.SerializerMethodField(
        help_text="The Ingress URL callers outside the cluster use (with the service's API key); "
                  "null without ingress_host.")
    api_key_set = serializers.SerializerMethodField(
        help_text="Whether the service has an API key (POST …/api-key/ makes a new one).")

    class Meta:
        model = ModelService
        fields = ["id", "name", "tenant", "project", "project_name", "cluster", "owner", "image",
                  "image_reference", "model_source_kind", "model_source", "port", "health_path", "args",
                  "env", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive", "gpu_models",
                  "cpu_millicores", "ram_mib", "min_replicas", "max_replicas", "autoscale_metric",
                  "autoscale_target", "scale_down_delay_seconds", "scale_to_zero_seconds", "load_profile",
                  "priority_class", "preemptible", "companions", "ingress_host", "revision",
                  "desired_replicas", "ready_replicas", "status", "status_reason", "load", "load_at",
                  "load_error", "latency_p50_seconds", "latency_p95_seconds", "replicas", "endpoint",
                  "external_endpoint", "api_key_set", "api_key_created_at", "created_at", "updated_at"]
        read_only_fields = ["id", "revision", "desired_replicas", "ready_replicas", "status", "status_reason",
                            "load", "load_at", "load_error", "latency_p50_seconds", "latency_p95_seconds",
                            "api_key_created_at", "created_at", "updated_at"]
        extra_kwargs = {"image_reference": {"required": False, "allow_blank": True},
                        "model_source": {"required": False, "allow_blank": True}}
        validators: list[Any] = []

    def to_representation(self, instance: Any) -> Any:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if not selectors.env_values_visible(getattr(request, "user", None), instance):
            for c in data.get("companions") or []:
                c["env"] = dict.fromkeys(c.get("env") or {}, selectors.ENV_MASK)
        return data

    def validate_companions(self, value: list[Any]) -> list[dict[str, Any]]:
        return [dict(c) for c in value]

    @extend_schema_field(ReplicaSerializer(many=True))
    def get_replicas(self, svc: ModelService) -> list[dict[str, Any]]:
        reps = getattr(svc, "live_replicas", None)
        if reps is None:
            reps = list(selectors.service_replicas(svc))
        return [ReplicaSerializer(r).data for r in reps]

    def get_endpoint(self, svc: ModelService) -> str:
        return selectors.service_endpoint(svc)

    def get_external_endpoint(self, svc: ModelService) -> str | None:
        return selectors.service_external_endpoint(svc) or None

    def get_api_key_set(self, svc: ModelService) -> bool:
        return bool(svc.api_key_hash)


class ServiceApiKeySerializer(serializers.Serializer[Any]):
    api_key = serializers.CharField(help_text="Shown once: only its SHA-256 is kept.")
    created_at = serializers.DateTimeField()
    external_endpoint = serializers.CharField()


class ModelServiceUpdateSerializer(ModelServiceSerializer):
    """PATCH/PUT: scaling settings apply at once; image, args, env, model or shape is a new
    revision (rolled out replica by replica). Where it runs and its priority stay (declared
    fields ignore ``read_only_fields``, hence declared again here)."""

    # (DRF replaces a declared field by name; the types differ from the create fields'.)
    name = serializers.CharField(read_only=True)
    project = serializers.PrimaryKeyRelatedField[Any](read_only=True)  # type: ignore[assignment]
    cluster = serializers.CharField(source="cluster.name", read_only=True)  # type: ignore[assignment]
    priority_class = serializers.CharField(read_only=True)  # type: ignore[assignment]
    preemptible = serializers.BooleanField(read_only=True)
    ingress_host = serializers.CharField(read_only=True)  # type: ignore[assignment]

    class Meta(ModelServiceSerializer.Meta):
        pass


class ScaleSerializer(serializers.Serializer[Any]):
    replicas = serializers.IntegerField(required=False, min_value=0, max_value=64,
                                        help_text="A fixed count (min = max = replicas; 0 stops it).")
    min_replicas = serializers.IntegerField(required=False, min_value=0, max_value=64)
    max_replicas = serializers.IntegerField(required=False, min_value=0, max_value=64)


class RolloutSerializer(serializers.Serializer[Any]):
    """What changes in the new revision; empty: restart every replica on a new revision."""

    image = VisiblePKField(queryset=Image.objects.all(), required=False, allow_null=True)
    image_reference = serializers.CharField(required=False, max_length=512)
    args = serializers.ListField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                 required=False, max_length=100)
    env = serializers.DictField(child=serializers.CharField(max_length=4096, allow_blank=True),
                                required=False)
    model_source = serializers.CharField(required=False, max_length=500)
