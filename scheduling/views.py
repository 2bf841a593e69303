"""Console pages for scheduling: clusters, nodes and GPUs, jobs. Same services and
permissions as the API; objects outside a user's reach are 404."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from tenants.forms import apply_service_errors
from tenants.permissions import CHANGE, CREATE, actor_of, can, restrict

from . import selectors, services
from .filters import JobListFilter
from .models import Cluster, GpuDevice, Job, JobState, Node, NodePool, PriorityClassMapping


class ClusterForm(forms.ModelForm[Cluster]):
    api_server = forms.URLField(required=False, assume_scheme="https")
    prometheus_url = forms.URLField(
        required=False, assume_scheme="https",
        help_text="Optional: GPU utilisation (DCGM / HAMi) for placement, and model services' load and "
                  "latency (vLLM metrics) for their autoscaler.")
    kubeconfig = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 4}),
                                 help_text="Write-only: leave empty to keep the stored credentials.")
    token = forms.CharField(required=False, widget=forms.PasswordInput,
                            help_text="Write-only bearer token (with the CA below).")
    ca_cert = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                              label="CA certificate (PEM)")

    class Meta:
        model = Cluster
        fields = ["name", "display_name", "enabled", "backend", "placement_policy", "api_server",
                  "prometheus_url", "namespace_prefix", "inventory"]
        widgets = {"inventory": forms.Textarea(attrs={"rows": 12, "class": "mono"})}


@login_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    clusters = restrict(Cluster.objects.all(), request.user)
    rows = [{"cluster": c, "usage": selectors.cluster_usage(cluster=c)} for c in clusters]
    return render(request, "scheduling/clusters.html", {
        "rows": rows, "can_create": can(request.user, CREATE, Cluster(name="x"))})


@login_required
def cluster_edit(request: HttpRequest, cluster_name: str | None = None) -> HttpResponseBase:
    cluster = (get_object_or_404(restrict(Cluster.objects.all(), request.user), name=cluster_name)
               if cluster_name else None)
    if not can(request.user, CHANGE if cluster else CREATE, cluster or Cluster(name="x")):
        raise PermissionDenied
    form = ClusterForm(request.POST or None, instance=cluster)
    if request.method == "POST" and form.is_valid():
        data = {k: form.cleaned_data[k] for k in ClusterForm.Meta.fields}
        creds = {k: form.cleaned_data[k] for k in ("kubeconfig", "token", "ca_cert")
                 if form.cleaned_data.get(k)}
        try:
            if cluster is None:
                name = data.pop("name")
                cluster = services.cluster_create(actor=actor_of(request), name=name,
                                                  credentials=creds or None, **data)
            else:
                cluster = services.cluster_update(actor=actor_of(request), cluster=cluster,
                                                  credentials=creds or None, **data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Cluster {cluster} saved.")
            return redirect("scheduling:clusters")
    return render(request, "scheduling/cluster_form.html", {"form": form, "cluster": cluster})


@login_required
def node_list(request: HttpRequest, cluster_name: str) -> HttpResponse:
    cluster = get_object_or_404(restrict(Cluster.objects.all(), request.user), name=cluster_name)
    nodes = restrict(Node.objects.filter(cluster=cluster), request.user).prefetch_related(
        Prefetch("gpus", queryset=GpuDevice.objects.order_by("index")))
    from tenants.models import Tenant

    visible_tenants = set(restrict(Tenant.objects.all(), request.user).values_list("pk", flat=True))
    pools: list[dict[str, Any]] = []
    for p in restrict(NodePool.objects.filter(cluster=cluster), request.user).prefetch_related(
            "tenants"):
        pools.append({"pool": p, "tenants": [t.name for t in p.tenants.all()
                                             if t.pk in visible_tenants]})
    dedicated = {row["pool"].name for row in pools if row["pool"].dedicated}
    # Dedicated pools of other tenants are not named (a pool's existence names who it serves).
    hidden = {name for cluster_id, name in selectors.hidden_pools(request.user)
              if cluster_id == cluster.pk}
    return render(request, "scheduling/nodes.html", {
        "cluster": cluster, "nodes": nodes, "pools": pools, "dedicated": dedicated,
        "hidden": hidden,
        "can_change": can(request.user, CHANGE, cluster)})


@login_required
@require_POST
def node_quarantine(request: HttpRequest, pk: int) -> HttpResponseBase:
    node = get_object_or_404(restrict(Node.objects.select_related("cluster"), request.user), pk=pk)
    quarantined = request.POST.get("quarantined") == "1"
    services.node_quarantine(actor=actor_of(request), node=node, quarantined=quarantined,
                             reason=request.POST.get("reason", "")[:255])
    messages.success(request, f"Node {node.name} {'quarantined' if quarantined else 'released'}.")
    return redirect("scheduling:nodes", cluster_name=node.cluster.name)


PAGE_SIZES = (25, 50, 100)


@login_required
def job_list(request: HttpRequest) -> HttpResponse:
    """Jobs the reader may see: search, filters, sortable columns, pages and bulk stop."""
    f, qs = _filtered_jobs(request, request.GET)
    if not request.GET.get("sort"):
        qs = qs.order_by("-submitted_at", "-id")
    try:
        per_page = int(request.GET.get("per_page", 25))
    except ValueError:
        per_page = 25
    per_page = per_page if per_page in PAGE_SIZES else 25
    page = Paginator(qs, per_page).get_page(request.GET.get("page"))
    params = request.GET.copy()
    params.pop("page", None)
    sort_params = params.copy()
    sort_params.pop("sort", None)
    current = request.GET.get("sort", "")
    columns = []
    for key, label in (("name", "Job"), ("project", "Project"), ("owner", "Owner"), ("state", "State"),
                       ("priority", "Priority"), ("submitted", "Submitted")):
        direction = "ascending" if current == key else "descending" if current == f"-{key}" else ""
        sort_params["sort"] = f"-{key}" if current == key else key
        columns.append({"key": key, "label": label, "aria": direction,
                        "href": "?" + sort_params.urlencode()})
    stoppable = {j.pk for j in page if not j.is_final and can(request.user, "delete", j)}
    counts = _state_counts(qs)
    return render(request, "scheduling/jobs.html", {
        "page": page, "filter": f, "query": params.urlencode(), "columns": columns,
        "per_page": per_page, "page_sizes": PAGE_SIZES, "stoppable": stoppable,
        "count": page.paginator.count,
        "state_counts": [(value, label, counts.get(value, 0)) for value, label in JobState.choices],
        "counts_query": request.GET.urlencode()})


def _filtered_jobs(request: HttpRequest, data: QueryDict) -> tuple[JobListFilter, QuerySet[Job]]:
    jobs = selectors.job_list(user=request.user).select_related("owner")
    f = JobListFilter(data or None, queryset=jobs, request=request)
    # an unreadable filter lists nothing and says which one (never "everything")
    return f, jobs if not f.is_bound else f.qs if f.is_valid() else jobs.none()


def _state_counts(qs: QuerySet[Job]) -> dict[str, int]:
    return dict(qs.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))


@login_required
def job_list_live(request: HttpRequest) -> JsonResponse:
    """What the jobs list refreshes without a reload (static/live.js): the per-state counts of
    the list's filters, and the live fields of the rows it shows (``ids``, at most 200, only
    jobs the reader may see) in one request, where polling one job at a time would cost a
    request per row. Pushed changes arrive over /ws/live/ as on the job page; this answers
    the counts they change and is the list's polling fallback."""
    from portal.live import job_payload

    params = request.GET.copy()
    raw_ids = params.pop("ids", [""])[-1]  # the filters never see "ids"
    _f, qs = _filtered_jobs(request, params)
    counts = _state_counts(qs)
    ids = [int(x) for x in raw_ids.split(",") if x.isdigit()][:200]
    rows = restrict(Job.objects.filter(pk__in=ids), request.user).select_related("cluster").only(
        "pk", "state", "reason", "queue_position", "queue_length", "floating", "kind", "updated_at",
        "cluster__last_cycle_at", "cluster__enabled", "cluster__unreachable_since") if ids else []
    return JsonResponse({"total": sum(counts.values()), "states": counts,
                         "jobs": [job_payload(j) for j in rows]})


