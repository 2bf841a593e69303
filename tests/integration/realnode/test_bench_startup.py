"""Submit → running on the real node, measured (``bench/realnode_startup.py`` runs it with
CAMP_BENCH=1; skipped otherwise, so the tier stays short). Notebooks, then 2-worker jobs, one
after another (each from its API submit until Camp says running; the next submitted once the
previous one has stopped), split at the pod's binding: Camp's part
(submit → the pod bound: ``PodScheduled``), the node's part (bound → container started,
kubelet's ``startedAt``) and Jupyter's (→ Ready). Results: bench/results/realnode_startup.json."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from scheduling.models import Job, JobState
from scheduling.selectors import project_namespace_name
from tests.conftest import client_for

from .node import wait

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(os.environ.get("CAMP_BENCH") != "1", reason="a benchmark: CAMP_BENCH=1")]

RESULTS = Path(__file__).resolve().parents[3] / "bench" / "results" / "realnode_startup.json"


def _cond(pod: Any, kind: str) -> float:
    c = next(c for c in pod.status.conditions if c.type == kind)
    return float(c.last_transition_time.timestamp())


def _started(pod: Any) -> float:
    return float(pod.status.container_statuses[0].state.running.started_at.timestamp())


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def _summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(rows)}
    for k in rows[0]:
        xs = [r[k] for r in rows]
        out[k] = {"median": round(statistics.median(xs), 2), "p95": round(_pct(xs, 0.95), 2)}
    return out


def test_submit_to_running_on_the_real_node(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    count = int(os.environ.get("CAMP_BENCH_NOTEBOOKS", "20"))
    node.add_volumes(count + 2)
    api = client_for(world.a.member)
    ns = project_namespace_name(cluster=camp_node.cluster, project=world.a.project)
    load_before = os.getloadavg()
    rows = []
    for i in range(count):
        t0 = time.time()
        r = api.post("/api/v1/environments/", {
            "name": f"b{i}", "project": world.a.project.pk, "cluster": "node", "kind": "jupyter",
            "image_reference": node.image("jupyter"), "gpu_count": 0, "cpu_millicores": 100,
            "ram_mib": 512, "home_gib": 1}, format="json")
        assert r.status_code == 201, r.content
        env_id = r.json()["id"]
        seen: list[Any] = []

        def running(env_id: int = env_id, seen: list[Any] = seen) -> bool:
            body = api.get(f"/api/v1/environments/{env_id}/").json()
            seen[:] = [body]
            return bool(body["state"] == "running")

        try:
            wait(running, f"notebook {i} to run", timeout=300)
        except AssertionError:
            pods = node.core.list_namespaced_pod(ns, label_selector=f"camp.io/workspace={env_id}").items
            listed = node.core.list_namespaced_persistent_volume_claim(ns).items
            claims = [(c.metadata.name, c.status.phase) for c in listed]
            raise AssertionError(f"notebook {i} never ran: {seen}; pods {[p.status for p in pods]}; "
                                 f"claims {claims}; done so far {_summary(rows) if rows else None}") from None
        t_camp = time.time()
        pod = node.core.list_namespaced_pod(ns, label_selector=f"camp.io/workspace={env_id}").items[0]
        bound = _cond(pod, "PodScheduled")
        started = _started(pod)
        ready = _cond(pod, "Ready")
        rows.append({"submit_to_bound": bound - t0, "bound_to_started": started - bound,
                     "started_to_ready": ready - started, "submit_to_camp_running": t_camp - t0})
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"partial": True, "notebooks": _summary(rows),
                                       "loadavg_now": os.getloadavg()}, indent=2) + "\n")
        # stop it and wait until it is (the next one then starts on an idle node, and its
        # submit → bound is Camp's own time, not a wait for this one's resources)
        assert api.post(f"/api/v1/environments/{env_id}/stop/", format="json").status_code in (200, 202)
        wait(lambda env_id=env_id: api.get(f"/api/v1/environments/{env_id}/").json()["state"] == "stopped",
             f"notebook {i} to stop", timeout=300)

    # 2-worker jobs (busybox: the node's part without an image's own start-up), one at a time
    jobs = []
    for i in range(int(os.environ.get("CAMP_BENCH_JOBS", "5"))):
        t0 = time.time()
        r = api.post("/api/v1/jobs/", {
            "name": f"two{i}", "project": world.a.project.pk, "cluster": "node", "kind": "pytorch",
            "groups": [{"name": "worker", "replicas": 2, "gpu_count": 0, "cpu_millicores": 100, "ram_mib": 64,
                        "image": "localhost/busybox:v1", "command": ["sleep", "3600"]}]}, format="json")
        assert r.status_code == 201, r.content
        job_id = r.json()["id"]
        try:
            wait(lambda job_id=job_id: Job.objects.get(pk=job_id).state == JobState.RUNNING,
                 f"2-worker job {i} to run", timeout=300)
        except AssertionError:
            job = Job.objects.get(pk=job_id)
            raise AssertionError(f"2-worker job {i} never ran: {job.state}: {job.reason}; done so far "
                                 f"{_summary(jobs) if jobs else None}") from None
        t_camp = time.time()
        pods = node.core.list_pod_for_all_namespaces(label_selector=f"camp.io/job-id={job_id}").items
        bound = max(_cond(p, "PodScheduled") for p in pods)
        started = max(_started(p) for p in pods)
        jobs.append({"submit_to_bound": bound - t0, "bound_to_started": started - bound,
                     "submit_to_camp_running": t_camp - t0})
        assert api.post(f"/api/v1/jobs/{job_id}/cancel/", format="json").status_code in (200, 202)
        wait(lambda job_id=job_id: Job.objects.get(pk=job_id).state == JobState.CANCELLED and not
             node.core.list_pod_for_all_namespaces(label_selector=f"camp.io/job-id={job_id}").items,
             f"2-worker job {i} to end", timeout=300)
    result = {"notebooks": _summary(rows) if rows else None, "two_worker_jobs": _summary(jobs),
              "loadavg_before": load_before,
              "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
              "note": "Kubernetes condition times have 1-s resolution"}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
