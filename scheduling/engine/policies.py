"""Scoring policies: given a node and one way to place a pod on its cards, how good is it?

A :class:`Policy` is configuration; :meth:`Policy.bind` returns a :class:`Scorer` tied to one
:class:`ClusterState` (so it may cache per node class). Higher scores win; the placer breaks ties
by the lexicographically smallest node name, then the first candidate in card-index order.

Policies:

* :class:`ResourcePolicy` — binpack or spread at node level × binpack or spread at card level,
  with optional topology (prefer, or with ``strict`` require, one NVLink island / NUMA node for a
  multi-GPU container) and load awareness (prefer cards with lower measured utilisation).
* :class:`FGDPolicy` — a faithful re-implementation of FGD (Weng et al., ATC'23) as its simulator
  scores: sigmoid of the fragmentation decrease, truncated to an integer 0–100.
* :class:`FragmentationPolicy` — Camp's default: FGD's fragmentation gradient, unquantised, with
  memory weighted above compute, RAM counted, a packing tie-breaker and topology/load terms.
* :class:`BestFitPolicy` and :class:`RandomPolicy` — the usual baselines.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal, Protocol

from scheduling.engine.candidates import Take, after_usage
from scheduling.engine.fragmentation import (
    CompiledProfile,
    WorkloadProfile,
    compile_profile,
    fragmentation,
)
from scheduling.engine.model import PodRequest
from scheduling.engine.state import ClusterState, NodeState

MEMORY_WEIGHT = 0.7
"""Memory counts above compute when measuring free or used card share: it cannot be compressed."""


class Scorer(Protocol):
    """A policy bound to one cluster state."""

    cacheable: bool
    """True when ``score`` depends only on the node's signature, the pod's shape and the take."""
    randomized: bool
    """True when the policy picks uniformly among feasible nodes (scores are ignored)."""
    strict_topology: bool

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        """Score placing ``pod`` on ``ns`` with ``take``; higher is better."""
        ...


class Policy(Protocol):
    """A scoring policy (configuration only)."""

    @property
    def name(self) -> str:
        """Short policy name (for reports)."""
        ...

    def bind(self, state: ClusterState) -> Scorer:
        """Return a scorer for ``state``."""
        ...


# --------------------------------------------------------------------------------------------------
# Shared terms
# --------------------------------------------------------------------------------------------------


def used_share(ns: NodeState, mem: list[int], cores: list[int], i: int) -> float:
    """Used fraction of card ``i`` given usage lists, memory weighted above compute."""
    gs = ns.static.gpus[i]
    m = min(1.0, mem[i] / gs.memory_capacity_mib)
    c = min(1.0, cores[i] / gs.cores_capacity)
    return MEMORY_WEIGHT * m + (1.0 - MEMORY_WEIGHT) * c


def node_used_share(ns: NodeState, mem: list[int], cores: list[int]) -> float:
    """Used fraction of the node: its cards when it has any, else its CPU."""
    n = len(ns.static.gpus)
    if n == 0:
        cap = ns.static.node.cpu_millicores or 1
        return 1.0 - ns.cpu_free / cap
    return sum(used_share(ns, mem, cores, i) for i in range(n)) / n


def topology_term(ns: NodeState, take: Take) -> float:
    """Rule (topology): 1 when every multi-GPU container sits in one NVLink island (or, with a
    link matrix, its mean pairwise link relative to the best link), 0.5 for one NUMA node only,
    else 0. Single-GPU takes score 1."""
    by_container: dict[int, list[int]] = {}
    for c, i, _ in take:
        by_container.setdefault(c, []).append(i)
    topo = ns.static.node.topology
    gpus = ns.static.gpus
    worst = 1.0
    for idx in by_container.values():
        if len(idx) < 2:
            continue
        if topo.link_matrix:
            best = max((max(r) for r in topo.link_matrix), default=0) or 1
            pairs = [(a, b) for a in idx for b in idx if a < b]
            val = sum(topo.link_matrix[a][b] for a, b in pairs) / (len(pairs) * best)
        elif topo.nvlink_islands:
            isl = {gpus[i].island for i in idx}
            val = 1.0 if len(isl) == 1 and -1 not in isl else 0.0
        else:
            val = 0.0
        if val < 1.0 and len({gpus[i].device.numa_node for i in idx}) == 1:
            val = max(val, 0.5)
        worst = min(worst, val)
    return worst


def load_term(ns: NodeState, take: Take) -> float:
    """Rule (load): mean measured utilisation (0..1) of the chosen cards; 0 without metrics."""
    vals = [ns.static.gpus[i].device.utilization_percent for _, i, _ in take]
    known = [v for v in vals if v is not None]
    return sum(known) / (100.0 * len(known)) if known else 0.0


# --------------------------------------------------------------------------------------------------
# Binpack / spread
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourcePolicy:
    """Binpack or spread at node and card level, topology- and load-aware."""

    node: Literal["binpack", "spread"] = "binpack"
    card: Literal["binpack", "spread"] = "binpack"
    topology_weight: float = 1.0
    strict_topology: bool = False
    load_weight: float = 0.5
    name: str = "resource"

    def bind(self, state: ClusterState) -> Scorer:
        return _ResourceScorer(self)


class _ResourceScorer:
    cacheable = True
    randomized = False

    def __init__(self, p: ResourcePolicy) -> None:
        self.p = p
        self.strict_topology = p.strict_topology
        self.node_sign = 1.0 if p.node == "binpack" else -1.0
        self.card_sign = 1.0 if p.card == "binpack" else -1.0

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        mem, cores, _, _ = after_usage(ns, take)
        s = self.node_sign * node_used_share(ns, mem, cores)
        if take:
            chosen = {i for _, i, _ in take}
            card = sum(used_share(ns, mem, cores, i) for i in chosen) / len(chosen)
            s += 0.01 * self.card_sign * card  # card level only orders cards within a node
            s += self.p.topology_weight * topology_term(ns, take)
            s -= self.p.load_weight * load_term(ns, take)
        return s


# --------------------------------------------------------------------------------------------------
# Fragmentation-aware policies
# --------------------------------------------------------------------------------------------------


class _FragScorerBase:
    cacheable = True
    randomized = False
    strict_topology = False

    def __init__(
        self,
        profile: WorkloadProfile,
        *,
        memory_weight: float,
        cpu_only_counts: bool,
        check_ram: bool,
    ) -> None:
        self.profile = profile
        self.memory_weight = memory_weight
        self.cpu_only_counts = cpu_only_counts
        self.check_ram = check_ram
        self._compiled: dict[int, CompiledProfile] = {}
        self._frag: dict[tuple[object, ...], tuple[float, float]] = {}

    def frag(
        self,
        ns: NodeState,
        cpu_free: int,
        ram_free: int,
        mem: list[int],
        cores: list[int],
        sharers: list[int],
        excl: list[bool],
    ) -> tuple[float, float]:
        """Fragmentation and free capacity (cards) of ``ns`` with the given usage, cached."""
        static = ns.static
        key = (
            static.class_id,
            cpu_free,
            ram_free if self.check_ram else 0,
            tuple(mem),
            tuple(cores),
            tuple(sharers),
            tuple(excl),
        )
        hit = self._frag.get(key)
        if hit is not None:
            return hit
        comp = self._compiled.get(static.class_id)
        if comp is None:
            comp = compile_profile(static, self.profile)
            self._compiled[static.class_id] = comp
        val = fragmentation(
            static,
            comp,
            cpu_free,
            ram_free,
            mem,
            cores,
            sharers,
            excl,
            memory_weight=self.memory_weight,
            cpu_only_counts=self.cpu_only_counts,
            check_ram=self.check_ram,
        )
        if len(self._frag) > 2_000_000:
            self._frag.clear()
        self._frag[key] = val
        return val

    def delta(self, ns: NodeState, pod: PodRequest, take: Take) -> tuple[float, float, float]:
        """(fragmentation before − after, free cards after, free cards before)."""
        before, free_before = self.frag(
            ns, ns.cpu_free, ns.ram_free, ns.mem_used, ns.cores_used, ns.sharers, ns.exclusive
        )
        mem, cores, sharers, excl = after_usage(ns, take)
        after, free_after = self.frag(
            ns,
            ns.cpu_free - pod.cpu_millicores,
            ns.ram_free - pod.ram_mib,
            mem,
            cores,
            sharers,
            excl,
        )
        return before - after, free_after, free_before


@dataclass(frozen=True)
class FGDPolicy:
    """FGD as published: score = ⌊100·sigmoid(ΔF)⌋ with ΔF the fragmentation decrease in cards.

    Faithful details: the node's free capacity is one number per card (its compute share), CPU-only
    shapes count every free card as fragmented, RAM is ignored by the measure, and scores are
    integers so that ties fall to the smallest node name."""

    profile: WorkloadProfile
    name: str = "fgd"

    def bind(self, state: ClusterState) -> Scorer:
        return _FGDScorer(self.profile)


class _FGDScorer(_FragScorerBase):
    def __init__(self, profile: WorkloadProfile) -> None:
        super().__init__(profile, memory_weight=0.0, cpu_only_counts=True, check_ram=False)

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        if not take and not pod.cpu_millicores and not pod.ram_mib:
            return 100.0  # a pod requesting nothing scores the maximum everywhere
        d, _, _ = self.delta(ns, pod, take)
        return float(int(100.0 / (1.0 + math.exp(-d))))


@dataclass(frozen=True)
class FragmentationPolicy:
    """Camp's default: minimise the increase of workload-weighted fragmentation (FGD's gradient),
    with what FGD leaves on the table added back. Each term was measured on the openb trace
    (docs/BENCHMARKS.md):

    * ``quantum``: the gradient is rounded to steps of this many cards, so that negligible
      differences do not scatter pods (FGD gets a similar effect from its integer sigmoid);
    * ``pack_weight``: within a step, the node left with the fewest free cards wins (FGD falls
      back to node names), which keeps large free blocks for multi-GPU pods;
    * ``balance_weight``: free cards that the node's remaining CPU could no longer feed at the
      workload's CPU-per-card ratio count as fragments — FGD only notices CPU starvation once a
      typical pod no longer fits;
    * ``scarcity_weight``: taking a card of a model that model-restricted pods need (more demand
      than supply for them) is charged, so flexible pods go elsewhere while they can;
    * ``waste_weight``: look-ahead on the chosen cards — the decrease of their expected waste
      (:func:`expected_waste`: what a gap ends as when the profile's pods keep filling it), on
      only when slices of a card carry at least ``waste_min_sharing`` of the profile's GPU
      demand (measured on openb: −0.16/−0.20 points on gpushare80/100; neutral to slightly
      worse at 64 % sharing and worse on cpu250, so off there);
    * card share is memory weighted (memory cannot be compressed) and RAM is part of the fit;
    * multi-GPU containers prefer one NVLink island / NUMA node (``topology_weight``, or required
      with ``strict_topology``); cards with low measured load are preferred (``load_weight``).
    """

    profile: WorkloadProfile
    quantum: float = 0.05
    pack_weight: float = 0.01
    pack_mode: Literal["cards", "fraction"] = "cards"
    balance_weight: float = 1.0
    scarcity_weight: float = 1.0
    card_weight: float = 0.0
    waste_weight: float = 0.25
    waste_min_sharing: float = 0.75
    topology_weight: float = 0.05
    load_weight: float = 0.02
    strict_topology: bool = False
    memory_weight: float = MEMORY_WEIGHT
    check_ram: bool = True
    name: str = "camp"

    def bind(self, state: ClusterState) -> Scorer:
        return _CampScorer(self, state)


def model_scarcity(profile: WorkloadProfile, state: ClusterState) -> dict[str, float]:
    """Per GPU model: the share of the workload's card demand that can run only on some models,
    attributed to this model in proportion to capacity, relative to this model's share of the
    cluster's cards. Above 1, pods restricted to the model would fill it on their own."""
    cap: dict[str, float] = {}
    for ns in state.nodes.values():
        for gs in ns.static.gpus:
            cap[gs.device.model] = cap.get(gs.device.model, 0.0) + 1.0
    total_cap = sum(cap.values())
    if not total_cap:
        return {}
    restricted = dict.fromkeys(cap, 0.0)
    demand = 0.0
    for shape, w in profile.shapes:
        cards = w * card_share(shape)
        if cards <= 0:
            continue
        demand += cards
        allowed = [m for m in cap if shape.allows_model(m)]
        if len(allowed) == len(cap) or not allowed:
            continue
        allowed_cap = sum(cap[m] for m in allowed)
        for m in allowed:
            restricted[m] += cards * cap[m] / allowed_cap
    if not demand:
        return {}
    return {m: (restricted[m] / demand) / (cap[m] / total_cap) for m in cap}


class _CampScorer(_FragScorerBase):
    def __init__(self, p: FragmentationPolicy, state: ClusterState) -> None:
        super().__init__(
            p.profile, memory_weight=p.memory_weight, cpu_only_counts=False, check_ram=p.check_ram
        )
        self.p = p
        self.strict_topology = p.strict_topology
        self.cpu_per_card = cpu_per_card(p.profile)
        self.scarcity = model_scarcity(p.profile, state) if p.scarcity_weight else {}
        self.waste = (
            expected_waste(p.profile)
            if p.waste_weight and sharing_share(p.profile) >= p.waste_min_sharing
            else []
        )

    def starved(self, cpu_free: int, free_cards: float) -> float:
        """Free cards the node's remaining CPU cannot feed at the workload's CPU-per-card."""
        if self.cpu_per_card <= 0:
            return 0.0
        return max(0.0, free_cards - max(0, cpu_free) / self.cpu_per_card)

    def waste_delta(self, ns: NodeState, take: Take) -> float:
        """Decrease of the chosen cards' expected waste (:func:`expected_waste`), in cards."""
        mem, cores, _, _ = after_usage(ns, take)
        w = self.waste
        dw = 0.0
        for i in {i for _, i, _ in take}:
            b = int(round(100 * (1.0 - used_share(ns, ns.mem_used, ns.cores_used, i))))
            a = int(round(100 * (1.0 - used_share(ns, mem, cores, i))))
            dw += w[max(0, b)] - w[max(0, a)]
        return dw

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        d, free_after, free_before = self.delta(ns, pod, take)
        if self.p.balance_weight:
            d -= self.p.balance_weight * (
                self.starved(ns.cpu_free - pod.cpu_millicores, free_after)
                - self.starved(ns.cpu_free, free_before)
            )
        n = len(ns.static.gpus) or 1
        if self.waste and take:
            d += self.p.waste_weight * self.waste_delta(ns, take)
        if self.p.quantum:
            d = math.floor(d / self.p.quantum + 0.5) * self.p.quantum
        if self.scarcity and take:
            pen = 0.0
            for _, i, dm in take:
                gs = ns.static.gpus[i]
                share = 1.0 if dm.exclusive else dm.gpu_cores_percent / gs.cores_capacity
                pen += min(1.0, self.scarcity.get(gs.device.model, 0.0)) * share
            d -= self.p.scarcity_weight * pen
        free_term = free_after if self.p.pack_mode == "cards" else free_after / n
        s = d - self.p.pack_weight * free_term
        if take and self.p.card_weight:
            mem, cores, _, _ = after_usage(ns, take)
            chosen = {i for _, i, _ in take}
            s += self.p.card_weight * sum(used_share(ns, mem, cores, i) for i in chosen) / len(chosen)
        if take:
            s += self.p.topology_weight * topology_term(ns, take)
            s -= self.p.load_weight * load_term(ns, take)
        return s


def expected_waste(profile: WorkloadProfile) -> list[float]:
    """Rule (look-ahead on a card): per free share of one card (0..100 %), the share (in cards)
    expected to stay unusable if the profile's pods keep arriving — a fitting shape is drawn in
    proportion to its weight, the remainder is filled again, until no shape fits.

    Only the observed workload (the profile) is used, never the pods still to come. FGD counts
    a gap as fragmented for every typical pod too large for it *now*; this asks what the gap
    ends as once smaller typical pods have filled it (0.53 of a card after a 0.47 pod is no
    loss when 0.47 pods are common; 0.19 after a 0.81 pod is, unless tiny pods are)."""
    shares: dict[int, float] = {}
    for shape, w in profile.shapes:
        if not shape.containers:
            continue
        c = shape.containers[0]
        pct = 100 if c.whole_cards else (c.gpu_memory_percent or c.gpu_cores_percent)
        if 0 < pct <= 100:
            shares[pct] = shares.get(pct, 0.0) + w
    out = [0.0] * 101
    for f in range(1, 101):
        fit = [(s, w) for s, w in shares.items() if s <= f]
        q = sum(w for _, w in fit)
        out[f] = sum(w * out[f - s] for s, w in fit) / q if fit else f / 100.0
    return out


def sharing_share(profile: WorkloadProfile) -> float:
    """The share of the profile's GPU demand (in cards) asked for as slices of a card."""
    sliced = total = 0.0
    for shape, w in profile.shapes:
        cards = w * card_share(shape)
        total += cards
        if any(not c.whole_cards for c in shape.containers):
            sliced += cards
    return sliced / total if total else 0.0


def card_share(p: PodRequest) -> float:
    """Cards a pod asks for (whole cards count 1, slices their memory or cores share)."""
    total = 0.0
    for c in p.containers:
        if c.whole_cards:
            total += c.gpu_count
        else:
            pct = c.gpu_memory_percent or c.gpu_cores_percent
            total += c.gpu_count * pct / 100.0
    return total


def cpu_per_card(profile: WorkloadProfile) -> float:
    """The workload's CPU millicores per requested card (GPU shapes only)."""
    cpu = cards = 0.0
    for shape, w in profile.shapes:
        share = card_share(shape)
        if share > 0:
            cpu += w * shape.cpu_millicores
            cards += w * share
    return cpu / cards if cards else 0.0


# --------------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BestFitPolicy:
    """Best fit as in the FGD simulator: ⌊100·(1 − ½·cpu_left/max_cpu − ½·gpu_left/max_gpu)⌋
    after placement, the tightest card for a shared slice."""

    max_cpu_millicores: int = 128_000
    max_gpus: int = 8
    name: str = "bestfit"

    def bind(self, state: ClusterState) -> Scorer:
        return _BestFitScorer(self)


class _BestFitScorer:
    cacheable = True
    randomized = False
    strict_topology = False

    def __init__(self, p: BestFitPolicy) -> None:
        self.p = p

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        mem, cores, sharers, excl = after_usage(ns, take)
        gpu_left = sum(
            max(0, gs.cores_capacity - cores[i]) / gs.cores_capacity
            for i, gs in enumerate(ns.static.gpus)
            if not excl[i]
        )
        cpu_left = ns.cpu_free - pod.cpu_millicores
        s = 0.5 * cpu_left / self.p.max_cpu_millicores + 0.5 * gpu_left / self.p.max_gpus
        node_score = float(int(100.0 * (1.0 - s)))
        # Card level: tightest card first (a tiny term that never reorders nodes).
        card = sum(used_share(ns, mem, cores, i) for _, i, _ in take)
        return node_score + 1e-6 * card


@dataclass(frozen=True)
class RandomPolicy:
    """A uniformly random feasible node (seeded)."""

    seed: int = 0
    name: str = "random"

    def bind(self, state: ClusterState) -> Scorer:
        return _RandomScorer(self.seed)


class _RandomScorer:
    cacheable = True
    randomized = True
    strict_topology = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def score(self, ns: NodeState, pod: PodRequest, take: Take) -> float:
        return 0.0


def default_policy(profile: WorkloadProfile | None) -> Policy:
    """Camp's default: fragmentation-aware when a workload profile is known, else binpack."""
    if profile:
        return FragmentationPolicy(profile)
    return ResourcePolicy()
