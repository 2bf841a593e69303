"""Console pages for workloads (same services and permissions as the API; objects
outside a user's reach are 404), and the auth endpoint the ingress asks before every
request to an environment URL."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core import signing
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from scheduling.models import Backend, Cluster
from tenants.forms import apply_service_errors
from tenants.permissions import CHANGE, CREATE, DELETE, actor_of, can, restrict

from . import presets, selectors, services
from .filters import ServiceListFilter
from .forms import EnvironmentForm, PolicyForm, PresetForm, ScaleForm, ServiceForm, SshKeyForm, TrainingForm
from .models import DevEnvironment, ModelService, Profile, SshKey, TrainingJob

COOKIE_MAX_AGE = 12 * 3600


def _cards(form: Any, request: HttpRequest) -> list[presets.PresetCard]:
    """The form's presets as cards, with what is free now on each cluster it offers."""
    fields: Any = form.fields
    return presets.preset_cards(fields["profile"].queryset, fields["cluster"].queryset, request.user)


@login_required
def environment_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.environment_list(user=request.user), 50).get_page(request.GET.get("page"))
    return render(request, "workspaces/environments.html", {"page": page})


@login_required
def environment_new(request: HttpRequest) -> HttpResponseBase:
    form = EnvironmentForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            env, token = services.environment_launch(actor=actor_of(request), **data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Environment {env.name} queued.")
            return redirect("workspaces:environment", pk=env.pk)
    return render(request, "workspaces/environment_form.html", {"form": form, "cards": _cards(form, request)})


@login_required
def environment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    env = get_object_or_404(selectors.environment_list(user=request.user), pk=pk)
    return render(
        request,
        "workspaces/environment.html",
        {
            "env": env,
            "open": selectors.how_to_open(env),
            "why": selectors.job_why(env.job),
            "logs": selectors.job_logs(env.job, tail=100),
            "is_owner": env.owner_id == request.user.pk,
            "can_change": can(request.user, CHANGE, env),
            "can_delete": can(request.user, DELETE, env),
        },
    )


@login_required
@require_POST
def environment_action(request: HttpRequest, pk: int, op: str) -> HttpResponseBase:
    env = get_object_or_404(restrict(DevEnvironment.objects.all(), request.user), pk=pk)
    actor = actor_of(request)
    try:
        if op == "open":
            return redirect(services.environment_open(actor=actor, env=env))
        if op == "stop":
            services.environment_stop(actor=actor, env=env)
        elif op == "start":
            services.environment_start(actor=actor, env=env)
        elif op == "delete":
            services.environment_delete(actor=actor, env=env)
            messages.success(request, f"Environment {env.name} deleted with its home volume.")
            return redirect("workspaces:environments")
        else:
            raise PermissionDenied
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Environment {env.name}: {op} requested.")
    return redirect("workspaces:environment", pk=env.pk)


COOKIE_SALT = "camp-workspace"


def _cookie_secure(request: HttpRequest) -> bool:
    # Behind the ingress the auth subrequest often arrives over plain HTTP, so whether the
    # browser-facing cookie is Secure follows the deployment (True in production).
    return bool(getattr(settings, "WORKSPACES_COOKIE_SECURE", settings.SESSION_COOKIE_SECURE)
                or request.is_secure())


@never_cache
def environment_auth(request: HttpRequest, pk: int) -> HttpResponse:
    """200 lets the request through to the environment, 401 refuses it.

    First, always: the owner is active and may still see the environment, and it runs
    (links and cookies act as the owner). Then one of: the link's one-time token, spent on
    first use (within ``WORKSPACES_LINK_TTL_SECONDS``) for a signed, HttpOnly cookie scoped
    to the environment's path and bound to its current nonce (a new link, a stop or the
    end of the run replaces the nonce); that cookie; or a portal session of the owner.
    Each accepted request counts as activity."""
    env = DevEnvironment.objects.select_related("owner", "job").filter(pk=pk).first()
    if env is None or not selectors.environment_reachable(env):
        return HttpResponse(status=401)
    cookie_name = f"camp_ws_{env.pk}"
    original = request.headers.get("X-Original-URI", "")
    token = (parse_qs(urlsplit(original).query).get("camp_token") or [""])[0]
    response = HttpResponse(status=200)
    nonce = services.environment_link_redeem(env_id=env.pk, token=token) if token else None
    if nonce:
        value = signing.dumps({"env": env.pk, "nonce": nonce}, salt=COOKIE_SALT)
        response.set_cookie(
            cookie_name,
            value,
            max_age=COOKIE_MAX_AGE,
            path=selectors.environment_path(env),
            secure=_cookie_secure(request),
            httponly=True,
            samesite="Lax",
        )
    elif not _cookie_ok(request.COOKIES.get(cookie_name, ""), env) and not (
        request.user.is_authenticated and request.user.pk == env.owner_id
    ):
        return HttpResponse(status=401)
    if env.last_activity_at is None or (timezone.now() - env.last_activity_at).total_seconds() > 60:
        services.environment_touch(env_id=env.pk)
    return response


def _cookie_ok(value: str, env: DevEnvironment) -> bool:
    if not value or not env.access_nonce:
        return False
    try:
        data = signing.loads(value, salt=COOKIE_SALT, max_age=COOKIE_MAX_AGE)
    except signing.BadSignature:
        return False
    if not isinstance(data, dict) or data.get("env") != env.pk:
        return False
    return secrets.compare_digest(str(data.get("nonce", "")), env.access_nonce)


@login_required
def training_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(selectors.training_list(user=request.user), 50).get_page(request.GET.get("page"))
    return render(request, "workspaces/trainings.html", {"page": page})


@login_required
def training_new(request: HttpRequest) -> HttpResponseBase:
    form = TrainingForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        try:
            t = services.training_submit(actor=actor_of(request), **data)
        except ValidationError as exc:
            apply_service_errors(form, form.service_errors(exc))
        else:
            messages.success(request, f"Training job {t.name} submitted.")
            return redirect("workspaces:training", pk=t.pk)
    return render(request, "workspaces/training_form.html", {"form": form, "cards": _cards(form, request)})


@login_required
def training_detail(request: HttpRequest, pk: int) -> HttpResponse:
    t = get_object_or_404(selectors.training_list(user=request.user), pk=pk)
    why = selectors.job_why(t.job)
    if t.job is None and t.blocked_reason:
        why["reason"] = t.blocked_reason
    pods: Any = (
        t.job.allocations.select_related("node", "group").order_by("group_id", "replica") if t.job else []
    )
    return render(
        request,
        "workspaces/training.html",
        {
            "t": t,
            "why": why,
            "pods": pods,
            "logs": selectors.job_logs(t.job, tail=100),
            "checkpoints": t.checkpoints.all()[:20],
            "depends_on": t.depends_on.all(),
            "tensorboard": selectors.tensorboard_url(t),
            "can_stop": t.state in ("waiting", "queued", "starting", "running")
            and can(request.user, CHANGE, t),
        },
    )


@login_required
@require_POST
def training_stop(request: HttpRequest, pk: int) -> HttpResponseBase:
    t = get_object_or_404(restrict(TrainingJob.objects.all(), request.user), pk=pk)
    try:
        services.training_stop(actor=actor_of(request), training=t)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Training job {t.name} stopped.")
    return redirect("workspaces:training", pk=t.pk)


@login_required
def policy_edit(request: HttpRequest, project_id: int) -> HttpResponseBase:
    from tenants.models import Project

    project = get_object_or_404(
        restrict(Project.objects.select_related("tenant"), request.user), pk=project_id
    )
    policy = selectors.policy_for(project)
    form = PolicyForm(request.POST or None, instance=policy)
    if request.method == "POST" and form.is_valid():
        try:
            services.workspace_policy_set(
                actor=actor_of(request),
                project=project,
                **{k: form.cleaned_data[k] for k in PolicyForm.Meta.fields},
            )
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Workspace policy of {project} saved.")
            return redirect("workspaces:policy", project_id=project.pk)
    return render(
        request,
        "workspaces/policy.html",
        {"form": form, "project": project, "can_change": can(request.user, CHANGE, policy)},
    )


@login_required
def profile_list(request: HttpRequest) -> HttpResponse:
    profiles = restrict(
        Profile.objects.select_related("image").prefetch_related("tenants", "projects"), request.user
    )
    cards = {c.profile.pk: c for c in presets.preset_cards(
        profiles, restrict(Cluster.objects.filter(enabled=True), request.user), request.user)}
    return render(request, "workspaces/profiles.html", {
        "rows": [(p, cards[p.pk]) for p in profiles],
        "can_edit": can(request.user, CREATE, Profile())})


@login_required
def preset_edit(request: HttpRequest, pk: int | None = None) -> HttpResponseBase:
    """Platform admins define compute presets here (or through /api/v1/profiles/)."""
    profile = get_object_or_404(Profile, pk=pk) if pk else None
    if not can(request.user, CHANGE if profile else CREATE, profile or Profile()):
        raise PermissionDenied
    form = PresetForm(request.POST or None, instance=profile)
    if request.method == "POST" and form.is_valid():
        data = dict(form.cleaned_data)
        tenants, projects = list(data.pop("tenants")), list(data.pop("projects"))
        try:
            if profile is None:
                profile = services.profile_create(actor=actor_of(request), tenants=tenants,
                                                  projects=projects, **data)
            else:
                # the form's instance already holds the new values; compare against the stored row
                stored = Profile.objects.get(pk=profile.pk)
                profile = services.profile_update(actor=actor_of(request), profile=stored,
                                                  tenants=tenants, projects=projects, **data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Preset {profile} saved.")
            return redirect("workspaces:profiles")
    return render(request, "workspaces/preset_form.html", {"form": form, "profile": profile})


@login_required
def ssh_keys(request: HttpRequest) -> HttpResponse:
    """Your SSH public keys (platform admins also see everyone's)."""
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key = services.ssh_key_add(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"SSH key {key.name} added ({key.fingerprint}).")
            return redirect("workspaces:ssh-keys")
    keys = selectors.ssh_key_list(user=request.user)
    return render(request, "workspaces/ssh_keys.html", {
        "form": form,
        "own": [k for k in keys if k.user_id == request.user.pk],
        "others": [k for k in keys if k.user_id != request.user.pk],
    })


@login_required
@require_POST
def ssh_key_delete(request: HttpRequest, pk: int) -> HttpResponseBase:
    key = get_object_or_404(restrict(SshKey.objects.all(), request.user), pk=pk)
    services.ssh_key_delete(actor=actor_of(request), key=key)
    messages.success(request, f"SSH key {key.name} removed.")
    return redirect("workspaces:ssh-keys")


# --- model services (issue 15): list, launch form, detail, scale, delete ----------------------


@login_required
def service_list(request: HttpRequest) -> HttpResponse:
    """The services the reader may see: replicas desired/ready, load, revision, endpoint and
    the latest events (scaled up/down, preempted whom), with search, filters and pages."""
    base = selectors.with_ready_now(selectors.model_services(request.user))
    f = ServiceListFilter(request.GET or None, queryset=base, request=request)
    # an unreadable filter lists nothing and says which one (never "everything")
    qs = base if not f.is_bound else f.qs if f.is_valid() else base.none()
    page = Paginator(qs, 25).get_page(request.GET.get("page"))
    shown = list(page)
    events = selectors.service_events(shown, request.user, per_service=3)
    card_mib = presets.card_memory()
    params = request.GET.copy()
    params.pop("page", None)
    return render(request, "workspaces/services.html", {
        "page": page, "filter": f, "query": params.urlencode(), "count": page.paginator.count,
        "rows": [{"svc": s, "endpoint": selectors.service_endpoint(s), "events": events[s.pk],
                  "unit": selectors.LOAD_UNITS.get(s.autoscale_metric, ""),
                  "shape": presets.shape_card(s, card_mib)} for s in shown]})


@login_required
def service_list_live(request: HttpRequest) -> JsonResponse:
    """The services pages' polling fallback (static/live.js): the live fields of the services
    ``ids`` (at most 200, only those the reader may see) in one request. Pushed changes arrive
    over /ws/live/ with the same payload."""
    from portal.live import service_payload

    ids = [int(x) for x in request.GET.get("ids", "").split(",") if x.isdigit()][:200]
    rows = selectors.with_ready_now(selectors.model_services(request.user).filter(pk__in=ids)) if ids else []
    return JsonResponse({"services": [service_payload(s) for s in rows]})


@login_required
def service_new(request: HttpRequest) -> HttpResponseBase:
    form = ServiceForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            svc = services.model_service_create(actor=actor_of(request), **form.service_fields())
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            n = svc.desired_replicas
            messages.success(request, f"Model service {svc.name} created; {n} replica{'s' if n != 1 else ''} "
                                      "queued.")
            return redirect("workspaces:service", pk=svc.pk)
    return render(request, "workspaces/service_form.html", {"form": form, "cards": _cards(form, request)})


@login_required
def service_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return _service_page(request, pk)


@login_required
@require_POST
def service_api_key(request: HttpRequest, pk: int) -> HttpResponse:
    """A new API key, shown on this answer only (rendered, not redirected: a key must not
    travel in a flash message or be replayed by a reload)."""
    svc = get_object_or_404(restrict(ModelService.objects.all(), request.user), pk=pk)
    try:
        key = services.model_service_api_key_rotate(actor=actor_of(request), service=svc)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("workspaces:service", pk=svc.pk)
    response = _service_page(request, pk, api_key=key)
    response["Cache-Control"] = "no-store"
    return response


@never_cache
def service_auth(request: HttpRequest, pk: int) -> HttpResponse:
    """The Ingress of a model service asks here before every call (ingress-nginx external
    auth): 200 with the service's current API key (``Authorization: Bearer`` or
    ``X-Api-Key``), else 401."""
    svc = ModelService.objects.filter(pk=pk).only("pk", "ingress_host", "api_key_hash").first()
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        key = request.headers.get("X-Api-Key", "")
    if svc is None or not svc.ingress_host or not services.service_key_matches(svc, key.strip()):
        refused = HttpResponse(status=401)
        refused["WWW-Authenticate"] = 'Bearer realm="camp model service"'
        return refused
    return HttpResponse(status=200)


def _service_page(request: HttpRequest, pk: int, api_key: str = "") -> HttpResponse:
    svc = get_object_or_404(selectors.with_ready_now(selectors.model_services(request.user)), pk=pk)
    replicas = list(selectors.service_replicas(svc))
    return render(request, "workspaces/service.html", {
        "svc": svc,
        "api_key": api_key,
        "external": selectors.service_external_endpoint(svc),
        "examples": selectors.service_call_examples(svc),
        "simulated": svc.cluster.backend == Backend.SIMULATED,
        "endpoint": selectors.service_endpoint(svc),
        "companions": selectors.service_companions(svc),
        "unit": selectors.LOAD_UNITS.get(svc.autoscale_metric, ""),
        "shape": presets.shape_card(svc, presets.card_memory()),
        "replicas": [(r, selectors.job_why(r.job)) for r in replicas],
        "removed": selectors.service_replicas(svc, removed=True)[:10],
        "events": selectors.service_events([svc], request.user, per_service=20)[svc.pk],
        "scale_form": ScaleForm(initial={"min_replicas": svc.min_replicas, "max_replicas": svc.max_replicas}),
        "can_change": can(request.user, CHANGE, svc),
        "can_delete": can(request.user, DELETE, svc),
    })


@login_required
@require_POST
def service_scale(request: HttpRequest, pk: int) -> HttpResponseBase:
    """A fixed replica count or new autoscaler bounds, through ``model_service_scale`` (its
    permission check and audit event)."""
    svc = get_object_or_404(restrict(ModelService.objects.all(), request.user), pk=pk)
    form = ScaleForm(request.POST)
    if not form.is_valid():
        messages.error(request, " ".join(str(e) for errs in form.errors.values() for e in errs))
        return redirect("workspaces:service", pk=svc.pk)
    data = form.cleaned_data
    try:
        svc = services.model_service_scale(
            actor=actor_of(request), service=svc, replicas=data["replicas"],
            min_replicas=data["min_replicas"], max_replicas=data["max_replicas"])
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Model service {svc.name}: {svc.desired_replicas} replica"
                                  f"{'s' if svc.desired_replicas != 1 else ''} wanted "
                                  f"({svc.min_replicas}–{svc.max_replicas}).")
    return redirect("workspaces:service", pk=svc.pk)


@login_required
@require_POST
def service_delete(request: HttpRequest, pk: int) -> HttpResponseBase:
    svc = get_object_or_404(restrict(ModelService.objects.all(), request.user), pk=pk)
    try:
        services.model_service_delete(actor=actor_of(request), service=svc)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect("workspaces:service", pk=svc.pk)
    messages.success(request, f"Model service {svc.name} deleted; its replicas are stopping.")
    return redirect("workspaces:services")


@never_cache
@login_required
def simulated_app(request: HttpRequest, rest: str) -> HttpResponse:
    """What an Open or TensorBoard link of a workload on a simulated cluster lands on: no
    container runs there, so Camp says so, says what opens on a real cluster, and counts the
    visit as activity, as the ingress's auth hook does for a real notebook. Only the owner
    opens an environment (the rule of ``environment_open``); a training job's TensorBoard
    is for whoever may see the job."""
    from .services.access import environment_link_redeem

    kind, slug = selectors.simulated_app(rest)
    pk = slug.split("-", 1)[0]
    context: dict[str, Any] = {"kind": kind, "workspaces_url": selectors.workspace_base_url()}
    if kind == "ws" and pk.isdigit():
        env = get_object_or_404(selectors.environment_list(user=request.user), pk=int(pk))
        if env.cluster is None or env.cluster.backend != Backend.SIMULATED:
            raise Http404  # its link is the real one
        if env.owner_id != request.user.pk:
            raise PermissionDenied("Only its owner opens an environment.")
        token = request.GET.get("camp_token", "")
        if token and selectors.environment_reachable(env):
            environment_link_redeem(env_id=env.pk, token=token)  # spent, as on a real cluster
        if selectors.environment_reachable(env):
            services.environment_touch(env_id=env.pk)
        context.update(env=env, running=selectors.environment_reachable(env),
                       real_url=selectors.workspace_base_url() + selectors.environment_path(env))
    elif kind == "tb" and pk.isdigit():
        t = get_object_or_404(selectors.training_list(user=request.user), pk=int(pk))
        if t.run_cluster is None or t.run_cluster.backend != Backend.SIMULATED:
            raise Http404
        context.update(t=t, real_url=selectors.workspace_base_url() + f"/tb/{slug}/")
    else:
        raise Http404
    return render(request, "workspaces/simulated_app.html", context)

