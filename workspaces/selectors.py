"""Reads for workloads: policies, lists for views, logs and "why is it waiting"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import F, QuerySet, Window
from django.db.models.functions import RowNumber

from scheduling.backends import backend_for
from scheduling.backends.base import BackendError
from scheduling.models import Job, PodLogTail
from scheduling.services import namespace_spec
from tenants.models import Project
from tenants.permissions import CHANGE, VIEW, can, restrict

from .models import (
    DevEnvironment,
    EnvKind,
    ModelService,
    ServiceReplica,
    SshKey,
    TrainingJob,
    WorkspacePolicy,
)


def policy_for(project: Project) -> WorkspacePolicy:
    """The project's policy, or an unsaved one with the defaults."""
    policy = WorkspacePolicy.objects.filter(project=project).first()
    if policy is None:
        policy = WorkspacePolicy(project=project, tenant_id=project.tenant_id,
                                 idle_minutes=getattr(settings, "WORKSPACES_IDLE_MINUTES", 60))
    return policy


def environment_list(*, user: Any) -> QuerySet[DevEnvironment]:
    return restrict(DevEnvironment.objects.all(), user).select_related(
        "tenant", "project", "owner", "cluster", "job", "image", "profile")


def training_list(*, user: Any) -> QuerySet[TrainingJob]:
    return restrict(TrainingJob.objects.all(), user).select_related(
        "tenant", "project", "owner", "cluster", "job__cluster", "image")


def floating_trainings_on(cluster: Any) -> list[tuple[Any, int]]:
    """Training jobs launched for any cluster with a run — the current one or an earlier one
    (``<name>`` or ``<name[:30]>-retryN``, services/training.py) — on ``cluster`` (a cluster
    user, scheduling/extensions.py): deleting the cluster would delete those runs, their history
    and what restarts and lost GPU time are counted from, so it is refused while they exist.
    (A job that merely shares the retry-name pattern also counts: that errs on refusing.)"""
    from django.db.models import Exists, OuterRef, Q, Value
    from django.db.models.functions import Concat, Left

    runs = Job.objects.filter(cluster=cluster, project=OuterRef("project")).filter(
        Q(name=OuterRef("name")) | Q(name__startswith=Concat(Left(OuterRef("name"), 30), Value("-retry"))))
    n = TrainingJob.objects.filter(cluster__isnull=True).filter(Exists(runs)).count()
    return [(TrainingJob._meta, n)]


# --- how to open ------------------------------------------------------------------------


# Where Camp itself answers for the web apps of workloads on a simulated cluster (the demo).
SIMULATED_APPS_PREFIX = "/workspaces/simulated"


def workspace_base_url(cluster: Any = None) -> str:
    """Where a workload's web apps (JupyterLab, TensorBoard) open: the workspaces host that
    the ingress serves. A simulated cluster runs no container, so nothing would answer
    there: its links lead to Camp's own page under ``SIMULATED_APPS_PREFIX``, which says
    what would open on a real cluster and counts as activity (issue 32)."""
    from scheduling.models import Backend

    if cluster is not None and cluster.backend == Backend.SIMULATED:
        return getattr(settings, "CAMP_URL", "http://localhost:8000").rstrip("/") + SIMULATED_APPS_PREFIX
    return getattr(settings, "WORKSPACES_URL", "https://workspaces.camp.local").rstrip("/")


def environment_path(env: DevEnvironment) -> str:
    return f"/ws/{env.slug}/"


def environment_url(env: DevEnvironment) -> str:
    return workspace_base_url(env.cluster) + environment_path(env)


def tensorboard_url(t: TrainingJob) -> str:
    """The training job's TensorBoard, or "" when it writes no event files."""
    from .pods import tensorboard_path

    return workspace_base_url(t.run_cluster) + tensorboard_path(t) if t.log_dir else ""


def simulated_app(path: str) -> tuple[str, str]:
    """(kind, slug) of a link under ``SIMULATED_APPS_PREFIX``, kind "ws" or "tb"."""
    kind, _, slug = path.strip("/").partition("/")
    return kind, slug.split("/", 1)[0]


