"""Placement: filter → score → select → reserve, per pod and per job (gang).

``Placer`` binds a policy to a :class:`ClusterState`. For one pod it walks the node *groups*
(nodes with identical signature), filters and scores one representative per group — the result is
cached per (signature, pod shape), so unchanged nodes are never re-scored — and selects the best
score, ties going to the lexicographically smallest node name. ``place_job`` places every pod of a
job, honouring gangs (all or nothing, rolled back with ``unreserve``) and job-level affinity.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

from scheduling.engine.candidates import Take, enumerate_takes
from scheduling.engine.fragmentation import WorkloadProfile, shape_key
from scheduling.engine.model import (
    Admit,
    ClusterSnapshot,
    Decision,
    Job,
    JobAffinity,
    Placement,
    PodPlacement,
    PodRequest,
    Reject,
    Wait,
)
from scheduling.engine.policies import Policy, Scorer, default_policy
from scheduling.engine.state import WHOLE_CARD_FOR_SLICE, ClusterState, NodeState, NodeStatic, empty_node

# Larger than any policy's score spread: a slice on a whole exclusive-only card always ranks
# below every placement on shareable cards.
SLICE_ON_WHOLE_CARD_PENALTY = 1e9

_MISS: tuple[float, Take] = (float("nan"), ())
"""Cache sentinel (compared by identity)."""
SAME_NODE_ATTEMPTS = 64
"""How many distinct node states a same-node job tries before it waits."""


# --------------------------------------------------------------------------------------------------
# Filter step
# --------------------------------------------------------------------------------------------------


def node_filter(ns: NodeState, pod: PodRequest) -> str | None:
    """Rule (node fit): a node can take a pod iff it is schedulable and healthy, has a free pod
    slot, enough free CPU and RAM, and, for each container, at least ``gpu_count`` cards of an
    allowed model (containers of one pod may share a card).
    Returns None when it passes, else the reason (as a user would read it)."""
    node = ns.static.node
    if not node.schedulable:
        return "node unschedulable"
    if not node.healthy:
        return "node unhealthy"
    if pod.arches and node.arch not in pod.arches:
        return f"image has no {node.arch} variant"
    if ns.pods_free < 1:
        return "too many pods"
    if pod.cpu_millicores > ns.cpu_free:
        return "insufficient CPU"
    if pod.ram_mib > ns.ram_free:
        return "insufficient RAM"
    if pod.containers:
        allowed = allowed_cards(ns.static, pod)
        if allowed == 0:
            return "no allowed GPU model"
        if allowed < max(c.gpu_count for c in pod.containers):
            return "too few GPUs of an allowed model"
    return None


def allowed_cards(static: NodeStatic, pod: PodRequest) -> int:
    """How many of the node's cards are of a model the pod allows (cached per node class)."""
    key = (pod.gpu_models, pod.excluded_gpu_models)
    n = static.allowed.get(key)
    if n is None:
        n = sum(1 for gs in static.gpus if pod.allows_model(gs.device.model))
        static.allowed[key] = n
    return n


def describe_gpu_ask(pod: PodRequest) -> str:
    """A short human description of a pod's GPU request."""
    parts = []
    for c in pod.containers:
        if c.whole_cards:
            parts.append(f"{c.gpu_count} whole GPU(s)")
        else:
            mem = f"{c.gpu_memory_mib} MiB" if c.gpu_memory_mib else f"{c.gpu_memory_percent}%"
            parts.append(f"{c.gpu_count} × ({mem} memory, {c.gpu_cores_percent}% cores)")
    return " + ".join(parts) or "no GPU"


def _static_fits(static: NodeStatic, pod: PodRequest, strict_topology: bool) -> bool:
    """Could ``pod`` run on this node if the node were empty and schedulable?"""
    node = static.node
    if pod.cpu_millicores > node.cpu_millicores or pod.ram_mib > node.ram_mib or node.max_pods < 1:
        return False
    if pod.arches and node.arch not in pod.arches:
        return False
    if not pod.containers:
        return True
    empty = NodeState(static, foreign=False)  # other schedulers' pods end too: never "never"
    return bool(enumerate_takes(empty, pod, strict_topology=strict_topology, max_takes=1))


