"""Workload REST API. Thin: look up through ``restrict``, write through services."""

from __future__ import annotations

import json
from typing import Any

from django.db.models import Prefetch, Q, QuerySet
from django.http import HttpResponseBase, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, renderers, serializers, status
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from camp.filters import CampFilterSet, IdFilter
from scheduling.models import without_cluster_bulk
from tenants.api.idempotency import IdempotentCreateMixin
from tenants.api.views import IDEMPOTENCY_PARAM, CampViewSet
from tenants.permissions import actor_of

from .. import logstream, selectors, services
from ..models import (
    DevEnvironment,
    ModelService,
    Profile,
    ServiceReplica,
    SshKey,
    TrainingJob,
    WorkspacePolicy,
)
from .serializers import (
    CheckpointSerializer,
    EnvironmentSerializer,
    LogSerializer,
    ModelServiceSerializer,
    ModelServiceUpdateSerializer,
    OpenSerializer,
    PolicySerializer,
    ProfileSerializer,
    RolloutSerializer,
    ScaleSerializer,
    ServiceApiKeySerializer,
    SshKeySerializer,
    TrainingSerializer,
    WhySerializer,
)


class EventStreamRenderer(renderers.BaseRenderer):
    """Lets ``Accept: text/event-stream`` (EventSource) through content negotiation; the
    stream itself is a StreamingHttpResponse, so this only ever renders an error body."""

    media_type = "text/event-stream"
    format = "sse"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return json.dumps(data, default=str).encode()


class PlainTextRenderer(EventStreamRenderer):
    media_type = "text/plain"
    format = "txt"


LOG_RENDERERS = [
    renderers.JSONRenderer,
    renderers.BrowsableAPIRenderer,
    EventStreamRenderer,
    PlainTextRenderer,
]


