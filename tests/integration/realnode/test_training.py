"""A 2-worker distributed training job on the real node (issue 28): submitted through the API
by a project member, it really trains (PyTorch CPU, gloo) with its workers meeting at the
address Camp gives them — rank 0's Service ClusterIP, through kube-proxy, no cluster DNS —
writes checkpoints to the volume the cluster mounts, its logs are read through the API while it
runs, a higher-priority job preempts it, Camp starts it again with the last checkpoint it
recorded (``CAMP_RESUME_FROM``), it resumes from there and finishes ``succeeded``. Once."""

from __future__ import annotations

import re
from typing import Any

import pytest

from scheduling.models import DecisionKind, Job, JobState, SchedulingDecision
from tests.conftest import client_for
from workspaces.models import TrainingJob
from workspaces.tasks import workspaces_tick

from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 40


def _pods(node: Any, job_id: int) -> list[Any]:
    pods = node.core.list_pod_for_all_namespaces(label_selector=f"camp.io/job-id={job_id}").items
    return sorted((p for p in pods if p.metadata.deletion_timestamp is None),
                  key=lambda p: p.metadata.labels["camp.io/replica"])


def _env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def _logs(api: Any, tid: int) -> dict[str, str]:
    r = api.get(f"/api/v1/training-jobs/{tid}/logs/", {"tail": 400})
    assert r.status_code == 200, r.content
    return {x["pod"]: x["text"] for x in r.json()}


def test_a_two_worker_job_trains_checkpoints_is_preempted_and_resumes(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    (volume,) = node.add_volumes(1)
    api = client_for(world.a.member)
    r = api.post("/api/v1/training-jobs/", {
        "name": "ddp", "project": world.a.project.pk, "cluster": "node", "framework": "pytorch",
        "image_reference": node.image("train"), "workers": 2, "gpu_count": 0,
        "cpu_millicores": 600, "ram_mib": 1024, "priority_class": "batch",
        "command": ["python", "/opt/train.py", "--steps", str(STEPS), "--every", "5", "--step-seconds", "2"],
        "checkpoint_dir": "/ckpt", "checkpoint_every": 5, "checkpoint_volume_gib": 1}, format="json")
    assert r.status_code == 201, r.content
    tid = r.json()["id"]

    def state() -> str:
        return str(api.get(f"/api/v1/training-jobs/{tid}/").json()["state"])

    wait(lambda: state() == "running", "the training to run", timeout=300)
    job_id = TrainingJob.objects.get(pk=tid).job_id
    pods = _pods(node, job_id)
    assert len(pods) == 2
    # the rendezvous: rank 0's Service ClusterIP (no DNS on this node), the same for both
    rdzv = {_env(p)["MASTER_ADDR"] for p in pods}
    assert len(rdzv) == 1 and re.fullmatch(r"\d+\.\d+\.\d+\.\d+", next(iter(rdzv))), rdzv

    # Logs through the API while it runs: both ranks joined the group and train.
    def training() -> bool:
        logs = _logs(api, tid)
        return (len(logs) == 2 and all("joined the process group (2 workers)" in x for x in logs.values())
                and any(re.search(r"\[rank 1\] step \d+ loss", x) for x in logs.values()))

    wait(training, "both ranks to train (logs through the API)", timeout=300)

    # Camp records the checkpoints rank 0 reports (its periodic tick reads the log), and the
    # files are on the volume the cluster mounted.
    def checkpointed() -> list[dict[str, Any]]:
        workspaces_tick()  # what beat runs; its training sync goes to the real worker
        got = api.get(f"/api/v1/training-jobs/{tid}/checkpoints/").json()
        return got if any(c["step"] >= 10 for c in got) else []

    seen = wait(checkpointed, "a checkpoint at step 10 recorded", timeout=240)
    assert all(c["path"].startswith("/ckpt/step-") for c in seen)
    assert (volume / "step-10.pt").exists()

    # A higher-priority job that cannot fit beside it preempts it.
    high = api.post("/api/v1/jobs/", {
        "name": "urgent", "project": world.a.project.pk, "cluster": "node", "kind": "pytorch",
        "priority_class": "normal",
        "groups": [{"name": "worker", "replicas": 1, "gpu_count": 0, "cpu_millicores": 1000, "ram_mib": 64,
                    "image": "localhost/busybox:v1", "command": ["sleep", "10"]}]}, format="json")
    assert high.status_code == 201, high.content
    high_id = high.json()["id"]
    wait(lambda: Job.objects.get(pk=high_id).state in (JobState.RUNNING, JobState.SUCCEEDED),
         "the urgent job to run", timeout=300)
    assert SchedulingDecision.objects.filter(job_id=job_id, kind=DecisionKind.PREEMPTED).exists()
    wait(lambda: Job.objects.get(pk=high_id).state == JobState.SUCCEEDED, "the urgent job to finish",
         timeout=300)

    # Camp starts it again with the last checkpoint it recorded, and it resumes from there.
    def resumed() -> list[Any]:
        workspaces_tick()  # (its training sync counts the restart)
        job = Job.objects.get(pk=job_id)
        if job.state != JobState.RUNNING or job.attempts < 2:
            return []
        return [p for p in _pods(node, job_id) if p.metadata.labels["camp.io/attempt"] == str(job.attempts)]

    again = wait(resumed, "the training to run again", timeout=300)
    resume = {_env(p).get("CAMP_RESUME_FROM") for p in again}
    assert len(resume) == 1
    (path,) = resume
    assert path and path.startswith("/ckpt/step-"), resume
    step = int(path.rsplit("-", 1)[1].split(".")[0])
    assert step >= 10
    wait(lambda: any(f"resumed from {path} at step {step}" in x for x in _logs(api, tid).values()),
         "the workers to say they resumed", timeout=240)

    # the restart is counted (the tick's sync while it runs again)
    wait(lambda: workspaces_tick() and api.get(f"/api/v1/training-jobs/{tid}/").json()["restarts"] >= 1,
         "the restart to be counted", timeout=120)
    wait(lambda: state() == "succeeded", "the training to succeed", timeout=300)
    # what it wrote after resuming is on the volume; the kept log tail says it finished
    assert (volume / f"step-{STEPS}.pt").exists()
    logs = _logs(api, tid)
    assert any("training done" in x for x in logs.values()), logs
    assert not any(f"[rank 0] step {step} loss" in x for x in logs.values())  # not trained twice