def model_family(model: str) -> str:
    """The physical GPU model an engine model name stands for: the part before ``@`` (a suffix
    marks the same cards elsewhere, e.g. in a dedicated pool)."""
    return model.split("@", 1)[0]


def model_families(job: Job, pods: Sequence[PodRequest], state: ClusterState) -> list[tuple[PodRequest, ...]]:
    """Rule (one GPU model per job), static part: the job's pod lists restricted to each model
    family that every GPU pod allows, by family name; empty when the rule does not apply (the job
    allows mixing, asks fewer than two GPUs, the cluster has one model, or its pods name
    different models themselves)."""
    gpu_pods = [p for p in pods if p.containers]
    if job.mixed_gpu_models or sum(p.gpu_count for p in gpu_pods) < 2 or len(state.gpu_models) < 2:
        return []
    families: dict[str, set[str]] = {}
    for m in state.gpu_models:
        families.setdefault(model_family(m), set()).add(m)
    common = sorted(f for f, ms in families.items()
                    if all(any(p.allows_model(m) for m in ms) for p in gpu_pods))
    return [
        tuple(dataclasses.replace(p, gpu_models=frozenset(m for m in families[f] if p.allows_model(m)))
              if p.containers else p for p in pods)
        for f in common
    ]


def one_model_variants(
    job: Job, pods: Sequence[PodRequest], state: ClusterState, placer: Placer
) -> list[tuple[PodRequest, ...]]:
    """Rule (one GPU model per job): unless the job allows mixing, all the GPUs of its pods are
    of one model. Returns the pod lists to try in turn, each restricted to one model family
    that every GPU pod of the job allows: first the family the placer would pick for the first
    GPU pod, then the others by name. A job with one GPU, or whose pods' model lists share no
    family (it asked for different models itself), is tried as it is."""
    out = model_families(job, pods, state)
    if not out:
        return [tuple(pods)]
    if len(out) > 1:
        first = placer.find(next(p for p in pods if p.containers))
        if first is not None and first.gpus:
            preferred = model_family(first.gpus[0].gpu_model)
            out.sort(key=lambda v: variant_family(v) != preferred)
    return out


def variant_family(variant: Sequence[PodRequest]) -> str:
    """The model family a :func:`model_families` pod list is restricted to."""
    return min(model_family(m) for p in variant if p.containers for m in p.gpu_models)


def cards_needed(pods: Sequence[PodRequest]) -> int:
    """Fewest cards that could hold all these pods at once (a lower bound): whole cards are not
    shared between pods, but containers of one pod may share cards (so a pod's widest
    whole-card container counts), and slices may share cards (only the widest sliced container
    counts)."""
    whole = sum(max((c.gpu_count for c in p.containers if c.whole_cards), default=0) for p in pods)
    sliced = max((c.gpu_count for p in pods for c in p.containers if not c.whole_cards), default=0)
    return whole + sliced


def family_cards(variant: Sequence[PodRequest], state: ClusterState) -> int:
    """Cards in the cluster of a model some GPU pod of ``variant`` allows (used or not)."""
    gpu_pods = [p for p in variant if p.containers]
    return sum(n for m, n in state.model_cards.items() if any(p.allows_model(m) for p in gpu_pods))


def one_model_never_fits(
    job: Job, pods: Sequence[PodRequest], state: ClusterState,
    can_hold: Callable[[tuple[PodRequest, ...]], bool],
) -> tuple[str | None, list[tuple[PodRequest, ...]]]:
    """Rule (reject, one GPU model per job): a job that may not mix models can never run when no
    single family could hold it: the family has fewer cards in all than the job needs, or
    ``can_hold`` (the caller's static node checks: each pod fits an empty node of the family,
    affinity) says no. Like the other never-fits rules this looks at the cluster's nodes as
    they are defined, not at their health or usage now.
    Returns (reason or None, the families that could hold it, in :func:`model_families` order)."""
    variants = model_families(job, pods, state)
    if not variants:
        return None, []
    need = cards_needed(pods)
    ok = [v for v in variants if family_cards(v, state) >= need and can_hold(v)]
    if ok:
        return None, ok
    have = ", ".join(f"{variant_family(v)}: {family_cards(v, state)}" for v in variants)
    return (
        f"no single GPU model can ever hold the job (it needs {need} GPUs of one model; cards "
        f"per model: {have}); allow mixing GPU models (mixed_gpu_models) to run it across models",
        [],
    )


