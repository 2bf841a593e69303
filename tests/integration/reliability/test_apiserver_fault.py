"""The Kubernetes apiserver restarted mid-burst, on real processes: a real kube-apiserver
v1.24 with its etcd (tests/integration/realkube/harness.py), two HAMi GPU nodes served by the
harness' kubelet and HAMi device-plugin stand-ins, and Camp's throwaway PostgreSQL, Redis,
web server, Celery worker with its beat, and ``camp_watch`` streaming the cluster's pods.

During a burst of submits and cancels through the API (admissions and HAMi bind handshakes
by the worker), the test stops the apiserver and its etcd, keeps them down a few seconds
and starts them again on the same port with the same data. After recovery it checks what a
user relies on: every submitted job exists exactly once and ends final or waiting with a
reason; no GPU is allocated beyond capacity; no job ran twice (one ``started`` decision,
one pod set running per job); the audit chain verifies; the watcher reconnected (its health,
as the API shows it, is not failing); and allocation rows equal pods — every allocation of
a running job has its pod bound to the same node, every Camp pod has a live allocation —
within a bounded time after the restart, then again once every job has ended.

The figures of the last run go to docs/RELIABILITY.md (printed with -s).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes.client.rest import ApiException

from tests.integration.realkube.harness import (
    HamiDevicePlugin,
    KubeApiserver,
    Kubelet,
    camp_pods,
    create_node,
    hami_devices,
    unavailable_reason,
    wait_until,
)

from . import invariants as inv
from .harness import Burst, Client, Stack, camp_stack

CLUSTER = "real"
RUN_SECONDS = 3.0  # how long a pod's container runs before it exits 0

SEED = """
from scheduling import services as s
from tenants import services as t
from tenants.models import Role, User
admin = User.objects.create(username="root", is_platform_admin=True)
tenant = t.tenant_create(actor=admin, name="acme")
member = User.objects.create(username="ann")
project = t.project_create(actor=admin, tenant=tenant, name="ml")
t.membership_create(actor=admin, user=member, tenant=tenant, project=project,
                    role=Role.PROJECT_MEMBER)
c = s.cluster_create(actor=admin, name={cluster!r}, backend="kubernetes", api_server={host!r},
                     credentials={credentials!r})
