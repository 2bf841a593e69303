"""Container images: the platform's base images, tenant and project images, and the
external registries they are pulled from (credentials encrypted at rest)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from scheduling.models import slug_validator


class Scope(models.TextChoices):
    PLATFORM = "platform", "Platform"
    TENANT = "tenant", "Tenant"
    PROJECT = "project", "Project"


class Variant(models.TextChoices):
    """What the image serves; dev environments pick an image of their own kind."""

    JUPYTER = "jupyter", "JupyterLab"
    VSCODE = "vscode", "VS Code (code-server)"
    SSH = "ssh", "SSH"
    TRAINING = "training", "Training / batch"
    INFERENCE = "inference", "Inference server"


class Framework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch"
    TENSORFLOW = "tensorflow", "TensorFlow"
    PADDLE = "paddle", "PaddlePaddle"
    OTHER = "other", "Other"


def _scope_constraint(prefix: str) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=(
            Q(scope="platform", tenant__isnull=True, project__isnull=True)
            | Q(scope="tenant", tenant__isnull=False, project__isnull=True)
            | Q(scope="project", tenant__isnull=False, project__isnull=False)
        ),
        name=f"{prefix}_scope_matches_owner",
    )


def _unique_names(prefix: str) -> list[models.UniqueConstraint]:
    """Names are unique per owner: among the platform's, a tenant's, or a project's entries
    (partial indexes, since NULL owners never compare equal)."""
    return [
        models.UniqueConstraint(fields=["name"], condition=Q(scope="platform"),
                                name=f"{prefix}_unique_platform_name"),
        models.UniqueConstraint(fields=["tenant", "name"], condition=Q(scope="tenant"),
                                name=f"{prefix}_unique_tenant_name"),
        models.UniqueConstraint(fields=["project", "name"], condition=Q(scope="project"),
                                name=f"{prefix}_unique_project_name"),
    ]


class ExternalRegistry(models.Model):
    """A registry that needs credentials. They become an imagePullSecret (type
    ``kubernetes.io/dockerconfigjson``) in each project namespace that pulls from it."""

    scope = models.CharField(max_length=10, choices=Scope.choices)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="registries")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="registries")
    name = models.CharField(max_length=63, validators=[slug_validator])
    server = models.CharField(max_length=253,
                              help_text="Registry host, e.g. ghcr.io or registry.example.com:5000")
    username = models.CharField(max_length=255, blank=True)
    # Fernet-encrypted password or access token; write-only, never shown back or logged.
    password_encrypted = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["server", "name"]
        verbose_name_plural = "external registries"
        constraints = [
            _scope_constraint("registry"),
            *_unique_names("registry"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.server})"

    @property
    def has_credentials(self) -> bool:
        return bool(self.password_encrypted)

    @property
    def secret_name(self) -> str:
        return f"camp-registry-{self.pk}"


PLATFORMS = ("linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x")
"""Image platforms Camp knows (OCI ``os/architecture``; Kubernetes' ``kubernetes.io/arch``)."""


def default_architectures() -> list[str]:
    return ["linux/amd64"]


class Image(models.Model):
    """A catalog entry: a validated image reference users can pick."""

    scope = models.CharField(max_length=10, choices=Scope.choices)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, null=True, blank=True,
                               related_name="images")
    project = models.ForeignKey("tenants.Project", on_delete=models.CASCADE, null=True, blank=True,
                                related_name="images")
    name = models.CharField(max_length=63, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    reference = models.CharField(max_length=512,
                                 help_text="e.g. quay.io/jupyter/pytorch-notebook:cuda12-2024-10-07")
    variant = models.CharField(max_length=10, choices=Variant.choices)
    framework = models.CharField(max_length=12, choices=Framework.choices, default=Framework.OTHER)
    description = models.TextField(blank=True)
    registry = models.ForeignKey(ExternalRegistry, on_delete=models.PROTECT, null=True, blank=True,
                                 related_name="images",
                                 help_text="Pull credentials, if the image is private.")
    architectures = models.JSONField(
        default=default_architectures, blank=True,
        help_text='The platforms the image is built for, e.g. ["linux/amd64", "linux/arm64"]: '
                  "a job using it only goes to nodes of one of them. Empty: unknown (no restriction).")
    # How the image starts and runs (issue 28: only docker-stacks images could start; their
    # user could not write a root-owned home volume). Empty/None: Camp's defaults (WORKLOADS.md).
    command = models.JSONField(
        default=list, blank=True,
        help_text='The container command, e.g. ["start-notebook.py"] (Kubernetes expands $(CAMP_BASE_URL), '
                  "$(CAMP_HOME) and $(CAMP_PORT)). Empty: Camp's own start for the variant (JupyterLab: "
                  "jupyter lab with the base URL, port and root dir; training and inference: the image's "
                  "entrypoint).")
    run_as_user = models.PositiveIntegerField(
        null=True, blank=True, help_text="The uid the image's processes run as (docker-stacks: 1000). "
                                         "Empty: the image's own USER.")
    run_as_group = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Its primary gid (docker-stacks: 100); volumes are group-owned by it "
                  "(fsGroup) so the user can write its home.")
    home = models.CharField(
        max_length=255, blank=True,
        help_text="Where the user's home volume is mounted and the working directory (e.g. /home/jovyan). "
                  "Empty: the variant's default.")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["scope", "framework", "name"]
        constraints = [
            _scope_constraint("image"),
            *_unique_names("image"),
        ]

    def __str__(self) -> str:
        return self.display_name or self.name