def ssh_command(env: DevEnvironment) -> str:
    """SSH goes through the platform's bastion (ProxyJump) to the environment's Service."""
    gateway = getattr(settings, "WORKSPACES_SSH_GATEWAY", "ssh.camp.local")
    ns = namespace_spec_for(env)
    return f"ssh -J {env.owner.get_username()}@{gateway} camp@{env.service_name}.{ns}.svc.cluster.local"


def namespace_spec_for(env: DevEnvironment | TrainingJob) -> str:
    """The project's namespace on the workload's cluster (a floating training job's: its run's;
    empty while that run waits in the global queue: it has no namespace anywhere yet)."""
    from scheduling.selectors import project_namespace_name

    cluster = env.run_cluster if isinstance(env, TrainingJob) else env.cluster
    return project_namespace_name(cluster=cluster, project=env.project) if cluster is not None else ""


def authorized_keys(env: DevEnvironment) -> str:
    """An SSH environment's ``authorized_keys``: its owner's stored keys, then the keys
    given for this environment (each once)."""
    stored = SshKey.objects.filter(user_id=env.owner_id).order_by("id")
    lines = list(stored.values_list("public_key", flat=True))
    lines += [line for line in env.ssh_public_keys.splitlines() if line.strip()]
    seen: set[str] = set()
    out = []
    for line in lines:
        key = " ".join(line.split()[:2])  # the same key with another comment is the same key
        if key not in seen:
            seen.add(key)
            out.append(line)
    return "\n".join(out) + "\n"


def ssh_key_list(*, user: Any) -> QuerySet[SshKey]:
    return restrict(SshKey.objects.select_related("user"), user).order_by("user__username", "name", "id")


def environment_reachable(env: DevEnvironment) -> bool:
    """May a request through the environment's URL reach it now? Links and cookies act as
    the owner, so the owner must still be active and allowed to see it, and it must run.
    Asked on every request the ingress forwards, so losing access takes effect at once."""
    owner = env.owner
    return (
        owner.is_active
        and can(owner, VIEW, env)
        and env.state == "running"
    )


def env_values_visible(user: Any, obj: DevEnvironment | TrainingJob | ModelService) -> bool:
    """Environment variables often carry secrets: their values are for whoever may change
    the workload (its owner, project admins and above); others see the names only."""
    return can(user, CHANGE, obj)


ENV_MASK = "********"


def env_for(user: Any, obj: DevEnvironment | TrainingJob | ModelService) -> dict[str, str]:
    env = dict(obj.env or {})
    if env_values_visible(user, obj):
        return env
    return dict.fromkeys(env, ENV_MASK)


def how_to_open(env: DevEnvironment) -> dict[str, str]:
    if env.kind == EnvKind.SSH:
        return {"ssh": ssh_command(env)}
    return {"url": environment_url(env),
            "note": "Open it from the portal or ask the API for a fresh link (POST …/open/): "
                    "each link carries a new one-time token."}


# --- logs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PodLog:
    pod: str
    role: str
    text: str


def _last_lines(text: str, n: int) -> str:
    return "\n".join(text.splitlines()[-n:]) if n > 0 else ""


def job_logs(job: Job | None, *, tail: int = 200, pod: str = "") -> list[PodLog]:
    """The last ``tail`` lines of each pod of the job's current run, read from the cluster;
    a pod that is gone (and every pod once the run is over) answers with the tail Camp kept
    when it was stopped (``PodLogTail``: its latest attempt's)."""
    if job is None:
        return []
    allocs = list(job.allocations.select_related("group").order_by("group_id", "replica"))
    kept = {t.pod_name: t for t in PodLogTail.objects.filter(
        job=job, attempt=job.attempts).order_by("pod_name")}
    if pod:
        allocs = [a for a in allocs if a.pod_name == pod]
        kept = {k: v for k, v in kept.items() if k == pod}
    if not allocs:
        return [PodLog(pod=t.pod_name, role=t.role, text=_last_lines(t.text, tail)) for t in kept.values()]
    backend = backend_for(job.placed_cluster)
    ns = namespace_spec(job, job.placed_cluster).name
    out = []
    silent = ""  # the cluster did not answer: the other pods' logs are not asked for either
    for a in allocs:
        if silent:
            text = silent
        else:
            try:
                text = backend.pod_logs(ns, a.pod_name, tail_lines=tail)
            except BackendError as exc:
                text = f"(logs unavailable: {exc})"
                if exc.unreachable or exc.retryable:
                    silent = text
        if not text and a.pod_name in kept:
            text = _last_lines(kept[a.pod_name].text, tail)
        out.append(PodLog(pod=a.pod_name, role=a.group.name, text=text))
    return out


