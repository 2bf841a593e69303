"""Console forms: input shape only; services apply the rules and name bad fields."""

from __future__ import annotations

import secrets
import shlex
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from registry.models import Image
from scheduling.models import Cluster, PriorityClass
from tenants.models import Project
from tenants.permissions import restrict

from .models import AutoscaleMetric, EnvKind, ModelSourceKind, Profile, TrainingFramework, WorkspacePolicy


def parse_env(text: str) -> dict[str, str]:
    """``KEY=value`` lines → a dict (the service checks the names)."""
    env: dict[str, str] = {}
    for n, line in enumerate((text or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise forms.ValidationError(f"Line {n}: write NAME=value.")
        k, v = line.split("=", 1)
        env[k.strip()] = v
    return env


def _default_name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(2)}"


IMAGE_FRAMEWORK: dict[str, str] = {
    TrainingFramework.PYTORCH: "pytorch", TrainingFramework.DEEPSPEED: "pytorch",
    TrainingFramework.TENSORFLOW: "tensorflow",
}
"""The image framework (``registry.models.Framework``) a training framework runs on (MPI: any)."""


class _ImageChoice(forms.ModelChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        badges = [obj.get_framework_display()] if obj.framework and obj.framework != "other" else []
        tag = obj.reference.rsplit(":", 1)[1] if ":" in obj.reference.rsplit("/", 1)[-1] else ""
        if tag:
            badges.append(tag)
        return f"{obj.display_name or obj.name}" + (f" ({', '.join(badges)})" if badges else "")


class _PresetChoice(forms.ModelChoiceField):  # type: ignore[type-arg]
    def label_from_instance(self, obj: Any) -> str:
        return str(obj)


def _default_preset(form: forms.Form, user: Any, *, slice_first: bool, preemptible: bool, copies: int = 1,
                    any_cluster: bool = False) -> None:
    """Preselect what submitting the defaults most likely starts now (issue 32 item 4,
    ``presets.default_choice``): the preset this user can start now, quota and guarantee
    included (notebooks and services: a GPU slice first), the project that may start it and
    the cluster where it may — or "Any cluster" where the form offers it (``any_cluster``:
    Camp places it where it starts soonest). A form being submitted is left alone."""
    from .presets import default_choice

    if form.is_bound:
        return
    fields: Any = form.fields
    profile, cluster, project = default_choice(
        user, fields["profile"].queryset, fields["cluster"].queryset, preemptible=preemptible,
        copies=copies, slice_first=slice_first)
    if profile is not None:
        form.initial.setdefault("profile", profile.pk)
    if project is not None:
        form.initial.setdefault("project", project.pk)
    if cluster is not None and not any_cluster:
        form.initial.setdefault("cluster", cluster.name)


# Fields a launch form shows up front; everything else folds into "Advanced".
class _WorkloadForm(forms.Form):
    basic: tuple[str, ...] = ()

    project = forms.ModelChoiceField(queryset=Project.objects.none(), label="Project",
                                     empty_label="Choose a project")
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.none(), to_field_name="name",
                                     label="Cluster", empty_label="Choose a cluster")
    name = forms.CharField(max_length=40, label="Name", help_text="Lowercase letters, digits and '-'.")
    profile = _PresetChoice(
        queryset=Profile.objects.none(),
        required=False,
        label="Compute preset",
        empty_label="Custom shape (set it under Advanced)",
        help_text="A preset sets the GPUs, CPU and RAM for you.",
    )
    image = _ImageChoice(
        queryset=Image.objects.none(),
        required=False,
        label="Image",
        help_text="From the catalog; or give an image reference under Advanced.",
    )
    image_reference = forms.CharField(max_length=512, required=False, label="Image reference",
                                      help_text="Any registry image, e.g. pytorch/pytorch:2.4.0 "
                                                "(used when no catalog image is chosen).")
    gpu_count = forms.IntegerField(min_value=0, max_value=64, initial=1, label="GPUs",
                                   help_text="0 for a CPU-only workload.")
    gpu_memory_mib = forms.IntegerField(
        min_value=0, initial=0, label="GPU memory per GPU (MiB)",
        help_text="A slice of a card: its memory. 0 here and below: whole cards.")
    gpu_cores_percent = forms.IntegerField(
        min_value=0, max_value=100, initial=0, label="GPU compute per GPU (%)",
        help_text="A slice of a card: its share of the compute.")
    exclusive = forms.BooleanField(required=False, label="Whole cards, not shared with anyone")
    cpu_millicores = forms.IntegerField(min_value=100, initial=2000, label="CPU (millicores)",
                                        help_text="1000 = one core.")
    ram_mib = forms.IntegerField(min_value=128, initial=8192, label="RAM (MiB)")
    env = forms.CharField(
        required=False,
        label="Environment variables",
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono"}),
        help_text="NAME=value, one per line.",
    )

    def __init__(self, *args: Any, user: Any = None, variant: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields: Any = self.fields
        fields["project"].queryset = restrict(Project.objects.select_related("tenant"), user)
        fields["cluster"].queryset = restrict(Cluster.objects.filter(enabled=True), user)
        images = restrict(Image.objects.filter(enabled=True), user)
        fields["image"].queryset = images.filter(variant=variant) if variant else images
        fields["profile"].queryset = restrict(Profile.objects.filter(enabled=True), user)
        # One choice is no choice: preselect it.
        for name in ("project", "cluster"):
            only = list(fields[name].queryset[:2])
            if len(only) == 1:
                self.initial.setdefault(name, only[0].name if name == "cluster" else only[0].pk)

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env", ""))

    def basic_fields(self) -> list[Any]:
        return [self[n] for n in self.basic]

    def advanced_fields(self) -> list[Any]:
        return [self[n] for n in self.fields if n not in self.basic and n != "profile"]

    def advanced_has_errors(self) -> bool:
        return any(self[n].errors for n in self.fields if n not in self.basic and n != "profile")


class EnvironmentForm(_WorkloadForm):
    basic = ("project", "cluster", "name", "kind", "image")
    kind = forms.ChoiceField(choices=EnvKind.choices, label="Environment", initial=EnvKind.JUPYTER)
    home_gib = forms.IntegerField(min_value=1, max_value=10240, initial=10, label="Home volume (GiB)",
                                  help_text="Kept across stops; deleted with the environment.")
    ssh_public_keys = forms.CharField(
        required=False,
        label="Extra SSH public keys",
        widget=forms.Textarea(attrs={"rows": 2, "class": "mono"}),
        help_text="SSH environments use your stored SSH keys; add extra ones here, one per line.",
    )
    field_order = ["project", "cluster", "name", "kind", "profile", "image", "image_reference"]

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, user=user, **kwargs)
        fields: Any = self.fields
        fields["image"].queryset = restrict(
            Image.objects.filter(enabled=True).exclude(variant="training"), user
        )
        fields["image"].empty_label = "The preset's image"
        self.initial.setdefault("name", _default_name("notebook"))
        _default_preset(self, user, slice_first=True, preemptible=False)  # notebooks never are
        # A preset without an image of its own: the first catalog image of the default kind,
        # so the defaults launch (issue 32 item 4) rather than ask for an image.
        preset = self.initial.get("profile")
        if not self.is_bound and preset is not None and not fields["profile"].queryset.filter(
                pk=preset, image__isnull=False).exists():
            first = fields["image"].queryset.filter(variant=self.initial.get("kind", EnvKind.JUPYTER)).first()
            if first is not None:
                self.initial.setdefault("image", first.pk)


def parse_labels(text: str) -> dict[str, str]:
    """``region=eu-west, arch=arm64`` → a dict (the service checks that a cluster has them)."""
    labels: dict[str, str] = {}
    for part in (text or "").replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        k, sep, v = part.partition("=")
        if not sep or not k.strip() or not v.strip():
            raise forms.ValidationError(f"{part!r}: write key=value, e.g. region=eu-west.")
        labels[k.strip()] = v.strip()
    return labels


class TrainingForm(_WorkloadForm):
    basic = ("project", "cluster", "cluster_set", "cluster_labels", "name", "framework", "image", "workers",
             "command")
    # A training job may float (issue 16): "Any cluster" lets Camp place each run where it
    # starts soonest, among the clusters with the labels given below.
    cluster = forms.ModelChoiceField(
        queryset=Cluster.objects.none(), to_field_name="name", required=False, label="Cluster",
        empty_label="Any cluster",
        help_text="Any cluster: Camp runs it where it starts soonest. Name one for a data volume "
                  "or a checkpoint volume.")
    cluster_set = forms.ModelMultipleChoiceField(
        queryset=Cluster.objects.none(), to_field_name="name", required=False,
        label="Only these clusters", widget=forms.CheckboxSelectMultiple,
        help_text="With Any cluster: none ticked means all of them.")
    cluster_labels = forms.CharField(
        required=False, max_length=500, label="Only clusters labelled",
        help_text="With Any cluster: e.g. region=eu-west (all must match); empty: any.")
    framework = forms.ChoiceField(choices=TrainingFramework.choices, label="Framework")
    workers = forms.IntegerField(min_value=1, max_value=128, initial=2, label="Workers",
                                 help_text="Each worker gets the preset (or custom shape) once.")
    command = forms.CharField(
        required=False, max_length=4096, label="Command",
        help_text="As in a shell, e.g. torchrun train.py --epochs 10"
    )
    checkpoint_dir = forms.CharField(required=False, max_length=255, initial="/checkpoints",
                                     label="Checkpoint directory",
                                     help_text="Where the job writes checkpoints; it resumes from the "
                                               "latest after a preemption.")
    checkpoint_volume_gib = forms.IntegerField(min_value=0, initial=0, label="Checkpoint volume (GiB)",
                                               help_text="0: no volume of its own.")
    data_volume = forms.CharField(required=False, max_length=253, label="Data volume",
                                  help_text="An existing PVC, mounted read-only at /data.")
    log_dir = forms.CharField(required=False, max_length=255, label="TensorBoard log directory")
    max_runtime_seconds = forms.IntegerField(min_value=60, required=False, label="Time limit (seconds)",
                                             help_text="Stopped after this long; empty: no limit.")
    retry_limit = forms.IntegerField(min_value=0, max_value=10, initial=0, label="Retries on failure")
    priority_class = forms.ChoiceField(choices=PriorityClass.choices, initial="normal", label="Priority")
    preemptible = forms.BooleanField(required=False, initial=True,
                                     label="May be preempted (lets it borrow idle GPUs beyond the "
                                           "project's guarantee)")
    duration_seconds = forms.IntegerField(
        min_value=1, required=False, label="Expected run time (seconds)",
        help_text="Simulated clusters run it this long; it also feeds start estimates."
    )
    field_order = ["project", "cluster", "cluster_set", "cluster_labels", "name", "framework", "profile",
                   "workers", "image", "image_reference", "command"]

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, user=user, variant="training", **kwargs)
        fields: Any = self.fields
        fields["image"].empty_label = "Choose an image"
        fields["cluster_set"].queryset = fields["cluster"].queryset
        labels = sorted({f"{k}={v}" for c in fields["cluster"].queryset for k, v in (c.labels or {}).items()})
        if labels:
            fields["cluster_labels"].help_text += f" Labels of your clusters: {', '.join(labels)}."
        self.initial.setdefault("name", _default_name("train"))
        # The default image follows the default framework (issue 32 item 4: PaddlePaddle was
        # preselected beside PyTorch DDP): the first image built for it, else the first image.
        self.initial.setdefault("framework", TrainingFramework.PYTORCH)
        images = fields["image"].queryset
        wanted = IMAGE_FRAMEWORK.get(str(self.initial["framework"]))
        first_image = (images.filter(framework=wanted).first() if wanted else None) or images.first()
        if first_image is not None:
            self.initial.setdefault("image", first_image.pk)
        _default_preset(self, user, slice_first=False, preemptible=bool(fields["preemptible"].initial),
                        copies=int(fields["workers"].initial), any_cluster=True)

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data.get("command") or "")
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split this command: {exc}") from exc

    def clean_cluster_labels(self) -> dict[str, str]:
        return parse_labels(self.cleaned_data.get("cluster_labels") or "")

    def clean(self) -> dict[str, Any]:
        """``cluster`` and the labels → ``training_submit``'s ``cluster`` / ``cluster_choice``."""
        data = super().clean() or {}
        labels = data.pop("cluster_labels", None) or {}
        names = sorted(c.name for c in data.pop("cluster_set", None) or [])
        choice: dict[str, Any] = {**({"clusters": names} if names else {}),
                                  **({"labels": labels} if labels else {})}
        if choice and data.get("cluster") is not None:
            for name, given in (("cluster_set", names), ("cluster_labels", labels)):
                if given:
                    self.add_error(name, "This chooses among clusters: pick Any cluster to use it.")
        data["cluster_choice"] = choice if data.get("cluster") is None else {}
        return data

    # The service names the choice's fields as the API does; here they are these three.
    SERVICE_FIELDS = {"cluster_choice": "cluster", "cluster_choice.clusters": "cluster_set",
                      "cluster_choice.labels": "cluster_labels"}

    def service_errors(self, exc: ValidationError) -> ValidationError:
        if not hasattr(exc, "error_dict"):
            return exc
        return ValidationError({self.SERVICE_FIELDS.get(k, k): v for k, v in exc.message_dict.items()})


