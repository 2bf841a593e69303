"""Model services (issue 15): writes (``model_service_<action>``, keyword-only, explicit
``actor=``), the workload kind ``service`` and what its pods look like.

A model service is a row (``ModelService``) plus, per replica, one scheduling Job of kind
``service`` submitted through the shared kind path (workspaces/kinds.py): queueing, quotas,
preemption, fractional placement and why-pending are the scheduler's, with no second
scheduler. This module only decides *how many* replicas of *which revision* there should
be (``_converge``) and asks the queue for them or cancels them:

* scaling: ``desired_replicas`` set by ``model_service_scale`` (a person) or
  ``model_service_autoscale`` (the beat task, workspaces/serving_load.py's HPA-like rule); surplus
  replicas go not-started first, then the newest;
* rollout: a change of image, arguments, environment, model or shape is a new
  ``revision``; one new-revision replica is added at a time (only when every new one
  already runs), and an old one is removed only while the running replicas stay at
  ``desired`` or more — a service never drops below its ready count for a rollout;
* every decision is audited (``service.*``; the autoscaler's as the actor ``autoscaler``).

A replica is ready when its job is RUNNING and its pod reports Ready (the readiness probe on
the health path, read by reconcile and the watcher into ``Allocation.ready``): only ready
replicas count for a rollout and for ``ready_replicas``, as only they get the Service's
requests.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone

from registry.models import Image, Variant
from registry.services import images_for_project, pull_secret_manifest
from scheduling import services as scheduling
from scheduling.backends.base import LABEL_PROJECT_ID, LABEL_ROLE, ExtraObject, JobObjects, PodSpec
from scheduling.models import FINAL_STATES, Cluster, Job, JobState, PriorityClass, slug_validator
from tenants import permissions
from tenants.audit import snapshot
from tenants.models import Project, User

from ..kinds import WorkloadKind, kind_audit, kind_check, kind_run, register_kind
from ..models import AutoscaleMetric, ModelService, ModelSourceKind, Profile, ServiceReplica, ServiceStatus
from ..serving_load import DEFAULT_PROFILE, LoadReading, read_load, recommend
from .common import (
    _clean_cluster,
    _clean_env,
    _clean_shape,
    _resolve_image,
    enqueue_on_commit,
    refuse_unrunnable,
)
from .policies import _check_profile

logger = logging.getLogger(__name__)
AUTOSCALER = "autoscaler"  # actor_username of the platform's own scaling decisions
LABEL_SERVICE = "camp.io/service"
LABEL_REVISION = "camp.io/revision"
# r4sng: a companion's pods (a speculative-decoding draft beside the target) carry these
# instead of LABEL_SERVICE, so the service's own Service never routes requests to them.
LABEL_COMPANION_OF = "camp.io/companion-of"
LABEL_COMPANION = "camp.io/companion"
SERVER_GROUP = "server"  # the main model server's pod group in a replica job
MAX_COMPANIONS = 4
COMPANION_DEFAULTS: dict[str, Any] = {
    "image_reference": "", "model_source": "", "args": [], "env": {}, "port": 8001, "health_path": "",
    "gpu_count": 1, "gpu_memory_mib": 10240, "gpu_cores_percent": 20, "cpu_millicores": 1000, "ram_mib": 8192,
}
_COMPANION_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,14}[a-z0-9])?$")
# RFC 1123 host name (an Ingress rule's host; no wildcard, no port).
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})+$")
# Replicas run until removed; the simulated backend needs a finite duration.
REPLICA_DURATION_SECONDS = 30 * 24 * 3600
# Audited snapshot: environment values often carry secrets (HF_TOKEN), so the append-only
# log keeps their names only (``_snapshot``).
SERVICE_FIELDS = (
    "name", "cluster", "image_reference", "model_source_kind", "model_source", "port", "health_path",
    "args", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive", "gpu_models",
    "cpu_millicores", "ram_mib", "min_replicas", "max_replicas", "autoscale_metric", "autoscale_target",
    "scale_down_delay_seconds", "scale_to_zero_seconds", "load_profile", "priority_class", "preemptible",
    "revision", "desired_replicas", "ingress_host",
)
# What a replica's pods are made of: changing any of them is a new revision (a rollout).
REVISION_FIELDS = (
    "image_reference", "model_source_kind", "model_source", "port", "health_path", "args", "env",
    "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive", "gpu_models", "cpu_millicores",
    "ram_mib", "companions",
)
SCALING_FIELDS = ("min_replicas", "max_replicas", "autoscale_metric", "autoscale_target",
                  "scale_down_delay_seconds", "scale_to_zero_seconds", "load_profile")
CREATE_FIELDS = frozenset(REVISION_FIELDS + SCALING_FIELDS
                          + ("priority_class", "preemptible", "ingress_host"))
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")


# --- the workload kind ------------------------------------------------------------------------


def _groups(svc: ModelService) -> list[dict[str, Any]]:
    """One pod for the main server and one per companion (all placed on one node:
    ``_job_options``' same-node affinity)."""
    return [{
        "name": SERVER_GROUP, "replicas": 1, "gpu_count": svc.gpu_count, "gpu_memory_mib": svc.gpu_memory_mib,
        "gpu_cores_percent": svc.gpu_cores_percent, "exclusive": svc.exclusive,
        "gpu_models": list(svc.gpu_models or []), "cpu_millicores": svc.cpu_millicores,
        "ram_mib": svc.ram_mib, "image": svc.image_reference, "env": dict(svc.env or {}),
    }] + [{
        "name": c["name"], "replicas": 1, "gpu_count": c["gpu_count"], "gpu_memory_mib": c["gpu_memory_mib"],
        "gpu_cores_percent": c["gpu_cores_percent"], "exclusive": False,
        "gpu_models": list(svc.gpu_models or []), "cpu_millicores": c["cpu_millicores"],
        "ram_mib": c["ram_mib"], "image": c["image_reference"], "env": dict(c.get("env") or {}),
    } for c in svc.companions or []]


def _job_options(svc: ModelService) -> dict[str, Any]:
    options = {"priority_class": svc.priority_class, "preemptible": svc.preemptible, "gang": True,
               "duration_seconds": REPLICA_DURATION_SECONDS}
    if svc.companions:  # draft + target: one node, admitted, scaled and preempted together
        options["affinity"] = "same-node"
    return options


def _replica_of_job(job: Job) -> ServiceReplica | None:
    return (ServiceReplica.objects.filter(job=job)
            .select_related("service__tenant", "service__project", "service__image__registry").first())


def _model_env(spec: dict[str, Any]) -> tuple[dict[str, str], list[dict[str, Any]], list[dict[str, Any]]]:
    """CAMP_MODEL and, for a volume source ``<pvc>:<path>``, the read-only mount at /models."""
    kind, source = spec.get("model_source_kind"), spec.get("model_source", "")
    if kind == ModelSourceKind.VOLUME and source:
        claim, _, path = source.partition(":")
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        mount = {"name": "model", "mountPath": "/models", "readOnly": True}
        return {"CAMP_MODEL": "/models/" + path.lstrip("/")}, [volume], [mount]
    return ({"CAMP_MODEL": source} if source else {}), [], []


def service_manifest(svc: ModelService) -> dict[str, Any]:
    """The ClusterIP Service in front of every replica of ``svc`` (outlives replicas)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": svc.service_name, "labels": {
                LABEL_SERVICE: str(svc.pk), LABEL_PROJECT_ID: str(svc.project_id)}},
            "spec": {"type": "ClusterIP", "selector": {LABEL_SERVICE: str(svc.pk)},
                     "ports": [{"name": "http", "port": svc.port, "targetPort": "http"}]}}


def companion_service_name(svc: ModelService, companion: str) -> str:
    return f"{svc.service_name}-{companion}"


def companion_service_manifest(svc: ModelService, companion: str, port: int) -> dict[str, Any]:
    """The ClusterIP Service of one companion (``<service>-<companion>``): how the main server
    reaches its draft on the same node (``CAMP_COMPANION_<NAME>_URL``). Labelled
    ``camp.io/service`` like the main one, so the leftover sweep removes it too."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": companion_service_name(svc, companion), "labels": {
                LABEL_SERVICE: str(svc.pk), LABEL_PROJECT_ID: str(svc.project_id),
                LABEL_COMPANION: companion}},
            "spec": {"type": "ClusterIP",
                     "selector": {LABEL_COMPANION_OF: str(svc.pk), LABEL_COMPANION: companion},
                     "ports": [{"name": "http", "port": port, "targetPort": "http"}]}}


