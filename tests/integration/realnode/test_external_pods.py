"""Camp as the cluster's GPU scheduler (issue 34), on the real node: plain pods that a user
``kubectl apply``s, naming Camp's scheduler in a namespace bound to a project, are queued behind
the project's quota, bound by Camp through HAMi's handshake (the device plugin stand-in answers
and the real kubelet runs them) when room frees, and say why they wait on the pod and in the API.
A pod in a namespace that is not bound gets an Event and a condition and is never bound; a gang
(the coscheduling plugin's pod-group label) is admitted all or nothing."""

from __future__ import annotations

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