class ServiceForm(_WorkloadForm):
    """Launch a model service: a preset per replica (a slice of a named card by default), an
    inference server image, what to serve and how far it may scale; the server's port, health
    path, arguments and the autoscaler's finer settings fold into Advanced."""

    basic = ("project", "cluster", "name", "image", "model_source", "min_replicas", "max_replicas",
             "autoscale_target")
    model_source_kind = forms.ChoiceField(choices=ModelSourceKind.choices, initial=ModelSourceKind.URI,
                                          label="Where the model comes from")
    model_source = forms.CharField(
        max_length=500, required=False, label="Model",
        help_text="e.g. hf://Qwen/Qwen2.5-7B-Instruct; a path in the image, or <volume>:<path> "
                  "(see Advanced).")
    min_replicas = forms.IntegerField(min_value=0, max_value=64, initial=1, label="Fewest replicas",
                                      help_text="0 lets it scale to zero when idle (Advanced).")
    max_replicas = forms.IntegerField(min_value=0, max_value=64, initial=2, label="Most replicas",
                                      help_text="The autoscaler stays within these bounds.")
    autoscale_metric = forms.ChoiceField(choices=AutoscaleMetric.choices, initial=AutoscaleMetric.CONCURRENCY,
                                         label="Scale on")
    autoscale_target = forms.FloatField(min_value=0.01, initial=8.0, label="Target per replica",
                                        help_text="Concurrent requests per replica (or what "
                                                  "\"Scale on\" says under Advanced).")
    port = forms.IntegerField(min_value=1, max_value=65535, initial=8000, label="Server port")
    health_path = forms.CharField(max_length=200, initial="/health", label="Health path",
                                  help_text="Readiness probe; /v2/health/ready for Triton.")
    args = forms.CharField(required=False, max_length=4096, label="Server arguments",
                           help_text="As in a shell, e.g. --max-model-len 8192")
    scale_down_delay_seconds = forms.IntegerField(
        min_value=0, initial=300, label="Scale-down delay (seconds)",
        help_text="Scale up at once; scale down only to the highest need of this window.")
    scale_to_zero_seconds = forms.IntegerField(
        min_value=60, required=False, label="Scale to zero after idle (seconds)",
        help_text="Empty: never.")
    priority_class = forms.ChoiceField(
        choices=PriorityClass.choices, initial=PriorityClass.INFERENCE, label="Priority",
        help_text="Inference: never preempted, may preempt batch training, within the project's "
                  "guarantee.")
    preemptible = forms.BooleanField(required=False, label="May be preempted (best-effort services)")
    field_order = ["project", "cluster", "name", "profile", "image", "model_source", "min_replicas",
                   "max_replicas", "autoscale_target", "image_reference", "model_source_kind"]

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, user=user, variant="inference", **kwargs)
        fields: Any = self.fields
        fields["name"].max_length = 24
        fields["name"].widget.attrs["maxlength"] = "24"
        fields["name"].help_text = "Lowercase letters, digits and '-'; at most 24."
        fields["image"].empty_label = "Choose an inference server"
        # Custom shape defaults: a slice of one card (20 GiB, 30 % of its compute).
        for name, value in (("gpu_memory_mib", 20480), ("gpu_cores_percent", 30), ("ram_mib", 16384)):
            fields[name].initial = value
        self.initial.setdefault("name", _default_name("svc"))
        first_image = fields["image"].queryset.first()
        if first_image is not None:
            self.initial.setdefault("image", first_image.pk)
        _default_preset(self, user, slice_first=True, preemptible=bool(fields["preemptible"].initial),
                        copies=int(fields["min_replicas"].initial))

    def clean_args(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data.get("args") or "")
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split these arguments: {exc}") from exc

    def service_fields(self) -> dict[str, Any]:
        """What ``model_service_create`` takes: the preset replaces the custom shape."""
        data = dict(self.cleaned_data)
        if data.get("profile") is not None:
            for name in ("gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive", "cpu_millicores",
                         "ram_mib"):
                data.pop(name, None)
        return data


