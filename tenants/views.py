"""The console: server-rendered pages over the same services and permissions as the API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from camp.units import mib_words

from . import extensions, permissions, services
from .api.views import AuditEventFilter, audit_csv_response
from .audit import audit_changes
from .forms import (
    MembershipForm,
    ProjectForm,
    QuotaForm,
    RoleForm,
    TenantForm,
    TokenForm,
    UserCreateForm,
    apply_service_errors,
)
from .models import (
    RESOURCE_LABELS,
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
from .permissions import CHANGE, CREATE, DELETE, actor_of, can, restrict
from .validators import canonical_username


def visible(request: HttpRequest, model: type[Any], **lookup: Any) -> Any:
    """The object if the user may see it, else 404 (never 403 for the invisible)."""
    return get_object_or_404(restrict(model.objects.all(), request.user), **lookup)


def _quota_rows(quota: Quota | None) -> list[dict[str, Any]]:
    """The quota table's rows as people read them: memory in GiB with thousands separators
    (the form keeps MiB, the unit it is entered in)."""
    def shown(resource: str, value: Any) -> Any:
        return mib_words(value) if value is not None and resource.endswith("_mib") else value

    return [
        {
            "label": RESOURCE_LABELS[r].removesuffix(" (MiB)"),
            "guaranteed": shown(r, getattr(quota, f"{r}_guaranteed")) if quota else None,
            "limit": shown(r, getattr(quota, f"{r}_limit")) if quota else None,
        }
        for r in RESOURCES
    ]


def _sets_gpus(quota: Quota | None) -> bool:
    """Whether the quota sets any GPU guarantee or limit: the detail pages show the quota by
    cluster only then (nothing to compare otherwise, and no usage read); the quota form always."""
    return quota is not None and bool(
        quota.gpus_guaranteed or quota.gpus_limit is not None or quota.gpus_guaranteed_all_clusters
        or quota.gpus_limit_all_clusters is not None)


def _all_cluster_rows(quota: Quota | None, tenant: Tenant, project: Project | None) -> dict[str, Any]:
    """The platform level beside the per-cluster rows: the quota across all clusters (GPUs
    guaranteed and at most; GPU memory per model class) with what is held on all clusters,
    what is left of the GPU guarantee (what is held beyond the per-cluster guarantee on each
    cluster uses it) and how the guarantee is split between the clusters now. Empty (and no
    usage aggregate) when the quota has nothing across all clusters."""
    if quota is None or (quota.gpus_limit_all_clusters is None
                         and not quota.gpus_guaranteed_all_clusters
                         and not quota.gpu_memory_mib_limits_all_clusters):
        return {"all_cluster_rows": [], "guarantee_split": {}, "guarantee_left": None}
    held = extensions.all_cluster_held(tenant.pk, project.pk if project else None)
    rows = [{"label": "GPUs", "guaranteed": quota.gpus_guaranteed_all_clusters,
             "limit": quota.gpus_limit_all_clusters, "used": held["gpus"]}]
    limits = quota.gpu_memory_mib_limits_all_clusters or {}
    for cls in sorted(set(limits) | set(held["memory"])):
        rows.append({"label": f"{cls} GPU memory (MiB)", "guaranteed": None, "limit": limits.get(cls),
                     "used": held["memory"].get(cls, 0)})
    return {"all_cluster_rows": rows, "guarantee_split": held.get("split", {}),
            "guarantee_left": held.get("guarantee_left")}


@login_required
def home(request: HttpRequest) -> HttpResponse:
    user = actor_of(request)
    tenants = restrict(Tenant.objects.all(), user).prefetch_related("projects")
    scope = permissions.scope_of(user)
    rows = []
    for tenant in tenants:
        projects = [p for p in tenant.projects.all() if permissions.can(user, "view", p)]
        rows.append({"tenant": tenant, "owner": tenant.pk in scope.owner_tenants, "projects": projects})
    memberships = Membership.objects.filter(user=user).select_related("tenant", "project")
    return render(request, "console/home.html", {"rows": rows, "memberships": memberships,
                                                 **extensions.home_context(user)})


@login_required
def tenant_detail(request: HttpRequest, tenant_name: str) -> HttpResponse:
    tenant = visible(request, Tenant, name=tenant_name)
    user = actor_of(request)
    project_form = ProjectForm(prefix="project")
    owner_form = MembershipForm(prefix="owner", roles=[(Role.TENANT_OWNER, "Tenant owner")])
    if request.method == "POST":
        try:
            if "project-name" in request.POST:
                project_form = ProjectForm(request.POST, prefix="project")
                if project_form.is_valid():
                    project = services.project_create(
                        actor=user, tenant=tenant, **project_form.cleaned_data
                    )
                    messages.success(request, f"Project {project.name} created.")
                    return redirect("console:project", tenant.name, project.name)
            elif "owner-username" in request.POST:
                # The right first, the username only then: no answer tells someone who may not
                # add owners which usernames exist (issue 30, item 8; the API does the same).
                if not can(user, CREATE, Membership(tenant=tenant, role=Role.TENANT_OWNER)):
                    raise PermissionDenied("Only platform admins and the tenant's owners add owners.")
                owner_form = MembershipForm(request.POST, prefix="owner",
                                            roles=[(Role.TENANT_OWNER, "Tenant owner")])
                if owner_form.is_valid():
                    services.membership_create(actor=user, tenant=tenant,
                                               user=owner_form.cleaned_data["username"],
                                               role=Role.TENANT_OWNER)
                    messages.success(request, "Tenant owner added.")
                    return redirect("console:tenant", tenant.name)
        except ValidationError as exc:
            apply_service_errors(project_form if "project-name" in request.POST else owner_form, exc)
    projects = restrict(Project.objects.filter(tenant=tenant), user)
    owners = Membership.objects.filter(tenant=tenant, project=None).select_related("user")
    quota = Quota.objects.filter(scope=QuotaScope.TENANT, tenant=tenant).first()
    ctx = {
        "tenant": tenant,
        "projects": projects,
        "owners": owners,
        "quota_rows": _quota_rows(quota),
        **_all_cluster_rows(quota, tenant, None),
        "guarantee_view": extensions.guarantee_view(tenant.pk) if _sets_gpus(quota) else [],
        "project_form": project_form,
        "owner_form": owner_form,
        "can_create_project": can(user, CREATE, Project(tenant=tenant)),
        "can_manage_owners": can(user, CREATE, Membership(tenant=tenant, role=Role.TENANT_OWNER)),
        "can_edit_quota": can(user, CHANGE, Quota(scope=QuotaScope.TENANT, tenant=tenant)),
        "can_view_audit": can(user, "view", AuditEvent(tenant=tenant)),
    }
    return render(request, "console/tenant.html", ctx)


def _member_picker(tenant: Tenant, project: Project) -> list[Any]:
    """The users a project's members are picked from: the tenant's active users not in the
    project yet (issue 32, finding 10). Nobody outside the tenant is listed."""
    in_project = Membership.objects.filter(project=project).values("user")
    return list(User.objects.filter(memberships__tenant=tenant, is_active=True)
                .exclude(pk__in=in_project).distinct().order_by("username"))


def _outside_tenant(request: HttpRequest, tenant: Tenant) -> str:
    """The typed username when it is none of the tenant's users and the adder has not yet
    confirmed it: the page then warns before anything is looked up, so the warning is the same
    whether or not such a user exists (no existence oracle)."""
    typed = request.POST.get("member-username", "").strip()
    if not typed or request.POST.get("member-outside_ok"):
        return ""
    known = set(Membership.objects.filter(tenant=tenant).values_list("user__username", flat=True))
    return "" if canonical_username(typed) in known or typed in known else typed


def _with_picker(form: MembershipForm) -> MembershipForm:
    widget = form.fields["username"].widget
    widget.attrs.update({"list": "tenant-users", "autocomplete": "off"})
    form.fields["username"].label = "User"
    form.fields["username"].help_text = ("Pick one of the tenant's users (start typing a name) "
                                         "or type a username.")
    return form


@login_required
def project_detail(request: HttpRequest, tenant_name: str, project_name: str) -> HttpResponse:
    project = visible(request, Project, tenant__name=tenant_name, name=project_name)
    user = actor_of(request)
    tenant = project.tenant
    grantable = [
        (r, label) for r, label in Role.choices
        if r != Role.TENANT_OWNER
        and can(user, CREATE, Membership(tenant=tenant, project=project, role=r))
    ]
    member_form = MembershipForm(prefix="member", roles=grantable,
                                 initial={"role": Role.PROJECT_MEMBER})
    picker = _member_picker(tenant, project)
    outside = ""
    if request.method == "POST":
        # The right first, the username only then (issue 30, item 8): someone who may grant
        # no role here learns nothing about which usernames exist.
        if not grantable:
            raise PermissionDenied("You may not add members to this project.")
        member_form = MembershipForm(request.POST, prefix="member", roles=grantable)
        outside = _outside_tenant(request, tenant)
        if outside:  # ask first, unbound: nothing is looked up before the adder confirms
            member_form = MembershipForm(prefix="member", roles=grantable, initial={
                "username": outside, "role": request.POST.get("member-role", Role.PROJECT_MEMBER)})
        elif member_form.is_valid():
            try:
                services.membership_create(
                    actor=user, tenant=tenant, project=project,
                    user=member_form.cleaned_data["username"], role=member_form.cleaned_data["role"],
                )
            except ValidationError as exc:
                apply_service_errors(member_form, exc)
            else:
                messages.success(request, "Member added.")
                return redirect("console:project", tenant.name, project.name)
    members = Membership.objects.filter(project=project).select_related("user")
    quota = Quota.objects.filter(scope=QuotaScope.PROJECT, project=project).first()
    ctx = {
        "tenant": tenant,
        "project": project,
        "members": [
            {"m": m, "can_change": can(user, CHANGE, m), "can_delete": can(user, DELETE, m)}
            for m in members
        ],
        "member_form": _with_picker(member_form),
        "tenant_users": picker,
        "outside_tenant": outside,
        "can_add_member": bool(grantable),
        "role_choices": grantable,
        "quota_rows": _quota_rows(quota),
        **_all_cluster_rows(quota, tenant, project),
        "guarantee_view": extensions.guarantee_view(tenant.pk, project.pk) if _sets_gpus(quota) else [],
        "can_edit_quota": can(user, CHANGE, Quota(scope=QuotaScope.PROJECT, tenant=tenant,
                                                  project=project)),
        "can_delete_project": can(user, DELETE, project),
    }
    return render(request, "console/project.html", ctx)


@login_required
@require_POST
def project_delete(request: HttpRequest, tenant_name: str, project_name: str) -> HttpResponse:
    project = visible(request, Project, tenant__name=tenant_name, name=project_name)
    services.project_delete(actor=actor_of(request), project=project)
    messages.success(request, f"Project {project_name} deleted.")
    return redirect("console:tenant", tenant_name)


@login_required
@require_POST
def membership_change(request: HttpRequest, pk: int) -> HttpResponse:
    membership = visible(request, Membership, pk=pk)
    back = _membership_page(membership)
    if request.POST.get("remove"):
        services.membership_delete(actor=actor_of(request), membership=membership)
        messages.success(request, f"Removed {membership.user.username}.")
        return back
    form = RoleForm(request.POST)
    if form.is_valid():
        try:
            services.membership_update(actor=actor_of(request), membership=membership,
                                       role=form.cleaned_data["role"])
            messages.success(request, f"{membership.user.username} is now {membership.get_role_display()}.")
        except ValidationError as exc:
            messages.error(request, "; ".join(exc.messages))
    else:
        messages.error(request, "Choose a valid role.")
    return back


def _membership_page(membership: Membership) -> HttpResponse:
    if membership.project is not None:
        return redirect("console:project", membership.tenant.name, membership.project.name)
    return redirect("console:tenant", membership.tenant.name)


def _quota_edit(
    request: HttpRequest, *, scope: str, title: str, back: HttpResponse, **target: Any
) -> HttpResponse:
    existing = Quota.objects.filter(scope=scope, **target).first()
    probe = existing or Quota(scope=scope, **target)
    if not can(request.user, CHANGE if existing else CREATE, probe):
        raise PermissionDenied
    # A new quota starts from zero guarantees and no limits, so the form submits as is.
    form = QuotaForm(request.POST or None, instance=Quota(**{
        f: getattr(probe, f) for f in QuotaForm.Meta.fields}) if existing else None,
        initial=None if existing else {f: 0 for f in QuotaForm.Meta.fields if f.endswith("_guaranteed")},
        scope=scope)
    if request.method == "POST" and form.is_valid():
        try:
            services.quota_set(actor=actor_of(request), scope=scope, values=form.cleaned_data, **target)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, "Quota saved.")
            # Guarantees the clusters cannot honour, flagged where they are set (issue 29).
            for line in extensions.guarantee_warnings(target["tenant"].pk if "tenant" in target else None):
                messages.warning(request, f"This guarantee cannot be honoured: {line}")
            return back
    # Per cluster and across all clusters: what can be given beside what is set (issue 32).
    view = (extensions.guarantee_view(target["tenant"].pk,
                                      target["project"].pk if "project" in target else None)
            if "tenant" in target else [])
    return render(request, "console/quota_form.html", {
        "form": form, "title": title, "guarantee_view": view, "project": target.get("project"),
        "guarantee_warnings": extensions.guarantee_warnings(
            target["tenant"].pk if "tenant" in target else None)})


@login_required
def tenant_quota(request: HttpRequest, tenant_name: str) -> HttpResponse:
    tenant = visible(request, Tenant, name=tenant_name)
    return _quota_edit(request, scope=QuotaScope.TENANT, tenant=tenant,
                       title=f"Quota of tenant {tenant}",
                       back=redirect("console:tenant", tenant.name))


@login_required
def project_quota(request: HttpRequest, tenant_name: str, project_name: str) -> HttpResponse:
    project = visible(request, Project, tenant__name=tenant_name, name=project_name)
    return _quota_edit(request, scope=QuotaScope.PROJECT, tenant=project.tenant, project=project,
                       title=f"Quota of project {project}",
                       back=redirect("console:project", project.tenant.name, project.name))


@login_required
def cluster_quota(request: HttpRequest, cluster_name: str) -> HttpResponse:
    cluster = get_object_or_404(
        restrict(extensions.cluster_model()._default_manager.all(), request.user), name=cluster_name)
    return _quota_edit(request, scope=QuotaScope.CLUSTER, cluster=cluster,
                       title=f"Quota of cluster {cluster}", back=redirect("console:admin-tenants"))


@login_required
def audit_log(request: HttpRequest) -> HttpResponseBase:
    events: QuerySet[AuditEvent] = restrict(AuditEvent.objects.all(), request.user)
    if not permissions.scope_of(request.user).platform_admin and not permissions.scope_of(
        request.user
    ).owner_tenants:
        raise PermissionDenied("The audit log is read by tenant owners and platform admins; "
                               "your tenant owner can look up a change for you.")
    filterset = AuditEventFilter(request.GET, queryset=events)
    # Invalid filters show their errors and no rows, rather than silently everything.
    events = filterset.qs if filterset.is_valid() else events.none()
    if request.GET.get("format") == "csv":
        return audit_csv_response(events.order_by("id"))
    page = Paginator(events.order_by("-id"), 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    changes = audit_changes(page.object_list)
    return render(request, "console/audit.html", {
        "page": page, "filterset": filterset, "query": query.urlencode(),
        "rows": [(e, changes.get(e.pk, [])) for e in page.object_list],
        # The action picker: the actions this reader's events have (an indexed column).
        "actions": list(restrict(AuditEvent.objects.all(), request.user).order_by("action")
                        .values_list("action", flat=True).distinct()),
        "time_zone": timezone.get_current_timezone_name(),
        "tenants": restrict(Tenant.objects.all(), request.user).filter(
            pk__in=permissions.scope_of(request.user).owner_tenants
        ) if not permissions.scope_of(request.user).platform_admin else Tenant.objects.all(),
    })


@login_required
def tokens(request: HttpRequest) -> HttpResponse:
    user = actor_of(request)
    projects = restrict(Project.objects.select_related("tenant"), user)
    form = TokenForm(request.POST or None, projects=projects)
    created: str | None = None
    if request.method == "POST" and form.is_valid():
        days = form.cleaned_data.get("expires_in_days")
        try:
            _token, created = services.token_create(
                actor=user, name=form.cleaned_data["name"], project=form.cleaned_data["project"],
                read_only=form.cleaned_data["read_only"],
                expires_at=timezone.now() + timedelta(days=days) if days else None,
            )
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            form = TokenForm(projects=projects)
    own = ApiToken.objects.filter(user=user).select_related("project__tenant")
    response = render(request, "console/tokens.html", {"form": form, "tokens": own, "created": created,
                                                       "now": timezone.now()})
    if created:
        response["Cache-Control"] = "no-store"  # the secret must not linger in caches
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=pk, user=actor_of(request))
    services.token_revoke(actor=actor_of(request), token=token)
    messages.success(request, f"Token {token.name} revoked.")
    return redirect("console:tokens")


def _require_platform_admin(request: HttpRequest) -> None:
    if not permissions.scope_of(request.user).platform_admin:
        # Admin pages are not objects of any tenant: hide them entirely.
        from django.http import Http404

        raise Http404


@login_required
def admin_tenants(request: HttpRequest) -> HttpResponse:
    _require_platform_admin(request)
    form = TenantForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            tenant = services.tenant_create(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Tenant {tenant.name} created.")
            return redirect("console:tenant", tenant.name)
    clusters = [
        {"cluster": c, "quota_rows": _quota_rows(Quota.objects.filter(cluster_id=c.pk).first())}
        for c in restrict(extensions.cluster_model()._default_manager.all(), request.user)
    ]
    return render(request, "console/admin_tenants.html", {
        "form": form, "tenants": Tenant.objects.prefetch_related("projects"), "clusters": clusters,
    })


@login_required
def admin_users(request: HttpRequest) -> HttpResponse:
    _require_platform_admin(request)
    form = UserCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            created = services.user_create(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"User {created.username} created.")
            return redirect("console:admin-users")
    users = Paginator(User.objects.order_by("username"), 100).get_page(request.GET.get("page"))
    return render(request, "console/admin_users.html", {"form": form, "users": users})


@login_required
@require_POST
def admin_user_toggle(request: HttpRequest, pk: int) -> HttpResponse:
    _require_platform_admin(request)
    target = get_object_or_404(User, pk=pk)
    field = request.POST.get("field")
    if field not in ("is_active", "is_platform_admin"):
        messages.error(request, "Unknown setting.")
        return redirect("console:admin-users")
    try:
        services.user_update(actor=actor_of(request), user=target, **{field: not getattr(target, field)})
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"{target.username} updated.")
    return redirect("console:admin-users")
