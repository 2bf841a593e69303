"""Serializers: shape and type checks only; rules live in services."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from camp.serializers import FastRead

from .. import extensions
from ..extensions import cluster_model
from ..models import (
    RESOURCES,
    ApiToken,
    AuditEvent,
    Membership,
    Project,
    Quota,
    QuotaScope,
    Role,
    Tenant,
    User,
)
from ..validators import NOT_INVITABLE


class VisiblePKField(serializers.PrimaryKeyRelatedField):  # type: ignore[type-arg]
    """A reference that resolves only to rows the requesting user may see.

    A foreign tenant's id then reads as "does not exist" (400), never as a 403
    that would confirm the object exists.
    """

    def get_queryset(self) -> Any:
        from ..permissions import restrict

        request = self.context.get("request")
        queryset = super().get_queryset()
        assert queryset is not None
        return restrict(queryset, request.user if request else None)

    def to_internal_value(self, data: Any) -> Any:
        return resolved_once(self, data, super().to_internal_value)


def resolved_once(field: serializers.RelatedField[Any, Any, Any], data: Any,
                  resolve: Any) -> Any:
    """``resolve(data)``, remembered in the serializer context for the rest of the request:
    the items of a bulk submit name the same project and cluster, and each lookup was a
    query per item. Only successes are kept (a bad reference is an error every time)."""
    context = field.context
    if not isinstance(context, dict) or not isinstance(data, str | int):
        return resolve(data)
    cache = context.setdefault("resolved_references", {})
    key = (type(field.parent), field.field_name, str(data))  # e.g. (JobSerializer, "project", "7")
    if key not in cache:
        cache[key] = resolve(data)
    return cache[key]


class TenantSerializer(serializers.ModelSerializer[Tenant]):
    class Meta:
        model = Tenant
        fields = ["id", "name", "display_name", "description", "created_at"]
        read_only_fields = ["id", "created_at"]


class ProjectSerializer(serializers.ModelSerializer[Project]):
    tenant = VisiblePKField(queryset=Tenant.objects.all())
    tenant_name = serializers.CharField(source="tenant.name", read_only=True)

    class Meta:
        model = Project
        fields = ["id", "tenant", "tenant_name", "name", "display_name", "description", "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is enforced by the service (as a field error) and the database.
        validators: list[Any] = []


class UserBriefSerializer(serializers.ModelSerializer[User]):
    class Meta:
        model = User
        fields = ["id", "username", "first_name", "last_name", "email"]
        read_only_fields = fields




class MembershipTargetSerializer(serializers.Serializer[Any]):
    """Where a new role would be granted, and which: read before the user is looked up."""

    tenant = VisiblePKField(queryset=Tenant.objects.all())
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipSerializer(serializers.ModelSerializer[Membership]):
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=User.objects.filter(is_active=True),
        error_messages={"does_not_exist": NOT_INVITABLE, "invalid": NOT_INVITABLE})
    tenant = VisiblePKField(queryset=Tenant.objects.all())
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True
    )
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "user", "tenant", "project", "role", "created_at"]
        read_only_fields = ["id", "created_at"]
        validators: list[Any] = []


class MembershipUpdateSerializer(serializers.Serializer[Any]):
    role = serializers.ChoiceField(choices=Role.choices)


_amount_fields: list[str] = [*(f"{r}_{k}" for r in RESOURCES for k in ("guaranteed", "limit")),
                              "gpus_guaranteed_all_clusters", "gpus_limit_all_clusters",
                              "gpu_memory_mib_limits_all_clusters"]


class ClassLimitSerializer(serializers.Serializer[Any]):
    model_class = serializers.CharField(max_length=100, help_text="GPU model class, e.g. A100-80G")
    gpu_memory_mib_limit = serializers.IntegerField(min_value=0, help_text="MiB at most on all clusters")


class ClassLimitsField(serializers.ListField):
    """The quota's ``{class: MiB}`` map as a list of ``{model_class, gpu_memory_mib_limit}``
    (one per class; the service checks the classes against the inventory)."""

    child = ClassLimitSerializer()

    def to_representation(self, data: Any) -> list[dict[str, Any]]:  # type: ignore[override]
        return [{"model_class": k, "gpu_memory_mib_limit": v} for k, v in sorted((data or {}).items())]

    def to_internal_value(self, data: Any) -> dict[str, int]:  # type: ignore[override]
        items = super().to_internal_value(data)
        out: dict[str, int] = {}
        for item in items:
            if item["model_class"] in out:
                raise serializers.ValidationError(f"{item['model_class']} is given twice.")
            out[item["model_class"]] = item["gpu_memory_mib_limit"]
        return out


class QuotaSerializer(serializers.ModelSerializer[Quota]):
    gpu_memory_mib_limits_all_clusters = ClassLimitsField(
        required=False, help_text="GPU memory limits per GPU model class on all clusters together")
    scope = serializers.ChoiceField(choices=QuotaScope.choices)
    cluster = VisiblePKField(
        queryset=cluster_model()._default_manager.all(), required=False, allow_null=True
    )
    tenant = VisiblePKField(queryset=Tenant.objects.all(), required=False, allow_null=True
    )
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True
    )

    guarantee_warnings = serializers.SerializerMethodField(
        help_text="GPU guarantees the enabled clusters cannot honour that concern this quota's "
                  "tenant (or, for the cluster quota, any tenant), in sentences: a warning, not a "
                  "refusal — the guarantee is saved as asked (capacity may be on its way).")

    class Meta:
        model = Quota
        fields = ["id", "scope", "cluster", "tenant", "project", *_amount_fields,
                  "guarantee_warnings", "updated_at"]
        read_only_fields = ["id", "updated_at"]
        validators: list[Any] = []

    def get_guarantee_warnings(self, quota: Quota) -> list[str]:
        # Once per tenant per answer (a list of quotas reads them once, not once per row).
        context: dict[str, Any] = self.context  # type: ignore[assignment]  # DRF's is a dict
        memo = context.setdefault("_guarantee_warnings", {})
        if quota.tenant_id not in memo:
            memo[quota.tenant_id] = extensions.guarantee_warnings(quota.tenant_id)
        return list(memo[quota.tenant_id])


class QuotaUpdateSerializer(serializers.ModelSerializer[Quota]):
    gpu_memory_mib_limits_all_clusters = ClassLimitsField(
        required=False, help_text="GPU memory limits per GPU model class on all clusters together")

    class Meta:
        model = Quota
        fields = _amount_fields


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    project = VisiblePKField(queryset=Project.objects.all(), required=False, allow_null=True
    )
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = [
            "id", "name", "prefix", "project", "read_only", "expires_at",
            "last_used_at", "revoked_at", "created_at", "active",
        ]
        read_only_fields = ["id", "prefix", "last_used_at", "revoked_at", "created_at", "active"]

    def get_active(self, obj: ApiToken) -> bool:
        from django.utils import timezone

        return obj.revoked_at is None and (obj.expires_at is None or obj.expires_at > timezone.now())


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class UserSerializer(serializers.ModelSerializer[User]):
    password = serializers.CharField(
        write_only=True, required=False, allow_blank=True, style={"input_type": "password"}
    )

    class Meta:
        model = User
        fields = [
            "id", "username", "email", "first_name", "last_name", "is_active",
            "is_platform_admin", "password", "date_joined", "last_login",
        ]
        read_only_fields = ["id", "date_joined", "last_login"]
        extra_kwargs: dict[str, dict[str, Any]] = {"username": {"validators": []}}


class AuditEventSerializer(FastRead, serializers.ModelSerializer[AuditEvent]):
    class Meta:
        model = AuditEvent
        fields = [
            "id", "created_at", "actor", "actor_username", "tenant", "project", "action",
            "target_type", "target_id", "target_repr", "before", "after", "request_id",
            "client_ip", "prev_hash", "hash", "chain_seq",
        ]
        read_only_fields = fields


class ScimTokenSerializer(serializers.Serializer[Any]):
    """A SCIM provisioning credential of one identity provider (never its secret)."""

    id = serializers.IntegerField(read_only=True)
    provider = serializers.SlugField(max_length=63, source="provider.name",
                                     help_text="The identity provider: okta, entra, onelogin…")
    sso_source = serializers.ChoiceField(
        choices=["oidc", "saml"], source="provider.sso_source", required=False,
        help_text="How the provisioned people sign in (needed for a new provider).")
    sso_issuer = serializers.CharField(
        max_length=255, source="provider.sso_issuer", required=False,
        help_text="The OIDC issuer or SAML IdP entity id they sign in with (new provider).")
    prefix = serializers.CharField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)  # null: never used
    revoked_at = serializers.DateTimeField(read_only=True, allow_null=True)  # null: not revoked
    active = serializers.SerializerMethodField()

    def get_active(self, obj: Any) -> bool:
        return obj.revoked_at is None


class ScimTokenCreatedSerializer(ScimTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now.")
