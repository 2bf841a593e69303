"""Camp as the cluster's GPU scheduler (issue 34), on the real node: plain pods that a user
``kubectl apply``s, naming Camp's scheduler in a namespace bound to a project, are queued behind
the project's quota, bound by Camp through HAMi's handshake (the device plugin stand-in answers
and the real kubelet runs them) when room frees, and say why they wait on the pod and in the API.
A pod in a namespace that is not bound gets an Event and a condition and is never bound; a gang
(the coscheduling plugin's pod-group label) is admitted all or nothing."""

from __future__ import annotations

import contextlib
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduling.models import ExternalPod, Job
from tenants import services as tenant_services
from tests.conftest import client_for

from .deviceplugin import HamiNodePlugin, wait_advertised
from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULER = "camp-scheduler"


def _pod(name: str, namespace: str, *, labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"schedulerName": SCHEDULER, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "localhost/busybox:v1",
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "env | sort; sleep 3600"],
                                     "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                   "limits": {"nvidia.com/gpu": "1",
                                                              "nvidia.com/gpumem": "4000",
                                                              "nvidia.com/gpucores": "25"}}}]}}


def _apply(node: Any, tmp_path: Path, *docs: dict[str, Any]) -> None:
    f = tmp_path / f"m{len(list(tmp_path.iterdir()))}.yaml"
    f.write_text(yaml.safe_dump_all(docs))
    node.kubectl_run("apply", "-f", str(f))


def _read(node: Any, ns: str, name: str) -> Any:
    return node.core.read_namespaced_pod(name, ns)


def _condition(pod: Any) -> Any:
    return next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)


def _running(node: Any, ns: str, name: str) -> bool:
    pod = _read(node, ns, name)
    return bool(pod.spec.node_name) and pod.status.phase == "Running"


def _bind(world: Any, node: Any, namespace: str) -> None:
    """A project admin binds; Camp answers with the labels the namespace's side must write,
    the cluster's admin writes them (kubectl label), the project admin binds again."""
    padmin = client_for(world.a.project_admin)
    body = {"cluster": "node", "namespace": namespace, "project": world.a.project.pk}
    r = padmin.post("/api/v1/namespace-bindings/", body, format="json")
    assert r.status_code == 400, r.content
    said = r.json()["namespace"][0]
    assert "kubectl label namespace" in said, said
    node.kubectl_run(*said.split("runs: kubectl ", 1)[1].split())
    # a plain member may not bind
    assert client_for(world.a.member).post("/api/v1/namespace-bindings/", body,
                                           format="json").status_code in (400, 403)
    r = padmin.post("/api/v1/namespace-bindings/", body, format="json")
    assert r.status_code == 201, r.content


def _job_of(name: str) -> Job | None:
    row = ExternalPod.objects.filter(name=name).select_related("job").first()
    return row.job if row else None


def test_plain_pods_queue_behind_the_quota_and_are_bound_by_camp(camp_node: Any, world: Any,
                                                                tmp_path: Path) -> None:
    from scheduling import services

    node = camp_node.node
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpu_memory_mib_limit": 6000, "gpus_limit": Decimal(4)})
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        node.kubectl_run("create", "namespace", "team-a")
        node.kubectl_run("create", "namespace", "team-x")
        _bind(world, node, "team-a")
        # Not bound: an Event and a condition saying why, and never bound.
        _apply(node, tmp_path, _pod("stray", "team-x"))
        _apply(node, tmp_path, _pod("first", "team-a"))
        wait(lambda: _running(node, "team-a", "first"), "the first pod to be bound and run", timeout=180)
        _apply(node, tmp_path, _pod("second", "team-a"))

        def told_queued() -> bool:
            c = _condition(_read(node, "team-a", "second"))
            return c is not None and c.reason == "CampQueued"
        wait(told_queued, "the second pod to say it waits", timeout=120)
        second = _job_of("second")
        assert second is not None and second.kind == "external" and second.state == "queued"
        # Its reason in the API, as the project's members read it, with its Kubernetes side.
        r = client_for(world.a.member).get(f"/api/v1/jobs/{second.pk}/")
        assert r.status_code == 200, r.content
        data = r.json()
        assert data["state"] == "queued" and "GPU memory limit" in data["reason"], data["reason"]
        assert data["kubernetes_pods"][0]["name"] == "second"
        assert data["kubernetes_pods"][0]["namespace"] == "team-a"
        assert _condition(_read(node, "team-a", "second")).message.startswith(f"Camp job {second.pk}: ")
        assert not _read(node, "team-a", "second").spec.node_name

        # The first pod went through HAMi's handshake with its fractional ask.
        first = _read(node, "team-a", "first")
        assert first.metadata.annotations["hami.io/bind-phase"] == "success"
        assert ",4000,25" in first.metadata.annotations["hami.io/vgpu-devices-allocated"]
        assert [p for p, _ in plugin.allocations] == ["first"]

        # Room frees (its user deletes it): the second one is bound and runs.
        node.kubectl_run("delete", "pod", "first", "-n", "team-a", "--wait=false")
        wait(lambda: _running(node, "team-a", "second"), "the second pod to be bound", timeout=180)

        stray = _read(node, "team-x", "stray")
        assert not stray.spec.node_name
        c = _condition(stray)
        assert c is not None and c.status == "False" and c.reason == "CampNamespaceNotBound"
        events = node.core.list_namespaced_event("team-x").items
        assert any(e.reason == "CampNamespaceNotBound" and e.involved_object.name == "stray"
                   for e in events)
        assert not ExternalPod.objects.filter(namespace="team-x").exists()
        assert not plugin.errors, plugin.errors