# --- why --------------------------------------------------------------------------------

_HINTS = {
    "quota": "It starts when the project's (or tenant's) usage drops below its limit — when "
             "another of its jobs ends — or when an admin raises the limit.",
    "capacity": "It starts when enough GPUs free up (running jobs end), or sooner with a smaller "
                "request (fewer GPUs, a fractional slice, fewer workers).",
    "behind": "Jobs ahead of it in its project's queue go first; it moves up as they start.",
    "preempting": "Lower-priority jobs are being stopped for it; it starts once their GPUs are released.",
    "never-fits": "It can never run as asked: no node is large enough; a job asking less per pod could.",
    "over-limit": "It asks more than a quota limit allows: a smaller job, or a larger limit, could run.",
    "guarantee": "It starts when the project's (or tenant's) other non-preemptible work ends, or "
                 "when a tenant owner raises the guarantee.",
    "over-guarantee": "It can never run as asked: a non-preemptible job must fit within the "
                      "guarantee. A smaller job, a preemptible one, or a larger guarantee could.",
    "unknown-queue": "Its project has no queue on this cluster.",
    "cluster": "Its cluster takes no new work now (disabled, or its API server does not answer); "
               "it starts there once the cluster is enabled or answers again.",
}


NOT_YET_SEEN = ("Waiting for the next scheduling cycle: it starts the job or says here why it "
                "waits (usually within seconds).")
NOT_YET_SEEN_FLOATING = "Not placed on a cluster yet (the next placement step chooses one)."
"""What a queued job's page says before any cycle or placement step has looked at it (issue 32)."""


def page_reason(job: Job) -> str:
    """The job's waiting reason as every page shows it: the scheduler's own words. One rule
    for every page (issue 29): a reason states facts (which rule, which figures) and suggests
    no action, so none a page cannot do; what would let the job start is the hint for its
    kind (``_HINTS``), worded as conditions, never as a control of the page. Before any cycle
    has looked at a queued job, it says that it waits for one (issue 32)."""
    if not job.reason and job.state == "queued":
        return NOT_YET_SEEN_FLOATING if job.floating and job.cluster_id is None else NOT_YET_SEEN
    return job.reason


def job_why(job: Job | None) -> dict[str, Any]:
    """Why a job waits, where it stands in its queue and what would let it start."""
    if job is None:
        return {"state": "waiting", "reason": "Not submitted yet (waiting for its dependencies).",
                "queue_position": None, "queue_length": None, "hint": ""}
    hint = _HINTS.get(job.reason_kind, "") if job.state == "queued" else ""
    reason = page_reason(job)
    from scheduling.selectors import reason_as_of

    as_of, stale = reason_as_of(job)
    if job.floating and job.cluster_id is None and job.state == "queued":
        hint = ("It waits in the global queue: Camp places it on the cluster where it starts "
                "soonest among those it may use.")
    return {"job": job.pk, "state": job.state, "reason": reason, "reason_kind": job.reason_kind,
            "queue_position": job.queue_position, "queue_length": job.queue_length, "hint": hint,
            "why_across_clusters": job.why_across_clusters, "as_of": as_of, "stale": stale}


# --- model services (workspaces/services/serving.py) ----------------------------------------------------


def model_services(user: Any, *, project: Project | None = None) -> QuerySet[ModelService]:
    """The model services ``user`` may see (newest first), with what a list renders; the API
    and the portal's services pages share it."""
    from django.db.models import OuterRef, Subquery

    from scheduling.models import ProjectNamespace

    stored = ProjectNamespace.objects.filter(cluster=OuterRef("cluster"), project=OuterRef("project"))
    qs = restrict(ModelService.objects.all(), user).select_related(
        "tenant", "project__tenant", "cluster", "owner", "image").annotate(
        namespace_name=Subquery(stored.values("name")[:1]))
    if project is not None:
        qs = qs.filter(project=project)
    return qs.order_by("-created_at", "-id")


