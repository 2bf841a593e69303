"""Console forms: input shape only; services apply the rules and name bad fields."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms

from registry.models import Image
from scheduling.models import Cluster, PriorityClass
from tenants.models import Project
from tenants.permissions import restrict

from .models import EnvKind, Profile, TrainingFramework, WorkspacePolicy


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


class _WorkloadForm(forms.Form):
    project = forms.ModelChoiceField(queryset=Project.objects.none())
    cluster = forms.ModelChoiceField(queryset=Cluster.objects.none(), to_field_name="name")
    name = forms.CharField(max_length=40, help_text="Lowercase letters, digits and '-'.")
    image = forms.ModelChoiceField(
        queryset=Image.objects.none(),
        required=False,
        help_text="From the catalog; or give a reference below.",
    )
    image_reference = forms.CharField(max_length=512, required=False)
    gpu_count = forms.IntegerField(min_value=0, max_value=64, initial=1)
    gpu_memory_mib = forms.IntegerField(
        min_value=0, initial=0, label="GPU memory per GPU (MiB)", help_text="0 with 0% compute: whole cards."
    )
    gpu_cores_percent = forms.IntegerField(
        min_value=0, max_value=100, initial=0, label="GPU compute per GPU (%)"
    )
    exclusive = forms.BooleanField(required=False)
    cpu_millicores = forms.IntegerField(min_value=100, initial=2000, label="CPU (millicores)")
    ram_mib = forms.IntegerField(min_value=128, initial=8192, label="RAM (MiB)")
    env = forms.CharField(
        required=False,
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

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env", ""))


class EnvironmentForm(_WorkloadForm):
    kind = forms.ChoiceField(choices=EnvKind.choices)
    profile = forms.ModelChoiceField(
        queryset=Profile.objects.none(),
        required=False,
        help_text="A profile sets the shape (and image) for you.",
    )
    home_gib = forms.IntegerField(min_value=1, max_value=10240, initial=10, label="Home volume (GiB)")
    ssh_public_keys = forms.CharField(
        required=False,
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
        fields["profile"].queryset = restrict(Profile.objects.filter(enabled=True), user)


class TrainingForm(_WorkloadForm):
    framework = forms.ChoiceField(choices=TrainingFramework.choices)
    workers = forms.IntegerField(min_value=1, max_value=128, initial=2)
    command = forms.CharField(
        required=False, max_length=4096, help_text="As in a shell, e.g. torchrun train.py --epochs 10"
    )
    checkpoint_dir = forms.CharField(required=False, max_length=255, initial="/checkpoints")
    checkpoint_volume_gib = forms.IntegerField(min_value=0, initial=0, label="Checkpoint volume (GiB)")
    data_volume = forms.CharField(required=False, max_length=253, help_text="An existing PVC, at /data.")
    log_dir = forms.CharField(required=False, max_length=255, help_text="TensorBoard log directory.")
    max_runtime_seconds = forms.IntegerField(min_value=60, required=False)
    retry_limit = forms.IntegerField(min_value=0, max_value=10, initial=0)
    priority_class = forms.ChoiceField(choices=PriorityClass.choices, initial="normal")
    preemptible = forms.BooleanField(required=False, initial=True)
    duration_seconds = forms.IntegerField(
        min_value=1, required=False, help_text="Simulated clusters: how long it runs."
    )
    field_order = ["project", "cluster", "name", "framework", "image", "image_reference", "workers"]

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, user=user, variant="training", **kwargs)

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data.get("command") or "")
        except ValueError as exc:
            raise forms.ValidationError(f"Cannot split this command: {exc}") from exc


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