def ingress_manifest(svc: ModelService) -> dict[str, Any]:
    """The Ingress routing ``ingress_host`` to the service's Service (class
    ``SERVING_INGRESS_CLASS``; none set: the cluster's default class)."""
    spec: dict[str, Any] = {"rules": [{"host": svc.ingress_host, "http": {"paths": [{
        "path": "/", "pathType": "Prefix",
        "backend": {"service": {"name": svc.service_name, "port": {"number": svc.port}}}}]}}]}
    ingress_class = getattr(settings, "SERVING_INGRESS_CLASS", "")
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    # Every call is checked by Camp first (ingress-nginx external auth): the service's own
    # API key (model_service_api_key_rotate), refused until one is made.
    camp = getattr(settings, "CAMP_URL", "http://localhost:8000").rstrip("/")
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": svc.service_name, "labels": {
                LABEL_SERVICE: str(svc.pk), LABEL_PROJECT_ID: str(svc.project_id)},
                "annotations": {
                    "nginx.ingress.kubernetes.io/auth-url": f"{camp}/workspaces/services/{svc.pk}/auth/"}},
            "spec": spec}


def _companion_env_name(name: str) -> str:
    return f"CAMP_COMPANION_{name.upper().replace('-', '_')}_URL"


def _specs(replica: ServiceReplica, job: Job, ns: Any, objs: JobObjects,
           pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    svc = replica.service
    spec = replica.spec or {}
    port = int(spec.get("port", svc.port))
    env, volumes, mounts = _model_env(spec)
    env.update({"CAMP_WORKLOAD": "service", "CAMP_SERVICE": svc.name, "CAMP_REVISION": str(replica.revision),
                "PORT": str(port)})
    companions = {c["name"]: c for c in spec.get("companions", [])}
    for name, c in companions.items():
        env[_companion_env_name(name)] = (f"http://{companion_service_name(svc, name)}.{ns.name}.svc:"
                                          f"{c.get('port', COMPANION_DEFAULTS['port'])}")
    probe = {"httpGet": {"path": spec.get("health_path", svc.health_path), "port": "http"},
             "periodSeconds": 5, "failureThreshold": 3}
    extra = [*objs.extra, ExtraObject(service_manifest(svc), owned=False)]
    for name, c in companions.items():
        port_c = int(c.get("port", COMPANION_DEFAULTS["port"]))
        extra.append(ExtraObject(companion_service_manifest(svc, name, port_c), owned=False))
    if svc.ingress_host:
        extra.append(ExtraObject(ingress_manifest(svc), owned=False))
    from ..pods import _pull_secret

    secrets: dict[str, tuple[str, ...]] = {}
    for p in pods:
        if p.image in secrets:
            continue
        registry = _pull_secret(svc.project, svc.image if p.image == svc.image_reference else None, p.image)
        secrets[p.image] = ()
        if registry is not None:
            extra.append(ExtraObject(pull_secret_manifest(registry), owned=False))
            secrets[p.image] = (registry.secret_name,)
    out = []
    for p in pods:
        role = p.labels.get(LABEL_ROLE, SERVER_GROUP)
        if role in companions:
            out.append(_companion_pod(svc, replica, p, companions[role], secrets[p.image]))
            continue
        out.append(dataclasses.replace(
            p, labels={**p.labels, LABEL_SERVICE: str(svc.pk), LABEL_REVISION: str(replica.revision)},
            env={**p.env, **env}, args=tuple(str(a) for a in spec.get("args", [])),
            ports=({"name": "http", "containerPort": port},), readiness_probe=probe,
            volumes=tuple(volumes), volume_mounts=tuple(mounts), image_pull_secrets=secrets[p.image]))
    return dataclasses.replace(objs, extra=tuple(extra)), out


def _companion_pod(svc: ModelService, replica: ServiceReplica, p: PodSpec, c: dict[str, Any],
                   secrets: tuple[str, ...]) -> PodSpec:
    """A companion's pod: its own image, arguments, model, container port ``http`` and
    readiness probe (its health path, or the port accepting connections)."""
    port = int(c.get("port", COMPANION_DEFAULTS["port"]))
    env = {"CAMP_WORKLOAD": "service", "CAMP_SERVICE": svc.name, "CAMP_REVISION": str(replica.revision),
           "CAMP_COMPANION": c["name"], "PORT": str(port)}
    if c.get("model_source"):
        env["CAMP_MODEL"] = c["model_source"]
    check: dict[str, Any] = ({"httpGet": {"path": c["health_path"], "port": "http"}} if c.get("health_path")
                             else {"tcpSocket": {"port": "http"}})
    return dataclasses.replace(
        p, labels={**p.labels, LABEL_COMPANION_OF: str(svc.pk), LABEL_COMPANION: c["name"],
                   LABEL_REVISION: str(replica.revision)},
        env={**p.env, **env}, args=tuple(str(a) for a in c.get("args", [])),
        ports=({"name": "http", "containerPort": port},),
        readiness_probe={**check, "periodSeconds": 5, "failureThreshold": 3}, image_pull_secrets=secrets)


SERVICE_KIND = register_kind(WorkloadKind(
    name="service", job_kinds=(scheduling.SERVICE_JOB_KIND,),
    job_kind_of=lambda svc: scheduling.SERVICE_JOB_KIND,
    groups=_groups,
    job_options=_job_options, row_of_job=_replica_of_job, specs=_specs, check_shape=True,
    defaults={"priority_class": PriorityClass.INFERENCE, "preemptible": False},
))


def _snapshot(svc: ModelService) -> dict[str, Any]:
    companions = [{**{k: v for k, v in c.items() if k != "env"}, "env_names": sorted(c.get("env") or {})}
                  for c in svc.companions or []]
    return {**snapshot(svc, SERVICE_FIELDS), "env_names": sorted(svc.env or {}), "companions": companions}


# --- validation ---------------------------------------------------------------------------------


def _require(actor: Any, action: str, obj: ModelService) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this model service.")


def _clean_source(svc: ModelService) -> None:
    kind, source = svc.model_source_kind, (svc.model_source or "").strip()
    if kind not in ModelSourceKind.values:
        raise ValidationError({"model_source_kind": [f"Choose one of: {', '.join(ModelSourceKind.values)}."]})
    if kind == ModelSourceKind.URI and not _URI.match(source):
        raise ValidationError({"model_source": ["A URI the server can download, e.g. hf://org/model."]})
    if kind == ModelSourceKind.VOLUME:
        claim, sep, path = source.partition(":")
        try:
            slug_validator(claim)
        except ValidationError as exc:
            raise ValidationError({"model_source": ["<pvc>:<path>: a PVC of the project's namespace and "
                                                    "a path on it."]}) from exc
        if not sep or not path:
            raise ValidationError({"model_source": ["<pvc>:<path>: give the path on the volume."]})
    svc.model_source = source


def _clean_scaling(svc: ModelService) -> None:
    if svc.autoscale_metric not in AutoscaleMetric.values:
        raise ValidationError({"autoscale_metric": [f"Choose one of: {', '.join(AutoscaleMetric.values)}."]})
    if not svc.autoscale_target or not 0 < svc.autoscale_target <= 1_000_000:
        raise ValidationError({"autoscale_target": ["A positive amount per replica, at most 1,000,000."]})
    if svc.max_replicas > 64:
        raise ValidationError({"max_replicas": ["At most 64 replicas."]})
    if svc.min_replicas > svc.max_replicas:
        raise ValidationError({"min_replicas": ["At most max_replicas."]})
    if svc.min_replicas == 0 and svc.max_replicas > 0 and svc.scale_to_zero_seconds is None:
        raise ValidationError({"min_replicas": ["0 needs scale_to_zero_seconds (the idle window)."]})
    if svc.scale_to_zero_seconds is not None and svc.scale_to_zero_seconds < 60:
        raise ValidationError({"scale_to_zero_seconds": ["At least 60 seconds."]})
    profile = svc.load_profile or {}
    if not isinstance(profile, dict) or any(
            k not in DEFAULT_PROFILE or not isinstance(v, (int, float)) or v < 0 for k, v in profile.items()):
        raise ValidationError({"load_profile": [
            f"A mapping of {', '.join(DEFAULT_PROFILE)} to non-negative numbers."]})


def _clean_companion(svc: ModelService, i: int, raw: Any, taken: set[str]) -> dict[str, Any]:
    field = f"companions[{i}]"
    if not isinstance(raw, dict):
        raise ValidationError({field: ["A mapping: name, image or image_reference, model_source, args, env, "
                                       "port, health_path, gpu_count, gpu_memory_mib, gpu_cores_percent, "
                                       "cpu_millicores, ram_mib."]})
    unknown = sorted(set(raw) - set(COMPANION_DEFAULTS) - {"name", "image"})
    if unknown:
        raise ValidationError({f"{field}.{unknown[0]}": ["Unknown field."]})
    c = {**COMPANION_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    name = c.get("name")
    if not isinstance(name, str) or not _COMPANION_NAME.match(name) or name == SERVER_GROUP:
        raise ValidationError({f"{field}.name": ["A DNS label of at most 16 characters (a-z, 0-9, -), "
                                                 f"not {SERVER_GROUP!r}."]})
    if name in taken:
        raise ValidationError({f"{field}.name": [f"Another companion is named {name}."]})
    taken.add(name)
    image = c.pop("image", None)
    if image not in (None, ""):  # a catalog image: its id or name, one the project may use
        found = images_for_project(svc.project).filter(
            **({"pk": image} if isinstance(image, int) or str(image).isdigit() else {"name": image})).first()
        if found is None:
            raise ValidationError({f"{field}.image": ["This image is not available to this project."]})
        c["image_reference"] = found.reference
    try:
        _resolve_image(project=svc.project, image=None, image_reference=str(c["image_reference"] or ""),
                       variant=Variant.INFERENCE, variant_label="inference server")
    except ValidationError as exc:
        msgs = [m for ms in exc.message_dict.values() for m in ms]
        raise ValidationError({f"{field}.image_reference": msgs}) from exc
    c["image_reference"] = str(c["image_reference"]).strip()
    ints = ("port", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "cpu_millicores", "ram_mib")
    for key in ints:
        if isinstance(c[key], bool) or not isinstance(c[key], int):
            raise ValidationError({f"{field}.{key}": ["A whole number."]})
    if not 1 <= c["port"] <= 65535:
        raise ValidationError({f"{field}.port": ["A TCP port, 1 to 65535."]})
    if c["gpu_count"] > 16:
        raise ValidationError({f"{field}.gpu_count": ["At most 16."]})
    try:
        _clean_shape({**{k: c[k] for k in ints[1:]}, "exclusive": False})
    except ValidationError as exc:
        raise ValidationError({f"{field}.{k}": v for k, v in exc.message_dict.items()}) from exc
    path = c["health_path"]
    if path and (not isinstance(path, str) or not path.startswith("/") or len(path) > 200 or " " in path):
        raise ValidationError({f"{field}.health_path": ["Empty, or an HTTP path starting with /."]})
    args = c["args"]
    if not isinstance(args, list) or len(args) > 100 or not all(
            isinstance(a, (str, int, float)) and len(str(a)) <= 4096 for a in args):
        raise ValidationError({f"{field}.args": ["A list of at most 100 arguments."]})
    c["args"] = [str(a) for a in args]
    source = c["model_source"]
    if not isinstance(source, str) or len(source) > 500:
        raise ValidationError({f"{field}.model_source": [
            "A URI or a path in the image, at most 500 characters."]})
    c["env"] = _clean_env(c["env"], field=f"{field}.env")
    return c


def _clean_companions(svc: ModelService) -> None:
    raw = svc.companions if svc.companions is not None else []
    if not isinstance(raw, list):
        raise ValidationError({"companions": ["A list of companion model servers."]})
    if len(raw) > MAX_COMPANIONS:
        raise ValidationError({"companions": [f"At most {MAX_COMPANIONS} companions."]})
    taken: set[str] = set()
    svc.companions = [_clean_companion(svc, i, c, taken) for i, c in enumerate(raw)]


def _refuse_unrunnable(svc: ModelService) -> None:
    """An image (the server's or a companion's) with no variant for the cluster's nodes, or GPU
    models none of them has: a 400 on ``image``/``companions[i].image``/``gpu_models``."""
    fields = {"groups[0].image": "image" if svc.image_id else "image_reference",
              "groups[0].gpu_models": "gpu_models"}
    for i in range(len(svc.companions or [])):
        fields[f"groups[{i + 1}].image"] = f"companions[{i}].image"
        fields[f"groups[{i + 1}].gpu_models"] = "gpu_models"
    refuse_unrunnable(cluster=svc.cluster, groups=_groups(svc), project=svc.project, fields=fields)


def _refuse_companions_never_fit(svc: ModelService) -> None:
    """Each companion's slice must fit a card of the cluster, and a replica's pods together one
    node (they are placed on one node): otherwise a 400 naming the companion field, never a
    replica the scheduler would reject."""
    if not svc.companions:
        return
    from django.db.models import Max

    from scheduling.models import GpuDevice

    from ..quota import refuse_if_no_node_holds_all

    largest = GpuDevice.objects.filter(node__cluster=svc.cluster, node__present=True).aggregate(
        m=Max("memory_mib"))["m"]
    for i, c in enumerate(svc.companions):
        if largest is not None and c["gpu_memory_mib"] > largest:
            raise ValidationError({f"companions[{i}].gpu_memory_mib": [
                f"{c['gpu_memory_mib']} MiB per GPU: the largest GPU of cluster {svc.cluster} has "
                f"{largest} MiB."]})
    refuse_if_no_node_holds_all(cluster=svc.cluster, groups=_groups(svc), field="companions")


def _clean_ingress_host(svc: ModelService) -> None:
    host = (svc.ingress_host or "").strip().lower().rstrip(".")
    if host and not _HOST.match(host):
        raise ValidationError({"ingress_host": ["A DNS name such as chat.example.com (letters, digits, "
                                                "hyphens and dots; no scheme, port or path)."]})
    svc.ingress_host = host


def _clean(svc: ModelService) -> None:
    if svc.priority_class not in PriorityClass.values:
        raise ValidationError({"priority_class": [f"Choose one of: {', '.join(PriorityClass.values)}."]})
    if svc.preemptible and svc.priority_class == PriorityClass.INFERENCE:
        raise ValidationError({"preemptible": ["inference services are never preemptible; choose a lower "
                                               "priority class for a best-effort service."]})
    if not 1 <= svc.port <= 65535:
        raise ValidationError({"port": ["A TCP port, 1 to 65535."]})
    if not svc.health_path.startswith("/") or len(svc.health_path) > 200 or " " in svc.health_path:
        raise ValidationError({"health_path": ["An HTTP path starting with /, e.g. /health."]})
    args = svc.args if svc.args is not None else []
    if not isinstance(args, list) or len(args) > 100 or not all(
            isinstance(a, (str, int, float)) and len(str(a)) <= 4096 for a in args):
        raise ValidationError({"args": ["A list of at most 100 arguments."]})
    svc.args = [str(a) for a in args]
    gpu_models = svc.gpu_models or []
    if not isinstance(gpu_models, list) or not all(isinstance(m, str) for m in gpu_models):
        raise ValidationError({"gpu_models": ["A list of GPU model names."]})
    svc.env = _clean_env(svc.env)
    _clean_source(svc)
    _clean_scaling(svc)
    _clean_companions(svc)
    _clean_ingress_host(svc)


def _save(svc: ModelService) -> None:
    try:
        svc.full_clean(exclude=["tenant", "project", "owner", "cluster", "image"], validate_unique=False,
                       validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    try:
        with transaction.atomic():
            svc.save()
    except IntegrityError as exc:
        raise ValidationError({"name": ["This project already has a model service with this name."]}) from exc


class ServiceGone(ModelService.DoesNotExist, Http404):
    """The service was deleted while this request waited for its row (a double-clicked delete,
    a scale racing a delete): a 404 to the portal and the API, never a 500."""


def _locked(pk: int) -> ModelService:
    try:
        return (ModelService.objects.select_for_update(no_key=True, of=("self",))
                .select_related("tenant", "project", "cluster", "owner", "image").get(pk=pk))
    except ModelService.DoesNotExist as exc:
        raise ServiceGone("This model service no longer exists.") from exc


def _refuse_min_beyond_limits(svc: ModelService) -> None:
    """``min_replicas`` replicas must fit within the project's limits together (one replica is
    ``kind_check``'s); otherwise the floor could never be reached: a 400 naming min_replicas."""
    if svc.min_replicas <= 1:
        return
    from ..quota import refuse_if_never_within_limits

    groups = [{**g, "replicas": svc.min_replicas} for g in _groups(svc)]
    try:
        refuse_if_never_within_limits(project=svc.project, cluster=svc.cluster, groups=groups,
                                      preemptible=svc.preemptible)
    except ValidationError as exc:
        why = " ".join(m for msgs in exc.message_dict.values() for m in msgs)
        raise ValidationError({"min_replicas": [f"{svc.min_replicas} replicas: {why}"]}) from exc


# --- writes -------------------------------------------------------------------------------------


@transaction.atomic
def model_service_create(*, actor: User, project: Project, cluster: Cluster, name: str,
                         image: Image | None = None, image_reference: str = "",
                         profile: Profile | None = None, **fields: Any) -> ModelService:
    """Create a model service and queue its first replicas (``max(min_replicas, 1)``, at most
    ``max_replicas``). ``fields``: any of ``CREATE_FIELDS``. With a compute preset
    (``profile``, one offered to the project) each replica takes the preset's shape and GPU
    model, as a training worker does."""
    unknown = set(fields) - CREATE_FIELDS
    if unknown:
        raise ValidationError({sorted(unknown)[0]: ["Unknown field."]})
    if profile is not None:  # r4servebench: the portal's launch form offers presets
        _check_profile(actor, profile, project)
        fields.update(gpu_count=profile.gpu_count, gpu_memory_mib=profile.gpu_memory_mib,
                      gpu_cores_percent=profile.gpu_cores_percent, exclusive=profile.exclusive,
                      cpu_millicores=profile.cpu_millicores, ram_mib=profile.ram_mib,
                      gpu_models=[profile.gpu_model] if profile.gpu_model else [])
    fields = {k: v for k, v in fields.items() if v is not None or k == "scale_to_zero_seconds"}
    svc = ModelService(tenant=project.tenant, project=project, owner=actor, cluster=cluster, name=name,
                       **{**SERVICE_KIND.defaults, **fields})
    _require(actor, permissions.CREATE, svc)
    _clean_cluster(cluster, actor)
    svc.image, svc.image_reference = _resolve_image(
        project=project, image=image, image_reference=image_reference, variant=Variant.INFERENCE,
        variant_label="inference server")
    _clean(svc)
    scheduling.require_priority_class(actor, svc.project, SERVICE_KIND.job_kind_of(svc), svc.priority_class)
    kind_check(SERVICE_KIND, project=project, cluster=cluster, row=svc)
    _refuse_unrunnable(svc)
    _refuse_companions_never_fit(svc)
    _refuse_min_beyond_limits(svc)
    svc.desired_replicas = min(max(svc.min_replicas, 1), svc.max_replicas)
    _save(svc)
    kind_audit(SERVICE_KIND, "created", svc, actor=actor, after={
        **_snapshot(svc), **({"preset": profile.name} if profile is not None else {})})
    _converge(svc, actor=actor, by=actor.get_username())
    return svc


SERVICE_KEY_PREFIX = "cms_"


@transaction.atomic
def model_service_api_key_rotate(*, actor: User, service: ModelService) -> str:
    """A new API key for calls through the service's Ingress (the old one stops working at
    once). Returned once; only its SHA-256 is kept. A per-service key rather than a Camp API
    token: the Ingress passes the caller's headers on to the model server, which project
    members write, so what it receives must open this service and nothing else."""
    import secrets

    from .access import hash_token

    svc = _locked(service.pk)
    _require(actor, permissions.CHANGE, svc)
    if not svc.ingress_host:
        raise ValidationError({"ingress_host": [
            "The service has no Ingress (set ingress_host): inside the cluster it is called "
            "without a key."]})
    key = SERVICE_KEY_PREFIX + secrets.token_urlsafe(32)
    had = bool(svc.api_key_hash)
    svc.api_key_hash, svc.api_key_created_at = hash_token(key), timezone.now()
    svc.save(update_fields=["api_key_hash", "api_key_created_at", "updated_at"])
    kind_audit(SERVICE_KIND, "api_key_rotated", svc, actor=actor, before={"api_key_set": had},
               after={"api_key_set": True, "created_at": svc.api_key_created_at.isoformat()})
    return key


def service_key_matches(svc: ModelService, key: str) -> bool:
    """Whether ``key`` is the service's current API key (constant-time)."""
    import secrets

    from .access import hash_token

    return bool(svc.api_key_hash and key) and secrets.compare_digest(svc.api_key_hash, hash_token(key))


@transaction.atomic
def model_service_scale(*, actor: User, service: ModelService, replicas: int | None = None,
                        min_replicas: int | None = None, max_replicas: int | None = None) -> ModelService:
    """Fix the replica count (``replicas``: min = max = replicas; 0 stops the service) or
    change the autoscaler's bounds; replicas are added or removed at once."""
    svc = _locked(service.pk)
    _require(actor, permissions.CHANGE, svc)
    if replicas is not None:
        if replicas < 0 or replicas > 64:
            raise ValidationError({"replicas": ["Between 0 and 64."]})
        min_replicas = max_replicas = replicas
    if min_replicas is None and max_replicas is None:
        raise ValidationError({"replicas": ["Give replicas, or min_replicas and/or max_replicas."]})
    before = {"min_replicas": svc.min_replicas, "max_replicas": svc.max_replicas,
              "desired_replicas": svc.desired_replicas}
    if min_replicas is not None:
        svc.min_replicas = min_replicas
    if max_replicas is not None:
        svc.max_replicas = max_replicas
    if svc.min_replicas < 0 or svc.max_replicas < 0:
        raise ValidationError({"replicas": ["Replica counts cannot be negative."]})
    _clean_scaling(svc)
    _refuse_min_beyond_limits(svc)
    floor = svc.min_replicas if svc.min_replicas or svc.max_replicas == 0 else min(1, svc.max_replicas)
    svc.desired_replicas = min(max(svc.desired_replicas, floor), svc.max_replicas)
    svc.save()
    kind_audit(SERVICE_KIND, "scaled", svc, actor=actor, before=before, after={
        "min_replicas": svc.min_replicas, "max_replicas": svc.max_replicas,
        "desired_replicas": svc.desired_replicas, "reason": f"Scaled by {actor.get_username()}"})
    _converge(svc, actor=actor, by=actor.get_username())
    return svc


@transaction.atomic
def model_service_update(*, actor: User, service: ModelService, image: Image | None = None,
                         **values: Any) -> ModelService:
    """Change a service. Scaling settings apply at once; a change of what the replicas are
    made of (``REVISION_FIELDS`` or ``image``) is a new revision, rolled out one replica
    at a time (``model_service_rollout`` with no change restarts every replica)."""
    svc = _locked(service.pk)
    _require(actor, permissions.CHANGE, svc)
    allowed = set(REVISION_FIELDS) | set(SCALING_FIELDS)
    for key in values:
        if key not in allowed:
            raise ValidationError({key: ["This field cannot be changed."]})
    before = _snapshot(svc)
    old = {f: getattr(svc, f) for f in REVISION_FIELDS}
    for key, value in values.items():
        if value is not None or key == "scale_to_zero_seconds":
            setattr(svc, key, value)
    if image is not None or "image_reference" in values:
        svc.image, svc.image_reference = _resolve_image(
            project=svc.project, image=image, image_reference=values.get("image_reference") or "",
            variant=Variant.INFERENCE, variant_label="inference server")
    if svc.port != old["port"]:
        # The ClusterIP Service outlives replicas and is not rewritten on dispatch.
        raise ValidationError({"port": ["A service's port cannot change; create a new service."]})
    old_ports = {c["name"]: c["port"] for c in old["companions"] or []}
    for i, c in enumerate(values.get("companions") or []):
        new_port = c.get("port", COMPANION_DEFAULTS["port"]) if isinstance(c, dict) else None
        if isinstance(c, dict) and c.get("name") in old_ports and new_port != old_ports[c["name"]]:
            raise ValidationError({f"companions[{i}].port": [
                "A companion's port cannot change (its Service outlives replicas); rename the companion."]})
    _clean(svc)
    _refuse_min_beyond_limits(svc)
    changed = any(getattr(svc, f) != old[f] for f in REVISION_FIELDS)
    if changed:
        kind_check(SERVICE_KIND, project=svc.project, cluster=svc.cluster, row=svc)
        _refuse_unrunnable(svc)
        _refuse_companions_never_fit(svc)
        svc.revision += 1
    svc.desired_replicas = min(max(svc.desired_replicas, svc.min_replicas), svc.max_replicas)
    _save(svc)
    kind_audit(SERVICE_KIND, "rolled_out" if changed else "updated", svc, actor=actor, before=before,
               after=_snapshot(svc))
    _converge(svc, actor=actor, by=actor.get_username())
    return svc


def model_service_rollout(*, actor: User, service: ModelService, image: Image | None = None,
                          **values: Any) -> ModelService:
    """A new revision: with changes (image, args, env, model, ...) those; without, a restart
    of every replica. Rolled out one replica at a time (the module docstring)."""
    with transaction.atomic():
        svc = _locked(service.pk)
        _require(actor, permissions.CHANGE, svc)
        old = {f: getattr(svc, f) for f in REVISION_FIELDS}
        if image is not None or any(k in REVISION_FIELDS and v is not None and v != old[k]
                                    for k, v in values.items()):
            return model_service_update(actor=actor, service=svc, image=image, **values)
        svc.revision += 1  # nothing changed: restart every replica on a new revision
        svc.save(update_fields=["revision", "updated_at"])
        kind_audit(SERVICE_KIND, "rolled_out", svc, actor=actor, before={"revision": svc.revision - 1},
                   after={"revision": svc.revision, "reason": "restart"})
        _converge(svc, actor=actor, by=actor.get_username())
    return svc


@transaction.atomic
def model_service_delete(*, actor: User, service: ModelService) -> None:
    """Remove every replica and the Service object; the audit log keeps what it was and the
    replicas' jobs stay in the job history."""
    svc = _locked(service.pk)
    _require(actor, permissions.DELETE, svc)
    by = actor.get_username()
    for r in svc.replicas.select_related("job").exclude(job__state__in=FINAL_STATES):
        _remove(r, f"Service {svc.name} deleted by {by}", by)
    kind_audit(SERVICE_KIND, "deleted", svc, actor=actor,
               before={**_snapshot(svc), "status": svc.status})
    from scheduling.selectors import project_namespace_name

    ns = project_namespace_name(cluster=svc.cluster, project=svc.project)
    specs = svc.replicas.values_list("spec", flat=True)
    companions = {c["name"] for c in svc.companions or []} | {
        c["name"] for spec in specs for c in (spec or {}).get("companions", [])}
    objects = [("Service", svc.service_name)] + [
        ("Service", companion_service_name(svc, name)) for name in sorted(companions)]
    if svc.ingress_host:
        objects.append(("Ingress", svc.service_name))
    enqueue_on_commit("delete_objects", svc.cluster_id, ns, objects)
    svc.replicas.all().delete()
    svc.delete()


# --- the autoscaler -----------------------------------------------------------------------------


def model_service_autoscale(*, service: ModelService, now: dt.datetime | None = None,
                            load: float | None = None) -> ModelService:
    """One autoscaler step for one service: read its load (``serving_load.read_load``, or
    ``load`` as given), recommend replicas (scale up at once, down after the stabilisation
    window, to zero after the idle window), audit a change as ``service.scaled`` by
    ``autoscaler``, then converge the replicas (also replacing ended ones and moving a
    rollout on)."""
    reading = LoadReading(float(load)) if load is not None else None
    if reading is None:
        # Read before taking the row lock: a slow Prometheus must not hold it (nor a transaction).
        unlocked = ModelService.objects.select_related("project", "cluster").get(pk=service.pk)
        reading = read_load(unlocked, now or timezone.now())
    with transaction.atomic():
        svc = _locked(service.pk)
        now = now or timezone.now()  # read after the lock: a step that waited is not in the past
        svc.latency_p50_seconds, svc.latency_p95_seconds = reading.p50, reading.p95
        if reading.load is None:
            _hold(svc, reading.error)  # nothing measured it: never scale on made-up numbers
        else:
            svc.load_error = ""
            _scale_on(svc, reading.load, now)
        _converge(svc, actor=None, by=AUTOSCALER, retry=False)
    return svc


def _hold(svc: ModelService, why: str) -> None:
    """Without a load reading (``why``: no source, Prometheus down, no series) the service
    keeps its replica count within its bounds — never zero by accident — and shows why. A
    service already scaled to zero stays there: a reading taken from its pods has none to
    come from, and waking it for that would flap between 0 and 1."""
    at_zero = svc.desired_replicas == 0 and svc.min_replicas == 0
    floor = 0 if svc.max_replicas == 0 or at_zero else max(svc.min_replicas, 1)
    held = min(max(svc.desired_replicas, floor), svc.max_replicas)
    svc.load_error = (why or "no load reading")[:300]
    if held != svc.desired_replicas:
        kind_audit(SERVICE_KIND, "scaled", svc, actor=None, actor_username=AUTOSCALER,
                   before={"desired_replicas": svc.desired_replicas},
                   after={"desired_replicas": held, "reason": f"{svc.load_error}: held within min/max"})
        svc.desired_replicas = held
    svc.save(update_fields=["desired_replicas", "load_error", "latency_p50_seconds", "latency_p95_seconds",
                            "updated_at"])


def _scale_on(svc: ModelService, load: float, now: dt.datetime) -> None:
    if load > 0:
        svc.idle_since = None
    elif svc.idle_since is None:
        svc.idle_since = now
    idle_for = (now - svc.idle_since).total_seconds() if svc.idle_since else None
    rec = recommend(metric=svc.autoscale_metric, target=svc.autoscale_target, load=load,
                    ready=svc.ready_replicas, current=svc.desired_replicas,
                    min_replicas=svc.min_replicas, max_replicas=svc.max_replicas,
                    window=list(svc.recommendations or []), window_seconds=svc.scale_down_delay_seconds,
                    now=now.timestamp(), idle_for=idle_for, scale_to_zero_seconds=svc.scale_to_zero_seconds)
    before = svc.desired_replicas
    svc.load, svc.load_at, svc.recommendations = load, now, rec.window
    if svc.max_replicas == 0:
        rec = dataclasses.replace(rec, desired=0)
    svc.desired_replicas = rec.desired
    svc.save(update_fields=["load", "load_at", "idle_since", "recommendations", "desired_replicas",
                            "load_error", "latency_p50_seconds", "latency_p95_seconds", "updated_at"])
    if rec.desired != before:
        kind_audit(SERVICE_KIND, "scaled", svc, actor=None, actor_username=AUTOSCALER,
                   before={"desired_replicas": before},
                   after={"desired_replicas": rec.desired, "load": load, "reason": rec.reason})


def model_services_autoscale(*, now: dt.datetime | None = None,
                             ids: list[int] | None = None) -> dict[str, int]:
    """Every model service on an enabled cluster (or those of ``ids``), one short transaction
    each (the beat task). A service deleted meanwhile is skipped; one refused step (its owner
    left the project) does not stop the others."""
    done = failed = gone = 0
    if ids is None:
        enabled = ModelService.objects.filter(cluster__enabled=True).order_by("pk")
        ids = list(enabled.values_list("pk", flat=True))
    for pk in ids:
        try:
            model_service_autoscale(service=ModelService(pk=pk), now=now)
            done += 1
        except ModelService.DoesNotExist:
            gone += 1
        except (PermissionDenied, ValidationError) as exc:
            logger.warning("model service %s: autoscaler step refused: %s", pk, exc)
            failed += 1
    return {"services": done, "failed": failed, "gone": gone}


def model_service_objects_sweep(*, cluster: Cluster) -> list[str]:
    """Delete the Services and Ingresses (labelled ``camp.io/service``) of model services that
    no longer exist on ``cluster``: their delete task gave up, or a project or tenant was
    deleted (rows cascade, cluster objects do not). Returns ``namespace/name`` of the Services
    and ``namespace/Ingress/name`` of the Ingresses deleted."""
    from scheduling.backends import backend_for

    backend = backend_for(cluster)
    found = [("Service", *o) for o in backend.list_services(LABEL_SERVICE)]
    found += [("Ingress", *o) for o in backend.list_ingresses(LABEL_SERVICE)]
    ids = {int(labels[LABEL_SERVICE]) for _, _, _, labels in found if labels[LABEL_SERVICE].isdigit()}
    alive = set(ModelService.objects.filter(pk__in=ids, cluster=cluster).values_list("pk", flat=True))
    removed = []
    for kind, ns, name, labels in found:
        owner = labels[LABEL_SERVICE]
        if owner.isdigit() and int(owner) not in alive:
            backend.delete_object(ns, kind, name)
            removed.append(f"{ns}/{name}" if kind == "Service" else f"{ns}/{kind}/{name}")
    if removed:
        logger.info("cluster %s: deleted %d Service(s) of deleted model services", cluster.name, len(removed))
    return removed


# --- converging replicas ------------------------------------------------------------------------


def _revision_spec(svc: ModelService) -> dict[str, Any]:
    # Companions without their env (the job's pod groups carry it, and rows read by more
    # people than the service's changers should not repeat secrets).
    return {"args": list(svc.args or []), "model_source_kind": svc.model_source_kind,
            "model_source": svc.model_source, "port": svc.port, "health_path": svc.health_path,
            "companions": [{k: v for k, v in c.items() if k != "env"} for c in svc.companions or []]}


def _add(svc: ModelService, actor: User | None) -> ServiceReplica:
    submitter = actor if actor is not None else svc.owner
    if submitter is None:
        raise PermissionDenied("The service has no owner to run its replicas as.")
    # Job names are unique per project and stay in the history: a deleted service of the same
    # name, or a user's job, may hold the next one; take the next free number.
    taken = set(Job.objects.filter(project_id=svc.project_id, name__startswith=f"{svc.name}-r{svc.revision}-")
                .values_list("name", flat=True))
    svc.replica_seq += 1
    while f"{svc.name}-r{svc.revision}-{svc.replica_seq}" in taken:
        svc.replica_seq += 1
    svc.save(update_fields=["replica_seq"])
    name = f"{svc.name}-r{svc.revision}-{svc.replica_seq}"
    job = kind_run(SERVICE_KIND, actor=submitter, row=svc, name=name)
    return ServiceReplica.objects.create(service=svc, job=job, revision=svc.revision, number=svc.replica_seq,
                                         spec=_revision_spec(svc))


def _remove(r: ServiceReplica, reason: str, by: str) -> None:
    scheduling.job_terminate(job_id=r.job_id, reason=reason, by=by)
    r.removed_reason = reason[:300]
    r.save(update_fields=["removed_reason"])


def _running(r: ServiceReplica) -> bool:
    """Ready: its job runs and its pod reports Ready (the readiness probe on the health path
    passes; the simulated backend's pods are ready once running)."""
    allocs = list(r.job.allocations.all())
    return r.job.state == JobState.RUNNING and bool(allocs) and all(a.ready for a in allocs)


CRASH_LIMIT = 3
CRASH_WINDOW = dt.timedelta(minutes=10)


def _blocking(svc: ModelService) -> tuple[ServiceReplica, str] | None:
    """Why the autoscaler must not add replicas of the current revision, if it must not: its
    newest replica was rejected by the scheduler (it can never run as it is: a limit, no node
    with an allowed GPU, non-preemptible beyond the guarantee), or ``CRASH_LIMIT`` replicas
    failed within ``CRASH_WINDOW`` (a crashing image or model) — each replacement would end
    the same way, every tick."""
    mine = svc.replicas.filter(revision=svc.revision).select_related("job").order_by("-number")
    newest = mine.first()
    if newest is not None and newest.job.state == JobState.REJECTED:
        return newest, f"Replica {newest.number} was rejected: {newest.job.reason}"
    failed = list(mine.filter(job__state=JobState.FAILED,
                              job__finished_at__gte=timezone.now() - CRASH_WINDOW)[:CRASH_LIMIT])
    if len(failed) >= CRASH_LIMIT:
        minutes = int(CRASH_WINDOW.total_seconds() // 60)
        return failed[0], (f"{CRASH_LIMIT} replicas of revision {svc.revision} failed within {minutes} "
                           f"minutes (latest: {failed[0].job.reason})")
    return None


def _converge(svc: ModelService, *, actor: User | None, by: str, retry: bool = True) -> dict[str, list[int]]:
    """Add or remove replica jobs so that ``desired_replicas`` of the current revision run
    (the caller holds the service's row lock). Returns the replica numbers added/removed.

    The autoscaler (``retry=False``) adds nothing while ``_blocking`` says so; the service
    shows ``blocked`` with the reason until a person scales, changes or rolls it out
    (``retry=True``)."""
    out: dict[str, list[int]] = {"added": [], "removed": []}
    blocked = None if retry else _blocking(svc)
    reps = list(svc.replicas.filter(removed_reason="").select_related("job")
                .prefetch_related("job__allocations").order_by("number"))
    for r in reps:
        if r.job.is_final:
            r.removed_reason = f"Ended ({r.job.state}): {r.job.reason}"[:300]
            r.save(update_fields=["removed_reason"])
    live = [r for r in reps if not r.job.is_final]
    new = [r for r in live if r.revision == svc.revision]
    old = [r for r in live if r.revision != svc.revision]
    desired = svc.desired_replicas

    def remove(r: ServiceReplica, reason: str) -> None:
        _remove(r, reason, by)
        out["removed"].append(r.number)

    def add() -> None:
        if blocked is not None:
            return
        r = _add(svc, actor)
        new.append(r)
        out["added"].append(r.number)

    if old:  # rollout: old replicas that serve nothing go now; ready ones once replaced
        for r in [r for r in old if not _running(r)]:
            remove(r, f"Replaced by revision {svc.revision}")
        old = [r for r in old if _running(r)]
        ready_new = sum(1 for r in new if _running(r))
        while old and ready_new + len(old) - 1 >= desired:
            remove(old.pop(), f"Replaced by revision {svc.revision}")
        if len(new) < desired and all(_running(r) for r in new) and len(new) + len(old) <= desired:
            add()  # surge one replica of the new revision
    elif len(new) < desired:
        for _ in range(desired - len(new)):
            add()
    else:  # surplus: not started first, then the newest
        surplus = sorted(new, key=lambda r: (_running(r), -r.number))[: len(new) - desired]
        for r in surplus:
            remove(r, f"Scaled down to {desired}")
    _set_status(svc, old, blocked[1] if blocked else "")
    if out["added"] or out["removed"]:
        kind_audit(SERVICE_KIND, "replicas_changed", svc, actor=actor,
                   actor_username=None if actor is not None else AUTOSCALER,
                   after={**out, "desired_replicas": desired, "revision": svc.revision})
    return out


def _set_status(svc: ModelService, old: list[ServiceReplica], blocked: str) -> None:
    ready = (svc.replicas.filter(removed_reason="", job__state=JobState.RUNNING)
             .exclude(job__allocations__ready=False).filter(job__allocations__isnull=False).distinct().count())
    reason = ""
    if blocked and ready < svc.desired_replicas:
        status = ServiceStatus.BLOCKED
        reason = f"{blocked} — change, scale or roll out the service to try again"[:300]
    elif svc.desired_replicas == 0:
        status = ServiceStatus.IDLE
    elif old:
        status = ServiceStatus.ROLLING
    elif ready == 0:
        status = ServiceStatus.PENDING
    elif ready < svc.desired_replicas:
        status = ServiceStatus.DEGRADED
    else:
        status = ServiceStatus.READY
    if (ready, status, reason) != (svc.ready_replicas, svc.status, svc.status_reason):
        svc.ready_replicas, svc.status, svc.status_reason = ready, status, reason
        # save(update_fields): writes these columns only, and its post_save tells live pages
        svc.save(update_fields=["ready_replicas", "status", "status_reason", "updated_at"])