def service_replicas(service: ModelService, *, removed: bool = False) -> QuerySet[ServiceReplica]:
    """A service's replicas with their jobs: the live ones, or (``removed``) those removed
    or ended, newest first (scaled down, replaced by a revision, failed)."""
    qs = service.replicas.select_related("job")
    if removed:
        return qs.exclude(removed_reason="").order_by("-number")
    return qs.filter(removed_reason="").order_by("number")


def service_endpoint(service: ModelService) -> str:
    """In-cluster URL of the service (its ClusterIP Service in the project's namespace)."""
    from scheduling.backends.naming import namespace_name
    from scheduling.selectors import project_namespace_name

    if hasattr(service, "namespace_name"):  # model_services() read it with the row
        ns = getattr(service, "namespace_name", None) or namespace_name(
            service.cluster.namespace_prefix, service.project_id, service.project.name)
    else:
        ns = project_namespace_name(cluster=service.cluster, project=service.project)
    return f"http://{service.service_name}.{ns}.svc:{service.port}"


def service_external_endpoint(service: ModelService) -> str:
    """The URL callers outside the cluster use (its Ingress), or "" without one."""
    return f"http://{service.ingress_host}/" if service.ingress_host else ""


# Servers that speak OpenAI's API (vLLM's and TGI's OpenAI-compatible routes), by image name.
OPENAI_COMPATIBLE = ("vllm", "text-generation-inference")


def service_call_examples(service: ModelService) -> list[tuple[str, str]]:
    """Copyable calls of the service from outside the cluster: (label, text). The key is read
    from ``$CAMP_SERVICE_KEY``, never written into the example."""
    url = service_external_endpoint(service)
    if not url:
        return []
    auth = '-H "Authorization: Bearer $CAMP_SERVICE_KEY"'
    examples = [("curl", f"curl {auth} {url}{service.health_path.lstrip('/')}")]
    if any(name in service.image_reference for name in OPENAI_COMPATIBLE):
        from .services.serving import _model_env

        # The name the server was started with (CAMP_MODEL, as the replicas receive it).
        model = _model_env({"model_source_kind": service.model_source_kind,
                            "model_source": service.model_source})[0].get("CAMP_MODEL") or service.name
        examples.append(("curl, chat", (
            f"curl {auth} -H 'Content-Type: application/json' {url}v1/chat/completions \\\n"
            f"  -d '{{\"model\": \"{model}\", "
            '"messages": [{"role": "user", "content": "Hello"}]}\'')))
        examples.append(("Python (openai)", (
            "import os\nfrom openai import OpenAI\n\n"
            f"client = OpenAI(base_url=\"{url}v1\", api_key=os.environ[\"CAMP_SERVICE_KEY\"])\n"
            f"reply = client.chat.completions.create(model=\"{model}\", "
            "messages=[{\"role\": \"user\", \"content\": \"Hello\"}])\n"
            "print(reply.choices[0].message.content)")))
    return examples


def service_companions(service: ModelService) -> list[dict[str, Any]]:
    """The companions of a service (each run beside the main server on the same node in
    every replica) with their in-cluster endpoints; env values left out."""
    base = service_endpoint(service).rsplit(":", 1)[0]  # http://<service>.<ns>.svc
    out = []
    for c in service.companions or []:
        host = base.replace(f"//{service.service_name}.", f"//{service.service_name}-{c['name']}.", 1)
        shown = {k: v for k, v in c.items() if k != "env"}
        out.append({**shown, "endpoint": f"{host}:{c.get('port', 8001)}"})
    return out


# --- the portal's services pages (r4servebench) --------------------------------------------------

LOAD_UNITS = {"concurrency": "concurrent requests", "rps": "requests/s", "gpu_util": "% GPU"}


def with_ready_now(qs: QuerySet[ModelService]) -> QuerySet[ModelService]:
    """``ready_now``: replicas ready at this moment, as ``services.serving._set_status`` counts
    them (running, with pods, none of them not Ready); ``ready_replicas`` is the count the
    autoscaler last stored, up to one beat old."""
    from django.db.models import Count, Exists, IntegerField, OuterRef, Subquery
    from django.db.models.functions import Coalesce

    from scheduling.models import Allocation, JobState

    pods = Allocation.objects.filter(job=OuterRef("job"))
    ready = (ServiceReplica.objects.filter(service=OuterRef("pk"), removed_reason="",
                                           job__state=JobState.RUNNING)
             .filter(Exists(pods)).exclude(Exists(pods.filter(ready=False)))
             .order_by().values("service").annotate(n=Count("pk")).values("n"))
    return qs.annotate(ready_now=Coalesce(Subquery(ready, output_field=IntegerField()), 0))