def test_a_gang_is_bound_all_or_nothing(camp_node: Any, world: Any, tmp_path: Path) -> None:
    from scheduling import services

    node = camp_node.node
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpu_memory_mib_limit": 10000, "gpus_limit": Decimal(4)})
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        node.kubectl_run("create", "namespace", "team-g")
        _bind(world, node, "team-g")
        _apply(node, tmp_path, _pod("solo", "team-g"))
        wait(lambda: _running(node, "team-g", "solo"), "the solo pod to run", timeout=180)
        gang = {"scheduling.x-k8s.io/pod-group": "g1"}
        two = {"camp.io/min-member": "2"}
        _apply(node, tmp_path, _pod("g1-a", "team-g", labels=gang, annotations=two))

        def told(name: str, reason: str) -> bool:
            c = _condition(_read(node, "team-g", name))
            return c is not None and c.reason == reason
        wait(lambda: told("g1-a", "CampGangIncomplete"), "the lone gang pod to wait for its peer")
        assert _job_of("g1-a") is None
        _apply(node, tmp_path, _pod("g1-b", "team-g", labels=gang, annotations=two))
        # 4000 + 2 x 4000 > 10000: the whole gang waits, neither pod is bound.
        wait(lambda: told("g1-a", "CampQueued") and told("g1-b", "CampQueued"), "the gang to queue")
        job = _job_of("g1-a")
        assert job is not None and job == _job_of("g1-b") and job.gang
        assert job.groups.get().replicas == 2
        assert not _read(node, "team-g", "g1-a").spec.node_name
        assert not _read(node, "team-g", "g1-b").spec.node_name
        node.kubectl_run("delete", "pod", "solo", "-n", "team-g", "--wait=false")
        wait(lambda: _running(node, "team-g", "g1-a") and _running(node, "team-g", "g1-b"),
             "both gang pods to be bound and run", timeout=180)
        assert sorted(p for p, _ in plugin.allocations) == ["g1-a", "g1-b", "solo"]
        assert not plugin.errors, plugin.errors


def test_a_batch_job_whose_pods_name_camp_runs_to_completion(camp_node: Any, world: Any,
                                                           tmp_path: Path) -> None:
    """A ``batch/v1`` Job (the real kube-controller-manager makes its pod) whose template names
    Camp's scheduler: its pod is queued as an external job naming its owner, bound by Camp, and
    the Job completes."""
    from scheduling import services

    node = camp_node.node
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        node.kubectl_run("create", "namespace", "team-j")
        _bind(world, node, "team-j")
        template = _pod("unused", "team-j")
        template["spec"]["containers"][0]["command"] = ["sh", "-c", "echo done"]
        _apply(node, tmp_path, {"apiVersion": "batch/v1", "kind": "Job",
                                "metadata": {"name": "train", "namespace": "team-j"},
                                "spec": {"backoffLimit": 0, "template": {"spec": template["spec"]}}})

        def complete() -> bool:
            from kubernetes import client as k8s

            job = k8s.BatchV1Api(node.admin()).read_namespaced_job("train", "team-j")
            return bool(job.status.succeeded)
        wait(complete, "the Job to complete on a pod Camp bound", timeout=240)
        row = ExternalPod.objects.select_related("job").get(namespace="team-j")
        assert (row.owner_kind, row.owner_name) == ("Job", "train")
        assert [p for p, _ in plugin.allocations] == [row.name]
        wait(lambda: Job.objects.get(pk=row.job_id).state == "succeeded", "Camp's job to succeed")