@login_required
@require_POST
def job_bulk_stop(request: HttpRequest) -> HttpResponseBase:
    """Stop the chosen jobs one by one through job_cancel (its permission check and audit
    event per job); jobs outside the reader's reach are skipped as if they did not exist."""
    ids = [int(x) for x in request.POST.getlist("job") if x.isdigit()][:200]
    jobs = restrict(Job.objects.filter(pk__in=ids), request.user)
    stopped, refused = [], []
    for job in jobs:
        try:
            services.job_cancel(actor=actor_of(request), job=job)
        except (ValidationError, PermissionDenied):
            refused.append(job.name)
        else:
            stopped.append(job.name)
    if stopped:
        messages.success(request, f"Stopped {len(stopped)} job{'s' if len(stopped) != 1 else ''}: "
                                  f"{', '.join(stopped)}.")
    if refused:
        messages.error(request, f"Not stopped (already ended or not yours to stop): {', '.join(refused)}.")
    if not stopped and not refused:
        messages.error(request, "Choose the jobs to stop first.")
    # back to the same filtered page (re-encoded: only a query string, never a location)
    back = QueryDict(request.POST.get("next", "")[:2000]).urlencode()
    return redirect(reverse("scheduling:jobs") + (f"?{back}" if back else ""))


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job: Any = get_object_or_404(selectors.job_list(user=request.user), pk=pk)
    allocations = job.allocations.select_related("node", "group").prefetch_related("slices__gpu")
    decisions = selectors.job_decisions(job=job)
    # A preemptor is linked only if the reader may see it (another tenant's job is not named).
    preemptors = restrict(Job.objects.filter(
        pk__in={d.preemptor_id for d in decisions if d.preemptor_id}), request.user)
    as_of, stale = selectors.reason_as_of(job)
    return render(request, "scheduling/job.html", {
        "job": job, "why": {"as_of": as_of, "stale": stale}, "groups": job.groups.all(),
        "allocations": allocations,
        "decisions": decisions, "visible_preemptors": set(preemptors.values_list("pk", flat=True)),
        "pods_total": sum(g.replicas for g in job.groups.all()),
        # an external job's own pods (issue 34): read within the job, whose rule was checked
        "external_pods": list(job.external_pods.order_by("replica")) if job.kind == "external" else [],
        "kubernetes_job": job.external_workloads.first() if job.kind == "external" else None,
        "can_cancel": not job.is_final and can(request.user, "delete", job)})