# --------------------------------------------------------------------------------------------------
# The placer
# --------------------------------------------------------------------------------------------------


class Placer:
    """Places pods and jobs on a :class:`ClusterState` with one policy."""

    def __init__(
        self,
        state: ClusterState,
        policy: Policy | None = None,
        *,
        profile: WorkloadProfile | None = None,
    ) -> None:
        self.state = state
        self.policy: Policy = policy if policy is not None else default_policy(profile)
        self.scorer: Scorer = self.policy.bind(state)
        self._shape_ids: dict[PodRequest, int] = {}
        self._cache: dict[int, dict[int, tuple[float, Take] | None]] = {}
        self._static_cache: dict[tuple[int, int], bool] = {}
        self._fits_somewhere: set[int] = set()
        """Shape ids that fit at least one empty node (the nodes' static shapes never change)."""
        self._cache_size = 0
        self._why_memo: dict[tuple[PodRequest, frozenset[str]], tuple[int, str]] = {}
        """(pod shape, excluded nodes) → (``state.version``, :meth:`why_not`'s text): the text
        depends on nothing else, and a placement step probes many jobs of one shape against an
        unchanged state (each answer walked every node state: ~60 % of a step's time on the
        two openb halves full of running jobs, BENCHMARKS §9)."""

    # -- score step ----------------------------------------------------------------------------

    def best_take(self, ns: NodeState, pod: PodRequest) -> tuple[float, Take] | None:
        """Filter the node, search its card combinations, score each; keep the best (first on
        ties, i.e. lowest card indices)."""
        if node_filter(ns, pod) is not None:
            return None
        best: tuple[float, Take] | None = None
        for take in enumerate_takes(ns, pod, strict_topology=self.scorer.strict_topology):
            s = self.scorer.score(ns, pod, take)
            if any(d.alignment == WHOLE_CARD_FOR_SLICE for _, _, d in take):
                # Rule (slices stay on shareable cards): a slice takes a whole exclusive-only
                # card (a node without HAMi) only when no shareable card anywhere can hold it.
                s -= SLICE_ON_WHOLE_CARD_PENALTY
            if best is None or s > best[0]:
                best = (s, take)
        return best

    def _shape_cache(self, pod: PodRequest) -> dict[int, tuple[float, Take] | None]:
        shape = shape_key(pod)
        sid = self._shape_ids.get(shape)
        if sid is None:
            sid = len(self._shape_ids)
            self._shape_ids[shape] = sid
        if self._cache_size > 4_000_000:
            self._cache.clear()
            self._cache_size = 0
        c = self._cache.get(sid)
        if c is None:
            c = {}
            self._cache[sid] = c
        return c

    # -- select step ---------------------------------------------------------------------------

    def ranked(self, pod: PodRequest, *, exclude: Collection[str] = ()) -> list[tuple[float, str, Take]]:
        """Every feasible node state as (score, first node name, take), best first."""
        out: list[tuple[float, str, Take]] = []
        cache = self._shape_cache(pod) if self.scorer.cacheable else None
        for sid, names in self.state.groups.items():
            r = self._group_result(sid, names, pod, cache)
            if r is None:
                continue
            name = _first_allowed(names, exclude)
            if name is not None:
                out.append((r[0], name, r[1]))
        out.sort(key=lambda t: (-t[0], t[1]))
        return out

    def _group_result(
        self,
        sid: int,
        names: list[str],
        pod: PodRequest,
        cache: dict[int, tuple[float, Take] | None] | None,
    ) -> tuple[float, Take] | None:
        if cache is None:
            return self.best_take(self.state.nodes[names[0]], pod)
        r = cache.get(sid, _MISS)
        if r is _MISS:
            r = self.best_take(self.state.nodes[names[0]], pod)
            cache[sid] = r
            self._cache_size += 1
        return r

    def find(
        self,
        pod: PodRequest,
        *,
        exclude: Collection[str] = (),
        only: Collection[str] | None = None,
    ) -> PodPlacement | None:
        """Select the best node and cards for ``pod`` (without reserving).

        ``exclude`` removes nodes (distinct-node affinity); ``only`` restricts to some nodes."""
        cache = self._shape_cache(pod) if self.scorer.cacheable else None
        nodes = self.state.nodes
        best_s = 0.0
        best_name: str | None = None
        best_take: Take = ()
        if only is not None:
            for cand in sorted(only):
                ns = nodes.get(cand)
                if ns is None or cand in exclude:
                    continue
                r = self._group_result(ns.sig_id, [cand], pod, cache)
                if r is not None and (best_name is None or r[0] > best_s):
                    best_s, best_name, best_take = r[0], cand, r[1]
        elif self.scorer.randomized:
            feasible: list[tuple[list[str], Take]] = []
            total = 0
            for sid, names in self.state.groups.items():
                r = self._group_result(sid, names, pod, cache)
                if r is None:
                    continue
                allowed = [n for n in names if n not in exclude] if exclude else names
                if allowed:
                    feasible.append((allowed, r[1]))
                    total += len(allowed)
            if not total:
                return None
            k = self.scorer.rng.randrange(total)  # type: ignore[attr-defined]
            for allowed, take in feasible:
                if k < len(allowed):
                    best_name, best_take = allowed[k], take
                    break
                k -= len(allowed)
        else:
            groups = self.state.groups
            for sid, names in groups.items():
                r = cache.get(sid, _MISS) if cache is not None else _MISS
                if r is _MISS:
                    r = self._group_result(sid, names, pod, cache)
                if r is None:
                    continue
                s = r[0]
                if best_name is not None and s < best_s:
                    continue
                name = names[0] if not exclude else _first_allowed(names, exclude)
                if name is None:
                    continue
                if best_name is None or s > best_s or name < best_name:
                    best_s, best_name, best_take = s, name, r[1]
        if best_name is None:
            return None
        return self.to_placement(pod, nodes[best_name], best_take)

    def to_placement(self, pod: PodRequest, ns: NodeState, take: Take) -> PodPlacement:
        """Turn a take into a :class:`PodPlacement` with per-card grants."""
        return PodPlacement(
            pod=pod.name,
            node=ns.name,
            gpus=tuple(self.state.grant(ns, c, i, d) for c, i, d in take),
            cpu_millicores=pod.cpu_millicores,
            ram_mib=pod.ram_mib,
        )

    # -- reserve step --------------------------------------------------------------------------

    def place_pod(self, pod: PodRequest) -> PodPlacement | None:
        """Find and reserve a placement for one pod; None when it does not fit now."""
        p = self.find(pod)
        if p is not None:
            self.state.reserve(p, check=False)
        return p

    # -- explanations --------------------------------------------------------------------------

    def never_fits(self, pod: PodRequest) -> str | None:
        """Rule (reject): a pod that fits no node even when that node is empty can never run."""
        shape = shape_key(pod)
        sid = self._shape_ids.setdefault(shape, len(self._shape_ids))
        if sid in self._fits_somewhere:
            return None
        seen: set[int] = set()
        for ns in self.state.nodes.values():
            cid = ns.static.class_id
            if cid in seen:
                continue
            seen.add(cid)
            key = (cid, sid)
            ok = self._static_cache.get(key)
            if ok is None:
                ok = _static_fits(ns.static, pod, self.scorer.strict_topology)
                self._static_cache[key] = ok
            if ok:
                self._fits_somewhere.add(sid)
                return None
        if pod.arches and not any(ns.static.node.arch in pod.arches for ns in self.state.nodes.values()):
            built = ", ".join(sorted(f"linux/{a}" for a in pod.arches))
            have = ", ".join(sorted({f"linux/{ns.static.node.arch}" for ns in self.state.nodes.values()}))
            return (f"pod {pod.name}: its image's architecture does not match — the image catalog "
                    f"records it as built for {built} only, and this cluster's nodes are {have or 'none'}")
        if pod.containers and not any(
            pod.allows_model(m) for ns in self.state.nodes.values() for m in ns.static.models
        ):
            return f"pod {pod.name}: no node has a GPU model it allows"
        return (
            f"pod {pod.name} ({pod.cpu_millicores}m CPU, {pod.ram_mib} MiB RAM, "
            f"{describe_gpu_ask(pod)}) is larger than any node"
        )

    def why_not(self, pod: PodRequest, *, exclude: Collection[str] = ()) -> str:
        """Why ``pod`` fits nowhere now, kube-scheduler style: reasons counted over nodes.

        Nodes in one state share one verdict, so this costs one check per distinct state; the
        text is kept per pod shape and excluded nodes until the state changes (``_why_memo``)."""
        key = (shape_key(pod), frozenset(exclude))
        hit = self._why_memo.get(key)
        if hit is not None and hit[0] == self.state.version:
            return hit[1]
        text = self._why_not(pod, exclude)
        if len(self._why_memo) > 10_000:
            self._why_memo.clear()
        self._why_memo[key] = (self.state.version, text)
        return text

    def _why_not(self, pod: PodRequest, exclude: Collection[str]) -> str:
        reasons: Counter[str] = Counter()
        cache = self._shape_cache(pod) if self.scorer.cacheable else None
        for sid, names in self.state.groups.items():
            allowed = [n for n in names if n not in exclude] if exclude else names
            if len(allowed) < len(names):
                reasons["used by another pod of the job"] += len(names) - len(allowed)
            if not allowed:
                continue
            ns = self.state.nodes[allowed[0]]
            r = node_filter(ns, pod)
            if r is None and self._group_result(sid, names, pod, cache) is None:
                r = "insufficient free GPU capacity"
            if r is not None:
                reasons[r] += len(allowed)
        total = len(self.state.nodes)
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        return f"0/{total} nodes can run {describe_gpu_ask(pod)} now: {detail}"

    # -- jobs ----------------------------------------------------------------------------------

    def place_job(self, job: Job, *, reserve: bool = True) -> Decision:
        """Place every pod of a job.

        Rules: a gang job is admitted only when all of its pods are placed in this decision,
        otherwise everything tentatively reserved is rolled back (Wait). A non-gang job is
        admitted with the pods that fit (its placement may cover a subset). ``SAME_NODE``
        affinity puts all pods on one node; ``DISTINCT_NODES`` puts each on its own node. A pod
        that could never fit rejects the job. With ``reserve`` the admitted placement stays
        reserved in the state."""
        pods = job.pods()
        if not pods:
            return Reject(job.name, "job has no pods")
        for p in _distinct_shapes(pods):
            reason = self.never_fits(p)
            if reason is not None:
                return Reject(job.name, reason)
        static_reason = self._affinity_never_fits(job, pods)
        if static_reason is not None:
            return Reject(job.name, static_reason)
        static_reason, _ = one_model_never_fits(
            job, pods, self.state,
            lambda v: all(self.never_fits(p) is None for p in _distinct_shapes(v))
            and self._affinity_never_fits(job, v) is None)
        if static_reason is not None:
            return Reject(job.name, static_reason)
        decision: Decision | None = None
        for variant in one_model_variants(job, pods, self.state, self):
            attempt = (self._place_same_node(job, variant) if job.affinity == JobAffinity.SAME_NODE
                       else self._place_sequential(job, variant))
            if decision is None or isinstance(attempt, Admit):
                decision = attempt
            if isinstance(attempt, Admit):
                break
        assert decision is not None
        if isinstance(decision, Admit) and not reserve:
            for pp in decision.placement.pods:
                self.state.unreserve(pp)
        return decision

    def _place_sequential(self, job: Job, pods: Sequence[PodRequest]) -> Decision:
        placed: list[PodPlacement] = []
        used: set[str] = set()
        distinct = job.affinity == JobAffinity.DISTINCT_NODES
        for p in pods:
            pp = self.find(p, exclude=used if distinct else ())
            if pp is None:
                if job.gang or not placed:
                    why = self.why_not(p, exclude=used if distinct else ())
                    for done in reversed(placed):
                        self.state.unreserve(done)
                    if len(pods) > 1:
                        why = f"gang of {len(pods)} pods: {len(placed)} placed, {p.name} does not fit ({why})"
                    return Wait(job.name, why)
                continue
            self.state.reserve(pp, check=False)
            placed.append(pp)
            used.add(pp.node)
        return Admit(job.name, Placement(tuple(placed)))

    def _place_same_node(self, job: Job, pods: Sequence[PodRequest]) -> Decision:
        candidates = self.ranked(pods[0])
        for _, name, _ in candidates[:SAME_NODE_ATTEMPTS]:
            placed: list[PodPlacement] = []
            for p in pods:
                pp = self.find(p, only=(name,))
                if pp is None:
                    break
                self.state.reserve(pp, check=False)
                placed.append(pp)
            if len(placed) == len(pods):
                return Admit(job.name, Placement(tuple(placed)))
            for done in reversed(placed):
                self.state.unreserve(done)
        return Wait(
            job.name,
            f"no node can take all {len(pods)} pods of the job together now "
            f"({len(candidates)} nodes fit the first pod)",
        )

    def _affinity_never_fits(self, job: Job, pods: Sequence[PodRequest]) -> str | None:
        """Rule (reject, affinity): a same-node job needs one node with room for all its pods when
        empty; a distinct-nodes job needs as many nodes as pods."""
        if job.affinity == JobAffinity.SAME_NODE and len(pods) > 1:
            for ns in self.state.nodes.values():
                trial = ClusterState(ClusterSnapshot(nodes=(empty_node(ns.static.node),)))
                trial_placer = Placer(trial, self.policy)
                if all(trial_placer.place_pod(p) is not None for p in pods):
                    return None
            return f"no node could hold all {len(pods)} pods of the job even when empty"
        if job.affinity == JobAffinity.DISTINCT_NODES and len(pods) > 1:
            hosts = 0
            for ns in self.state.nodes.values():
                if all(
                    _static_fits(ns.static, p, self.scorer.strict_topology) for p in _distinct_shapes(pods)
                ):
                    hosts += 1
            if hosts < len(pods):
                return f"the job needs {len(pods)} distinct nodes; only {hosts} could ever fit"
        return None