def _batch(node: Any) -> Any:
    from kubernetes import client as k8s

    return k8s.BatchV1Api(node.admin())


def _helm_agent(node: Any, *values: str, files: tuple[str, ...] = ()) -> None:
    """The operator's ``helm upgrade`` of the camp-agent chart (docs/KUBERNETES.md)."""
    from .node import AGENT_NAMESPACE, CHART

    args = [str(node.helm), "upgrade", "camp-agent", str(CHART), "-n", AGENT_NAMESPACE, "--reuse-values",
            "--kubeconfig", str(node.kubeconfig)]
    for v in values:
        args += ["--set", v]
    for f in files:
        args += ["--set-file", f]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr


def _camp_cli(world: Any, url: str, tmp_path: Path, *args: str) -> str:
    """The ``camp`` CLI as a project member runs it (a token of theirs)."""
    import os
    import sys

    from django.conf import settings

    _, token = tenant_services.token_create(actor=world.a.member, name=f"cli-{len(args)}-{args[-1]}")
    env = {**os.environ, "CAMP_URL": url, "CAMP_TOKEN": token, "CAMP_CONFIG": str(tmp_path / "cli.json")}
    done = subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _batch_priority_class(node: Any) -> None:
    """A PriorityClass named like Camp's preemptible class (its pods map to it by name)."""
    from kubernetes import client as k8s

    with contextlib.suppress(k8s.ApiException):
        k8s.SchedulingV1Api(node.admin()).create_priority_class(
            {"metadata": {"name": "batch"}, "value": 100, "description": "preemptible batch"})


def _urgent(world: Any) -> int:
    """A high-priority Camp job of the project (its admin may use that class): 1 GPU, 4000 MiB."""
    r = client_for(world.a.project_admin).post("/api/v1/jobs/", {
        "name": "urgent", "project": world.a.project.pk, "cluster": "node", "kind": "pytorch",
        "priority_class": "high",
        "groups": [{"name": "worker", "replicas": 1, "gpu_count": 1, "gpu_memory_mib": 4000,
                    "gpu_cores_percent": 25, "cpu_millicores": 200, "ram_mib": 128,
                    "image": "localhost/busybox:v1", "command": ["sh", "-c", "sleep 3600"]}]},
        format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def _queue_job(name: str, namespace: str) -> dict[str, Any]:
    spec = _pod("unused", namespace)["spec"]
    del spec["schedulerName"]  # a manifest written for Kueue names no scheduler: the webhook does
    spec["priorityClassName"] = "batch"
    spec["terminationGracePeriodSeconds"] = 2
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kueue.x-k8s.io/queue-name": "team-queue"}},
            "spec": {"backoffLimit": 0, "parallelism": 1, "completions": 1,
                     "template": {"spec": spec}}}


def _job_story(node: Any, ns: str, name: str, job_id: int) -> str:
    """What a failed wait on a Kueue-style Job tells: the Job's status, its pods, Camp's job."""
    kj = _batch(node).read_namespaced_job(name, ns)
    st = kj.status
    pods = [(p.metadata.name, p.status.phase, p.spec.node_name, bool(p.metadata.deletion_timestamp))
            for p in node.core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items]
    job = Job.objects.get(pk=job_id)
    said = list(job.decisions.order_by("-pk").values_list("kind", "reason")[:6])
    return (f"Job suspend={kj.spec.suspend} active={st.active} failed={st.failed} "
            f"succeeded={st.succeeded} conditions={[(c.type, c.reason) for c in st.conditions or []]}; "
            f"pods={pods}; Camp job {job.state} ({job.reason}); latest decisions={said}")