@login_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponseBase:
    job = get_object_or_404(restrict(Job.objects.all(), request.user), pk=pk)
    try:
        services.job_cancel(actor=actor_of(request), job=job)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Job {job.name} cancelled.")
    return redirect("scheduling:job", pk=job.pk)


class NamespaceBindForm(forms.Form):
    project = forms.TypedChoiceField(coerce=int, choices=())
    cluster = forms.ChoiceField(choices=())
    namespace = forms.CharField(max_length=63)

    def __init__(self, *args: Any, projects: list[tuple[int, str]], clusters: list[str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fields["project"].choices = projects  # type: ignore[attr-defined]
        self.fields["cluster"].choices = [(c, c) for c in clusters]  # type: ignore[attr-defined]


@login_required
def namespace_bindings(request: HttpRequest) -> HttpResponseBase:
    """Namespaces bound to projects (issue 34): the reader's, and a form for the projects they
    administer (docs/KUBERNETES.md, "Routing existing workloads to Camp")."""
    from tenants.models import Project

    from .models import Backend, NamespaceBinding

    user = actor_of(request)
    projects = [(p.pk, f"{p.tenant.name}/{p.name}")
                for p in restrict(Project.objects.select_related("tenant"), request.user)
                if can(user, CREATE, NamespaceBinding(project=p, tenant=p.tenant))]
    clusters = list(restrict(Cluster.objects.filter(backend=Backend.KUBERNETES, enabled=True), request.user)
                    .values_list("name", flat=True))
    form = NamespaceBindForm(request.POST or None, projects=projects, clusters=clusters)
    if request.method == "POST" and form.is_valid():
        project = Project.objects.select_related("tenant").get(pk=form.cleaned_data["project"])
        try:
            services.namespace_bind(actor=user, project=project, namespace=form.cleaned_data["namespace"],
                                    cluster=Cluster.objects.get(name=form.cleaned_data["cluster"]))
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Namespace {form.cleaned_data['namespace']} bound.")
            return redirect("scheduling:namespaces")
    rows = [{"b": b, "can_delete": can(user, "delete", b)}
            for b in restrict(NamespaceBinding.objects.select_related("cluster", "project", "tenant",
                                                                      "created_by"), request.user)]
    mapped = PriorityClassMapping.objects.select_related("cluster", "created_by")
    mappings = list(restrict(mapped, request.user))
    may_map = can(user, CREATE, PriorityClassMapping())
    return render(request, "scheduling/namespaces.html", {
        "rows": rows, "form": form, "can_bind": bool(projects and clusters), "mappings": mappings,
        "may_map": may_map, "map_form": PriorityMapForm(clusters=clusters) if may_map else None})


class PriorityMapForm(forms.Form):
    cluster = forms.ChoiceField(choices=())
    kube_priority_class = forms.CharField(max_length=253, label="Kubernetes PriorityClass")
    priority_class = forms.ChoiceField(choices=(), label="Camp priority class")

    def __init__(self, *args: Any, clusters: list[str], **kw: Any) -> None:
        from .models import PriorityClass

        super().__init__(*args, **kw)
        self.fields["cluster"].choices = [(c, c) for c in clusters]  # type: ignore[attr-defined]
        self.fields["priority_class"].choices = PriorityClass.choices  # type: ignore[attr-defined]


@login_required
@require_POST
def priority_map_set(request: HttpRequest) -> HttpResponseBase:
    """Platform admins map a Kubernetes PriorityClass to a Camp class (issue 34)."""
    from .models import Backend

    user = actor_of(request)
    if not can(user, CREATE, PriorityClassMapping()):
        raise PermissionDenied
    clusters = list(restrict(Cluster.objects.filter(backend=Backend.KUBERNETES), request.user)
                    .values_list("name", flat=True))
    form = PriorityMapForm(request.POST, clusters=clusters)
    if form.is_valid():
        try:
            services.priority_mapping_set(
                actor=user, cluster=Cluster.objects.get(name=form.cleaned_data["cluster"]),
                kube_priority_class=form.cleaned_data["kube_priority_class"],
                priority_class=form.cleaned_data["priority_class"])
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"PriorityClass {form.cleaned_data['kube_priority_class']} mapped.")
            return redirect("scheduling:namespaces")
    # the page keeps no form state across the redirect: each field's error is said by its label
    for field, errors in form.errors.items():
        label = form[field].label if field in form.fields else field
        messages.error(request, f"{label}: {' '.join(str(e) for e in errors)}")
    return redirect("scheduling:namespaces")


@login_required
@require_POST
def priority_map_delete(request: HttpRequest, pk: int) -> HttpResponseBase:
    rows = PriorityClassMapping.objects.select_related("cluster")
    mapping = get_object_or_404(restrict(rows, request.user), pk=pk)
    services.priority_mapping_delete(actor=actor_of(request), mapping=mapping)
    messages.success(request, f"Mapping of {mapping.kube_priority_class} removed.")
    return redirect("scheduling:namespaces")


@login_required
@require_POST
def namespace_unbind(request: HttpRequest, pk: int) -> HttpResponseBase:
    from .models import NamespaceBinding

    rows = NamespaceBinding.objects.select_related("cluster", "project", "tenant")
    binding = get_object_or_404(restrict(rows, request.user), pk=pk)
    services.namespace_unbind(actor=actor_of(request), binding=binding)
    messages.success(request, f"Namespace {binding.namespace} unbound.")
    return redirect("scheduling:namespaces")
