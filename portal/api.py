"""/api/v1/prices/ and /api/v1/usage/: showback's prices (platform admins set them) and a
tenant's usage report with its cost, the same figures as the usage page and its CSV
(``selectors.showback``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from tenants.api.views import CampViewSet
from tenants.models import AuditEvent, Tenant
from tenants.permissions import actor_of, can, restrict

from . import selectors, services
from .models import Price, PriceKind


class PriceSerializer(serializers.ModelSerializer[Price]):
    kind = serializers.ChoiceField(choices=PriceKind.choices)
    per_hour = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=0,
                                        help_text="The price of one hour, in `currency`.")
    currency = serializers.SerializerMethodField()

    class Meta:
        model = Price
        fields = ["id", "kind", "gpu_model", "per_hour", "currency", "updated_at"]
        read_only_fields = ["id", "updated_at"]
        validators: list[Any] = []

    def get_currency(self, price: Price) -> str:
        return str(settings.SHOWBACK_CURRENCY)


class PriceViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                   mixins.DestroyModelMixin, CampViewSet):
    """What an hour of each resource costs in showback: a GPU-hour per GPU model, a CPU
    core-hour, a RAM GiB-hour. Everyone in a tenant reads them; platform admins set them
    (POST sets or replaces the price of that kind and model) and remove them."""

    model = Price
    serializer_class = PriceSerializer
    filterset_fields = ["kind", "gpu_model"]
    ordering_fields = ["kind", "gpu_model"]

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = PriceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        price = services.price_set(actor=actor_of(request), **{
            k: body.validated_data.get(k, "") for k in ("kind", "gpu_model", "per_hour")})
        return Response(PriceSerializer(price).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: Price) -> None:
        services.price_delete(actor=actor_of(self.request), price=instance)


class UsageRowSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    project = serializers.CharField()
    user = serializers.CharField(help_text='The owner with by=user; "" with by=project.')
    cluster = serializers.CharField()
    gpu_model = serializers.CharField(help_text='"" for what held no GPU.')
    gpu_hours = serializers.FloatField()
    gpu_memory_gib_hours = serializers.FloatField()
    cpu_core_hours = serializers.FloatField()
    ram_gib_hours = serializers.FloatField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True,
                                    help_text="null: no price covers any of it.")


class UsageSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    since = serializers.DateField()
    until = serializers.DateField(help_text="The period's last day (included).")
    currency = serializers.CharField()
    gpu_hours = serializers.FloatField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=2, allow_null=True)
    unpriced = serializers.ListField(child=serializers.CharField(),
                                     help_text="Resources used in the period that have no price.")
    rows = UsageRowSerializer(many=True)


class UsageViewSet(CampViewSet):
    """A tenant's usage report (showback), for its owners and platform admins: hours per
    project or user, split by cluster and GPU model, with their cost at today's prices."""

    model = Tenant

    @extend_schema(parameters=[
        OpenApiParameter("tenant", str, required=True, description="The tenant's name."),
        OpenApiParameter("since", str, description="First day, YYYY-MM-DD (default: 30 days ago)."),
        OpenApiParameter("until", str, description="Last day, YYYY-MM-DD (default: today)."),
        OpenApiParameter("by", str, enum=["project", "user"],
                         description="Rows per project (default) or user."),
    ], responses=UsageSerializer)
    def list(self, request: Request) -> Response:
        import datetime as dt

        from .views import _period

        name = request.query_params.get("tenant", "")
        if not name:
            raise ValidationError({"tenant": ["Name the tenant."]})
        tenant = get_object_or_404(restrict(Tenant.objects.all(), request.user), name=name)
        if not can(request.user, "view", AuditEvent(tenant=tenant)):
            raise PermissionDenied("Usage reports are for tenant owners.")
        by = request.query_params.get("by", "project")
        if by not in ("project", "user"):
            raise ValidationError({"by": ["Group by project or user."]})
        since, until, errors = _period(request)
        if errors:
            raise ValidationError({k: [v] for k, v in errors.items()})
        report = selectors.showback(tenants=[tenant.pk], since=since, until=until, by=by)
        return Response(UsageSerializer({
            "tenant": tenant.name, "since": since.date(), "until": (until - dt.timedelta(days=1)).date(),
            "currency": report.currency, "gpu_hours": report.gpu_hours, "cost": report.cost,
            "unpriced": report.unpriced, "rows": report.rows}).data)