class JsonErrorsMixin:
    """An error from a logs endpoint is JSON, as the schema documents every error, even when the
    request asked for the logs as ``text/plain`` or an event stream (``?format=txt``): a 404 or
    400 rendered as text was a body no client of the schema could read."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        if (isinstance(response, Response) and response.status_code >= 400
                and isinstance(getattr(response, "accepted_renderer", None), EventStreamRenderer)):
            response.accepted_renderer = renderers.JSONRenderer()
            response.accepted_media_type = "application/json"
        return response


# Detail actions that answer a plain list: no list filters, no pagination (in the schema too).
NOT_A_LIST: dict[str, Any] = {"filter_backends": [], "pagination_class": None}

LOG_PARAMS = [
    OpenApiParameter("tail", OpenApiTypes.INT, description="Lines per pod (1–5000, default 200)"),
    OpenApiParameter("pod", OpenApiTypes.STR, description="Only this pod"),
]
LOG_PARAMS += [
    OpenApiParameter(
        "follow",
        OpenApiTypes.BOOL,
        description=(
            "Stream the logs as they are written instead: `text/event-stream` (events `log` with "
            "JSON `{pod, role, line}`, then one `end` with `{reason}`) when the request accepts it, "
            "else `text/plain` lines `[pod] line`. Starts with the last `tail` lines (default 50) "
            "of each pod; ends when the run ends or after `timeout` seconds."
        ),
    ),
    OpenApiParameter("timeout", OpenApiTypes.INT, description="With follow: seconds (1–3600, default 300)"),
]


LOG_RESPONSES: Any = {
    (200, "application/json"): LogSerializer(many=True),
    (200, "text/event-stream"): OpenApiTypes.STR,
    (200, "text/plain"): OpenApiTypes.STR,
}


def _tail(request: Request, default: int = 200, low: int = 1) -> int:
    try:
        return max(low, min(5000, int(request.query_params.get("tail", default))))
    except ValueError as exc:
        raise serializers.ValidationError({"tail": ["A whole number of lines."]}) from exc


def _follow(request: Request, job: Any) -> StreamingHttpResponse:
    try:
        timeout = int(request.query_params.get("timeout", logstream.DEFAULT_TIMEOUT))
    except ValueError as exc:
        raise serializers.ValidationError({"timeout": ["A whole number of seconds."]}) from exc
    if not 1 <= timeout <= logstream.MAX_TIMEOUT:
        raise serializers.ValidationError({"timeout": [f"Between 1 and {logstream.MAX_TIMEOUT} seconds."]})
    # Content negotiation chose the renderer: Accept: text/event-stream (or ?format=sse).
    fmt = "sse" if getattr(request.accepted_renderer, "format", "") == "sse" else "plain"
    response = StreamingHttpResponse(
        logstream.encoded(
            job,
            fmt=fmt,
            pod=request.query_params.get("pod", "")[:63],
            tail=_tail(request, 50, low=0),
            timeout=timeout,
        ),
        content_type="text/event-stream" if fmt == "sse" else "text/plain; charset=utf-8",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # ingress-nginx: pass chunks on at once
    return response


def _logs(request: Request, job: Any) -> HttpResponseBase:
    if request.query_params.get("follow", "").lower() in ("1", "true", "yes"):
        return _follow(request, job)
    logs = selectors.job_logs(job, tail=_tail(request), pod=request.query_params.get("pod", "")[:63])
    return Response(
        LogSerializer([{"pod": x.pod, "role": x.role, "text": x.text} for x in logs], many=True).data
    )


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class EnvironmentViewSet(
    JsonErrorsMixin,
    IdempotentCreateMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    CampViewSet,
):
    """Dev environments (JupyterLab, VS Code, SSH): launch, open, stop, start, delete, logs.
    The create response carries ``access_url`` with a one-time token; later links come from
    ``open`` (only the owner), and only the token's SHA-256 is stored."""

    model = DevEnvironment
    serializer_class = EnvironmentSerializer
    # The link's token is shown once and never stored; env values (often secrets) are not
    # kept in the idempotency table either. A replay answers with both null.
    idempotency_redact = ("access_url", "env")
    filterset_fields = ["project", "cluster", "kind", "name", "tenant"]
    search_fields = ["name"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[Any]:
        return without_cluster_bulk(
            super().get_queryset().select_related("tenant", "project", "cluster", "owner", "job", "image",
                                                  "profile"), "cluster").order_by("-created_at", "-id")

    def perform_create(self, serializer: Any) -> None:
        # Through IdempotentCreateMixin.create → CreateModelMixin.create (Idempotency-Key).
        env, token = services.environment_launch(actor=actor_of(self.request), **serializer.validated_data)
        serializer.instance = self.get_queryset().get(pk=env.pk)
        serializer.context["access_token"] = token

    def perform_destroy(self, instance: DevEnvironment) -> None:
        services.environment_delete(actor=actor_of(self.request), env=instance)

    def _fresh(self, request: Request, env: DevEnvironment) -> Response:
        return Response(
            EnvironmentSerializer(
                self.get_queryset().get(pk=env.pk), context=self.get_serializer_context()
            ).data
        )

    @extend_schema(request=None, responses=EnvironmentSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Stop it; its home volume is kept."""
        return self._fresh(request, services.environment_stop(actor=actor_of(request), env=self.get_object()))

    @extend_schema(request=None, responses=EnvironmentSerializer)
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        """Start a stopped environment again, on the same home volume."""
        return self._fresh(
            request, services.environment_start(actor=actor_of(request), env=self.get_object())
        )

    @extend_schema(request=None, responses=OpenSerializer)
    @action(detail=True, methods=["post"])
    def open(self, request: Request, pk: str | None = None) -> Response:
        """A fresh link with a new one-time token (the owner only; older links stop working)."""
        url = services.environment_open(actor=actor_of(request), env=self.get_object())
        response = Response({"url": url})
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["post"])
    def activity(self, request: Request, pk: str | None = None) -> Response:
        """Report activity (the in-pod agent does this for running kernels and terminals)."""
        env = self.get_object()
        if env.owner_id != actor_of(request).pk:
            return Response({"detail": "Only the owner reports activity."}, status=status.HTTP_403_FORBIDDEN)
        services.environment_touch(env_id=env.pk)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(parameters=LOG_PARAMS, responses=LOG_RESPONSES)
    @action(detail=True, methods=["get"], renderer_classes=LOG_RENDERERS, **NOT_A_LIST)
    def logs(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The pods' logs (synthetic on the simulated backend); ``follow=true`` streams them."""
        return _logs(request, self.get_object().job)

    @extend_schema(responses=WhySerializer)
    @action(detail=True, methods=["get"])
    def why(self, request: Request, pk: str | None = None) -> Response:
        """Why it waits, its queue position and what would let it start."""
        return Response(selectors.job_why(self.get_object().job))


class TrainingFilter(CampFilterSet):
    cluster = IdFilter(method="filter_cluster", help_text="Runs on this cluster (a floating "
                                                          "training job: where its run was placed).")

    class Meta:
        model = TrainingJob
        fields = ["project", "cluster", "framework", "name", "tenant"]

    def filter_cluster(self, queryset: QuerySet[Any], name: str, value: int) -> QuerySet[Any]:
        return queryset.filter(Q(cluster_id=value) | Q(cluster__isnull=True, job__cluster_id=value))


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class TrainingViewSet(
    JsonErrorsMixin,
    IdempotentCreateMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    CampViewSet,
):
    """Distributed training jobs (PyTorch DDP, DeepSpeed, MPI, TensorFlow): submit, follow
    (state, why, restarts, lost GPU time, checkpoints), logs, stop, delete (a running job
    is stopped first; the audit log keeps the record)."""

    model = TrainingJob
    serializer_class = TrainingSerializer
    idempotency_redact = ("env",)  # often secrets: not kept in the idempotency table
    filterset_class = TrainingFilter
    search_fields = ["name"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[Any]:
        return without_cluster_bulk(
            super().get_queryset().select_related("tenant", "project", "cluster", "owner", "job__cluster",
                                                  "image"), "cluster", "job__cluster",
        ).prefetch_related("depends_on").order_by("-created_at", "-id")

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.training_submit(actor=actor_of(self.request), **data)

    def perform_destroy(self, instance: TrainingJob) -> None:
        services.training_delete(actor=actor_of(self.request), training=instance)

    @extend_schema(request=None, responses=TrainingSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        t = services.training_stop(actor=actor_of(request), training=self.get_object())
        return Response(
            TrainingSerializer(self.get_queryset().get(pk=t.pk), context=self.get_serializer_context()).data
        )

    @extend_schema(parameters=LOG_PARAMS, responses=LOG_RESPONSES)
    @action(detail=True, methods=["get"], renderer_classes=LOG_RENDERERS, **NOT_A_LIST)
    def logs(self, request: Request, pk: str | None = None) -> HttpResponseBase:
        """The pods' logs (synthetic on the simulated backend); ``follow=true`` streams them."""
        return _logs(request, self.get_object().job)

    @extend_schema(responses=WhySerializer)
    @action(detail=True, methods=["get"])
    def why(self, request: Request, pk: str | None = None) -> Response:
        t = self.get_object()
        why = selectors.job_why(t.job)
        if t.job is None and t.blocked_reason:
            why["reason"] = t.blocked_reason
        return Response(why)

    @extend_schema(methods=["GET"], responses=CheckpointSerializer(many=True))
    @extend_schema(methods=["POST"], request=CheckpointSerializer, responses=CheckpointSerializer(many=True))
    @action(detail=True, methods=["get", "post"], **NOT_A_LIST)
    def checkpoints(self, request: Request, pk: str | None = None) -> Response:
        """Checkpoints seen so far, newest first; a training script may POST one (the next
        run gets ``CAMP_RESUME_FROM`` pointing to the latest)."""
        t = self.get_object()
        if request.method == "POST":
            body = CheckpointSerializer(data=request.data)
            body.is_valid(raise_exception=True)
            services.training_report_checkpoint(
                training=t,
                actor=actor_of(request),
                step=body.validated_data["step"],
                path=body.validated_data["path"],
            )
        return Response(CheckpointSerializer(t.checkpoints.all()[:100], many=True).data)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ProfileViewSet(
    IdempotentCreateMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    CampViewSet,
):
    """Launch profiles (shape + image). Platform admins define them and may limit each to
    chosen tenants or projects; users see the ones offered to them."""

    model = Profile
    serializer_class = ProfileSerializer
    filterset_fields = ["name", "enabled"]
    ordering_fields = ["name"]

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.profile_create(
            actor=actor_of(self.request), **serializer.validated_data
        )

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = services.profile_update(
            actor=actor_of(self.request), profile=serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: Profile) -> None:
        services.profile_delete(actor=actor_of(self.request), profile=instance)


class PolicyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, CampViewSet):
    """Per-project workspace policy: idle culling, maximum lifetime, warning, storage limit.
    POST sets it (creating or replacing); project admins and tenant owners may."""

    model = WorkspacePolicy
    serializer_class = PolicySerializer
    filterset_fields = ["project"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().order_by("project_id")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        policy = services.workspace_policy_set(actor=actor_of(request), **data)
        return Response(
            PolicySerializer(policy, context=self.get_serializer_context()).data, status=status.HTTP_200_OK
        )


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class SshKeyViewSet(
    IdempotentCreateMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    CampViewSet,
):
    """Your SSH public keys (platform admins see everyone's). SSH environments authorise
    their owner's keys from their next start. Keys are validated (ssh-ed25519,
    ecdsa-sha2-*, ssh-rsa of at least 2048 bits) and shown with their SHA256 fingerprint."""

    model = SshKey
    serializer_class = SshKeySerializer
    filterset_fields = ["user", "key_type", "fingerprint"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("user").order_by("user_id", "name", "id")

    def perform_create(self, serializer: Any) -> None:
        data = serializer.validated_data
        serializer.instance = services.ssh_key_add(
            actor=actor_of(self.request), name=data.get("name", ""), public_key=data["public_key"]
        )

    def perform_destroy(self, instance: SshKey) -> None:
        services.ssh_key_delete(actor=actor_of(self.request), key=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ModelServiceViewSet(
    IdempotentCreateMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    CampViewSet,
):
    """Model services (online inference): create, follow (replicas desired/ready, each
    replica's job and why it waits, load, revision, endpoint), change (scaling settings at
    once; image/args/env/model/shape as a new revision), scale, roll out, delete. Replicas
    are scheduling jobs of kind ``service`` (also listed under /jobs/)."""

    model = ModelService
    serializer_class = ModelServiceSerializer
    idempotency_redact = ("env",)
    filterset_fields = ["project", "cluster", "name", "tenant", "status"]
    search_fields = ["name"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self) -> QuerySet[Any]:
        live = ServiceReplica.objects.filter(removed_reason="").select_related("job").order_by("number")
        return selectors.model_services(self.request.user).prefetch_related(
            Prefetch("replicas", queryset=live, to_attr="live_replicas"))

    def get_serializer_class(self) -> Any:
        if self.action in ("update", "partial_update"):
            return ModelServiceUpdateSerializer
        return ModelServiceSerializer

    def _answer(self, svc: ModelService, code: int = status.HTTP_200_OK) -> Response:
        fresh = self.get_queryset().get(pk=svc.pk)
        data = ModelServiceSerializer(fresh, context=self.get_serializer_context()).data
        return Response(data, status=code)

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.model_service_create(actor=actor_of(self.request), **data)

    def perform_update(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.model_service_update(
            actor=actor_of(self.request), service=serializer.instance, **data)

    def perform_destroy(self, instance: ModelService) -> None:
        services.model_service_delete(actor=actor_of(self.request), service=instance)

    @extend_schema(request=ScaleSerializer, responses=ModelServiceSerializer)
    @action(detail=True, methods=["post"])
    def scale(self, request: Request, pk: str | None = None) -> Response:
        """A fixed replica count (``replicas``), or the autoscaler's bounds."""
        body = ScaleSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        svc = services.model_service_scale(actor=actor_of(request), service=self.get_object(),
                                          **body.validated_data)
        return self._answer(svc)

    @extend_schema(request=None, responses=ServiceApiKeySerializer)
    @action(detail=True, methods=["post"], url_path="api-key")
    def api_key(self, request: Request, pk: str | None = None) -> Response:
        """A new API key for calls through the service's Ingress; the previous one stops
        working at once. The key is in this answer only (never stored, never replayed)."""
        svc = self.get_object()
        key = services.model_service_api_key_rotate(actor=actor_of(request), service=svc)
        svc.refresh_from_db()
        out = ServiceApiKeySerializer({"api_key": key, "created_at": svc.api_key_created_at,
                                       "external_endpoint": selectors.service_external_endpoint(svc)})
        return Response(out.data, headers={"Cache-Control": "no-store"})

    @extend_schema(request=RolloutSerializer, responses=ModelServiceSerializer)
    @action(detail=True, methods=["post"])
    def rollout(self, request: Request, pk: str | None = None) -> Response:
        """A new revision (the changes given, or a restart), one replica at a time."""
        body = RolloutSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        svc = services.model_service_rollout(actor=actor_of(request), service=self.get_object(),
                                            **body.validated_data)
        return self._answer(svc)