@dataclass(frozen=True)
class ServiceEvent:
    """One thing that happened to a service, in words: scaled up or down (by whom, why), created,
    rolled out, or a replica that preempted other jobs (named only where the reader may see them)."""

    at: Any
    kind: str  # "up" | "down" | "created" | "rollout" | "preempted"
    text: str


def _scaled_text(ev: Any) -> tuple[str, str]:
    before = (ev.before or {}).get("desired_replicas")
    after = (ev.after or {}).get("desired_replicas")
    who = ev.actor_username or "someone"
    if before is None or after is None or before == after:
        bounds = ev.after or {}
        return "up", (f"Scaling changed by {who}: {bounds.get('min_replicas', '?')}–"
                      f"{bounds.get('max_replicas', '?')} replicas")
    kind = "up" if after > before else "down"
    words = f"Scaled {kind} {before} → {after}"
    load = (ev.after or {}).get("load")
    if who == "autoscaler" and load is not None:
        return kind, f"{words} by the autoscaler (load {load:g})"
    return kind, f"{words} by {who}"


def service_events(services: list[ModelService], user: Any, *, per_service: int = 5,
                   ) -> dict[int, list[ServiceEvent]]:
    """The latest events of each service (newest first), in three queries whatever the number
    of services: its audit events (created, scaled, rolled out) and its replicas' preemptions.
    A victim is named when ``user`` may see it; the others are counted."""
    from scheduling.models import DecisionKind, SchedulingDecision
    from tenants.models import AuditEvent

    if not services:
        return {}
    ids = [s.pk for s in services]
    out: dict[int, list[ServiceEvent]] = {pk: [] for pk in ids}
    # The latest per_service of EACH service (a window per target), so a busy service's many
    # scalings never crowd a quiet one's events off the page.
    audit = (AuditEvent.objects.filter(
        target_type=ModelService._meta.label_lower, target_id__in=[str(pk) for pk in ids],
        action__in=["service.created", "service.scaled", "service.rolled_out"])
        .annotate(nth=Window(RowNumber(), partition_by=[F("target_id")],
                             order_by=[F("created_at").desc(), F("id").desc()]))
        .filter(nth__lte=per_service)
        .only("created_at", "actor_username", "action", "target_id", "before", "after")
        .order_by("-created_at", "-id"))
    for ev in audit:
        if ev.action == "service.scaled":
            kind, text = _scaled_text(ev)
        elif ev.action == "service.created":
            kind, text = "created", f"Created by {ev.actor_username or 'someone'}"
        else:
            revision = (ev.after or {}).get("revision", "")
            kind, text = "rollout", f"Rolled out revision {revision} by {ev.actor_username or 'someone'}"
        out[int(ev.target_id)].append(ServiceEvent(ev.created_at, kind, text))
    decisions = list(SchedulingDecision.objects.filter(
        kind=DecisionKind.PREEMPTING, job__service_replica__service__in=ids)
        .annotate(nth=Window(RowNumber(), partition_by=[F("job__service_replica__service")],
                             order_by=[F("created_at").desc(), F("id").desc()]))
        .filter(nth__lte=per_service)
        .select_related("job__service_replica").order_by("-created_at", "-id"))
    victim_ids = {int(v) for d in decisions for v in (d.victims or [])}
    visible = dict(restrict(Job.objects.filter(pk__in=victim_ids), user).values_list("pk", "name"))
    for d in decisions:
        replica = d.job.service_replica  # type: ignore[attr-defined]
        victims = [int(v) for v in (d.victims or [])]
        named = [visible[v] for v in victims if v in visible]
        hidden = len(victims) - len(named)
        whom = ", ".join(named + ([f"{hidden} job{'s' if hidden > 1 else ''} you cannot see"]
                                  if hidden else []))
        out[replica.service_id].append(ServiceEvent(
            d.created_at, "preempted", f"Replica {replica.number} preempted {whom or 'nobody'}"))
    for pk, events in out.items():
        events.sort(key=lambda e: e.at, reverse=True)
        out[pk] = events[:per_service]
    return out
