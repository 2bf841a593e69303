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
