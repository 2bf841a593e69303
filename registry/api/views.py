"""Registry REST API: the image catalog and external registries. Thin: look up through
``restrict``, write through services."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins

from tenants.api.idempotency import IdempotentCreateMixin
from tenants.api.views import IDEMPOTENCY_PARAM, CampViewSet
from tenants.permissions import actor_of

from .. import services
from ..models import ExternalRegistry, Image
from .serializers import ImageSerializer, RegistrySerializer

_CRUD = (mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
         mixins.UpdateModelMixin, mixins.DestroyModelMixin)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ImageViewSet(IdempotentCreateMixin, *_CRUD, CampViewSet):  # type: ignore[misc]
    """Images: the platform's base images (admins), tenant images (owners), project images
    (project admins). Everyone reads the ones their projects may use."""

    model = Image
    serializer_class = ImageSerializer
    filterset_fields = ["scope", "tenant", "project", "variant", "framework", "enabled", "name"]
    search_fields = ["name", "display_name", "reference"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("tenant", "project", "registry")

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.image_create(actor=actor_of(self.request), **serializer.validated_data)

    def perform_update(self, serializer: Any) -> None:
        data = {k: v for k, v in serializer.validated_data.items() if k not in ("tenant", "project")}
        serializer.instance = services.image_update(actor=actor_of(self.request), image=serializer.instance,
                                                    **data)

    def perform_destroy(self, instance: Image) -> None:
        services.image_delete(actor=actor_of(self.request), image=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class RegistryViewSet(IdempotentCreateMixin, *_CRUD, CampViewSet):  # type: ignore[misc]
    """External registries with pull credentials (write-only, encrypted at rest); they become
    imagePullSecrets in the namespaces of the projects that pull from them."""

    model = ExternalRegistry
    serializer_class = RegistrySerializer
    filterset_fields = ["scope", "tenant", "project", "server"]
    ordering_fields = ["name", "server"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("tenant", "project")

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.registry_create(actor=actor_of(self.request),
                                                       **serializer.validated_data)

    def perform_update(self, serializer: Any) -> None:
        data = {k: v for k, v in serializer.validated_data.items() if k not in ("tenant", "project")}
        password = data.pop("password", None)
        serializer.instance = services.registry_update(
            actor=actor_of(self.request), registry=serializer.instance, password=password, **data)

    def perform_destroy(self, instance: ExternalRegistry) -> None:
        services.registry_delete(actor=actor_of(self.request), registry=instance)