class ScaleForm(forms.Form):
    """Scale a service: a fixed number of replicas, or new bounds for the autoscaler."""

    replicas = forms.IntegerField(min_value=0, max_value=64, required=False, label="Replicas",
                                  help_text="A fixed count (0 stops the service).")
    min_replicas = forms.IntegerField(min_value=0, max_value=64, required=False, label="Fewest")
    max_replicas = forms.IntegerField(min_value=0, max_value=64, required=False, label="Most")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if all(data.get(n) is None for n in ("replicas", "min_replicas", "max_replicas")):
            raise forms.ValidationError("Give a number of replicas, or the fewest and most.")
        return data


class PresetForm(forms.ModelForm[Profile]):
    """A compute preset, for platform admins (services.profile_create/update audit it)."""

    class Meta:
        model = Profile
        fields = ["name", "display_name", "description", "gpu_model", "gpu_count", "gpu_memory_mib",
                  "gpu_cores_percent", "exclusive", "cpu_millicores", "ram_mib", "home_gib", "image",
                  "tenants", "projects", "enabled"]
        labels = {"display_name": "Title on the card", "gpu_model": "GPU model", "gpu_count": "GPUs",
                  "gpu_memory_mib": "GPU memory per GPU (MiB)",
                  "gpu_cores_percent": "GPU compute per GPU (%)",
                  "exclusive": "Whole cards, not shared", "cpu_millicores": "CPU (millicores)",
                  "ram_mib": "RAM (MiB)", "home_gib": "Home volume (GiB)", "image": "Image for notebooks",
                  "tenants": "Only for these tenants", "projects": "Only for these projects"}
        help_texts = {"name": "A short identifier, e.g. a100-quarter.",
                      "display_name": "What users read, e.g. ¼ A100 · 20 GB.",
                      "gpu_memory_mib": "With the compute share: a slice of one card. 0 and 0: whole cards.",
                      "tenants": "Neither tenants nor projects: offered to everyone."}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields: Any = self.fields
        fields["image"].queryset = Image.objects.filter(scope="platform", enabled=True).exclude(
            variant="training")
        fields["image"].required = False
        from scheduling.models import GpuDevice

        models_ = sorted(set(GpuDevice.objects.values_list("model", flat=True).distinct()))
        self.fields["gpu_model"] = forms.ChoiceField(
            choices=[("", "Any model")] + [(m, m) for m in models_ if "@" not in m],
            required=False, label="GPU model", help_text=Profile._meta.get_field("gpu_model").help_text)


class PolicyForm(forms.ModelForm[WorkspacePolicy]):
    class Meta:
        model = WorkspacePolicy
        fields = ["idle_minutes", "max_lifetime_hours", "warning_minutes", "storage_gib_limit"]


class SshKeyForm(forms.Form):
    name = forms.CharField(required=False, max_length=100, help_text="Defaults to the key's comment.")
    public_key = forms.CharField(
        max_length=20000,
        widget=forms.Textarea(attrs={"rows": 3, "class": "mono",
                                     "placeholder": "ssh-ed25519 AAAA… you@laptop"}),
        help_text="The contents of your .pub file: ssh-ed25519, ecdsa-sha2-*, "
                  "or ssh-rsa of at least 2048 bits.",
    )