def _first_allowed(names: list[str], exclude: Collection[str]) -> str | None:
    if not exclude:
        return names[0]
    for n in names:
        if n not in exclude:
            return n
    return None


def _distinct_shapes(pods: Iterable[PodRequest]) -> list[PodRequest]:
    seen: dict[PodRequest, PodRequest] = {}
    for p in pods:
        seen.setdefault(shape_key(p), p)
    return list(seen.values())


# --------------------------------------------------------------------------------------------------
# One scheduling cycle
# --------------------------------------------------------------------------------------------------


def profile_for(snapshot: ClusterSnapshot, jobs: Iterable[Job]) -> WorkloadProfile:
    """The workload profile used by the default policy: the shapes of pending pods (the workload
    that is about to arrive)."""
    pods: list[PodRequest] = []
    for j in jobs:
        pods.extend(j.pods())
    return WorkloadProfile.from_pods(pods)


def schedule(
    snapshot: ClusterSnapshot,
    jobs: Sequence[Job],
    policy: Policy | None = None,
    *,
    profile: WorkloadProfile | None = None,
) -> list[Decision]:
    """Decide every job in the given order on a fresh state built from ``snapshot``.

    Admitted jobs reserve their placement, so later jobs see it. With no policy, Camp's default
    (fragmentation-aware, profiled on the pending pods) is used."""
    state = ClusterState(snapshot)
    if policy is None:
        policy = default_policy(profile if profile is not None else profile_for(snapshot, jobs))
    placer = Placer(state, policy)
    return [placer.place_job(j) for j in jobs]
