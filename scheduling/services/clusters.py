"""Clusters: create, update, delete, encrypted credentials, and reachability records."""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import ProtectedError, Q
from django.db.models.fields.reverse_related import ForeignObjectRel
from django.utils import timezone

from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import User

from ..backends.credentials import decrypt_credentials, encrypt_credentials, kubeconfig_problems
from ..backends.simulated import InventoryError, parse_inventory
from ..extensions import cluster_users
from ..models import (
    FINAL_STATES,
    Backend,
    Cluster,
    Job,
    not_reserved_cluster_name,
)
from .common import (
    RECONCILE_REQUEST_SECONDS,
    SCHEDULER,
    _require,
    enqueue_on_commit,
    request_cycle,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

CLUSTER_FIELDS = ("name", "display_name", "enabled", "backend", "api_server", "prometheus_url",
                  "namespace_prefix", "placement_policy", "labels")


# --- clusters ------------------------------------------------------------------------------


def _validate_cluster(cluster: Cluster) -> None:
    try:
        not_reserved_cluster_name(cluster.name)
    except ValidationError as exc:
        raise ValidationError({"name": exc.messages}) from exc
    if cluster.backend == Backend.SIMULATED:
        try:
            nodes, _ = parse_inventory(cluster.inventory)
        except InventoryError as exc:
            raise ValidationError({"inventory": [str(exc)]}) from exc
        if cluster.enabled and not nodes:
            raise ValidationError({"inventory": ["A simulated cluster needs at least one node."]})
    labels = cluster.labels
    if labels in (None, ""):
        cluster.labels = labels = {}
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v and len(k) <= 63 and len(v) <= 63
            for k, v in labels.items()):
        raise ValidationError({"labels": [
            'Labels as {"key": "value"} (up to 63 characters each), e.g. {"region": "eu-west"}.']})
    cluster.full_clean(exclude=["credentials_encrypted"])


def _validate_credentials(credentials: dict[str, str]) -> None:
    if credentials.get("kubeconfig"):
        problems = kubeconfig_problems(credentials["kubeconfig"])
        if problems:
            raise ValidationError({"kubeconfig": problems})


def _merged_credentials(cluster: Cluster, given: dict[str, str]) -> str:
    """The stored credentials with ``given`` keys replaced (an empty value clears its key;
    keys not given are kept: a new token keeps the CA certificate and the kubeconfig)."""
    try:
        current = decrypt_credentials(cluster.credentials_encrypted)
    except ValueError:
        current = {}  # unreadable with the configured key: what is given replaces them
    return encrypt_credentials({**current, **given})


def _cluster_snapshot(cluster: Cluster) -> dict[str, Any]:
    data = snapshot(cluster, CLUSTER_FIELDS)
    data["has_credentials"] = cluster.has_credentials  # never the credentials themselves
    return data


def _verify_cluster(cluster: Cluster) -> None:
    """A Kubernetes cluster must answer, accept the credentials and allow what Camp does
    (``kubernetes.access_problems``); else a 400 naming the field, in words."""
    if cluster.backend != Backend.KUBERNETES or not cluster.enabled:
        return
    from ..backends.kubernetes import access_problems

    problems = access_problems(cluster)
    if problems:
        raise ValidationError({k: [v] for k, v in problems.items()})
    from ..backends.kubernetes import cluster_identity

    cluster.kube_system_uid = cluster_identity(cluster)
    _refuse_registered_twice(cluster)


def _refuse_registered_twice(cluster: Cluster) -> None:
    """One registration per Kubernetes cluster, recognised by its kube-system namespace's UID
    whatever the endpoint (a public and a private one): two registrations would each take the
    other's pods for leftovers. A 400 on ``api_server``, in words."""
    uid = cluster.kube_system_uid
    other = Cluster.objects.filter(kube_system_uid=uid).exclude(pk=cluster.pk).first() if uid else None
    if other is not None:
        raise ValidationError({"api_server": [
            f"This Kubernetes cluster is already registered in Camp as {other.name!r} (its "
            f"kube-system namespace has the same UID, {uid}): register a cluster once; to reach "
            f"it through another endpoint, change that registration's api_server."]})


