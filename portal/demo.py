"""The living demo: a load generator that keeps the simulated cluster busy, so dashboards,
the GPU map and the queues are never flat a few minutes after ``make demo``.

Every tick (Celery beat, ``DEMO_LOAD_SECONDS``, only when ``DEMO_LOAD`` is on: ``rundemo``
turns it on) it acts as the demo's own users, through the same services as the console:

- keeps a few notebooks open (``environment_launch`` with a preset), and closes some after a
  while as their owners would (``environment_stop``); the rest are culled by the real idle
  culler (the demo projects' workspace policy stops idle notebooks after 5 minutes);
- keeps training jobs coming (``training_submit``, workers × a preset), more of them in a
  burst every few minutes; a mix of batch (preemptible, checkpointing), normal and high
  priority, so high-priority work preempts batch work when the cluster is full. Two in
  five name no cluster (one pool across clusters): for any cluster, or by a label of the
  second simulated cluster (its region or architecture), with a plain GPU
  shape (no GPU model) and an image whose catalog record allows that cluster's nodes, so the
  placement step keeps both clusters busy, not only the first;
- deletes its own finished workloads beyond the newest ``KEEP`` of each kind (with their
  runs), so the demo database stays bounded; after ``DEMO_LOAD_MAX_HOURS`` it pauses itself.

Paused (``DemoLoad.paused``), it does nothing. Randomness comes from ``random.Random``
seeded per tick, so a test can replay a tick.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from scheduling.models import Cluster, Job, JobState
from tenants.audit import audit_record
from tenants.models import Membership, Project, Role, User
from tenants.permissions import CHANGE, acts_as_platform_admin

from .models import DemoLoad

logger = logging.getLogger(__name__)

KEEP = 40  # finished demo workloads of each kind kept for the lists and history
KEEP_RUNS = 200  # finished demo runs (scheduling jobs) kept for the job list
NOTEBOOKS = 6  # notebooks kept open
TRAININGS = 5  # training jobs running or waiting, outside a burst
BURST = 12  # ... and during one
# Of every 5 training jobs (by launch number), the 2nd names no cluster (any cluster) and the 4th
# a label of the second simulated cluster (its labels in turn): placed by the global queue.
FLOAT_ANY, FLOAT_LABEL = 1, 3
# Self-throttle: with this many runs admitted over a minute ago and still not started, the
# worker is behind (a busy laptop); the tick then only prunes, so the backlog cannot grow.
BACKLOG = 4
BURST_EVERY = dt.timedelta(minutes=6)
BURST_LENGTH = dt.timedelta(minutes=1)
PREFIX = "demo-"  # names of the workloads it starts (only those are stopped or deleted)
ACTIVE = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING)


def state() -> DemoLoad | None:
    return DemoLoad.objects.order_by("pk").first()


@transaction.atomic
def set_paused(*, actor: User, paused: bool) -> DemoLoad:
    """Pause or resume the generator (platform admins; audited)."""
    if not acts_as_platform_admin(actor, CHANGE):
        raise PermissionDenied("Only platform admins pause the demo load.")
    row = DemoLoad.objects.select_for_update().order_by("pk").first()
    if row is None:
        raise ValidationError("The demo load generator is not set up (manage.py seed_demo).")
    before = {"paused": row.paused}
    row.paused = paused
    if not paused:
        row.started_at = timezone.now()  # a resume restarts the DEMO_LOAD_MAX_HOURS clock
    row.save(update_fields=["paused", "started_at", "updated_at"])
    audit_record(actor=actor, action="demo_load.paused" if paused else "demo_load.resumed", target=row,
                 before=before, after={"paused": paused})
    return row


def _people() -> list[tuple[User, Project]]:
    """Who may launch where: project members and admins in their project, owners in all."""
    pairs: list[tuple[User, Project]] = []
    for m in Membership.objects.select_related("user", "project__tenant", "tenant").filter(
            user__is_active=True):
        if m.project is not None:
            pairs.append((m.user, m.project))
        elif m.role == Role.TENANT_OWNER:
            pairs.extend((m.user, p) for p in m.tenant.projects.select_related("tenant").all())
    return pairs


def _in_burst(now: dt.datetime, started: dt.datetime) -> bool:
    return (now - started) % BURST_EVERY < BURST_LENGTH


def tick(*, now: dt.datetime | None = None, seed: int | None = None) -> dict[str, Any]:
    """One step of load. Returns what it did (for logs and tests)."""
    from registry.models import Image
    from workspaces import services as ws
    from workspaces.models import DevEnvironment, TrainingJob
    from workspaces.presets import is_slice, offered_presets

    now = now or timezone.now()
    row = state()
    if row is None or row.paused:
        return {"paused": True}
    if now - row.started_at > dt.timedelta(hours=settings.DEMO_LOAD_MAX_HOURS):
        DemoLoad.objects.filter(pk=row.pk).update(paused=True)
        audit_record(actor=None, actor_username="demo-load", action="demo_load.paused", target=row,
                     after={"paused": True, "reason": f"ran {settings.DEMO_LOAD_MAX_HOURS} h"})
        return {"paused": True}
    rng = random.Random(seed if seed is not None else now.timestamp())
    clusters = list(Cluster.objects.filter(enabled=True, backend="simulated").order_by("pk")[:2])
    cluster = clusters[0] if clusters else None
    people = _people()
    if cluster is None or not people:
        return {"idle": True}
    done: dict[str, Any] = {"notebooks": 0, "trainings": 0, "floating": 0, "stopped": 0, "pruned": 0,
                            "refused": 0}
    counter = row.launched

    def name(kind: str) -> str:
        nonlocal counter
        counter += 1
        return f"{PREFIX}{kind}-{counter}"

    behind = Job.objects.filter(state=JobState.STARTING, admitted_at__lt=now - dt.timedelta(minutes=1))
    if behind.count() >= BACKLOG:
        done["pruned"] = _prune()
        DemoLoad.objects.filter(pk=row.pk).update(last_tick_at=now)
        return {**done, "throttled": True}
    open_envs = DevEnvironment.objects.filter(name__startswith=PREFIX, job__state__in=ACTIVE)
    for _ in range(min(2, NOTEBOOKS - open_envs.count())):
        user, project = rng.choice(people)
        presets = [p for p in offered_presets(user, [project.pk]) if is_slice(p) or not p.gpu_count]
        kind = rng.choice(["jupyter", "jupyter", "vscode"])
        preset = rng.choice(presets) if presets else None
        image = preset.image if preset is not None and preset.image else None
        if image is None or image.variant != kind:
            image = Image.objects.filter(scope="platform", variant=kind, enabled=True).order_by("pk").first()
        # without a preset: a small slice of any card
        custom: dict[str, Any] = ({} if presets else
                                  {"gpu_count": 1, "gpu_memory_mib": 10240, "gpu_cores_percent": 20})
        try:
            ws.environment_launch(
                actor=user, project=project, cluster=cluster, name=name("nb"), kind=kind,
                profile=preset, image=image,
                **custom)
            done["notebooks"] += 1
        except (ValidationError, PermissionDenied) as exc:
            done["refused"] += 1
            logger.info("demo load: notebook refused: %s", exc)
    # owners close some notebooks themselves after a while
    for env in open_envs.filter(job__state=JobState.RUNNING, job__started_at__lt=now - dt.timedelta(
            minutes=4)).select_related("owner")[:3]:
        if rng.random() < 0.3:
            try:
                ws.environment_stop(actor=env.owner, env=env)
                done["stopped"] += 1
            except (ValidationError, PermissionDenied):
                pass
    target = BURST if _in_burst(now, row.started_at) else TRAININGS
    waiting_or_running = TrainingJob.objects.filter(name__startswith=PREFIX, job__state__in=ACTIVE).count()
    images = list(Image.objects.filter(scope="platform", variant="training", enabled=True).order_by("pk"))
    image = images[0] if images else None
    other = clusters[1] if len(clusters) > 1 else None
    # The floating ones' image: one the catalog does not tie to the first cluster's architecture
    # (recorded for the second cluster's too, or not recorded: unrestricted).
    other_arch = f"linux/{(other.labels or {}).get('arch', 'amd64')}" if other is not None else ""
    anywhere = next((i for i in images if not i.architectures or other_arch in i.architectures), None)
    for _ in range(min(4, target - waiting_or_running)):
        user, project = rng.choice(people)
        presets = [p for p in offered_presets(user, [project.pk]) if p.gpu_count]
        priority = rng.choices(["batch", "normal", "high"], weights=[6, 3, 2])[0]
        workers = rng.choice([1, 1, 2, 2, 3])
        where: dict[str, Any] = {"cluster": cluster, "image": image,
                                 "profile": rng.choice(presets) if presets else None}
        job_name = name("train")
        if other is not None and anywhere is not None and counter % 5 in (FLOAT_ANY, FLOAT_LABEL):
            labels = sorted((other.labels or {}).items())
            label = labels[counter // 5 % len(labels)] if labels and counter % 5 == FLOAT_LABEL else None
            where = {"cluster": None, "image": anywhere, "profile": None,
                     "cluster_choice": {"labels": dict([label])} if label else {},
                     "gpu_count": rng.choice([1, 2, 4]), "cpu_millicores": 4000, "ram_mib": 16384}
            # preemptible (it borrows idle GPUs beyond its guarantee) wherever it lands
            priority = "normal" if priority == "high" else priority
        try:
            ws.training_submit(
                actor=user, project=project, name=job_name, framework="pytorch",
                image_reference="" if where["image"] else "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
                workers=workers, command=["torchrun", "train.py"], priority_class=priority,
                preemptible=priority != "high",
                checkpoint_dir="/ckpt" if priority == "batch" else "",
                duration_seconds=rng.randint(60, 300), **where)
            done["trainings"] += 1
            if where["cluster"] is None:
                done["floating"] += 1
        except (ValidationError, PermissionDenied) as exc:
            done["refused"] += 1
            logger.info("demo load: training refused: %s", exc)
    done["pruned"] = _prune()
    DemoLoad.objects.filter(pk=row.pk).update(launched=counter, last_tick_at=now)
    return done


def _prune() -> int:
    """Delete the generator's finished workloads beyond the newest KEEP of each kind, as
    their owners would (the services delete their runs and audit it)."""
    from workspaces import services as ws
    from workspaces.models import DevEnvironment, TrainingJob

    n = 0
    finished_envs = (DevEnvironment.objects.filter(name__startswith=PREFIX).exclude(job__state__in=ACTIVE)
                     .select_related("owner").order_by("-created_at"))
    for env in finished_envs[KEEP:KEEP + 10]:
        try:
            ws.environment_delete(actor=env.owner, env=env)
            n += 1
        except (ValidationError, PermissionDenied):
            pass
    finished = (TrainingJob.objects.filter(name__startswith=PREFIX).exclude(job__state__in=ACTIVE)
                .exclude(job__isnull=True).select_related("owner").order_by("-created_at"))
    for t in finished[KEEP:KEEP + 10]:
        if t.owner is None:
            continue
        try:
            ws.training_delete(actor=t.owner, training=t)
            n += 1
        except (ValidationError, PermissionDenied):
            pass
    # Runs of deleted workloads stay in the job history (training_delete says so); the demo
    # keeps the newest KEEP_RUNS of its own finished runs (groups and decisions cascade).
    from scheduling.models import FINAL_STATES

    old = list(Job.objects.filter(name__startswith=PREFIX, state__in=FINAL_STATES)
               .order_by("-finished_at", "-id").values_list("pk", flat=True)[KEEP_RUNS:KEEP_RUNS + 200])
    if old:
        Job.objects.filter(pk__in=old, allocations__isnull=True).delete()
        n += len(old)
    return n
