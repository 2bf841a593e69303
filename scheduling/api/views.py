"""REST API for scheduling. Thin: look up through ``restrict``, write through services."""

from __future__ import annotations

from typing import Any

import django_filters
from django.db.models import Prefetch, QuerySet, prefetch_related_objects
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError as DRFValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from camp.filters import CampFilterSet
from camp.serializers import PAGE_PREFIX
from tenants.api.idempotency import IdempotentCreateMixin
from tenants.api.views import IDEMPOTENCY_PARAM, CampViewSet
from tenants.permissions import CHANGE, CREATE, actor_of

from .. import selectors, services
from ..models import (
    Allocation,
    Cluster,
    GpuDevice,
    GpuSlice,
    Job,
    NamespaceBinding,
    Node,
    NodePool,
    PriorityClassMapping,
)
from .serializers import (
    ClusterSerializer,
    DecisionSerializer,
    JobBriefSerializer,
    JobBulkResultSerializer,
    JobBulkSerializer,
    JobSerializer,
    NamespaceBindingSerializer,
    NodePoolSerializer,
    NodeSerializer,
    PriorityClassMappingSerializer,
    QuarantineSerializer,
    flat_errors,
)

CREDENTIALS = ("kubeconfig", "token", "ca_cert")


def _split_credentials(data: dict[str, Any]) -> dict[str, str] | None:
    creds = {k: data.pop(k) for k in CREDENTIALS if k in data}
    return creds or None


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class ClusterViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                     CampViewSet):
    """Clusters. Tenant members read them; platform admins register and edit them.
    Credentials (kubeconfig, or token + CA) are write-only and encrypted at rest."""

    model = Cluster
    serializer_class = ClusterSerializer
    filterset_fields = ["name", "enabled", "backend"]
    ordering_fields = ["name", "created_at"]

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        creds = _split_credentials(data)
        serializer.instance = services.cluster_create(actor=actor_of(self.request), credentials=creds,
                                                      **data)

    def perform_update(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        creds = _split_credentials(data)
        serializer.instance = services.cluster_update(
            actor=actor_of(self.request), cluster=serializer.instance, credentials=creds, **data)

    def perform_destroy(self, instance: Cluster) -> None:
        services.cluster_delete(actor=actor_of(self.request), cluster=instance)

    @extend_schema(request=None, responses={202: None})
    @action(detail=True, methods=["post"])
    def sync(self, request: Request, pk: str | None = None) -> Response:
        """Refresh the cluster's inventory now (asynchronously)."""
        cluster = self.get_object()
        from tenants.services import require

        require(actor_of(request), "change", cluster)
        from ..tasks import cluster_inventory_sync

        cluster_inventory_sync.delay_on_commit(cluster.pk)
        return Response(status=status.HTTP_202_ACCEPTED)


class NodeFilter(CampFilterSet):
    pool = django_filters.CharFilter(method="filter_pool")

    class Meta:
        model = Node
        fields = ["cluster", "pool", "quarantined", "ready", "present"]

    def filter_pool(self, queryset: QuerySet[Any], name: str, value: str) -> QuerySet[Any]:
        """Nodes in pool ``value``; a dedicated pool the reader may not see matches nothing
        (as a pool that does not exist), so its name cannot be probed."""
        queryset = queryset.filter(pool=value)
        hidden = selectors.hidden_pools(self.request.user if self.request else None)
        clusters = [cluster_id for cluster_id, pool in hidden if pool == value]
        return queryset.exclude(cluster_id__in=clusters) if clusters else queryset


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, CampViewSet):
    """Nodes and their GPUs, with what is allocated and whether they are quarantined.
    Nodes of a dedicated pool the reader may not see show no pool and no pool labels."""

    model = Node
    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    search_fields = ["name"]
    ordering_fields = ["name"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("cluster").prefetch_related(
            Prefetch("gpus", queryset=GpuDevice.objects.order_by("index")))

    @extend_schema(request=QuarantineSerializer, responses=NodeSerializer)
    @action(detail=True, methods=["post"])
    def quarantine(self, request: Request, pk: str | None = None) -> Response:
        """Take a node out of service (its jobs are rescheduled), or back in."""
        node = self.get_object()
        data = QuarantineSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = services.node_quarantine(actor=actor_of(request), node=node,
                                        quarantined=data.validated_data["quarantined"],
                                        reason=data.validated_data["reason"])
        return Response(NodeSerializer(node, context={"request": request}).data)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class NodePoolViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                      mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin,
                      CampViewSet):
    """Node pools selected by node labels. Shared pools serve every tenant; a dedicated
    pool places only its tenants' jobs (and only they see it). Platform admins manage them."""

    model = NodePool
    serializer_class = NodePoolSerializer
    filterset_fields = ["cluster", "dedicated"]
    ordering_fields = ["name"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("cluster").prefetch_related("tenants")

    # Permission before the body's cluster and tenant names are resolved (issue 30, item 8).
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self.require_before_parsing(CREATE, NodePool())
        return super().create(request, *args, **kwargs)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self.require_before_parsing(CHANGE, self.get_object())
        return super().update(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.nodepool_create(actor=actor_of(self.request), **data)

    def perform_update(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        if "cluster" in data and data["cluster"] != serializer.instance.cluster:
            from django.core.exceptions import ValidationError

            raise ValidationError({"cluster": ["A pool cannot move to another cluster."]})
        data.pop("cluster", None)
        serializer.instance = services.nodepool_update(
            actor=actor_of(self.request), pool=serializer.instance, **data)

    def perform_destroy(self, instance: NodePool) -> None:
        services.nodepool_delete(actor=actor_of(self.request), pool=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class NamespaceBindingViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                              mixins.CreateModelMixin, mixins.DestroyModelMixin, CampViewSet):
    """Namespaces Camp did not create, bound to a project by its admins (issue 34): pods there
    naming Camp's scheduler are queued, shared and placed as the project's ``external`` jobs.
    Unbinding stops admitting them; running pods are left alone. docs/KUBERNETES.md."""

    model = NamespaceBinding
    serializer_class = NamespaceBindingSerializer
    filterset_fields = ["cluster", "project", "namespace"]
    ordering_fields = ["namespace", "created_at"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("cluster", "tenant", "created_by")

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        serializer.instance = services.namespace_bind(actor=actor_of(self.request), **data)

    def perform_destroy(self, instance: NamespaceBinding) -> None:
        services.namespace_unbind(actor=actor_of(self.request), binding=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class PriorityClassMappingViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                                  mixins.CreateModelMixin, mixins.DestroyModelMixin, CampViewSet):
    """Kubernetes PriorityClass → Camp priority class, per cluster, for the pods Camp schedules
    that it did not create (issue 34). Platform admins set rows (a create for a PriorityClass
    already mapped changes its class); every tenant member reads them. docs/KUBERNETES.md."""

    model = PriorityClassMapping
    serializer_class = PriorityClassMappingSerializer
    filterset_fields = ["cluster", "priority_class"]
    ordering_fields = ["kube_priority_class", "updated_at"]

    def get_queryset(self) -> QuerySet[Any]:
        return super().get_queryset().select_related("cluster", "created_by")

    # Permission before the body's cluster name is resolved (issue 30, item 8).
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self.require_before_parsing(CREATE, PriorityClassMapping())
        return super().create(request, *args, **kwargs)

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = services.priority_mapping_set(
            actor=actor_of(self.request), **dict(serializer.validated_data))

    def perform_destroy(self, instance: PriorityClassMapping) -> None:
        services.priority_mapping_delete(actor=actor_of(self.request), mapping=instance)


@extend_schema_view(create=extend_schema(parameters=[IDEMPOTENCY_PARAM]))
class JobViewSet(IdempotentCreateMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                 mixins.CreateModelMixin, CampViewSet):
    """Jobs: submit, follow (state, reason, queue position, decisions) and cancel."""

    model = Job
    serializer_class = JobSerializer
    cursor_pages = True  # camp.pagination: ?cursor= documented in the schema
    filterset_fields = ["project", "cluster", "state", "priority_class", "tenant"]
    search_fields = ["name"]
    ordering_fields = ["submitted_at", "priority", "state", "queue_position"]

    def get_queryset(self) -> QuerySet[Any]:
        jobs = selectors.job_list(user=self.request.user)
        if self.action == "decisions":  # the job only answers "may you see it"; its pods are not shown
            return jobs
        # plain lists (``to_attr``), read by the nested serializers (``camp.serializers.PrefetchedList``):
        # no QuerySet built per job of the page to hold them
        return jobs.prefetch_related(
            Prefetch("groups", to_attr=PAGE_PREFIX + "groups"),
            Prefetch("allocations", to_attr=PAGE_PREFIX + "allocations",
                     queryset=Allocation.objects.select_related("node", "group").prefetch_related(
                         Prefetch("slices", queryset=GpuSlice.objects.select_related("gpu"),
                                  to_attr=PAGE_PREFIX + "slices"))),
        )  # … and a page's latest decisions (``paginate_queryset``; one job reads its own)

    def paginate_queryset(self, queryset: Any) -> list[Any] | None:
        page = super().paginate_queryset(queryset)
        if page and self.action == "list":  # a page of jobs (``decisions`` pages its own rows)
            selectors.with_latest_decisions(page)  # each job's latest decision, in one query
            # the external jobs' Kubernetes pods in one query (none for a page without any)
            prefetch_related_objects([j for j in page if j.kind == "external"], "external_pods",
                                     "external_workloads")
        return page

    def perform_create(self, serializer: Any) -> None:
        data = dict(serializer.validated_data)
        data["groups"] = [dict(g) for g in data["groups"]]
        serializer.instance = services.job_submit(actor=actor_of(self.request), **data)

    @extend_schema(request=JobBulkSerializer, responses={201: JobBulkResultSerializer},
                   parameters=[IDEMPOTENCY_PARAM])
    @action(detail=False, methods=["post"])
    def bulk(self, request: Request) -> Response:
        """Submit many jobs at once (a parameter sweep, at most 1,000): all or nothing.
        A 400 names every bad item's field, as ``jobs[3].name``; nothing is then queued."""
        return self.idempotent(request, lambda: self._bulk(request))

    def _bulk(self, request: Request) -> Response:
        data = JobBulkSerializer(data=request.data, context=self.get_serializer_context())
        if not data.is_valid():
            raise DRFValidationError(flat_errors(data.errors))
        items = [{**dict(j), "groups": [dict(g) for g in j["groups"]]}
                 for j in data.validated_data["jobs"]]
        jobs = services.job_submit_many(actor=actor_of(request), jobs=items)
        body = {"count": len(jobs), "jobs": JobBriefSerializer(jobs, many=True).data}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=JobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the job (its pods are stopped, its resources released)."""
        job = services.job_cancel(actor=actor_of(request), job=self.get_object())
        return Response(JobSerializer(self.get_queryset().get(pk=job.pk),
                                      context={"request": request}).data)

    @extend_schema(responses=DecisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def decisions(self, request: Request, pk: str | None = None) -> Response:
        """The job's scheduling history: admitted with placement, waiting with reason and
        queue position, preempted with the preemptor named (when the reader may see it)."""
        job = self.get_object()
        page = self.paginate_queryset(job.decisions.order_by("-id"))
        data = DecisionSerializer(page, many=True, context=self.get_serializer_context()).data
        return self.get_paginated_response(data)