s.inventory_sync(cluster=c)
_, token = t.token_create(actor=member, name="burst")
print(project.pk, token)
"""


class KubeletWithExits(Kubelet):
    """The harness' kubelet stand-in, plus two things a kubelet does that a burst needs:
    a container exits 0 after ``RUN_SECONDS`` (unless its job is in ``keep``), and a pod
    being deleted is finalised — the kubelet stops its containers, then deletes the pod
    object with grace 0 (pkg/kubelet/status/status_manager.go) — so deleted pods go away
    as on a real node. ``runs`` records, per job id, the pods it moved to Running (by uid)."""

    def __init__(self, core: Any, plugin: HamiDevicePlugin) -> None:
        super().__init__(core, plugin)
        # The client logs each retry against the stopped server: the outage is expected here.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        self.keep: set[str] = set()
        self.runs: dict[str, set[str]] = defaultdict(set)
        self._running_since: dict[str, float] = {}
        self.finalised = 0

    def _set_phase(self, pod: Any, phase: str, reason: str = "", message: str = "") -> None:
        super()._set_phase(pod, phase, reason, message)
        if phase == "Running":
            self.runs[(pod.metadata.labels or {}).get("camp.io/job-id", "")].add(pod.metadata.uid)
            self._running_since[pod.metadata.uid] = time.monotonic()

    def sync(self) -> None:
        super().sync()
        now = time.monotonic()
        for pod in camp_pods(self.core):
            meta = pod.metadata
            if meta.deletion_timestamp is not None:
                try:
                    self.core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0)
                    self.finalised += 1
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                continue
            since = self._running_since.get(meta.uid)
            if (pod.status.phase == "Running" and since is not None and now - since >= RUN_SECONDS
                    and (meta.labels or {}).get("camp.io/job-id") not in self.keep):
                self.finish(meta.namespace, meta.name)


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeApiserver]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = KubeApiserver.start(prefix="camp-faults-kube-")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stack(kube: KubeApiserver) -> Iterator[Stack]:
    with camp_stack(tick_seconds=2) as s:
        yield s


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def test_apiserver_restart_mid_burst_loses_nothing_and_pods_equal_allocations(
        stack: Stack, kube: KubeApiserver) -> None:
    core = kube.core
    for n in range(2):
        create_node(core, f"gpu-{n}", devices=hami_devices(4, prefix=f"GPU-n{n}-"))
    project, token = stack.python(SEED.format(
        cluster=CLUSTER, host=kube.host, credentials=kube.credentials)).split()
    watch = stack.manage_service("watch", "camp_watch", "--cluster", CLUSTER, "--window", "60")
    client = Client(stack, token, cluster=CLUSTER)
    rows = stack.rows
    plugin = HamiDevicePlugin(core)

    def cluster_health() -> dict[str, Any]:
        r = requests.get(f"{stack.base_url}/api/v1/clusters/", params={"name": CLUSTER},
                         headers=client.headers, timeout=10)
        assert r.status_code == 200, r.text
        return dict(r.json()["results"][0])

    def pods_vs_allocations() -> list[str]:
        return inv.allocations_vs_pods(inv.allocation_rows(rows, CLUSTER), inv.kube_pods(core))

    def state(job_id: int) -> str:
        return str(rows("SELECT state FROM scheduling_job WHERE id = %s", job_id)[0][0])

    with KubeletWithExits(core, plugin) as kubelet:
        # Two jobs that keep running through the fault: their pods and allocations must
        # survive it unchanged.
        steady = [client.submit(int(project), f"steady-{i}", 1) for i in range(2)]
        kubelet.keep.update(str(j) for j in steady)
        wait_until(lambda: all(state(j) == "running" for j in steady), "the steady jobs to run",
                   timeout=120, interval=0.5)

        # paced so the burst spans the outage with a few jobs starting at any moment
        b = Burst(client, int(project), threads=2, pace=0.8, names=[f"steady-{i}" for i in range(2)])
        names, submitted, stop, done, errors = b.names, b.submitted, b.stop, b.done, b.errors
        samples: list[int] = []

        def sample() -> None:
            bad = inv.over_capacity(rows)
            samples.append(len(bad))
            assert not bad, f"GPU over-allocated during the burst: {bad}"

        def active() -> dict[str, int]:
            return {str(s): int(c) for s, c in rows(
                "SELECT state, count(*) FROM scheduling_job WHERE state IN"
                " ('starting', 'running', 'preempting') GROUP BY state")}

        runner = threading.Thread(target=b.run, daemon=True)
        started = time.monotonic()
        runner.start()
        # Strike while burst jobs are being started (HAMi handshakes in flight) and running.
        wait_until(lambda: (sample() or True) and active().get("starting", 0) >= 1
                   and sum(active().values()) >= 4 and len(submitted) >= 6,
                   "burst jobs starting and running", timeout=90, interval=0.2)
        in_flight = {"states": active(), "submitted_so_far": len(submitted),
                     "load_average": _load()}
        (down_at,), = rows("SELECT now()")
        outage = kube.restart(down_seconds=4.0)
        back = time.monotonic()
        (back_at,), = rows("SELECT now()")
        submitted_by_back = len(submitted)
        # The burst goes on a few seconds after the apiserver is back.
        wait_until(lambda: (sample() or True) and time.monotonic() - back > 6,
                   "the burst to go on after the restart", timeout=30, interval=0.4)
        stop.set()
        wait_until(lambda: (sample() or True) and done.is_set(), "the burst to end", timeout=120,
                   interval=0.5)
        runner.join()
        assert not errors, errors
        burst_ended = time.monotonic()

        # Converged within a bounded time of the restart: every job final or waiting (the
        # steady ones running), nothing held by a finished job, allocation rows equal pods.
        def converged() -> bool:
            return (not inv.unsettled(rows, still_running=steady) and not pods_vs_allocations()
                    and all(state(j) == "running" for j in steady))

        wait_until(converged, "allocations and pods to converge after the restart "
                   f"(unsettled: {inv.unsettled(rows, still_running=steady)}; "
                   f"pods: {pods_vs_allocations()})", timeout=180, interval=0.5)
        converged_after = time.monotonic() - back
        # The watcher reconnected: it saw events after the restart and is not failing.
        health = wait_until(lambda: (h := cluster_health())["watch_last_event_at"] and not h[
            "watch_failing"] and h["unreachable_since"] is None and h, "the watcher and reconcile "
            "to report recovery", timeout=60, interval=0.5)
        watch_row = rows("SELECT watch_last_event_at, watch_error_since, watch_error FROM "
                         "scheduling_cluster WHERE name = %s", CLUSTER)[0]
        assert watch_row[0] > back_at, "no pod event applied since the apiserver came back"
        assert watch.proc is not None and watch.proc.poll() is None, "camp_watch died"
        # The outage was noticed, then recovered from: the watcher's last error is the
        # outage's and fell inside it (no event failed to apply since: e.g. no deadlock),
        # and the reconcile's unreachable/reachable audit events bracket it.
        assert watch_row[1] is not None and down_at <= watch_row[1] <= back_at, watch_row
        # Camp's ServiceAccount (not system:masters) may also meet the restarted server's
        # RBAC authorizer before its caches filled: a 403 that the next retry gets past.
        assert "unreachable" in watch_row[2] or "403 Forbidden" in watch_row[2], watch_row
        watch_log = (stack.root / "watch.log").read_text()
        assert "recovered" in watch_log and "failed:" not in watch_log, watch_log[-3000:]
        audited = [a for (a,) in rows(
            "SELECT action FROM tenants_auditevent WHERE action LIKE 'cluster.%%reachable'"
            " AND created_at >= %s ORDER BY id", down_at)]
        # (A reconcile falls inside the outage unless the worker was busy all through it.)
        assert not audited or (audited[0] == "cluster.unreachable"
                               and audited[-1] == "cluster.reachable"), audited
        (reachable_at,), = rows("SELECT max(created_at) FROM tenants_auditevent"
                                " WHERE action = 'cluster.reachable'")
        (first_start,), = rows("SELECT min(created_at) FROM scheduling_schedulingdecision"
                               " WHERE kind = 'started' AND created_at > %s", back_at)
        # The steady jobs ran through it on their one pod each.
        assert all(len(kubelet.runs[str(j)]) == 1 for j in steady)

        # Then every job ends: nothing left either way.
        kubelet.keep.clear()
        wait_until(lambda: not inv.unsettled(rows) and not pods_vs_allocations()
                   and not inv.allocation_rows(rows, CLUSTER) and not inv.kube_pods(core),
                   "every job to end with its pods gone and its allocations released",
                   timeout=90, interval=0.5)

    n_jobs = len(names)
    # every submitted job exists exactly once (names are unique per submission)
    counted = rows("SELECT name, count(*) FROM scheduling_job GROUP BY name")
    assert sorted(counted) == sorted((n, 1) for n in names) and n_jobs >= 12
    assert sorted(submitted) == sorted(n for n in names if n.startswith("burst-"))
    # ... and is final, or waits with a reason
    states = dict(rows("SELECT state, count(*) FROM scheduling_job GROUP BY state"))
    assert set(states) <= {*inv.FINAL, "queued"}, states
    assert not rows("SELECT id FROM scheduling_job WHERE state = 'queued' AND reason = ''")
    n_burst = n_jobs - len(steady)
    assert states.get("rejected", 0) == n_burst // 30
    # no GPU beyond capacity (sampled during the burst too)
    assert not inv.over_capacity(rows)
    # no job ran twice: one start decision each, one pod set running per (one-pod) job
    assert not inv.ran_twice(rows)
    twice = {j: len(u) for j, u in kubelet.runs.items() if len(u) > 1}
    assert not twice, f"pods of one job ran twice: {twice}"
    # the audit chain verifies
    verify = stack.manage("audit_verify", check=False)
    assert verify.returncode == 0, verify.stderr

    figures = {
        "fault": "kube-apiserver + etcd stopped, down 4 s, started on the same port and data",
        "outage_seconds": round(outage, 1),
        "in_flight_at_fault": in_flight,
        "submitted_by_the_time_it_was_back": submitted_by_back,
        "jobs_submitted": n_jobs,
        "states": states,
        "jobs_lost": n_jobs - len(counted),
        "jobs_duplicated": sum(1 for _, c in counted if c > 1),
        "pods_run": sum(len(u) for u in kubelet.runs.values()),
        "pods_finalised_after_delete": kubelet.finalised,
        "capacity_samples": len(samples),
        "over_capacity_samples": sum(samples),
        "client_calls_retried": client.failed_calls,
        "reconcile_audits": audited,
        "reachable_again_seconds_after_back": (
            round((reachable_at - back_at).total_seconds(), 1) if reachable_at else None),
        "first_job_started_seconds_after_back": (
            round((first_start - back_at).total_seconds(), 1) if first_start else None),
        "converged_seconds_after_back": round(converged_after, 1),
        "burst_ended_seconds_after_back": round(burst_ended - back, 1),
        "watch_error_during_outage": watch_row[2][:120],
        "watch_health_after": {k: health[k] for k in ("watch_failing", "unreachable_since", "failures")},
        "kubelet_standin_errors_during_outage": len(kubelet.errors),
        "seconds_from_start": round(time.monotonic() - started, 1),
        "load_average_end": _load(),
        "audit": verify.stdout.strip(),
    }
    print("KUBE-FAULT-FIGURES " + json.dumps(figures, default=str))
