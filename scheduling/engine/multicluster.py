"""One pool across clusters: which cluster a floating job goes to (pure, no I/O).

A *floating* job names no single cluster: any cluster its project may use, a set of
clusters, or cluster labels (region, arch, accelerator). The global queue holds floating
jobs with no cluster yet; a placement step offers each, in the global order (priority, then
the project's share across clusters, then submission), to the clusters it may use, and
binds it to the one where it starts soonest. From then on the cluster's own cycle (quotas,
fair share, preemption) handles it as any other job, under that cluster's lock; a floating
job still queued may be moved again when another cluster would start it sooner.

Rules, in order (:func:`rank`):

1. *Eligibility* (:func:`excluded`): the cluster matches the job's choice (names, labels), is
   reachable, has a node of an architecture its image is built for and a GPU model it
   allows; otherwise the cluster is out, with the reason the user reads.
2. *Best start*: fits now > fits after preempting lower-priority work (fewest victims, then
   fewest victim GPUs) > shortest estimated wait (running jobs' expected ends).
   Over the project's, the tenant's or the cluster's own GPU limit on a cluster counts as
   waiting there; a job asking more than one of those limits can never run there. Over a
   quota across all clusters (the GPU limit; the GPU memory limit of every GPU model class
   it may use there) it waits everywhere and is not bound; asking more than such a limit
   itself (:func:`never_all_clusters`), it can never run there.
3. *Tie-break*: data locality (the job's preferred labels the cluster has), then the
   larger free share, then the name (so the choice is deterministic).

Kueue's MultiKueue keeps one copy of a workload in a manager cluster and lets one worker
cluster admit it; here the choice is made up front from the clusters' snapshots, so that
"best start" (not "whichever worker answers first") decides, and the per-cluster cycle and
its lock are unchanged.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduling.engine import accounting
from scheduling.engine.guarantees import nonpreemptible_refusal
from scheduling.engine.model import Admit, ClusterSnapshot, Job, Node, PodPlacement, Reject
from scheduling.engine.placement import Placer, model_family
from scheduling.engine.queueing import RunningJob

FITS_NOW, FITS_AFTER_PREEMPTION, WAITS = 0, 1, 2
CLUSTER = ""
"""The key of the cluster's own total in :attr:`ClusterTrial.usage` and ``limits`` (no tenant
or project is named "")."""
OUTCOME_TEXT = {FITS_NOW: "fits now", FITS_AFTER_PREEMPTION: "fits after preemption",
                WAITS: "waits"}


def platform_arch(platform: str) -> str:
    """``linux/arm64`` → ``arm64`` (the value of the node label ``kubernetes.io/arch``)."""
    return platform.split("/")[1] if "/" in platform else platform


@dataclass(frozen=True, slots=True)
class ClusterChoice:
    """Where a job may go: named clusters (empty: any), labels all of which must match, and
    labels that are preferred (data locality) but not required."""

    clusters: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    prefer: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, data: Mapping[str, object] | None) -> ClusterChoice:
        data = data or {}
        names = data.get("clusters") or ()
        labels = data.get("labels") or {}
        prefer = data.get("prefer") or {}
        assert isinstance(labels, Mapping) and isinstance(prefer, Mapping)
        return cls(frozenset(str(n) for n in names),  # type: ignore[attr-defined]
                   tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                   tuple(sorted((str(k), str(v)) for k, v in prefer.items())))


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One cluster as the placement step sees it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    reachable: bool = True
    closed_reason: str = ""
    """Non-empty: the cluster takes no new work (disabled, unreachable...), said this way."""
    arches: frozenset[str] = frozenset({"amd64"})
    gpu_models: frozenset[str] = frozenset()
    """Physical GPU models on its nodes (``model_family``)."""
    gpu_capacity: float = 0.0
    """GPUs on its schedulable nodes (for the free-share tie-break)."""


@dataclass(frozen=True, slots=True)
class JobNeeds:
    """What a floating job needs of a cluster, beyond what the engine checks per node."""

    arches: frozenset[str] = frozenset()
    """Architectures its images run on; empty means any."""
    gpu_models: frozenset[str] = frozenset()
    """Allowed GPU models (empty: any)."""
    gpus: float = 0.0


def excluded(choice: ClusterChoice, needs: JobNeeds, c: ClusterView) -> str | None:
    """Rule 1 (eligibility): None if the job may go to ``c``, else why not (user's words)."""
    if choice.clusters and c.name not in choice.clusters:
        return "not among the clusters the job allows"
    for k, v in choice.labels:
        if c.labels.get(k) != v:
            return f"does not have {k}={v}" if k in c.labels else f"has no label {k}"
    if c.closed_reason:
        return c.closed_reason
    if not c.reachable:
        return "unreachable; it takes no new work"
    if needs.arches and not (needs.arches & c.arches):
        missing = "/".join(sorted(c.arches)) or "any"
        return f"the image has no {missing} variant"
    if needs.gpus and needs.gpu_models and not (needs.gpu_models & c.gpu_models):
        return f"no {'/'.join(sorted(needs.gpu_models))} GPUs there"
    if needs.gpus and not c.gpu_models:
        return "no GPUs there"
    return None


@dataclass(frozen=True, slots=True)
class Probe:
    """How soon a job would start on one cluster, and why (for the why-pending answer)."""

    cluster: str
    outcome: int
    victims: int = 0
    victim_gpus: float = 0.0
    wait_s: float = math.inf
    reason: str = ""
    never: bool = False
    """The job can never run there as asked (too large for any node, ...)."""
    placement: tuple[PodPlacement, ...] = ()
    all_clusters: bool = False
    """Over a GPU limit across all clusters: it starts nowhere yet (not bound for it)."""

    def text(self) -> str:
        if self.outcome == FITS_NOW:
            return "fits now"
        if self.outcome == FITS_AFTER_PREEMPTION:
            return f"fits after preempting {self.victims} lower-priority job(s)"
        wait = f" (estimated wait ~{_minutes(self.wait_s)})" if math.isfinite(self.wait_s) else ""
        return f"{self.reason or 'no room now'}{wait}"


def _minutes(s: float) -> str:
    return f"{max(1, round(s / 60))} min"


def gpus_of(placement: Iterable[PodPlacement]) -> float:
    """GPUs held by placed pods, in the one GPU unit (:func:`accounting.placement_gpus`)."""
    return accounting.placement_gpus(placement)


def job_gpus(job: Job) -> float:
    """GPUs a job asks before placement, in the one GPU unit (:func:`accounting.job_ask_gpus`)."""
    return accounting.job_ask_gpus(job)


def running_ends(running: Iterable[RunningJob]) -> list[tuple[float, float]]:
    """Running jobs' (expected end, GPUs held), soonest first; jobs with no expected end left out."""
    out = []
    for rj in running:
        end = rj.expected_end
        if end is not None:
            out.append((end, gpus_of(rj.pods)))
    out.sort()
    return out


def card_classes(nodes: Iterable[Node]) -> dict[str, tuple[int, frozenset[str]]]:
    """GPU model class (``model_family``) → (its largest card's MiB, the engine model names of
    that class) on these nodes."""
    mib: dict[str, int] = {}
    names: dict[str, set[str]] = {}
    for node in nodes:
        for g in node.gpus:
            cls = model_family(g.model)
            mib[cls] = max(mib.get(cls, 0), g.memory_mib)
            names.setdefault(cls, set()).add(g.model)
    return {cls: (mib[cls], frozenset(names[cls])) for cls in mib}


def job_memory(job: Job, card_mib: int) -> int:
    """GPU memory (MiB) the job would hold on shareable cards of ``card_mib`` MiB, as the engine
    charges it (``engine.state.align_demand``): a whole card (or an exclusive one) all of it, a
    slice its memory — the larger of its MiB and its share of the card, rounded up — so a slice
    asking only compute holds none. On an exclusive-only card a slice holds the whole card and
    on a templated one its template, so this is a lower bound there (the admission re-check
    counts what the placement holds: ``placement_memory``)."""
    total = 0
    for g in job.groups:
        for c in g.template.containers:
            per = card_mib if c.whole_cards else max(
                c.gpu_memory_mib, math.ceil(c.gpu_memory_percent * card_mib / 100))
            total += g.replicas * c.gpu_count * per
    return total


def class_floors(nodes: Iterable[Node]) -> dict[str, int]:
    """GPU model class → its smallest card's MiB on these nodes (what a whole card of the class
    holds at the least: the "can never run" rule counts no more than that)."""
    out: dict[str, int] = {}
    for node in nodes:
        for g in node.gpus:
            cls = model_family(g.model)
            out[cls] = min(out.get(cls, g.memory_mib), g.memory_mib)
    return out


AllClusterOwner = tuple[str, float | None, Mapping[str, int]]
"""(who, e.g. "project acme/vision" or "tenant acme"; its GPU limit across all clusters or
None; its GPU memory limits across all clusters, MiB per GPU model class)."""


def never_all_clusters(ask: float, memory: Mapping[str, int],
                       owners: Sequence[AllClusterOwner], mixed: bool = False) -> tuple[str, str] | None:
    """Rule (can never run under a quota across all clusters): (the request field, what it asks
    beyond which limit) when the job could never start whatever the other clusters hold — its
    GPUs above its project's or tenant's GPU limit across all clusters, or, for every GPU model
    class it may use (``memory``: class → the MiB it would hold there, on the class's smallest
    cards, ``job_memory``), its GPU memory above that class's limit. A class with room, or no
    class known (``memory`` empty), refuses nothing. ``mixed``: the job may spread over several
    classes (``mixed_gpu_models``), so it is over only when even its least memory on one class
    is above the sum of the classes' limits (each the lower of its project's and its tenant's;
    a class with none refuses nothing). None when it could start some day."""
    for who, lim, _ in owners:
        if lim is not None and ask > lim + 1e-9:
            return "gpu_count", (f"{_gpus(ask)} in all, more than {who}'s limit of {_gpus(lim)} "
                                 f"on all clusters together")
    if ask <= 0 or not memory:
        return None
    if mixed:
        return _never_mixed(memory, owners)
    over: dict[str, str] = {}
    for cls, mib in sorted(memory.items()):
        for who, _, mems in owners:
            cap = mems.get(cls)
            if cap is not None and mib > cap:
                over[cls] = (f"{_gib(mib)} of {cls} GPU memory in all, more than {who}'s limit of "
                             f"{_gib(cap)} of {cls} GPU memory on all clusters together")
                break
    if len(over) < len(memory):
        return None
    first, *rest = sorted(over)
    also = f" (and over the limit of every other class it may use: {', '.join(rest)})" if rest else ""
    return "gpu_memory_mib", over[first] + also


def _never_mixed(memory: Mapping[str, int], owners: Sequence[AllClusterOwner]) -> tuple[str, str] | None:
    """``never_all_clusters`` for a job that may spread over the classes of ``memory``."""
    caps: dict[str, int] = {}
    for cls in memory:
        lims = [mems[cls] for _, _, mems in owners if cls in mems]
        if not lims:
            return None  # a class with no memory limit: room for the whole job some day
        caps[cls] = min(lims)
    least, total = min(memory.values()), sum(caps.values())
    if least <= total:
        return None
    classes = ", ".join(sorted(memory))
    return "gpu_memory_mib", (f"{_gib(least)} of GPU memory in all, more than the GPU memory limits "
                              f"on all clusters together of every GPU model class it may use "
                              f"({classes}: {_gib(total)} in all)")


def _gpus(n: float) -> str:
    return f"{n:g} GPU" if n == 1 else f"{n:g} GPUs"


def usable_classes(job: Job, cards: Mapping[str, tuple[int, frozenset[str]]]) -> list[str]:
    """The GPU model classes whose cards every GPU pod group of the job allows."""
    gpu_groups = [g.template for g in job.groups if g.template.containers]
    return sorted(cls for cls, (_, names) in cards.items()
                  if all(any(t.allows_model(m) for m in names) for t in gpu_groups))


def placement_memory(pods: Iterable[PodPlacement]) -> dict[str, int]:
    """GPU memory (MiB) per GPU model class that a placement holds."""
    out: dict[str, int] = {}
    for pp in pods:
        for g in pp.gpus:
            cls = model_family(g.gpu_model)
            out[cls] = out.get(cls, 0) + g.gpu_memory_mib
    return out


def without_models(job: Job, models: frozenset[str]) -> Job:
    """The job with these GPU models excluded from every GPU pod group (for one decision)."""
    groups = tuple(replace(g, template=replace(
        g.template, excluded_gpu_models=g.template.excluded_gpu_models | models))
        if g.template.containers else g for g in job.groups)
    return replace(job, groups=groups)


def _gib(mib: float) -> str:
    return f"{mib / 1024:g} GiB"


def estimated_wait(need: float, free: float, running: Sequence[RunningJob], now: float,
                   queued_ahead: float = 0.0, ends: Sequence[tuple[float, float]] | None = None) -> float:
    """Seconds until ``need`` GPUs (plus the GPUs queued ahead) are free, from running jobs'
    expected ends; infinite when too few ends are known. A coarse estimate: it ignores where
    the freed GPUs are (fragmentation), as a user's "~40 min" does. ``ends``: ``running_ends
    (running)`` computed once by the caller (a placement step probes many jobs against the same
    running jobs; sorting them on each probe cost ~40 ms with 4,000 running jobs)."""
    missing = need + queued_ahead - free
    if missing <= 0:
        return 0.0
    for end, g in (ends if ends is not None else running_ends(running)):
        missing -= g
        if missing <= 1e-9:
            return max(0.0, end - now)  # type: ignore[operator]
    return math.inf


def preemption_probe(job: Job, running: Sequence[RunningJob], free: float) -> tuple[int, float] | None:
    """Fewest lower-priority preemptible jobs whose GPUs, with the free ones, cover the ask
    (largest first): (victims, their GPUs), or None. An upper bound on what the cluster's
    own preemption step (scheduling/engine/preemption.py) will choose. Jobs already being
    preempted are no candidates: the snapshot marks a PREEMPTING job's allocations not
    preemptible (``selectors._running_part``)."""
    need = job_gpus(job) - free
    if need <= 0:
        return None
    cands = sorted((gpus_of(rj.pods) for rj in running
                    if rj.preemptible and rj.priority < job.priority), reverse=True)
    got, n = 0.0, 0
    for g in cands:
        got += g
        n += 1
        if got >= need - 1e-9:
            return n, got
    return None


@dataclass
class ClusterTrial:
    """A cluster's state during one placement pass: jobs placed tentatively reserve their
    room, so the next job in the global order sees what is left (undone by :meth:`undo`)."""

    view: ClusterView
    placer: Placer
    running: Sequence[RunningJob]
    now: float
    usage: dict[str, float] = field(default_factory=dict)
    """GPUs held per queue (project), per tenant and in all (:data:`CLUSTER`) on this cluster."""
    limits: Mapping[str, float | None] = field(default_factory=dict)
    """GPU limit per queue, per tenant and of the cluster (:data:`CLUSTER`; None: no limit)."""
    queued_gpus: float = 0.0
    reserved: list[PodPlacement] = field(default_factory=list)
    all_limits: Mapping[str, float] = field(default_factory=dict)
    """GPU limits across all clusters per queue and per tenant (issue 16)."""
    all_usage: dict[str, float] = field(default_factory=dict)
    """GPUs held on all clusters per queue and per tenant: one dict shared by every trial of
    a step, so a job placed on one cluster counts on the others too."""
    memory_limits: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    """GPU memory limits (MiB) per GPU model class across all clusters, per queue and tenant."""
    memory_usage: dict[tuple[str, str], int] = field(default_factory=dict)
    """(queue or tenant, class) → MiB held on all clusters; shared by every trial like ``all_usage``."""
    guarantees: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """Queue or tenant → (GPU guarantee across all clusters, per-cluster guarantee, this
    cluster's part of the former now: the part its cycle uses, ``engine.guarantees``)."""
    np_usage: dict[str, float] = field(default_factory=dict)
    """GPUs held by non-preemptible jobs here, per queue and tenant with such a guarantee."""

    free: float = -1.0
    """Free GPUs (cards' free compute share on schedulable nodes); computed when not given."""
    _cards: dict[str, tuple[int, frozenset[str]]] | None = field(default=None, repr=False)
    _floors: dict[str, int] | None = field(default=None, repr=False)

    _ends: list[tuple[float, float]] | None = field(default=None, init=False, repr=False, compare=False)
    """``running_ends(running)``, sorted once per trial on first use (running jobs do not change
    within a step)."""

    def __post_init__(self) -> None:
        if self.free < 0:
            self.free = free_gpus(self.placer)

    def over_limit(self, job: Job, tenant: str) -> tuple[str, bool] | None:
        """Why the job would wait (or, ``True``: can never run) under a GPU limit there — its
        project's, its tenant's or the cluster's own (key :data:`CLUSTER`); None if within."""
        ask = job_gpus(job)
        for key, who in ((job.queue, "your project's"), (tenant, "your tenant's"),
                         (CLUSTER, "the cluster's")):
            lim = self.limits.get(key)
            if lim is None:
                continue
            if ask > lim + 1e-9:  # the cluster's cycle would reject it (over limit)
                return f"asks {ask:g} GPUs, more than {who} GPU limit there ({lim:g})", True
            if self.usage.get(key, 0.0) + ask > lim + 1e-9:
                return f"over {who} GPU limit there ({self.usage.get(key, 0.0):g} of {lim:g} in use)", False
        return None

    def never_all_clusters(self, job: Job, tenant: str) -> str:
        """What the job asks beyond a quota across all clusters it could never start within
        here (:func:`never_all_clusters`, the classes of this cluster it may use), "" if none."""
        owners = [(f"project {job.queue}", self.all_limits.get(job.queue),
                   self.memory_limits.get(job.queue, {})),
                  (f"tenant {tenant}", self.all_limits.get(tenant), self.memory_limits.get(tenant, {}))]
        if all(lim is None and not mems for _, lim, mems in owners):
            return ""
        memory: dict[str, int] = {}
        if any(mems for _, _, mems in owners):
            if self._floors is None:
                self._floors = class_floors(ns.static.node for ns in self.placer.state.nodes.values())
            if self._cards is None:
                self._cards = card_classes(ns.static.node for ns in self.placer.state.nodes.values())
            memory = {cls: job_memory(job, self._floors[cls]) for cls in usable_classes(job, self._cards)}
        never = never_all_clusters(job_gpus(job), memory, owners, job.mixed_gpu_models)
        return never[1] if never else ""

    def over_all_clusters(self, job: Job, tenant: str) -> str:
        """Why the job would cross its project's or tenant's GPU limit across all clusters
        (issue 16; the usage is every cluster's, the same in each trial), "" if within. The
        cycle holds such a job waiting likewise (one asking more than the limit itself:
        :meth:`never_all_clusters`)."""
        ask = job_gpus(job)
        for key, who in ((job.queue, "your project's"), (tenant, "your tenant's")):
            lim = self.all_limits.get(key)
            if lim is not None and self.all_usage.get(key, 0.0) + ask > lim + 1e-9:
                return (f"over {who} GPU limit across all clusters "
                        f"({self.all_usage.get(key, 0.0):g} of {lim:g} in use)")
        return ""

    def over_class_memory(self, job: Job, tenant: str) -> tuple[str, frozenset[str]]:
        """(why it waits, the model names to keep it off): the GPU model classes of this
        cluster the job may use whose GPU memory limit across all clusters (its project's or
        its tenant's) it would cross. All of them over: the reason names the first; some: it
        may still go on the others' cards."""
        if not (job.queue in self.memory_limits or tenant in self.memory_limits) or not job_gpus(job):
            return "", frozenset()
        if self._cards is None:
            self._cards = card_classes(ns.static.node for ns in self.placer.state.nodes.values())
        cards = self._cards
        usable = usable_classes(job, cards)
        over: dict[str, str] = {}
        for cls in usable:
            ask = job_memory(job, cards[cls][0])
            for key, who in ((job.queue, "your project's"), (tenant, "your tenant's")):
                lim = self.memory_limits.get(key, {}).get(cls)
                used = self.memory_usage.get((key, cls), 0)
                if lim is not None and used + ask > lim and cls not in over:
                    over[cls] = (f"over {who} {cls} GPU memory limit across all clusters: "
                                 f"{_gib(used)} of {_gib(lim)} in use")
        if not over:
            return "", frozenset()
        if len(over) == len(usable):
            return over[min(over)], frozenset()
        return "", frozenset(m for cls in over for m in cards[cls][1])

    def over_guarantee(self, job: Job, tenant: str) -> tuple[str, bool]:
        """The cycle's rule for a non-preemptible job of a project or tenant with a GPU
        guarantee across all clusters (``services/all_clusters.over_guarantee_here``): its
        non-preemptible GPUs here + the ask within the per-cluster guarantee + this cluster's
        part, else it waits; asking more than per-cluster + across all clusters, never.
        ("", False) when within or preemptible."""
        if job.preemptible:
            return "", False
        ask = job_gpus(job)
        for key, who in ((job.queue, "your project's"), (tenant, "your tenant's")):
            g = self.guarantees.get(key)
            if g is None:
                continue
            total, base, part = g
            here = self.np_usage.get(key, 0.0)
            verdict = nonpreemptible_refusal(here, ask, base + part, ever=base + total)
            if verdict == "never":
                return (f"asks {ask:g} GPUs, more than {who} GPU guarantee for non-preemptible "
                        f"work ({base:g} per cluster + {total:g} across all clusters)"), True
            if verdict:
                return (f"over {who} GPU guarantee there for non-preemptible work ({here:g} of "
                        f"{base + part:g}: this cluster's part of {total:g} across all clusters now)"), False
        return "", False

    def probe(self, job: Job, tenant: str, free: float) -> Probe:
        name = self.view.name
        beyond = self.never_all_clusters(job, tenant)
        if beyond:  # the cluster's cycle would reject it (over a quota across all clusters)
            return Probe(name, WAITS, reason=f"can never run there: asks {beyond}", never=True)
        everywhere = self.over_all_clusters(job, tenant)
        if everywhere:
            return Probe(name, WAITS, reason=everywhere, all_clusters=True)
        guarantee, never = self.over_guarantee(job, tenant)
        if guarantee:
            return Probe(name, WAITS, reason=f"can never run there: {guarantee}" if never else guarantee,
                         never=never, all_clusters=not never)
        memory, closed = self.over_class_memory(job, tenant)
        if memory:
            return Probe(name, WAITS, reason=memory, all_clusters=True)
        if closed:
            job = without_models(job, closed)
        limit = self.over_limit(job, tenant)
        if limit:
            return Probe(name, WAITS, reason=limit[0] if not limit[1] else f"can never run there: {limit[0]}",
                         never=limit[1])
        d = self.placer.place_job(job, reserve=True)
        if isinstance(d, Admit):
            for pp in d.placement.pods:
                self.placer.state.unreserve(pp)
            return Probe(name, FITS_NOW, placement=d.placement.pods)
        if isinstance(d, Reject) and closed and job.mixed_gpu_models:
            # Refused on the other classes' cards only: a job that may mix models could use
            # them beside the classes now over a memory limit, once those have room again.
            return Probe(name, WAITS, reason=_short(d.reason), all_clusters=True)
        if isinstance(d, Reject):
            return Probe(name, WAITS, reason=f"can never run there: {d.reason}", never=True)
        pre = preemption_probe(job, self.running, free)
        if pre is not None:
            return Probe(name, FITS_AFTER_PREEMPTION, victims=pre[0], victim_gpus=pre[1],
                         reason=getattr(d, "reason", ""))
        wait = estimated_wait(job_gpus(job), free, self.running, self.now, self.queued_gpus,
                              ends=self.ends())
        return Probe(name, WAITS, wait_s=wait, reason=_short(getattr(d, "reason", "")))

    def take(self, job: Job, tenant: str, probe: Probe) -> None:
        """The job is bound here: hold its room (fits now) or count it as queued."""
        if probe.outcome == FITS_NOW:
            for pp in probe.placement:
                self.placer.state.reserve(pp, check=False)
                self.reserved.append(pp)
        else:
            self.queued_gpus += job_gpus(job)
        g = job_gpus(job)
        if probe.outcome == FITS_NOW:
            self.free = max(0.0, self.free - g)
        for key in (job.queue, tenant, CLUSTER):
            self.usage[key] = self.usage.get(key, 0.0) + g
        if probe.outcome == FITS_NOW:
            for key in (job.queue, tenant):
                if key in self.all_limits:
                    self.all_usage[key] = self.all_usage.get(key, 0.0) + g
            if not job.preemptible:
                for key in (job.queue, tenant):
                    if key in self.guarantees:
                        self.np_usage[key] = self.np_usage.get(key, 0.0) + g
            for cls, mib in placement_memory(probe.placement).items():
                for key in (job.queue, tenant):
                    if key in self.memory_limits:
                        self.memory_usage[(key, cls)] = self.memory_usage.get((key, cls), 0) + mib

    def undo(self) -> None:
        for pp in self.reserved:
            self.placer.state.unreserve(pp)
        self.reserved.clear()

    def ends(self) -> list[tuple[float, float]]:
        """The running jobs' expected ends, soonest first, sorted once (see ``_ends``)."""
        if self._ends is None:
            self._ends = running_ends(self.running)
        return self._ends


def free_gpus(placer: Placer) -> float:
    """Free GPUs of a cluster state (:meth:`ClusterState.free_room`), in GPUs."""
    return placer.state.free_room()[0] / accounting.MILLI


def _short(reason: str) -> str:
    return reason.split(";")[0].strip()[:160] if reason else ""


def rank_key(p: Probe, view: ClusterView, choice: ClusterChoice, free: float
             ) -> tuple[int, int, float, float, int, float, str]:
    """Rules 2 and 3 as a sort key (smaller is better)."""
    locality = sum(1 for k, v in choice.prefer if view.labels.get(k) == v)
    share = free / view.gpu_capacity if view.gpu_capacity else 0.0
    if p.outcome == FITS_NOW:
        return (FITS_NOW, 0, 0.0, 0.0, -locality, -share, view.name)
    if p.outcome == FITS_AFTER_PREEMPTION:
        return (FITS_AFTER_PREEMPTION, p.victims, p.victim_gpus, 0.0, -locality, -share, view.name)
    return (WAITS + (1 if p.never else 0), 0, 0.0, p.wait_s, -locality, -share, view.name)


@dataclass(frozen=True, slots=True)
class Choice:
    """The placement step's answer for one job."""

    cluster: str | None
    """Where it goes (None: nowhere now — it stays in the global queue)."""
    probe: Probe | None
    others: tuple[tuple[str, str], ...]
    """Every other cluster with why not there (excluded or a worse start)."""
    never: bool = False
    """No cluster could ever run it as asked."""

    def others_text(self) -> str:
        """Why not each other cluster: "cluster a: …; cluster b: …"."""
        return "; ".join(f"cluster {n}: {why}" for n, why in self.others)

    def reason(self) -> str:
        """What the job's page and the API say, naming the chosen cluster."""
        rest = self.others_text()
        if self.cluster is None or self.probe is None:
            head = "No cluster can run it as asked" if self.never else "Waiting for a cluster"
            return f"{head} — {rest}" if rest else head
        head = f"Placed on cluster {self.cluster} ({self.probe.text()})"
        return f"{head}; {rest}" if rest else head


def choose(jobs: Mapping[str, Job], tenant: str, choice: ClusterChoice, needs: JobNeeds,
           trials: Sequence[ClusterTrial], avoid: Mapping[str, str] | None = None,
           refused: Mapping[str, str] | None = None) -> Choice:
    """Rules 1–3 for one job over every cluster's trial; reserves nothing (see ``take``).

    ``jobs``: the job as each cluster's engine sees it (by cluster name; dedicated pools
    change its allowed models); ``avoid``: clusters to pass over for now, with why. A job is
    ``never`` placeable only when no cluster is merely closed or avoided for the time being.
    ``refused``: clusters whose own cycle found the job can never run there (with why): out
    for good, as a cluster the job cannot fit."""
    avoid = avoid or {}
    refused = refused or {}
    scored: list[tuple[tuple[int, int, float, float, int, float, str], Probe]] = []
    others: list[tuple[str, str]] = []
    temporary = False
    for t in trials:
        why = excluded(choice, needs, t.view)
        if why is None and t.view.name in refused:
            others.append((t.view.name, f"can never run there: {refused[t.view.name]}"))
            continue
        if why is None and t.view.name in avoid:
            why = avoid[t.view.name]
        if why is not None:
            matches = excluded(choice, JobNeeds(), replace(t.view, closed_reason="", reachable=True)) is None
            temporary = temporary or (matches and (bool(t.view.closed_reason) or not t.view.reachable
                                                   or t.view.name in avoid))
            others.append((t.view.name, why))
            continue
        p = t.probe(jobs[t.view.name], tenant, t.free)
        scored.append((rank_key(p, t.view, choice, t.free), p))
    scored.sort(key=lambda x: x[0])
    if not scored or all(p.never for _, p in scored):
        others += [(p.cluster, p.text()) for _, p in scored]
        return Choice(None, None, tuple(sorted(others)), never=not temporary)
    if all(p.never or p.all_clusters for _, p in scored):
        # Over a limit across all clusters: binding it would only tie it to one cluster.
        others += [(p.cluster, p.text()) for _, p in scored]
        return Choice(None, None, tuple(sorted(others)))
    best = scored[0][1]
    others += [(p.cluster, p.text()) for _, p in scored[1:]]
    return Choice(best.cluster, best, tuple(sorted(others)))


# --- refusals: what a cluster's cycle found a job can never do there -----------------------


def capacity_key(nodes: Iterable[Node], policy: str = "") -> str:
    """A digest of what a cluster's "can never fit" verdicts rest on: the distinct static node
    shapes (CPU, RAM, pods, labels, pool, NVLink islands, and the GPUs: model as the engine
    sees it, dedicated pools included; memory; sharing; slice templates; sharers; health) and
    the placement policy. Not node names nor how many nodes share a shape (an autoscaler
    adding or removing nodes like those there changes no verdict, but for the count of hosts
    a distinct-nodes job needs: that lapses with the time bound), and not what changes every
    minute (allocations, utilisation, pods of others, cordons)."""
    shapes = set()
    for n in nodes:
        gpus = tuple(sorted((g.index, g.model, g.memory_mib, g.vendor, str(g.sharing),
                             tuple((t.gpu_memory_mib, t.gpu_cores_percent, t.name) for t in g.templates),
                             g.max_sharers, g.healthy) for g in n.gpus))
        islands = tuple(sorted(tuple(sorted(i)) for i in n.topology.nvlink_islands))
        shapes.add((n.cpu_millicores, n.ram_mib, n.max_pods, tuple(sorted(n.labels)), n.pool, islands, gpus))
    return hashlib.sha256(repr((str(policy), sorted(shapes))).encode()).hexdigest()[:20]


SHAPE_KINDS = frozenset({"never-fits"})
"""Refusals that rest on the cluster's nodes only (the engine's ``Kind``)."""
QUOTA_KINDS = frozenset({"over-limit", "over-guarantee"})
"""Refusals that rest on the quotas on the job's path only."""


def refusal_fingerprint(capacity: str, job: Job, quotas: str, kind: str = "") -> str:
    """What one refusal rests on: the job as that cluster sees it (GPU models allowed there,
    which dedicated pools change; architectures; preemptible, which the guarantee rule reads)
    and, by the refusal's ``kind``, the cluster's :func:`capacity_key` (a shape no node holds)
    or ``quotas`` (the caller's stamp of the quota rows on the job's path there: a limit or a
    guarantee), both for any other kind. So node churn never lapses a quota refusal, nor a
    quota edit a shape refusal."""
    view = (job.preemptible, job.queue,
            tuple(sorted((g.name, g.replicas, tuple(sorted(g.template.gpu_models)),
                          tuple(sorted(g.template.excluded_gpu_models)), tuple(sorted(g.template.arches)))
                         for g in job.groups)))
    basis = (capacity if kind not in QUOTA_KINDS else "", quotas if kind not in SHAPE_KINDS else "")
    return hashlib.sha256(repr((basis, view)).encode()).hexdigest()[:20]


REFUSAL_MAX_AGE_S = 6 * 3600.0
"""A refusal lapses after this long even if its fingerprint still matches: the fingerprint
cannot see every change (the engine's rules after an upgrade, a node label a selector
reads that was there all along but mis-set...). A lapsed refusal whose reason still holds
costs one probe per step (the placement step's own probe says "can never run" for the
shapes and limits it models) or, for what only the cycle checks (guarantees), one round
trip there and back every 6 hours."""


def refusal_text(entry: object) -> str:
    """The reason of one ``refused`` entry, old shape ("why") or new ({"why", "at", "fp"})."""
    return str(entry.get("why", "")) if isinstance(entry, Mapping) else str(entry)


def live_refusals(entries: Mapping[str, object] | None, current: Mapping[str, str], now: dt.datetime,
                  legacy_at: dt.datetime | None = None, max_age_s: float = REFUSAL_MAX_AGE_S
                  ) -> dict[str, str]:
    """The refusals that still hold (cluster name → why, for :func:`choose`).

    New entries ``{"why", "at", "fp"}`` hold while the cluster's current fingerprint for the
    job (``current``; a cluster not in it — closed, not tried — keeps its refusals) equals
    the one recorded and for ``max_age_s`` after ``at``. Old entries (a bare reason, recorded
    before fingerprints) have no fingerprint: they hold for ``max_age_s`` after
    ``legacy_at`` (the job's last change, never earlier than its last refusal), for ever
    without it."""
    out: dict[str, str] = {}
    for name, entry in (entries or {}).items():
        name = str(name)
        at: dt.datetime | None
        if isinstance(entry, Mapping):
            fp = entry.get("fp")
            if name in current and fp != current[name]:
                continue  # the cluster, its quotas or the job changed since
            try:
                at = dt.datetime.fromisoformat(str(entry.get("at")))
            except ValueError:
                at = None
        else:
            at = legacy_at
        if at is not None and (now - at).total_seconds() >= max_age_s:
            continue
        out[name] = refusal_text(entry)
    return out


@dataclass(frozen=True, slots=True)
class Pending:
    """One job of the global queue's head as the placement step sees it."""

    key: object
    """The caller's handle (the service's Job row, the bench's job name)."""
    jobs: Mapping[str, Job]
    """The job as each cluster's engine sees it, by cluster name (dedicated pools change its
    allowed models)."""
    tenant: str
    choice: ClusterChoice = ClusterChoice()
    needs: JobNeeds = JobNeeds()
    bound: str | None = None
    """The cluster where it is queued already (None: in the global queue, not bound)."""
    avoid: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    fresh: bool = False
    """Bound moments ago and not looked at by its cluster's cycle since: while it still fits
    now there and every cluster is open, :func:`step` probes no other cluster for it (no
    start beats fits now, so it would stay anyway) and leaves its note as last written (at
    the bind or by a full look since; ``kept`` gets ``None``)."""


def _stays(decided: Choice, cur: str, here: Probe | None) -> tuple[str, str]:
    """What a job that stays bound to ``cur`` is told this step: its own cluster's answer
    (``here``'s start, else why ``cur`` was passed over) and why not each other cluster, each
    named once (the chosen one, when it is another cluster no better than ``cur``, too)."""
    others = [(n, why) for n, why in decided.others if n != cur]
    if decided.cluster is not None and decided.cluster != cur and decided.probe is not None:
        others.append((decided.cluster, decided.probe.text()))
    if decided.cluster == cur and decided.probe is not None:
        own = decided.probe.text()
    elif here is not None:
        own = here.text()
    else:
        own = next((why for n, why in decided.others if n == cur), "")
    return own, "; ".join(f"cluster {n}: {why}" for n, why in sorted(others))


def step(order: Iterable[Pending], trials: Sequence[ClusterTrial],
         bind: Callable[[Pending, str, Choice], bool],
         unplaced: Callable[[Pending, Choice], None] | None = None,
         kept: Callable[[Pending, str, str | None], None] | None = None) -> None:
    """One placement step over the global queue's head, in ``order`` (:func:`global_order`).

    For each job: :func:`choose` over the trials; a job bound to a cluster and still queued
    there stays unless another cluster gives it a strictly better start (fits now > fits after
    preemption > waits) — a move to an equal start would only churn; then the job's room is
    taken in the trial where it is (tentatively, so the next job sees what is left). Its own
    GPUs do not count as queued ahead of it on its cluster while it is reconsidered.

    ``bind(p, cluster, choice)`` binds or moves the job (the service: one conditional UPDATE
    under the cycle locks; the bench: its in-memory queues); False when it could not (a lock
    was busy): nothing is taken then. ``unplaced(p, choice)``: a job not bound that no cluster
    takes now (``choice.never``: none ever could). ``kept(p, own, others)``: a bound job that
    stays where it is, with its cluster's answer now and why not each other cluster now
    (``_stays``), so what it says is refreshed each step — but for a ``fresh`` job that still
    fits now where it is, which is not probed elsewhere: ``others`` is None then (its note
    stands). The caller undoes the trials afterwards."""
    by_name = {t.view.name: t for t in trials}
    for p in order:
        cur = by_name.get(p.bound or "") if p.bound is not None else None
        own = 0.0
        mine: Probe | None = None  # its own cluster's answer, once probed (choose leaves it as it was)
        if cur is not None:
            own = job_gpus(p.jobs[cur.view.name])
            cur.queued_gpus = max(0.0, cur.queued_gpus - own)
            if (p.fresh and excluded(p.choice, p.needs, cur.view) is None and cur.view.name not in p.refused
                    and all(not t.view.closed_reason and t.view.reachable and t.view.name not in p.avoid
                            for t in trials)):  # a cluster closed since: the full look says so
                mine = cur.probe(p.jobs[cur.view.name], p.tenant, cur.free)
                if mine.outcome == FITS_NOW:  # what the full look below would decide too
                    cur.take(p.jobs[cur.view.name], p.tenant, mine)
                    if kept is not None:
                        kept(p, mine.text(), None)
                    continue
        decided = choose(p.jobs, p.tenant, p.choice, p.needs, trials, p.avoid, p.refused)
        target = by_name.get(decided.cluster) if decided.cluster is not None else None
        if target is None or decided.probe is None:
            if cur is not None:
                cur.queued_gpus += own  # bound, nothing better: its cluster's cycle decides
                if kept is not None:
                    kept(p, *_stays(decided, cur.view.name, None))
            elif unplaced is not None:
                unplaced(p, decided)
            continue
        probe = decided.probe
        here: Probe | None = None
        if cur is not None and cur is not target and not cur.view.closed_reason:
            here = mine if mine is not None else cur.probe(p.jobs[cur.view.name], p.tenant, cur.free)
            if here.outcome <= probe.outcome:
                target, probe = cur, here
        if target is cur:
            target.take(p.jobs[target.view.name], p.tenant, probe)
            if kept is not None:
                kept(p, *_stays(decided, cur.view.name, here))
        elif bind(p, target.view.name, decided):
            target.take(p.jobs[target.view.name], p.tenant, probe)
        elif cur is not None:
            cur.queued_gpus += own
            if kept is not None:
                kept(p, *_stays(decided, cur.view.name, here))


def global_order(jobs: Sequence[tuple[Job, str]], usage: Mapping[str, float]) -> list[tuple[Job, str]]:
    """The global queue's order: priority (higher first), then the project's GPUs in use across
    all clusters (fair share: the emptier project first), then submission time."""
    return sorted(jobs, key=lambda jt: (-jt[0].priority, usage.get(jt[0].queue, 0.0),
                                         jt[0].submit_time, jt[0].name))


def cluster_arches(snapshot: ClusterSnapshot) -> frozenset[str]:
    return frozenset(n.arch for n in snapshot.nodes) or frozenset({"amd64"})
