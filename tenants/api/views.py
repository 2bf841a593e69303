"""REST API for tenancy. Thin: look up through ``restrict``, write through services."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import Any

import django_filters
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from camp.filters import CampFilterSet

from .. import services
from ..models import ApiToken, AuditEvent, Membership, Project, Quota, Tenant, User
from ..permissions import CREATE, actor_of, can, restrict
from ..scim.models import ScimToken
from .idempotency import IdempotentCreateMixin
from .serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenSerializer,
    AuditEventSerializer,
    MembershipSerializer,
    MembershipTargetSerializer,
    MembershipUpdateSerializer,
    ProjectSerializer,
    QuotaSerializer,
    QuotaUpdateSerializer,
    ScimTokenCreatedSerializer,
    ScimTokenSerializer,
    TenantSerializer,
    UserSerializer,
)

IDEMPOTENCY_PARAM = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="Retrying a create with the same key returns the first result and creates nothing.",
)


class ReadOnlyTokenPermission(permissions.BasePermission):
    """A read-only API token may only read (also enforced inside ``permissions.can``)."""

    message = "This API token is read-only."

    def has_permission(self, request: Request, view: Any) -> bool:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return token is None or not token.read_only or request.method in permissions.SAFE_METHODS


class CampViewSet(viewsets.GenericViewSet):  # type: ignore[type-arg]
    permission_classes = [permissions.IsAuthenticated, ReadOnlyTokenPermission]
    model: type[Any]

    def get_queryset(self) -> QuerySet[Any]:
        return restrict(self.model.objects.all(), self.request.user)

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The list's filters (django-filter's FilterSet, search, ordering) narrow lists only.
        One object (its detail, an update, an action on it) is found by its id among what the
        caller may see (``get_queryset``); DRF's ``get_object`` filters it too, which built a
        FilterSet on every detail request (~7 % of one job's CPU, issue 35) for nothing a
        client asks of a detail."""
        if getattr(self, "detail", False):
            return queryset
        return super().filter_queryset(queryset)

    def require_before_parsing(self, action: str, obj: Any) -> None:
        """403 before the body's names are resolved, when the caller may not take ``action``
        on ``obj`` whatever the body says: otherwise "does not exist" (400) for a name and
        403 for another tell a caller without the right which names exist (issue 30, 8)."""
        if not can(self.request.user, action, obj):
            raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class TenantViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                    mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                    CampViewSet):
    """Tenants. Everyone sees the tenants they belong to; platform admins manage them."""

    model = Tenant
    serializer_class = TenantSerializer
    filterset_fields = ["name"]
    search_fields = ["name", "display_name"]
    ordering_fields = ["name", "created_at"]

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.tenant_create(
            actor=actor_of(self.request), **serializer.validated_data
        )

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = services.tenant_update(
            actor=actor_of(self.request), tenant=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: Tenant) -> None:
        services.tenant_delete(actor=actor_of(self.request), tenant=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ProjectViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                     CampViewSet):
    """Projects. Tenant owners create and delete them; project admins edit theirs."""

    model = Project
    serializer_class = ProjectSerializer
    filterset_fields = ["tenant", "name"]
    search_fields = ["name", "display_name"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("tenant")

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.project_create(
            actor=actor_of(self.request), **serializer.validated_data
        )

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = services.project_update(
            actor=actor_of(self.request), project=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: Project) -> None:
        services.project_delete(actor=actor_of(self.request), project=instance)


class MembershipFilter(CampFilterSet):
    user = django_filters.CharFilter(field_name="user__username")

    class Meta:
        model = Membership
        fields = ["tenant", "project", "role", "user"]


@extend_schema_view(
    create=extend_schema(parameters=[IDEMPOTENCY_PARAM]),
    update=extend_schema(request=MembershipUpdateSerializer),
    partial_update=extend_schema(request=MembershipUpdateSerializer),
)
class MembershipViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                        CampViewSet):
    """Roles of users in tenants (tenant owner) and projects (project admin / member)."""

    model = Membership
    serializer_class = MembershipSerializer
    filterset_class = MembershipFilter
    ordering_fields = ["created_at", "role"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("user", "tenant", "project")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # Where and what role first (403 if the caller may not grant it there), the user
        # only then: a username is looked up only for someone who may invite, and unknown
        # and not-invitable usernames answer alike (MembershipSerializer.user).
        target = MembershipTargetSerializer(data=request.data, context=self.get_serializer_context())
        target.is_valid(raise_exception=True)
        self.require_before_parsing(CREATE, Membership(**target.validated_data))
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.membership_create(
            actor=actor_of(self.request), **serializer.validated_data
        )

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        membership = self.get_object()
        data = MembershipUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_update(
            actor=actor_of(request), membership=membership, role=data.validated_data["role"]
        )
        return Response(MembershipSerializer(membership, context={"request": request}).data)

    def perform_destroy(self, instance: Membership) -> None:
        services.membership_delete(actor=actor_of(self.request), membership=instance)


@extend_schema_view(
    create=extend_schema(parameters=[IDEMPOTENCY_PARAM]),
    update=extend_schema(request=QuotaUpdateSerializer),
    partial_update=extend_schema(request=QuotaUpdateSerializer),
)
class QuotaViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                   mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                   CampViewSet):
    """Guaranteed and limit per resource for the cluster, a tenant or a project.

    Creating a quota for a scope that already has one replaces its values.
    """

    model = Quota
    serializer_class = QuotaSerializer
    filterset_fields = ["scope", "cluster", "tenant", "project"]
    ordering_fields = ["scope", "updated_at"]

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        target = {k: data.pop(k, None) for k in ("scope", "cluster", "tenant", "project")}
        serializer.instance = services.quota_set(actor=actor_of(self.request), values=data, **target)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        quota = self.get_object()
        data = QuotaUpdateSerializer(quota, data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        quota = services.quota_set(
            actor=actor_of(request), scope=quota.scope, cluster=quota.cluster, tenant=quota.tenant,
            project=quota.project, values=dict(data.validated_data),
        )
        return Response(QuotaSerializer(quota, context={"request": request}).data)

    def perform_destroy(self, instance: Quota) -> None:
        services.quota_delete(actor=actor_of(self.request), quota=instance)


@extend_schema_view(
    create=extend_schema(parameters=[IDEMPOTENCY_PARAM], responses=ApiTokenCreatedSerializer),
)
class ApiTokenViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      mixins.CreateModelMixin, mixins.DestroyModelMixin, CampViewSet):
    """Your API tokens. The secret is returned once, at creation; DELETE revokes."""

    model = ApiToken
    serializer_class = ApiTokenSerializer
    # The secret is shown once and never stored, not even for an idempotent replay.
    idempotency_redact = ("token",)
    filterset_fields = ["project", "read_only"]
    ordering_fields = ["created_at", "last_used_at"]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        token, plaintext = services.token_create(actor=actor_of(self.request), **serializer.validated_data)
        serializer.instance = token
        token.token = plaintext  # type: ignore[attr-defined]

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return ApiTokenCreatedSerializer if self.action == "create" else ApiTokenSerializer

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.token_revoke(actor=actor_of(request), token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class UserViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                  mixins.CreateModelMixin, mixins.UpdateModelMixin, CampViewSet):
    """Accounts. Platform admins manage them; others see themselves and co-members."""

    model = User
    serializer_class = UserSerializer
    filterset_fields = ["username", "is_active", "is_platform_admin"]
    search_fields = ["username", "email", "first_name", "last_name"]
    ordering_fields = ["username", "date_joined"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().order_by("username")

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        data.pop("is_active", None)
        serializer.instance = services.user_create(
            actor=actor_of(self.request), password=data.pop("password", None), **data
        )

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = services.user_update(
            actor=actor_of(self.request), user=serializer.instance, **serializer.validated_data
        )

    @action(detail=False, methods=["get"])
    def me(self, request: Request) -> Response:
        """The authenticated user."""
        return Response(self.get_serializer(request.user).data)


class AuditEventFilter(CampFilterSet):
    action = django_filters.CharFilter(lookup_expr="startswith")
    actor = django_filters.CharFilter(field_name="actor_username")
    since = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    until = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["tenant", "project", "action", "actor", "target_type", "target_id", "request_id"]


CSV_COLUMNS = [
    "id", "created_at", "actor_username", "tenant_id", "project_id", "action", "target_type",
    "target_id", "target_repr", "before", "after", "request_id", "client_ip", "hash",
]


def csv_safe(value: str) -> str:
    """Neutralise spreadsheet formulas in a CSV cell (CSV injection, OWASP)."""
    if value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


class _Echo:
    def write(self, value: str) -> str:
        return value


def audit_csv_rows(queryset: QuerySet[AuditEvent]) -> Iterator[str]:
    import json

    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for event in queryset.iterator():
        row = []
        for col in CSV_COLUMNS:
            value = getattr(event, col)
            if col in ("before", "after"):
                value = "" if value is None else json.dumps(value, sort_keys=True)
            elif col == "created_at":
                value = value.isoformat()
            row.append(csv_safe("" if value is None else str(value)))
        yield writer.writerow(row)


def audit_csv_response(queryset: QuerySet[AuditEvent]) -> StreamingHttpResponse:
    response = StreamingHttpResponse(audit_csv_rows(queryset), content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="camp-audit.csv"'
    return response


class AuditEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, CampViewSet):
    """The audit log: tenant owners see their tenant's events, platform admins all."""

    model = AuditEvent
    serializer_class = AuditEventSerializer
    cursor_pages = True  # camp.pagination: ?cursor= documented in the schema
    filterset_class = AuditEventFilter
    search_fields = ["target_repr", "actor_username"]
    ordering_fields = ["id", "created_at", "action"]

    @extend_schema(responses={(200, "text/csv"): OpenApiTypes.STR})
    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> StreamingHttpResponse:
        """The filtered events as CSV."""
        queryset = self.filter_queryset(self.get_queryset()).order_by("id")
        return audit_csv_response(queryset)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ScimTokenViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       mixins.CreateModelMixin, mixins.DestroyModelMixin, CampViewSet):
    """SCIM provisioning tokens, one identity provider each (platform admins only).

    POST creates one (and the provider, bound to how its people sign in, the first time);
    the secret is returned once and only its SHA-256 is kept. DELETE revokes."""

    model = ScimToken
    serializer_class = ScimTokenSerializer
    idempotency_redact = ("token",)
    filterset_fields = ["provider__name"]
    ordering_fields = ["created_at", "last_used_at"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("provider").order_by("-created_at")

    def get_serializer_class(self) -> type[serializers.BaseSerializer[Any]]:
        return ScimTokenCreatedSerializer if self.action == "create" else ScimTokenSerializer

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        from ..scim.models import ScimProvider

        self.require_before_parsing(CREATE, ScimToken(provider=ScimProvider()))
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        from django.db import transaction

        from ..scim.services import scim_provider_for, scim_token_create

        data = serializer.validated_data.get("provider", {})
        with transaction.atomic():
            provider = scim_provider_for(data.get("name", ""), data.get("sso_source"),
                                         data.get("sso_issuer"))
            token, plaintext = scim_token_create(actor=actor_of(self.request), provider=provider)
        serializer.instance = token
        token.token = plaintext  # type: ignore[attr-defined]

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        from ..permissions import DELETE
        from ..scim.services import scim_token_revoke

        token = self.get_object()
        self.require_before_parsing(DELETE, token)
        scim_token_revoke(actor=actor_of(request), token=token)
        return Response(status=status.HTTP_204_NO_CONTENT)