def test_a_kueue_labelled_job_is_admitted_suspended_again_when_preempted_and_requeued(
        camp_node: Any, world: Any, tmp_path: Path) -> None:
    """Kueue's admission, by Camp: a ``batch/v1`` Job with Kueue's queue label (a manifest
    written for Kueue, unchanged) is created suspended by Camp's webhook (the chart's
    configuration, the real API server calling Camp over HTTPS), queued behind the project's
    limit with no pod, un-suspended when room frees and its pod bound by Camp with HAMi's
    annotations; a higher-priority Camp job preempts it: suspended again (its controller
    deletes the pod), requeued, and admitted again when that job ends."""

    from scheduling import services
    from scheduling.models import ExternalWorkload, installation_id

    from .https import camp_over_https

    node = camp_node.node
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpu_memory_mib_limit": 6000, "gpus_limit": Decimal(4)})
    _batch_priority_class(node)
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin, \
            camp_over_https(tmp_path / "tls") as (url, ca):
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        node.kubectl_run("create", "namespace", "team-k")
        _bind(world, node, "team-k")
        _helm_agent(node, "jobWebhook.enabled=true", f"jobWebhook.campUrl={url}",
                    f"jobWebhook.installation={installation_id()}", files=(f"jobWebhook.caCert={ca}",))
        try:
            # The API server applies a new webhook configuration a moment later: a server-side
            # dry run shows when it does (and that the webhook answers).
            said: list[str] = []

            def mutated() -> bool:
                probe = tmp_path / "probe.yaml"
                probe.write_text(yaml.safe_dump(_queue_job("probe", "team-k")))
                done = subprocess.run([str(node.kubectl), "--kubeconfig", str(node.kubeconfig), "create",
                                       "--dry-run=server", "-o", "json", "-f", str(probe)],
                                      capture_output=True, text=True, timeout=60, check=False)
                said.append(done.stderr or done.stdout[-300:])
                return '"suspend": true' in done.stdout
            try:
                wait(mutated, "the webhook to suspend a labelled Job", timeout=60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; kubectl said: {said[-1]}") from exc
            _apply(node, tmp_path, _pod("first", "team-k"))
            wait(lambda: _running(node, "team-k", "first"), "the first pod to run", timeout=180)
            _apply(node, tmp_path, _queue_job("train", "team-k"))
            kj = _batch(node).read_namespaced_job("train", "team-k")
            assert kj.spec.suspend is True
            assert kj.spec.template.spec.scheduler_name == SCHEDULER
            wait(lambda: ExternalWorkload.objects.filter(name="train", job__isnull=False).exists(),
                 "Camp to queue the Job")
            row = ExternalWorkload.objects.select_related("job").get(name="train")
            assert row.queue_name == "team-queue" and row.job.kind == "external"
            wait(lambda: "GPU memory limit" in Job.objects.get(pk=row.job_id).reason, "its reason")
            assert Job.objects.get(pk=row.job_id).state == "queued"
            r = client_for(world.a.member).get(f"/api/v1/jobs/{row.job_id}/")
            assert r.status_code == 200 and "GPU memory limit" in r.json()["reason"], r.content
            assert r.json()["kubernetes_job"] == {"kind": "Job", "namespace": "team-k", "name": "train",
                                                  "queue_name": "team-queue"}
            assert not node.core.list_namespaced_pod("team-k", label_selector="job-name=train").items
            why = _camp_cli(world, camp_node.camp_url, tmp_path, "why", f"job/{row.job_id}")
            assert "why: Project " in why and "kubernetes: Job team-k/train, queue team-queue" in why, why
            page = client_for(world.a.member).get(f"/scheduling/jobs/{row.job_id}/")
            assert page.status_code == 200
            assert "Job <code>team-k/train</code>, queue <code>team-queue</code>" in page.content.decode()

            def job_event(reason: str) -> bool:
                return any(e.reason == reason and e.involved_object.kind == "Job"
                           and e.involved_object.name == "train"
                           for e in node.core.list_namespaced_event("team-k").items)
            wait(lambda: job_event("CampQueued"), "a CampQueued Event on the Job")

            # Room frees: un-suspended, its controller's pod bound by Camp through HAMi.
            node.kubectl_run("delete", "pod", "first", "-n", "team-k", "--wait=false")

            def job_pod() -> Any:
                pods = node.core.list_namespaced_pod("team-k", label_selector="job-name=train").items
                live = [p for p in pods if not p.metadata.deletion_timestamp]
                return live[0] if live and live[0].status.phase == "Running" else None
            first_pod = wait(job_pod, "the Job's pod to be bound and run", timeout=180)
            assert first_pod.metadata.annotations["hami.io/bind-phase"] == "success"
            assert ",4000,25" in first_pod.metadata.annotations["hami.io/vgpu-devices-allocated"]
            assert _batch(node).read_namespaced_job("train", "team-k").spec.suspend is False
            wait(lambda: Job.objects.get(pk=row.job_id).state == "running", "Camp's job to run")

            # A high-priority Camp job of the project preempts it: suspended again, requeued.
            urgent = _urgent(world)
            wait(lambda: Job.objects.get(pk=row.job_id).state == "queued"
                 and Job.objects.get(pk=urgent).state == "running", "the preemption", timeout=180)
            # (its history keeps why: the next cycle gives it a new reason to wait)
            said = list(Job.objects.get(pk=row.job_id).decisions.values_list("reason", flat=True))
            assert (f"Preempted by job urgent (#{urgent}, priority high); its Job was suspended; requeued"
                    in said), said
            assert _batch(node).read_namespaced_job("train", "team-k").spec.suspend is True
            wait(lambda: not node.core.list_namespaced_pod("team-k", label_selector="job-name=train").items,
                 "its controller to delete the Job's pod", timeout=120)

            # The urgent job ends: the Job is admitted again, with a new pod.
            assert client_for(world.a.project_admin).post(f"/api/v1/jobs/{urgent}/cancel/",
                                                   format="json").status_code == 200
            try:
                second_pod = wait(job_pod, "the Job's new pod to run", timeout=240)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; {_job_story(node, 'team-k', 'train', row.job_id)}; "
                                     f"device plugin: {plugin.errors}") from exc
            assert second_pod.metadata.uid != first_pod.metadata.uid
            assert ExternalWorkload.objects.get(name="train").job_id == row.job_id  # the same Camp job
            assert not plugin.errors, plugin.errors
        finally:
            _helm_agent(node, "jobWebhook.enabled=false")


