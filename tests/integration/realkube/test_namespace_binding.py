"""Issue 34 on the plain kube-apiserver (Camp acts as the camp-agent chart's ServiceAccount):
binding a namespace takes both sides — a project admin in Camp, the namespace's labels in the
cluster — to one project of one installation; pods naming Camp's scheduler there become external
jobs that Camp binds where its cycle placed them; pods elsewhere get an Event and a condition and
no job; unbinding cancels what waits and admits nothing new; everything audited."""

from __future__ import annotations

import re
from typing import Any

import pytest
from kubernetes import client as k8s

from scheduling import services
from scheduling.backends.kubernetes import WORKLOADS_ROLE
from scheduling.models import ExternalPod, Job, NamespaceBinding, PriorityClassMapping
from tenants.models import AuditEvent
from tests.conftest import client_for

from .harness import hami_devices

pytestmark = pytest.mark.django_db(transaction=True)


def _pod(core: Any, ns: str, name: str, **limits: str) -> Any:
    return core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"schedulerName": "camp-scheduler", "containers": [{
            "name": "main", "image": "busybox",
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                          "limits": {"nvidia.com/gpu": "1", **limits}}}]}})


def _condition(core: Any, ns: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, ns)
    return next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)


def _bind_both_sides(world: Any, core: Any, cluster: Any, ns: str) -> None:
    """The project admin asks, the cluster's side writes the labels Camp names, the admin binds."""
    body = {"cluster": cluster.name, "namespace": ns, "project": world.a.project.pk}
    padmin = client_for(world.a.project_admin)
    said = padmin.post("/api/v1/namespace-bindings/", body, format="json").json()["namespace"][0]
    labels = dict(kv.split("=", 1) for kv in said.split(f"kubectl label namespace {ns} ", 1)[1].split())
    core.patch_namespace(ns, {"metadata": {"labels": labels}})
    assert padmin.post("/api/v1/namespace-bindings/", body, format="json").status_code == 201