@transaction.atomic
def cluster_create(*, actor: User, name: str, credentials: dict[str, str] | None = None,
                   verify: bool = True, **fields: Any) -> Cluster:
    """Register a cluster. A Kubernetes one is checked first (reachable, credentials valid,
    Camp's permissions granted). ``verify=False`` skips that check: only for tests of a
    cluster that is meant to be dead (no API or console path passes it)."""
    cluster = Cluster(name=name, **fields)
    _require(actor, permissions.CREATE, cluster)
    _validate_cluster(cluster)
    if credentials:
        _validate_credentials(credentials)
        cluster.credentials_encrypted = encrypt_credentials(credentials)
    if verify:
        _verify_cluster(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError as exc:
        _refuse_registered_twice(cluster)  # registered concurrently: say so in words
        raise ValidationError({"name": ["A cluster with this name already exists."]}) from exc
    audit_record(actor=actor, action="cluster.created", target=cluster,
                 after=_cluster_snapshot(cluster))
    if cluster.enabled:
        _after_commit_inventory(cluster.pk)
    return cluster


@transaction.atomic
def cluster_update(*, actor: User, cluster: Cluster, credentials: dict[str, str] | None = None,
                   verify: bool = True, **changes: Any) -> Cluster:
    """Change a cluster; a change of how Camp reaches a Kubernetes cluster (server,
    credentials, backend, enabling it) is checked as at registration."""
    _require(actor, permissions.CHANGE, cluster)
    before = _cluster_snapshot(cluster)
    for key, value in changes.items():
        if key not in (*CLUSTER_FIELDS, "inventory"):
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(cluster, key, value)
    _validate_cluster(cluster)
    if credentials is not None:
        _validate_credentials(credentials)
        cluster.credentials_encrypted = _merged_credentials(cluster, credentials)
    reach = {"api_server", "backend", "enabled"}
    if verify and (credentials or any(before.get(k) != getattr(cluster, k) for k in reach)):
        _verify_cluster(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError as exc:
        _refuse_registered_twice(cluster)
        raise ValidationError({"name": ["A cluster with this name already exists."]}) from exc
    audit_record(actor=actor, action="cluster.updated", target=cluster, before=before,
                 after=_cluster_snapshot(cluster))
    if cluster.enabled:
        _after_commit_inventory(cluster.pk)
    if before.get("enabled") and not cluster.enabled:
        # It takes no new work: its queued floating jobs go back to the global queue, its
        # pinned ones say why they wait (its running jobs stay).
        cluster_close_queued(cluster_id=cluster.pk)
    elif cluster.enabled and not before.get("enabled"):
        _reopened(cluster.pk)
    return cluster


def _cluster_users(cluster: Cluster) -> list[str]:
    """What keeps ``cluster`` from being deleted, as "3 jobs", "1 dev environment": its
    unfinished jobs (finished ones go with it) and every row of another model that refers
    to it with ``on_delete=PROTECT`` (workloads, found by introspection so that scheduling
    does not import the apps built on it)."""
    active = Job.objects.filter(Q(cluster=cluster) & (
        ~Q(state__in=FINAL_STATES) | Q(allocations__isnull=False)))  # or its pods still stopping
    counts: list[tuple[Any, int]] = [(Job._meta, active.distinct().count())]
    for rel in Cluster._meta.get_fields(include_hidden=True):  # hidden: related_name="+"
        if not isinstance(rel, ForeignObjectRel) or getattr(rel, "on_delete", None) is not models.PROTECT:
            continue
        model = rel.related_model
        if model is Job or not isinstance(model, type):
            continue
        counts.append((model._meta, model._base_manager.filter(**{rel.field.name: cluster}).count()))
    counts += cluster_users(cluster)  # workloads that use it through their runs (floating ones)
    merged: dict[Any, int] = {}
    for meta, n in counts:
        merged[meta] = merged.get(meta, 0) + n
    return [f"{n} {meta.verbose_name if n == 1 else meta.verbose_name_plural}"
            for meta, n in merged.items() if n]


@transaction.atomic
def cluster_delete(*, actor: User, cluster: Cluster) -> None:
    """Delete a cluster with its nodes and finished jobs; refused (naming what blocks it)
    while jobs or workloads still use it."""
    _require(actor, permissions.DELETE, cluster)
    blockers = _cluster_users(cluster)
    if blockers:
        listed = blockers[0] if len(blockers) == 1 else f"{', '.join(blockers[:-1])} and {blockers[-1]}"
        verb = "uses" if len(blockers) == 1 and blockers[0].startswith("1 ") else "use"
        raise ValidationError({"cluster": [
            f"{listed} still {verb} this cluster; stop and delete them first."]})
    audit_record(actor=actor, action="cluster.deleted", target=cluster,
                 before=_cluster_snapshot(cluster))
    try:
        with transaction.atomic():
            # Finished jobs only: one bound here since the check (a placement step) is PROTECTed
            # and refuses the delete below rather than being deleted with it.
            Job.objects.filter(cluster=cluster, state__in=FINAL_STATES).delete()
            cluster.delete()
    except ProtectedError as exc:  # something started using it meanwhile
        raise ValidationError({"cluster": [
            "Jobs or workloads still use this cluster; stop and delete them first."]}) from exc


def _after_commit_inventory(cluster_id: int) -> None:
    enqueue_on_commit("cluster_inventory_sync", cluster_id)


# Reachability: a cluster whose API server fails is skipped by the periodic ticks until its
# ``retry_at``: 2, 4, 8 ... seconds after each failure, at most this long.
MAX_RETRY_SECONDS = 300
PERIODIC_TIMEOUT_SECONDS = (5.0, 30.0)
"""Each call of a periodic run (``cluster_periodic``), one attempt: connect within 5 s (a dead
server), read within 30 s (listing a large cluster's pods takes a while); both capped by what
is left of the run's ``CAMP_CLUSTER_RUN_SECONDS``."""

_clock: Callable[[], float] = time.monotonic  # the budget's clock (tests may turn it by hand)


def periodic_request(kind: str, cluster_id: int) -> bool:
    """Whether a periodic run of ``kind`` (``reconcile``, ``inventory``, ``services-sweep`` …)
    may be queued for the cluster now: not while one is queued or running. Ticks coalesce per
    cluster and kind, so a slow cluster never piles its runs up in the queue; the key is
    dropped when the run ends (``cluster_periodic``) or expires (a run lost with a killed
    worker holds back the next one this long at most)."""
    timeout = max(RECONCILE_REQUEST_SECONDS, 2 * _run_seconds())  # outlives a run in its budget
    # The value is when it was queued: the admin home reads the oldest (``scheduler_lag``).
    return bool(cache.add(f"camp:periodic:{kind}:{cluster_id}", time.time(), timeout=timeout))


def periodic_request_taken(kind: str, cluster_id: int) -> None:
    cache.delete(f"camp:periodic:{kind}:{cluster_id}")


# --- is the scheduler keeping up? (issue 32, finding 2) ------------------------------------

SCHEDULER_TICK_KEY = "camp:tick:scheduler"
PERIODIC_KINDS = ("reconcile", "inventory")
"""The per-cluster periodic runs the beat queues through ``periodic_request`` (their age is
read by ``scheduler_lag``)."""


def scheduler_tick_ran(*, sent_at: float | None, now: float | None = None) -> None:
    """Record that the beat's scheduler tick ran now, and how long it waited in the queue
    (``sent_at``: when the beat sent it; None when unknown, e.g. run by hand)."""
    now = time.time() if now is None else now
    waited = max(0.0, now - sent_at) if sent_at is not None else 0.0
    try:
        cache.set(SCHEDULER_TICK_KEY, {"ran": now, "waited": waited}, timeout=None)
    except Exception:  # the cache is down: the tick itself goes on
        logger.warning("scheduler tick not recorded (cache unavailable)")


@dataclass(frozen=True)
class SchedulerLag:
    """How far behind the workers are. ``tick_age``: age of the oldest scheduler tick not run
    yet, as far as can be told — the wait of the last one that ran, or, when none ran for
    longer than a period, the time since (the next one has waited that long at least);
    ``periodic_age``/``periodic_what``: the oldest periodic run queued or running (reconcile,
    inventory) and which; ``lagging``: either is over ``SCHEDULER_LAG_SECONDS``."""

    tick_age: float | None
    periodic_age: float | None
    periodic_what: str
    lagging: bool


def scheduler_lag(cluster_names: dict[int, str], *, now: float | None = None) -> SchedulerLag:
    """The admin home's "is the scheduler lagging" (one cache read for the tick, one for the
    periodic runs of ``cluster_names``: cluster id → name). No tick recorded yet (no beat
    since the cache was emptied): ``tick_age`` None, nothing to say about it."""
    now = time.time() if now is None else now
    period = float(settings.SCHEDULER_TICK_SECONDS)
    tick_age: float | None = None
    try:
        last = cache.get(SCHEDULER_TICK_KEY)
        keys = {f"camp:periodic:{kind}:{pk}": f"{kind} of {name}"
                for pk, name in cluster_names.items() for kind in PERIODIC_KINDS}
        queued = cache.get_many(list(keys))
    except Exception:  # the cache is down: nothing known
        return SchedulerLag(None, None, "", False)
    if isinstance(last, dict):
        since = max(0.0, now - float(last["ran"]) - period)
        tick_age = max(float(last["waited"]), since)
    oldest = min(((float(v), keys[k]) for k, v in queued.items() if isinstance(v, (int, float))
                  and not isinstance(v, bool) and v > 1), default=None)  # 1: a marker of before
    periodic_age = max(0.0, now - oldest[0]) if oldest else None
    limit = float(settings.SCHEDULER_LAG_SECONDS)
    lagging = (tick_age or 0.0) > limit or (periodic_age or 0.0) > limit + _run_seconds()
    return SchedulerLag(tick_age, periodic_age, oldest[1] if oldest else "", lagging)


def cluster_periodic(kind: str, cluster_id: int, run: Callable[[Cluster], T], *,
                     enabled_only: bool = True) -> T | str:
    """The one gate of every periodic task that calls a cluster: ``run(cluster)`` if the
    cluster may be called now, within its time; else why not.

    Rules: a disabled cluster is not called ("disabled"; ``enabled_only=False`` for what its
    running jobs still need, e.g. their checkpoints); one backing off after a failure is
    not called before its ``retry_at`` ("backing-off") and stays skipped until a probe finds
    it answering. A Kubernetes cluster is probed first (``GET /version``,
    ``CAMP_KUBE_PROBE_SECONDS``, no retries) by one run at a time: a run that finds another
    probing it skips this round ("busy": a healthy cluster answers in milliseconds, a dead
    one is being found out, so its failure costs one probe, not one per task); then ``run``
    calls it with one attempt per call and at most
    ``CAMP_CLUSTER_RUN_SECONDS`` in all (``CallBudget``: every ``backend_for`` inside is bound
    to it). A probe or call that gets no answer, or a 5xx/429, is a reachability failure
    (``cluster_reachability_record``: backoff, the cluster takes no new work) — "unreachable";
    an answered refusal (4xx) is kept in ``last_error`` — "error"; a run whose time ran out
    between answered calls stops there ("budget-spent"; the next run goes on). A run that
    got its answers ends an outage. The run's request key (``periodic_request``) is dropped at
    the end, whatever happened, so the next tick may queue it again."""
    from ..backends import backend_for, budgeted
    from ..backends.base import BackendError, BudgetSpent, CallBudget

    try:
        cluster = Cluster.objects.filter(pk=cluster_id).first()
        if cluster is None or (enabled_only and not cluster.enabled):
            return "disabled"
        if not cluster_due(cluster):
            return "backing-off"
        down = cluster.unreachable_since is not None or cluster.failures > 0
        connect, read = PERIODIC_TIMEOUT_SECONDS
        budget = CallBudget(deadline=_clock() + _run_seconds(), connect=connect, read=read,
                            retries=0, clock=_clock)
        try:
            with budgeted(cluster_id, budget):
                if cluster.backend == Backend.KUBERNETES:
                    probing = f"camp:cluster-probing:{cluster_id}"
                    if not cache.add(probing, 1, timeout=_run_seconds() + 5):
                        return "busy"  # another run is probing it now
                    try:
                        # Read again under the probe lock: a run that read the cluster before
                        # another's probe failed must not probe it a second time.
                        fresh = Cluster.objects.filter(pk=cluster_id).only("retry_at").first()
                        if fresh is None or not cluster_due(fresh):
                            return "backing-off"
                        backend_for(cluster).probe()  # type: ignore[attr-defined]
                    finally:
                        cache.delete(probing)
                result: T | str = run(cluster)
        except BudgetSpent as exc:
            logger.warning("cluster %s: %s stopped: %s", cluster.name, kind, exc)
            result = "budget-spent"
        except BackendError as exc:
            if exc.unreachable or exc.retryable:
                cluster_reachability_record(cluster_id=cluster_id, error=str(exc))
                return "unreachable"
            Cluster.objects.filter(pk=cluster_id).update(last_error=str(exc)[:500])
            return "error"
        if down:
            cluster_reachability_record(cluster_id=cluster_id, error=None)
        return result
    finally:
        periodic_request_taken(kind, cluster_id)


def _run_seconds() -> float:
    return float(getattr(settings, "CAMP_CLUSTER_RUN_SECONDS", 30))


def cluster_reachability_record(*, cluster_id: int, error: str | None) -> None:
    """Record a reconcile's outcome for the cluster's backoff: ``error`` None means it
    answered. The first failure and the recovery are audited (the system as actor); the
    cluster page and /metrics show the state."""
    now = timezone.now()
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update(no_key=True).get(pk=cluster_id)
        if error is None:
            if cluster.unreachable_since is None and not cluster.failures:
                return
            down_for = (now - cluster.unreachable_since).total_seconds() if cluster.unreachable_since else 0
            Cluster.objects.filter(pk=cluster_id).update(
                unreachable_since=None, retry_at=None, failures=0, last_error="")
            audit_record(actor=None, actor_username=SCHEDULER, action="cluster.reachable",
                         target=cluster, before={"failures": cluster.failures},
                         after={"unreachable_seconds": round(down_for)})
            if cluster.unreachable_since is not None:
                _reopened(cluster_id)  # its next cycle admits again and rewrites the reasons
            return
        failures = cluster.failures + 1
        wait = min(2 ** failures, MAX_RETRY_SECONDS)
        Cluster.objects.filter(pk=cluster_id).update(
            failures=failures, retry_at=now + dt.timedelta(seconds=wait),
            unreachable_since=cluster.unreachable_since or now, last_error=error[:500])
        if cluster.unreachable_since is None:
            audit_record(actor=None, actor_username=SCHEDULER, action="cluster.unreachable",
                         target=cluster, after={"error": error[:500]})
        # It takes no new work: its queued floating jobs go back to the global queue (those
        # running stay; a job never runs in two clusters), its pinned ones say why they wait.
        cluster_close_queued(cluster_id=cluster_id)


def cluster_due(cluster: Cluster, now: dt.datetime | None = None) -> bool:
    """Whether the periodic ticks may talk to the cluster now (not backing off)."""
    return cluster.retry_at is None or cluster.retry_at <= (now or timezone.now())


# --- a cluster that takes no new work (disabled or unreachable) ------------------------------

_URL_CREDENTIALS = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s@]*@", re.IGNORECASE)
_SECRET_PARAMS = re.compile(
    r"\b(token|access_token|password|passwd|secret|api[_-]?key|sig|signature)=[^&\s]+", re.IGNORECASE)
_BEARER = re.compile(r"\b(bearer)\s+[A-Za-z0-9._~+/=-]+", re.IGNORECASE)


def public_error(text: str, limit: int = 200) -> str:
    """A cluster's error as every user may read it in a job's reason: no user or password
    in URLs, no token or secret query parameters, no Authorization values; one line."""
    text = " ".join((text or "").split())
    text = _URL_CREDENTIALS.sub(r"\1", text)
    text = _SECRET_PARAMS.sub(r"\1=…", text)
    text = _BEARER.sub(r"\1 …", text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class ClosedWhy:
    """Why a cluster takes no new work: ``floating`` for its queued floating jobs sent back to
    the global queue ("cluster west is unreachable"), ``pinned`` the reason its pinned jobs
    wait with (kind ``cluster``)."""

    floating: str
    pinned: str


def cluster_closed_why(cluster: Cluster) -> ClosedWhy | None:
    """None while the cluster is enabled and answers."""
    if not cluster.enabled:
        return ClosedWhy(f"cluster {cluster} is disabled",
                         f"Cluster {cluster} is disabled; it takes no new work until an "
                         "administrator enables it again")
    if cluster.unreachable_since is not None:
        since = cluster.unreachable_since.astimezone(dt.UTC).strftime("%H:%M UTC")
        error = public_error(cluster.last_error)
        last = f" (last error: {error})" if error else ""
        return ClosedWhy(f"cluster {cluster} is unreachable",
                         f"Cluster {cluster} is unreachable since {since}{last}; it takes "
                         "no new work until it answers again")
    return None


def cluster_close_queued(*, cluster_id: int) -> list[int]:
    """A cluster that takes no new work (disabled or unreachable): its queued floating jobs go
    back to the global queue and its queued pinned jobs wait saying why (``cycle.closed_hold``,
    which the cluster's cycle also runs while it is closed). Its cycle running now: that
    cycle is asked again, and it does this then. The ids of the jobs sent back."""
    from .cycle import closed_hold, cycle_lock  # the cycle imports this module's callers

    with cycle_lock(cluster_id) as got:
        if not got:
            request_cycle(cluster_id, countdown=1)
            return []
        cluster = Cluster.objects.get(pk=cluster_id)
        why = cluster_closed_why(cluster)
        return closed_hold(cluster, why).unplaced if why else []


def _reopened(cluster_id: int) -> None:
    """Enabled again or answering again: its next cycle admits and rewrites its pinned jobs'
    reasons; the global queue is offered it again."""
    from .placement import request_placement

    request_cycle(cluster_id)
    request_placement()