def test_a_deployments_pods_are_queued_bound_and_replaced_after_a_preemption(
        camp_node: Any, world: Any, tmp_path: Path) -> None:
    """A ``Deployment`` whose pod template names Camp's scheduler (the real controller manager
    makes its ReplicaSet and pods): its pod is queued as an external job naming its owner, bound
    by Camp, preempted by a high-priority Camp job (the pod deleted, as kube-scheduler's
    preemption does), and the pod its ReplicaSet makes in its place queues and runs once the
    preemptor ends."""

    from scheduling import services

    node = camp_node.node
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpu_memory_mib_limit": 6000, "gpus_limit": Decimal(4)})
    _batch_priority_class(node)
    with HamiNodePlugin(node.core, node.node_name, cards=2, sharers=10) as plugin:
        wait_advertised(node.core, node.node_name, 20)
        services.inventory_sync(cluster=camp_node.cluster)
        node.kubectl_run("create", "namespace", "team-d")
        _bind(world, node, "team-d")
        spec = _pod("unused", "team-d")["spec"]
        spec.update(restartPolicy="Always", priorityClassName="batch", terminationGracePeriodSeconds=2)
        _apply(node, tmp_path, {"apiVersion": "apps/v1", "kind": "Deployment",
                                "metadata": {"name": "serve", "namespace": "team-d"},
                                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "serve"}},
                                         "template": {"metadata": {"labels": {"app": "serve"}},
                                                      "spec": spec}}})

        def running_pod() -> Any:
            pods = node.core.list_namespaced_pod("team-d", label_selector="app=serve").items
            live = [p for p in pods if not p.metadata.deletion_timestamp and p.status.phase == "Running"]
            return live[0] if live else None
        first = wait(running_pod, "the Deployment's pod to be bound and run", timeout=180)
        row = ExternalPod.objects.select_related("job").get(uid=first.metadata.uid)
        assert row.owner_kind == "ReplicaSet" and row.owner_name.startswith("serve-")
        assert first.metadata.annotations["hami.io/bind-phase"] == "success"

        urgent = _urgent(world)
        wait(lambda: Job.objects.get(pk=row.job_id).state == "cancelled"
             and Job.objects.get(pk=urgent).state == "running", "the preemption", timeout=180)
        assert Job.objects.get(pk=row.job_id).reason == (
            f"Preempted by job urgent (#{urgent}, priority high); its pod was deleted")

        def replacement_queued() -> Any:
            rows = ExternalPod.objects.filter(namespace="team-d").exclude(uid=first.metadata.uid)
            got = rows.select_related("job").first()
            return got if got is not None and got.job.state == "queued" else None
        again = wait(replacement_queued, "the ReplicaSet's new pod to queue", timeout=120)
        assert again.owner_name == row.owner_name
        assert client_for(world.a.project_admin).post(f"/api/v1/jobs/{urgent}/cancel/",
                                               format="json").status_code == 200
        second = wait(running_pod, "the new pod to be bound and run", timeout=240)
        assert second.metadata.uid == again.uid
        assert not plugin.errors, plugin.errors
