"""Registry API serializers: shape only; rules live in services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from tenants.api.serializers import VisiblePKField
from tenants.models import Project, Tenant

from ..models import PLATFORMS, ExternalRegistry, Framework, Image, Variant


class RegistrySerializer(serializers.ModelSerializer[ExternalRegistry]):
    """The password is write-only: encrypted at rest and never returned."""

    tenant = VisiblePKField(queryset=Tenant.objects.all(), required=False, allow_null=True)
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True)
    password = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=4096,
                                     style={"input_type": "password"})
    has_credentials = serializers.BooleanField(read_only=True)
    scope = serializers.CharField(read_only=True, help_text="platform, tenant or project (from the owner)")

    class Meta:
        model = ExternalRegistry
        fields = ["id", "scope", "tenant", "project", "name", "server", "username", "password",
                  "has_credentials", "created_at", "updated_at"]
        read_only_fields = ["id", "scope", "has_credentials", "created_at", "updated_at"]
        validators: list[Any] = []


class ImageSerializer(serializers.ModelSerializer[Image]):
    scope = serializers.CharField(read_only=True, help_text="platform, tenant or project (from the owner)")
    tenant = VisiblePKField(queryset=Tenant.objects.all(), required=False, allow_null=True)
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True)
    registry = VisiblePKField(queryset=ExternalRegistry.objects.all(), required=False, allow_null=True)
    variant = serializers.ChoiceField(choices=Variant.choices)
    framework = serializers.ChoiceField(choices=Framework.choices, default=Framework.OTHER)
    architectures = serializers.ListField(
        child=serializers.ChoiceField(choices=PLATFORMS), required=False,
        help_text='Platforms the image is built for (default ["linux/amd64"]; at least one when '
                  "given); a job using it only goes to nodes of one of them. Read as [] for an "
                  "image catalogued before platforms were recorded: no restriction.")
    command = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text='The container command, e.g. ["start-notebook.py"]; empty: Camp starts the variant '
                  "itself (JupyterLab: jupyter lab with the base URL, port and root dir).")

    def validate_architectures(self, value: list[str]) -> list[str]:
        # Not ``min_length=1`` on the field: the schema would then say every image read has
        # one, and images catalogued before platforms were recorded read as [] (no restriction).
        if not value:
            raise serializers.ValidationError("Name at least one platform, e.g. [\"linux/amd64\"].")
        return value

    class Meta:
        model = Image
        fields = ["id", "scope", "tenant", "project", "name", "display_name", "reference", "variant",
                  "framework", "description", "registry", "architectures", "command", "run_as_user",
                  "run_as_group", "home", "enabled", "created_at"]
        read_only_fields = ["id", "scope", "created_at"]
        validators: list[Any] = []
