"""Compute presets (``Profile`` rows) as launch forms show them: a plain-words summary (the
GPU slice as a fraction of a named card, MiB and % for those who care) and how many could
start now on each cluster.

"Free now" is counted from the inventory's per-card allocation (``GpuDevice``) the scheduler
keeps current, over the nodes a user's jobs may use (schedulable, present, not in another
tenant's dedicated pool). It is a count of GPU fits only (CPU and RAM are rarely what a
preset waits for, and the card says so); the scheduler decides for real at its next cycle.

When nothing is free now, the card says when one is expected to start: the job page's
estimator (``portal.selectors.first_fit``) run for a hypothetical job of the preset's shape,
from a capacity timeline loaded once per cluster that has a preset with nothing free.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from scheduling.models import Cluster, GpuDevice
from scheduling.selectors import hidden_pools, plain_model

from .models import Profile

if TYPE_CHECKING:
    from portal.selectors import CapacityTimeline

# Fractions people say out loud; anything else is shown as a percentage of the card.
_NAMED = {Fraction(1, 8): "⅛", Fraction(1, 4): "¼", Fraction(1, 3): "⅓", Fraction(1, 2): "½",
          Fraction(2, 3): "⅔", Fraction(3, 4): "¾"}


def _gib(mib: int) -> str:
    return f"{mib / 1024:g} GB" if mib % 1024 == 0 else f"{mib / 1024:.1f} GB"


def is_slice(p: Any) -> bool:
    return bool(p.gpu_count and not p.exclusive and (p.gpu_memory_mib or p.gpu_cores_percent))


def fraction_label(memory_mib: int, cores_percent: int, card_mib: int) -> str:
    """The larger of the memory and compute shares of one card, as "¼" or "30 %"."""
    share = max(Fraction(memory_mib, card_mib) if card_mib else Fraction(0), Fraction(cores_percent, 100))
    near = min(_NAMED, key=lambda f: abs(f - share))
    if abs(near - share) <= Fraction(1, 50):
        return _NAMED[near]
    return f"{round(float(share) * 100)} %"


@dataclass
class PresetCard:
    profile: Profile
    title: str
    gpu: str
    detail: str
    host: str
    free_now: list[tuple[Cluster, int | None]] = field(default_factory=list)
    """Per cluster: how many more could start now (None: CPU-only, not counted)."""
    availability: list[tuple[Cluster, int | None, str]] = field(default_factory=list)
    """Per cluster: free now, and when nothing is, the expected wait in words."""


def describe(p: Profile, card_mib: dict[str, int]) -> PresetCard:
    """Title (the admin's name), the GPU part in words, its MiB/% detail and CPU/RAM."""
    model = plain_model(p.gpu_model) if p.gpu_model else ""
    card = model or "GPU"
    if not p.gpu_count:
        gpu, detail = "No GPU", ""
    elif is_slice(p):
        mib = card_mib.get(p.gpu_model) or max(card_mib.values(), default=0)
        frac = fraction_label(p.gpu_memory_mib, p.gpu_cores_percent, mib)
        each = f"{frac} of {'an' if card[:1] in 'AEFHILMNORSX8' else 'a'} {card}"
        gpu = each if p.gpu_count == 1 else f"{p.gpu_count}× {each}"
        parts = []
        if p.gpu_memory_mib:
            parts.append(f"{_gib(p.gpu_memory_mib)} GPU memory ({p.gpu_memory_mib} MiB)")
        if p.gpu_cores_percent:
            parts.append(f"{p.gpu_cores_percent} % of its compute")
        detail = " · ".join(parts) + (" per GPU" if p.gpu_count > 1 else "")
    else:
        gpu = f"{p.gpu_count}× {card}" + (" (whole card)" if p.gpu_count == 1 else " (whole cards)")
        detail = "Not shared with anyone" if p.exclusive else ""
    host = f"{p.cpu_millicores / 1000:g} CPU cores · {_gib(p.ram_mib)} RAM"
    return PresetCard(profile=p, title=str(p), gpu=gpu, detail=detail, host=host)


def _free_count(p: Profile, cards: list[tuple[Any, ...]]) -> int:
    """How many copies of the preset's GPU ask fit in the free parts of these cards."""
    per_node: dict[int, list[int]] = defaultdict(list)
    for node_id, model, mem, mem_alloc, cores_alloc, sharers, max_sharers, exclusive_held in cards:
        if p.gpu_model and model != p.gpu_model:
            continue
        if is_slice(p):
            if exclusive_held:
                continue
            fits = [max_sharers - sharers]
            if p.gpu_memory_mib:
                fits.append((mem - mem_alloc) // p.gpu_memory_mib)
            if p.gpu_cores_percent:
                fits.append((100 - cores_alloc) // p.gpu_cores_percent)
            per_node[node_id].append(max(0, min(fits)))
        else:
            per_node[node_id].append(int(not exclusive_held and sharers == 0 and mem_alloc == 0))
    total = 0
    for slots in per_node.values():
        if sum(1 for s in slots if s) >= p.gpu_count:
            total += sum(slots) // p.gpu_count
    return total


def preset_cards(profiles: Iterable[Profile], clusters: Iterable[Cluster], user: Any) -> list[PresetCard]:
    """One card per preset, with what is free now on each cluster (two queries per cluster)."""
    clusters = list(clusters)
    hidden = hidden_pools(user)
    inventory: dict[int, list[tuple[Any, ...]]] = {}
    card_mib: dict[str, int] = {}
    for c in clusters:
        rows = (
            GpuDevice.objects.filter(
                node__cluster=c, node__present=True, node__ready=True, node__cordoned=False,
                node__quarantined=False, healthy=True, quarantined=False,
            )
            .values_list("node_id", "node__pool", "model", "memory_mib", "memory_allocated_mib",
                         "cores_allocated", "sharers", "max_sharers", "exclusive_held")
        )
        usable: list[tuple[Any, ...]] = []
        for row in rows:
            node_id, pool, model, memory = row[0], str(row[1]), str(row[2]), int(row[3])
            card_mib[model] = max(card_mib.get(model, 0), memory)
            if (c.pk, pool) not in hidden:
                usable.append((node_id, *row[2:]))
        inventory[c.pk] = usable
    from portal.selectors import capacity_timeline

    timelines: dict[int, CapacityTimeline] = {}  # loaded on first need, once per cluster
    now = timezone.now()
    out = []
    for p in profiles:
        card = describe(p, card_mib)
        for c in clusters:
            n = _free_count(p, inventory[c.pk]) if p.gpu_count else None
            wait = ""
            if n == 0:
                if c.pk not in timelines:
                    timelines[c.pk] = capacity_timeline(c)
                wait = expected_wait(p, timelines[c.pk], now)
            card.free_now.append((c, n))
            card.availability.append((c, n, wait))
        out.append(card)
    return out


def _duration(seconds: float) -> str:
    minutes = max(1, math.ceil(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    h, m = divmod(minutes, 60)
    return f"{h} h {m} min" if m else f"{h} h"


def expected_wait(p: Profile, timeline: CapacityTimeline, now: dt.datetime) -> str:
    """When a job of the preset's shape is expected to start on a cluster with none free now,
    in words. Same rule and caveats as the job page's estimated start (a lower bound: it
    assumes nothing queued ahead takes the GPUs first and counts GPU-equivalents, not cards)."""
    from portal.selectors import first_fit, shape_demand

    at = first_fit(shape_demand([p], timeline.largest_card_mib), timeline, now)
    if at is None:
        return "no estimate: nothing running ends by a known time"
    if at <= now:
        # enough GPU-equivalents are free in total, but not on cards of this shape
        return "no estimate: the free GPUs are split up or of another kind"
    return f"expected in about {_duration((at - now).total_seconds())}"


def offered_presets(user: Any, project_ids: Iterable[int] | None = None) -> list[Profile]:
    """Enabled presets the user may use (for any of the given projects, when given)."""
    from tenants.models import Project
    from tenants.permissions import restrict

    qs = restrict(Profile.objects.filter(enabled=True), user).select_related("image").prefetch_related(
        "tenants", "projects")
    profiles = list(qs)
    if project_ids is None:
        return profiles
    projects = list(Project.objects.filter(pk__in=list(project_ids)).only("pk", "tenant_id"))
    out = []
    for p in profiles:
        tenants = {t.pk for t in p.tenants.all()}
        pids = {x.pk for x in p.projects.all()}
        if (not tenants and not pids) or any(pr.tenant_id in tenants or pr.pk in pids for pr in projects):
            out.append(p)
    return out


@dataclass(frozen=True)
class Startable:
    """What one user may start of a preset on one cluster now."""

    count: int
    """Copies this user may start now: those that fit on the free cards, bounded by the quota
    left and (non-preemptible work) the guarantee's room of the user's best project there."""
    fit: int
    """Copies that fit on the free cards."""
    why: str
    """What bounds ``count`` below ``fit`` ("" when the free cards do)."""
    project: Any
    """The user's project that may start the most there (None: the user has none)."""


def startable_now(user: Any, cards: list[PresetCard], clusters: list[Cluster], *,
                  preemptible: bool = False) -> dict[tuple[int, int], Startable]:
    """(preset pk, cluster pk) → what ``user`` may start of it there now ("free now" for this
    user, issue 29): the copies that fit on the free cards (``PresetCard.free_now``), bounded
    by what the user's best project there may still start — its quota left as the scheduler
    checks it (``portal.selectors.projects_left``) and, for non-preemptible work (notebooks,
    services), the room its project's and tenant's guarantees leave (the engine's rule,
    ``portal.selectors.guarantee_rooms``) — counted by ``engine.accounting.startable``.
    CPU-only presets are not counted (absent); a user with no project sees the fits. The
    member's home and the launch forms' defaults read it."""
    from portal import selectors
    from scheduling.engine import accounting as unit
    from tenants.models import Project
    from tenants.permissions import restrict

    projects = list(restrict(Project.objects.select_related("tenant"), user))
    lefts = selectors.projects_left(projects, clusters)
    rooms = {} if preemptible else selectors.guarantee_rooms(projects, clusters)
    largest = card_memory()
    out: dict[tuple[int, int], Startable] = {}
    for i, c in enumerate(clusters):
        for card in cards:
            n = card.free_now[i][1]
            if n is None:
                continue
            p = card.profile
            ask = unit.shape_ask_gpus(
                replicas=1, gpu_count=p.gpu_count, exclusive=p.exclusive, memory_mib=p.gpu_memory_mib,
                memory_percent=0, cores_percent=p.gpu_cores_percent,
                card_memory_mib=largest.get(p.gpu_model) or max(largest.values(), default=0))
            best = Startable(n, n, "", None)  # no project: the free cards bound it, as before
            for pl in lefts.values():
                allowed, why = unit.startable(n, ask, [(pl.clusters[i].left, pl.clusters[i].why),
                                                       *rooms.get((pl.project.pk, c.pk), [])])
                if best.project is None or allowed > best.count:
                    best = Startable(allowed, n, why, pl.project)
            out[(p.pk, c.pk)] = best
    return out


def default_choice(user: Any, profiles: Iterable[Profile], clusters: Iterable[Cluster], *,
                   preemptible: bool, copies: int = 1, slice_first: bool = False
                   ) -> tuple[Profile | None, Cluster | None, Any]:
    """A launch form's defaults (issue 32 item 4): the preset this user can most likely start
    now (``startable_now``: at least ``copies`` may start; among those, a GPU slice first when
    ``slice_first``, then the most startable, then the admin's order), the cluster where it
    may start the most and the project that may start it. Nothing startable: the first slice
    (``slice_first``) or the first preset, the cluster with the most fits, no project."""
    profiles, clusters = list(profiles), list(clusters)
    if not profiles:
        return None, None, None
    cards = preset_cards(profiles, clusters, user)
    can = startable_now(user, cards, clusters, preemptible=preemptible)
    ranked = []
    for order, p in enumerate(profiles):
        for c in clusters:
            s = can.get((p.pk, c.pk))
            if s is not None and s.count >= copies and s.project is not None:
                ranked.append(((slice_first and is_slice(p), s.count, -order), p, c, s.project))
    if ranked:
        _key, p, c, project = max(ranked, key=lambda r: r[0])
        return p, c, project
    pick = next((p for p in profiles if is_slice(p)), None) if slice_first else None
    pick = pick or profiles[0]
    fits = [(can[(pick.pk, c.pk)].fit, c) for c in clusters if (pick.pk, c.pk) in can]
    return pick, (max(fits, key=lambda f: f[0])[1] if fits else None), None


def card_memory() -> dict[str, int]:
    """Memory of each GPU model in the inventory (MiB), to name a slice as a share of its card."""
    from django.db.models import Max

    rows = GpuDevice.objects.values_list("model").annotate(mib=Max("memory_mib")).values_list("model", "mib")
    return {str(m): int(mib or 0) for m, mib in rows}


def shape_card(w: Any, card_mib: dict[str, int]) -> PresetCard:
    """A workload's per-replica ask (a model service's, a worker's) in the words of the preset
    cards: "¼ of an A100-80G", with the MiB and % detail and its CPU and RAM."""
    models = list(getattr(w, "gpu_models", None) or [])
    p = Profile(name="", gpu_model=models[0] if len(models) == 1 else "", gpu_count=w.gpu_count,
                gpu_memory_mib=w.gpu_memory_mib, gpu_cores_percent=w.gpu_cores_percent,
                exclusive=w.exclusive, cpu_millicores=w.cpu_millicores, ram_mib=w.ram_mib)
    return describe(p, card_mib)
