"""Issue 28 findings 2, 3 and 5 on the real kube-apiserver: the image catalog says how each
image starts and runs, and the notebook pod the apiserver stores follows it — command (or
Camp's own ``jupyter lab`` start), user, group and ``fsGroup``, the home volume as working
directory and Jupyter's root dir."""

from __future__ import annotations

from typing import Any

import pytest

from registry.models import Image
from registry.services import image_create
from scheduling import services
from scheduling.models import Allocation

from .harness import camp_pods

pytestmark = pytest.mark.django_db(transaction=True)


def _notebook_pod(world: Any, kube: Any, image: Image) -> Any:
    from workspaces import services as ws

    kube.node("cpu-a")
    cluster = kube.register(world)
    env, _ = ws.environment_launch(actor=world.a.member, project=world.a.project, cluster=cluster,
                                   name="nb", kind="jupyter", image=image, gpu_count=0,
                                   cpu_millicores=1000, ram_mib=1024)
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=env.job.pk) == "created"
    (name,) = Allocation.objects.filter(job=env.job).values_list("pod_name", flat=True)
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.name == name]
    return pod


def test_a_docker_stacks_notebook_runs_as_jovyan_and_can_write_its_home(world: Any, kube: Any) -> None:
    pod = _notebook_pod(world, kube, Image.objects.get(scope="platform", name="pytorch-jupyter"))
    (c,) = pod.spec.containers
    sc = pod.spec.security_context
    # uid 1000, gid 100, and the volume group-owned by 100 (it is created root-owned).
    assert (sc.run_as_user, sc.run_as_group, sc.fs_group, sc.run_as_non_root) == (1000, 100, 100, True)
    assert sc.seccomp_profile.type == "RuntimeDefault"
    assert c.security_context.allow_privilege_escalation is False
    assert c.security_context.capabilities.drop == ["ALL"]
    # The notebook's files are on the home volume: it is the working and root directory.
    assert [(m.name, m.mount_path) for m in c.volume_mounts if m.name == "home"] == [("home", "/home/jovyan")]
    assert c.working_dir == "/home/jovyan"
    # Camp starts JupyterLab itself (any image with jupyter on its PATH), not start-notebook.py.
    assert c.command[:2] == ["jupyter", "lab"] and "--ServerApp.root_dir=/home/jovyan" in c.command
    assert not any("start-notebook" in part for part in c.command)


def test_a_catalog_entry_declares_its_own_start_user_and_home(world: Any, kube: Any) -> None:
    image = image_create(actor=world.a.owner, tenant=world.a.tenant, name="lab", variant="jupyter",
                         reference="registry.example.com/team/lab:3", home="/workspace",
                         command=["/opt/lab/start.sh", "--base-url=$(CAMP_BASE_URL)"],
                         run_as_user=1001, run_as_group=1001)
    pod = _notebook_pod(world, kube, image)
    (c,) = pod.spec.containers
    assert c.command == ["/opt/lab/start.sh", "--base-url=$(CAMP_BASE_URL)"]
    env = {e.name: e.value for e in c.env}
    assert env["CAMP_HOME"] == "/workspace" and env["CAMP_BASE_URL"].startswith("/")
    assert c.working_dir == "/workspace"
    assert [m.mount_path for m in c.volume_mounts if m.name == "home"] == ["/workspace"]
    sc = pod.spec.security_context
    assert (sc.run_as_user, sc.run_as_group, sc.fs_group) == (1001, 1001, 1001)


def test_an_image_that_declares_nothing_runs_as_its_own_user_from_its_home(world: Any, kube: Any) -> None:
    image = image_create(actor=world.a.owner, tenant=world.a.tenant, name="plain", variant="jupyter",
                         reference="registry.example.com/team/plain:1")
    pod = _notebook_pod(world, kube, image)
    (c,) = pod.spec.containers
    assert pod.spec.security_context is None or pod.spec.security_context.run_as_user is None
    assert c.working_dir == "/home/jovyan" and "--ServerApp.root_dir=/home/jovyan" in c.command


def test_a_distributed_job_meets_at_rank_0s_cluster_ip_with_no_dns(world: Any, kube: Any) -> None:
    """The rendezvous needs no cluster DNS: Camp gives every worker the ClusterIP of a Service
    selecting rank 0 (made before the pods, read back by a second dispatch with the chart's
    rights), the headless Service still names each pod for hostfiles, and both go with the
    job's objects."""
    from scheduling.backends import backend_for
    from scheduling.backends.naming import rendezvous_service_name
    from workspaces import services as ws

    kube.node("cpu-a")
    cluster = kube.register(world)
    t = ws.training_submit(actor=world.a.member, project=world.a.project, cluster=cluster, name="ddp",
                           framework="pytorch", image_reference="registry.example.com/team/train:1",
                           workers=2, gpu_count=0, cpu_millicores=500, ram_mib=512)
    services.cycle_run(cluster=cluster)
    job = t.job
    assert services.job_dispatch(job_id=job.pk) == "created", job.reason
    job.refresh_from_db()
    pods = sorted((p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job.pk)),
                  key=lambda p: p.metadata.labels["camp.io/replica"])
    assert len(pods) == 2
    owner = pods[0].spec.subdomain
    rdzv = kube.core.read_namespaced_service(rendezvous_service_name(owner), job.namespace)
    ip = rdzv.spec.cluster_ip
    assert ip and ip != "None"
    assert rdzv.spec.selector == {"camp.io/job-id": str(job.pk), "camp.io/role": "worker",
                                  "camp.io/replica": "0"}
    assert [p.port for p in rdzv.spec.ports] == [29500]
    for rank, pod in enumerate(pods):
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert (env["MASTER_ADDR"], env["PET_MASTER_ADDR"], env["MASTER_PORT"], env["RANK"]) == (
            ip, ip, "29500", str(rank))
    # the headless Service (each pod's DNS name) stays for hostfiles and TF_CONFIG
    assert kube.core.read_namespaced_service(owner, job.namespace).spec.cluster_ip == "None"
    # a second dispatch of the same attempt finds the Service made and the same address
    backend = backend_for(cluster)
    from scheduling.services.dispatch import job_specs

    _, objs, _ = job_specs(job, cluster)
    assert backend.ensure_job_objects(objs) == ip
    backend.delete_job_objects(job.namespace, owner)
    names = {s.metadata.name for s in kube.core.list_namespaced_service(job.namespace).items}
    assert not names & {owner, rendezvous_service_name(owner)}
