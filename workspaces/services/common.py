"""Shared by the workload services: permission check, audit, field validators, saving a row and
submitting its run as a ``scheduling.Job``."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Model

from registry.models import Image
from registry.references import ReferenceError, parse_reference
from registry.services import images_for_project
from scheduling import services as scheduling
from scheduling.models import (
    Cluster,
    Job,
)
from tenants import permissions
from tenants.audit import audit_record
from tenants.models import Project, User

from ..models import (
    DevEnvironment,
    TrainingJob,
)

CULLER = "culler"  # actor_username of the platform's own workspace actions
ENV_FIELDS = (
    "name",
    "kind",
    "image_reference",
    "profile",
    "gpu_count",
    "gpu_memory_mib",
    "gpu_cores_percent",
    "exclusive",
    "gpu_models",
    "cpu_millicores",
    "ram_mib",
    "home_gib",
    "cluster",
)
TRAINING_FIELDS = (
    "name",
    "framework",
    "image_reference",
    "workers",
    "gpu_count",
    "gpu_memory_mib",
    "gpu_cores_percent",
    "exclusive",
    "gpu_models",
    "cpu_millicores",
    "ram_mib",
    "checkpoint_dir",
    "log_dir",
    "max_runtime_seconds",
    "retry_limit",
    "priority_class",
    "preemptible",
    "cluster",
    "cluster_choice",
)
POLICY_FIELDS = ("idle_minutes", "max_lifetime_hours", "warning_minutes", "storage_gib_limit")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Dev environments run until stopped; the simulated backend needs a finite duration.
ENV_DURATION_SECONDS = 30 * 24 * 3600
LAUNCHER = {"cpu_millicores": 1000, "ram_mib": 2048}


def _require(actor: Any, action: str, obj: Model) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _audit(
    action: str, obj: DevEnvironment | TrainingJob, *, actor: User | None = None, **extra: Any
) -> None:
    audit_record(
        actor=actor,
        actor_username=None if actor is not None else CULLER,
        action=action,
        target=obj,
        tenant=obj.tenant,
        project=obj.project,
        **extra,
    )


# --- shared validation ----------------------------------------------------------------------


def _clean_env(env: Any, field: str = "env") -> dict[str, str]:
    if env in (None, ""):
        return {}
    if not isinstance(env, dict):
        raise ValidationError({field: ["A mapping of variable names to values."]})
    if len(env) > 100:
        raise ValidationError({field: ["At most 100 variables."]})
    out = {}
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise ValidationError({field: [f"{k!r} is not a valid variable name."]})
        if k.startswith("CAMP_"):
            raise ValidationError({field: [f"{k}: names starting with CAMP_ are set by the platform."]})
        if not isinstance(v, (str, int, float, bool)) or len(str(v)) > 4096:
            raise ValidationError({field: [f"{k}: a value of at most 4096 characters."]})
        out[k] = str(v)
    return out


def _resolve_image(
    *, project: Project, image: Image | None, image_reference: str, variant: str, variant_label: str
) -> tuple[Image | None, str]:
    """A catalog image the project may use, of the right variant; or a raw, valid reference."""
    if image is not None:
        if not images_for_project(project).filter(pk=image.pk).exists():
            raise ValidationError({"image": ["This image is not available to this project."]})
        if image.variant != variant:
            raise ValidationError(
                {"image": [f"Choose a {variant_label} image (this one is {image.get_variant_display()})."]}
            )
        return image, image.reference
    if not image_reference:
        raise ValidationError({"image": ["Choose an image from the catalog or give an image reference."]})
    try:
        parse_reference(image_reference)
    except ReferenceError as exc:
        raise ValidationError({"image_reference": [str(exc)]}) from exc
    return None, image_reference.strip()


def _clean_shape(data: dict[str, Any]) -> None:
    gpus, mem, cores = data["gpu_count"], data["gpu_memory_mib"], data["gpu_cores_percent"]
    if gpus < 0 or mem < 0 or cores < 0:
        raise ValidationError({"gpu_count": ["Amounts cannot be negative."]})
    if gpus == 0 and (mem or cores):
        raise ValidationError({"gpu_count": ["A GPU slice needs gpu_count ≥ 1."]})
    if cores > 100:
        raise ValidationError({"gpu_cores_percent": ["At most 100 (% of one GPU's compute)."]})
    if data["exclusive"] and (mem or cores):
        raise ValidationError({"exclusive": ["Whole cards take no memory or compute slice."]})
    if data["cpu_millicores"] < 100:
        raise ValidationError({"cpu_millicores": ["At least 100 (0.1 CPU core)."]})
    if data["ram_mib"] < 128:
        raise ValidationError({"ram_mib": ["At least 128 MiB."]})


def _clean_cluster(cluster: Cluster, actor: User) -> None:
    if not cluster.enabled or not permissions.can(actor, permissions.VIEW, cluster):
        raise ValidationError({"cluster": ["This cluster does not exist or is disabled."]})


_HOME_CLAIM = re.compile(r"ws-(\d+)-home")
_CHECKPOINT_CLAIM = re.compile(r"tr-(\d+)-ckpt")


def refuse_unrunnable(*, cluster: Cluster | None, groups: list[dict[str, Any]], project: Project,
                      fields: dict[str, str]) -> None:
    """A workload pinned to ``cluster`` whose image or GPU models none of its nodes has is refused
    at create/start (``scheduling.services.runnable``), its errors on the workload's own fields:
    ``fields`` maps ``groups[i].image`` / ``groups[i].gpu_models`` to them (unmapped: as is)."""
    if cluster is None:
        return
    from scheduling.services.runnable import refuse_never_runs_on

    try:
        refuse_never_runs_on(cluster, groups, project)
    except ValidationError as exc:
        raise ValidationError({fields.get(k, k): v for k, v in exc.message_dict.items()}) from exc


def _clean_data_volume(actor: User, project: Project, name: str) -> None:
    """A data volume is a PVC of the project's namespace that the submitter may use: a data
    set, one of the project's checkpoint volumes, or the submitter's own home volume, never
    a colleague's home (it holds their files and credentials) nor another project's volume."""
    from scheduling.models import slug_validator

    try:
        slug_validator(name)
    except ValidationError as exc:
        raise ValidationError({"data_volume": ["The name of a PVC in the project's namespace."]}) from exc
    home = _HOME_CLAIM.fullmatch(name)
    if home:
        env = DevEnvironment.objects.filter(pk=int(home[1])).only("project_id", "owner_id").first()
        if env is None or env.project_id != project.pk or env.owner_id != actor.pk:
            raise ValidationError({"data_volume": [
                f"{name} is the home volume of another user's environment; you may mount only "
                f"your own home volume, your project's checkpoint volumes or data sets."]})
    ckpt = _CHECKPOINT_CLAIM.fullmatch(name)
    if ckpt and not TrainingJob.objects.filter(pk=int(ckpt[1]), project=project).exists():
        raise ValidationError({"data_volume": [
            f"{name} is not a checkpoint volume of this project."]})


def _save(obj: DevEnvironment | TrainingJob, message: str) -> None:
    try:
        obj.full_clean(
            exclude=["tenant", "project", "owner", "cluster", "job", "image", "profile"],
            validate_unique=False,
            validate_constraints=False,
        )
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError as exc:
        raise ValidationError({"name": [message]}) from exc


def _submit_run(
    *,
    actor: User,
    project: Project,
    cluster: Cluster | None,
    name: str,
    kind: str,
    groups: list[dict[str, Any]],
    **job: Any,
) -> Job:
    """One run = one scheduling Job; its name errors are the workload's name errors. Whether
    its pinned cluster could ever run it was checked when the workload was created or started
    (``refuse_unrunnable``); a later run (a retry, an autoscaled replica) is not refused here."""
    try:
        return scheduling.job_submit(
            actor=actor, project=project, cluster=cluster, name=name, kind=kind, groups=groups,
            refuse_unrunnable=False, **job
        )
    except ValidationError as exc:
        errors = dict(getattr(exc, "message_dict", {"__all__": exc.messages}))
        if "name" in errors:
            errors["name"] = [f"Its run would be named {name}, which is taken in this project."]
        raise ValidationError(errors) from exc


def enqueue_on_commit(task_name: str, *args: Any) -> None:
    """Queue ``workspaces.tasks.<task_name>`` once the transaction commits. The one place the
    services reach their tasks module, imported at call time: the tasks import the services."""
    from .. import tasks

    getattr(tasks, task_name).delay_on_commit(*args)