def _cli(world: Any, live_server: Any, tmp_path: Any) -> Any:
    """``camp`` as the project admin, through the API of a live server."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tenants import services as tenant_services

    _, token = tenant_services.token_create(actor=world.a.project_admin, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}

    def camp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "camp_cli", *args], env=env, cwd=settings.BASE_DIR,
                              capture_output=True, text=True, timeout=60)
    return camp


def test_binding_needs_both_sides_and_external_pods_follow_it(world: Any, kube: Any, live_server: Any,
                                                               tmp_path: Any) -> None:
    camp = _cli(world, live_server, tmp_path)
    kube.node("gpu-a", devices=hami_devices(2))
    cluster = kube.register(world)
    core = kube.core
    for ns in ("team-b", "team-z"):
        core.create_namespace({"metadata": {"name": ns}})
    body = {"cluster": cluster.name, "namespace": "team-b", "project": world.a.project.pk}
    padmin = client_for(world.a.project_admin)

    # Camp's side alone is not enough: the answer names the labels the cluster's side writes.
    r = padmin.post("/api/v1/namespace-bindings/", body, format="json")
    assert r.status_code == 400, r.content
    said = r.json()["namespace"][0]
    labels = dict(kv.split("=", 1) for kv in said.split("kubectl label namespace team-b ", 1)[1].split())
    assert labels["camp.io/bound-project-id"] == str(world.a.project.pk)
    # Labelled for another project: refused too.
    core.patch_namespace("team-b", {"metadata": {"labels": {**labels, "camp.io/bound-project-id": "999999"}}})
    r = padmin.post("/api/v1/namespace-bindings/", body, format="json")
    assert r.status_code == 400 and "another project" in r.json()["namespace"][0], r.content
    core.patch_namespace("team-b", {"metadata": {"labels": labels}})
    # A member may not bind; another tenant's project admin does not even see the project.
    bindings = "/api/v1/namespace-bindings/"
    assert client_for(world.a.member).post(bindings, body, format="json").status_code == 403
    assert client_for(world.b.project_admin).post("/api/v1/namespace-bindings/", body,
                                                  format="json").status_code == 400
    project = f"{world.a.tenant.name}/{world.a.project.name}"
    done = camp("ns", "bind", cluster.name, "team-b", "--project", project)
    assert done.returncode == 0, done.stdout + done.stderr
    binding = NamespaceBinding.objects.get(cluster=cluster, namespace="team-b")
    assert (binding.project, binding.created_by) == (world.a.project, world.a.project_admin)
    assert f"{binding.pk}\t{cluster.name}/team-b" in camp("ns", "ls").stdout
    # The console shows it to the project's members, not to another tenant's.
    page = client_for(world.a.member).get("/scheduling/namespaces/").content.decode()
    assert f'id="binding-{binding.pk}"' in page and "Unbind" not in page
    assert f'id="binding-{binding.pk}"' not in client_for(world.b.owner).get(
        "/scheduling/namespaces/").content.decode()
    assert client_for(world.b.owner).post(f"/scheduling/namespaces/{binding.pk}/unbind/").status_code == 404
    assert AuditEvent.objects.filter(action="namespace.bound", target_id=str(binding.pk)).exists()
    rbac = k8s.RbacAuthorizationV1Api(kube.server.client())
    grant = rbac.read_namespaced_role_binding("camp-agent", "team-b")
    assert grant.role_ref.name == WORKLOADS_ROLE
    # One namespace, one project: a second binding of it is refused.
    other = {**body, "project": world.a.other_project.pk}
    assert client_for(world.a.owner).post(bindings, other, format="json").status_code == 400

    _pod(core, "team-b", "frac", **{"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
    _pod(core, "team-z", "stray")
    counts = services.external_pods_sync(cluster=cluster)
    assert counts["queued"] == 1 and counts["unbound"] == 1, counts
    job = Job.objects.get(kind="external")
    assert (job.project, job.namespace, job.state) == (world.a.project, "team-b", "queued")
    g = job.groups.get()
    assert (g.gpu_count, g.gpu_memory_mib, g.gpu_cores_percent, g.cpu_millicores, g.ram_mib) == (
        1, 3000, 30, 100, 64)
    stray = _condition(core, "team-z", "stray")
    assert stray.status == "False" and stray.reason == "CampNamespaceNotBound"
    assert any(e.reason == "CampNamespaceNotBound" and e.involved_object.name == "stray"
               for e in core.list_namespaced_event("team-z").items)

    # Placed by the cycle, bound by Camp (HAMi's handshake) with its slice.
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created", Job.objects.get(pk=job.pk).reason
    pod = core.read_namespaced_pod("frac", "team-b")
    assert pod.spec.node_name == "gpu-a"
    assert pod.metadata.annotations["hami.io/vgpu-devices-allocated"].endswith(",3000,30:;")
    assert pod.metadata.labels["camp.io/job-id"] == str(job.pk)
    assert pod.spec.containers[0].image == "busybox"  # its spec is its own
    services.external_pods_sync(cluster=cluster)
    assert not core.read_namespaced_pod("stray", "team-z").spec.node_name

    # A pod asking beyond what any node holds: refused on the pod, never a job.
    _pod(core, "team-b", "huge", **{"nvidia.com/gpumem": "999999"})
    services.external_pods_sync(cluster=cluster)
    huge = _condition(core, "team-b", "huge")
    assert huge.reason in ("CampRefused", "CampQueued"), huge
    if huge.reason == "CampQueued":  # accepted at submit: the cycle then rejects it for good
        services.cycle_run(cluster=cluster)
        services.external_pods_sync(cluster=cluster)
        assert _condition(core, "team-b", "huge").reason == "CampRefused"
    assert not core.read_namespaced_pod("huge", "team-b").spec.node_name

    # Unbinding: what waits is cancelled, the running pod left alone, nothing new admitted.
    _pod(core, "team-b", "later")
    services.external_pods_sync(cluster=cluster)
    waiting = ExternalPod.objects.get(name="later").job
    assert client_for(world.a.member).delete(f"{bindings}{binding.pk}/").status_code == 403
    done = camp("ns", "unbind", str(binding.pk))
    assert done.returncode == 0, done.stdout + done.stderr
    assert Job.objects.get(pk=waiting.pk).state == "cancelled"
    assert Job.objects.get(pk=job.pk).state in ("starting", "running")
    assert core.read_namespaced_pod("frac", "team-b").spec.node_name == "gpu-a"
    assert AuditEvent.objects.filter(action="namespace.unbound").exists()
    _pod(core, "team-b", "after")
    services.external_pods_sync(cluster=cluster)
    assert _condition(core, "team-b", "after").reason == "CampNamespaceNotBound"
    assert not ExternalPod.objects.filter(name="after").exists()


def test_an_external_pods_priority_class_maps_to_camps_by_the_admins_table(
        world: Any, kube: Any, live_server: Any, tmp_path: Any) -> None:
    """Issue 34: a pod's PriorityClass (a real one: the apiserver's Priority admission resolves
    it) gives its external job the Camp class of the platform admins' table; without a row, a
    Camp class of the same name, else normal. Set from the API, the CLI and the console,
    read by tenant members, refused to them, audited."""
    from tenants import services as tenant_services

    kube.node("gpu-a", devices=hami_devices(2))
    cluster = kube.register(world)
    core = kube.core
    sched = k8s.SchedulingV1Api(kube.server.client())
    for name, value in (("team-urgent", 100000), ("team-low", 10), ("batch", 5), ("unmapped", 7)):
        sched.create_priority_class({"metadata": {"name": name}, "value": value})
    core.create_namespace({"metadata": {"name": "team-p"}})
    body = {"cluster": cluster.name, "namespace": "team-p", "project": world.a.project.pk}
    said = client_for(world.a.project_admin).post("/api/v1/namespace-bindings/", body, format="json")
    labels = dict(kv.split("=", 1) for kv in said.json()["namespace"][0].split(
        "kubectl label namespace team-p ", 1)[1].split())
    core.patch_namespace("team-p", {"metadata": {"labels": labels}})
    assert client_for(world.a.project_admin).post("/api/v1/namespace-bindings/", body,
                                                  format="json").status_code == 201

    maps = "/api/v1/priority-class-mappings/"
    row = {"cluster": cluster.name, "kube_priority_class": "team-urgent", "priority_class": "high"}
    # only platform admins set the table; a bad class or name is refused naming its field
    assert client_for(world.a.owner).post(maps, row, format="json").status_code == 403
    admin = client_for(world.admin)
    bad = admin.post(maps, {**row, "priority_class": "urgent"}, format="json")
    assert bad.status_code == 400 and "priority_class" in bad.json(), bad.content
    bad = admin.post(maps, {**row, "kube_priority_class": "Team_Urgent"}, format="json")
    assert bad.status_code == 400 and "kube_priority_class" in bad.json(), bad.content
    made = admin.post(maps, {**row, "priority_class": "normal"}, format="json")
    assert made.status_code == 201, made.content
    again = admin.post(maps, row, format="json")  # the same PriorityClass again: its class changes
    assert again.status_code == 201 and again.json()["id"] == made.json()["id"], again.content
    # the CLI (as the platform admin) and the console (a platform admin's form)
    _, token = tenant_services.token_create(actor=world.admin, name="cli")
    env = {"CAMP_URL": live_server.url, "CAMP_TOKEN": token, "CAMP_CONFIG": str(tmp_path / "admin.json")}
    import os
    import subprocess
    import sys

    from django.conf import settings

    done = subprocess.run([sys.executable, "-m", "camp_cli", "priority-map", "set", cluster.name, "team-low",
                           "batch"], env={**os.environ, **env}, cwd=settings.BASE_DIR, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "team-low → batch" in done.stdout, done.stdout + done.stderr
    from django.test import Client

    console = Client()
    console.force_login(world.admin)
    page = console.post("/scheduling/namespaces/priority-map/", {
        "cluster": cluster.name, "kube_priority_class": "batch", "priority_class": "normal"}, follow=True)
    assert page.status_code == 200 and "PriorityClass batch mapped." in page.content.decode(), re.findall(
        r"<li[^>]*>([^<]*)</li>", page.content.decode())
    # members read the table (what their pods will get) but have no form and may not post
    mine = client_for(world.a.member)
    listed = {m["kube_priority_class"]: m["priority_class"] for m in mine.get(maps).json()["results"]}
    assert listed == {"team-urgent": "high", "team-low": "batch", "batch": "normal"}
    seen = mine.get("/scheduling/namespaces/").content.decode()
    assert "team-urgent" in seen and 'action="/scheduling/namespaces/priority-map/"' not in seen
    member_console = Client()
    member_console.force_login(world.a.member)
    assert member_console.post("/scheduling/namespaces/priority-map/", {
        "cluster": cluster.name, "kube_priority_class": "x", "priority_class": "high"}).status_code == 403
    bad_form = console.post("/scheduling/namespaces/priority-map/", {
        "cluster": cluster.name, "kube_priority_class": "Not_A_Name", "priority_class": "high"}, follow=True)
    assert "Kubernetes PriorityClass: A Kubernetes object name" in bad_form.content.decode()

    def pod(name: str, priority_class: str) -> None:
        core.create_namespaced_pod("team-p", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": "camp-scheduler", "priorityClassName": priority_class,
                     "containers": [{"name": "main", "image": "busybox", "resources": {
                         "requests": {"cpu": "100m", "memory": "64Mi"},
                         "limits": {"nvidia.com/gpu": "1"}}}]}})

    for name, pc in (("urgent", "team-urgent"), ("low", "team-low"), ("named", "batch"),
                     ("other", "unmapped")):
        pod(name, pc)
    services.external_pods_sync(cluster=cluster)
    got = {p.name: p.job.priority_class for p in ExternalPod.objects.select_related("job")}
    # mapped rows win (even over a Camp class's own name); an unmapped name is normal
    assert got == {"urgent": "high", "low": "batch", "named": "normal", "other": "normal"}
    assert AuditEvent.objects.filter(action="priority_mapping.set").count() == 4
    mapping = PriorityClassMapping.objects.get(kube_priority_class="batch")
    assert admin.delete(f"{maps}{mapping.pk}/").status_code == 204
    assert services.external_priority(cluster, "batch") == "batch"  # the default rule again
    assert AuditEvent.objects.filter(action="priority_mapping.deleted").exists()


def test_a_camp_job_of_higher_priority_preempts_an_external_pod(world: Any, kube: Any) -> None:
    """Issue 34: an external pod is preempted like any job. Running on the only card, a batch
    pod (its PriorityClass ``batch``) yields to a high-priority Camp job of the project: Camp
    deletes the pod (as kube-scheduler's preemption does), its job ends cancelled saying why,
    and the Camp job is admitted on the card it freed; the pod's owner would make a new pod,
    which queues as a new job."""
    kube.node("gpu-a", devices=hami_devices(1))
    cluster = kube.register(world)
    core = kube.core
    k8s.SchedulingV1Api(kube.server.client()).create_priority_class(
        {"metadata": {"name": "batch"}, "value": 10})
    core.create_namespace({"metadata": {"name": "team-x"}})
    _bind_both_sides(world, core, cluster, "team-x")
    core.create_namespaced_pod("team-x", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sweep"},
        "spec": {"schedulerName": "camp-scheduler", "priorityClassName": "batch",
                 "containers": [{"name": "main", "image": "busybox", "resources": {
                     "requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"nvidia.com/gpu": "1"}}}]}})
    services.external_pods_sync(cluster=cluster)
    ext = Job.objects.get(kind="external")
    assert (ext.priority_class, ext.preemptible) == ("batch", True)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=ext.pk) == "created", Job.objects.get(pk=ext.pk).reason
    assert core.read_namespaced_pod("sweep", "team-x").spec.node_name == "gpu-a"

    from tests.integration.scheduling.conftest import submit

    urgent = submit(world, cluster, "urgent", priority_class="high", group={"gpu_count": 1})
    services.cycle_run(cluster=cluster)
    assert Job.objects.get(pk=ext.pk).state == "preempting"
    assert Job.objects.get(pk=urgent.pk).state == "queued"  # until the card is free
    assert services.job_stop(job_id=ext.pk, queued=True) == "waiting"  # deleted, 30 s of grace
    pod = core.read_namespaced_pod("sweep", "team-x")
    assert pod.metadata.deletion_timestamp is not None
    # The kubelet's part once the container stopped: the pod object goes.
    core.delete_namespaced_pod("sweep", "team-x", grace_period_seconds=0)
    services.cluster_reconcile(cluster=cluster)
    ended = Job.objects.get(pk=ext.pk)
    assert ended.state == "cancelled", ended.reason
    assert ended.reason == f"Preempted by job urgent (#{urgent.pk}, priority high); its pod was deleted"
    services.cycle_run(cluster=cluster)
    assert Job.objects.get(pk=urgent.pk).state == "starting", Job.objects.get(pk=urgent.pk).reason
    page = client_for(world.a.member).get(f"/api/v1/jobs/{ext.pk}/").json()
    assert page["state"] == "cancelled" and page["kubernetes_pods"][0]["name"] == "sweep"
    # the portal's job page: how it ended, and the Kubernetes objects it stands for
    from django.test import Client

    member = Client()
    member.force_login(world.a.member)
    html = member.get(f"/scheduling/jobs/{ext.pk}/").content.decode()
    assert f"Preempted by job urgent (#{urgent.pk}, priority high); its pod was deleted" in html
    assert 'id="kubernetes-objects"' in html and "<code>team-x/sweep</code>" in html
    assert "kubectl -n team-x get pod sweep" in html
    assert 'id="kubernetes-objects"' not in member.get(f"/scheduling/jobs/{urgent.pk}/").content.decode()
    other = Client()
    other.force_login(world.b.member)
    assert other.get(f"/scheduling/jobs/{ext.pk}/").status_code == 404


def _labelled_job(batch: Any, ns: str, name: str, *, scheduler: str | None, suspend: bool = False,
                  parallelism: int = 2, completions: int = 4) -> Any:
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "busybox",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000"}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return batch.create_namespaced_job(ns, {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "q"}},
        "spec": {"suspend": suspend, "parallelism": parallelism, "completions": completions,
                 "template": {"spec": spec}}})


def test_labelled_jobs_camp_may_bind_are_queued_suspended_and_others_left_alone(world: Any,
                                                                              kube: Any) -> None:
    """The sync's side of Kueue-style admission (issue 34), as the chart's ServiceAccount on the
    plain API server (no Job controller runs here: the real node's test has the pods): a labelled
    Job whose pods name Camp's scheduler and that runs (the webhook was off) is suspended and
    queued as a gang of its parallelism; one whose pods name another scheduler is left running,
    told why once; in a namespace not bound, a Job that is not Camp's gets no Event and no row;
    a queued job follows what its Job still needs, and ends when it needs nothing."""
    from scheduling.models import ExternalWorkload

    kube.node("gpu-a", devices=hami_devices(2))
    cluster = kube.register(world)
    core, batch = kube.core, k8s.BatchV1Api(kube.server.client())
    for ns in ("team-q", "elsewhere"):
        core.create_namespace({"metadata": {"name": ns}})
    _bind_both_sides(world, core, cluster, "team-q")

    _labelled_job(batch, "team-q", "ours", scheduler="camp-scheduler")
    _labelled_job(batch, "team-q", "theirs", scheduler=None)
    _labelled_job(batch, "elsewhere", "kueues", scheduler=None)
    for _ in range(2):  # a second pass changes nothing and tells nothing again
        services.external_pods_sync(cluster=cluster)

    ours = ExternalWorkload.objects.select_related("job").get(name="ours")
    assert batch.read_namespaced_job("ours", "team-q").spec.suspend is True
    assert ours.job is not None and ours.job.kind == "external" and ours.job.state == "queued"
    assert ours.job.groups.get().replicas == 2 and ours.job.groups.get().gpu_memory_mib == 2000
    assert ours.queue_name == "q"
    # another scheduler's: not suspended, no job, one Event saying why
    assert batch.read_namespaced_job("theirs", "team-q").spec.suspend is False
    theirs = ExternalWorkload.objects.get(name="theirs")
    assert theirs.job is None
    events = [e for e in core.list_namespaced_event("team-q").items if e.involved_object.name == "theirs"]
    assert len(events) == 1 and "'default-scheduler'" in events[0].message, [e.message for e in events]
    assert not ExternalWorkload.objects.filter(namespace="elsewhere").exists()
    assert not core.list_namespaced_event("elsewhere").items

    # What the Job still needs: 3 of its 4 completions done, so the queued job asks for 1 pod;
    # all 4 done (its status says so), so it ends.
    batch.patch_namespaced_job_status("ours", "team-q", {"status": {"succeeded": 3}})
    services.external_pods_sync(cluster=cluster)
    assert Job.objects.get(pk=ours.job_id).groups.get().replicas == 1
    batch.patch_namespaced_job_status("ours", "team-q", {"status": {"succeeded": 4}})
    services.external_pods_sync(cluster=cluster)
    ended = Job.objects.get(pk=ours.job_id)
    assert ended.state == "cancelled" and ended.reason == "Its Job team-q/ours needs no more pods"

    # a queued Job that its controller fails (a pod counted against its backoffLimit: on
    # Kubernetes 1.24 that can be a pod stopped by a preemption): its job ends saying so
    _labelled_job(batch, "team-q", "fails", scheduler="camp-scheduler", parallelism=1, completions=1)
    services.external_pods_sync(cluster=cluster)
    fails = ExternalWorkload.objects.select_related("job").get(name="fails")
    assert fails.job is not None and fails.job.state == "queued"
    batch.patch_namespaced_job_status("fails", "team-q", {"status": {"failed": 1, "conditions": [{
        "type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
        "message": "Job has reached the specified backoff limit"}]}})
    services.external_pods_sync(cluster=cluster)
    ended = Job.objects.get(pk=fails.job_id)
    assert ended.state == "cancelled", ended.state
    assert ended.reason == ("Its Job team-q/fails failed (BackoffLimitExceeded: Job has reached the "
                            "specified backoff limit)"), ended.reason

    # a Job deleted while Camp tells it why: its row goes with it
    batch.delete_namespaced_job("theirs", "team-q")
    services.external_pods_sync(cluster=cluster)
    assert not ExternalWorkload.objects.filter(name="theirs").exists()
