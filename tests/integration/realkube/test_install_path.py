"""docs/DEPLOY.md's install path, literally: its ``install-path`` block runs as it stands in
bash (helm install of the camp-agent chart, ``kubectl create token``, the CA and server from
the kubeconfig, registration with ``curl`` as a platform admin against a live Camp), on a
fresh real kube-apiserver; then a project member's notebook launched through the API is
admitted, dispatched with that token, bound on the node through HAMi's handshake (the
device-plugin and kubelet stand-ins of harness.py) and runs."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduling import services
from scheduling.models import Cluster, Job, JobState
from tests.conftest import client_for
from tests.integration.deploy.tools import install_tools

from .harness import (
    AGENT_NAMESPACE,
    ROOT,
    HamiDevicePlugin,
    KubeApiserver,
    Kubelet,
    camp_pods,
    create_node,
    default_storage_class,
    hami_devices,
    unavailable_reason,
)
from .steps import wait_running

pytestmark = pytest.mark.django_db(transaction=True)
CAMP_URL = "https://camp.example.com"


def install_block() -> str:
    """The shell block docs/DEPLOY.md marks ``<!-- install-path -->``."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    found = re.search(r"<!-- install-path -->\n```sh\n(.*?)```", text, re.S)
    assert found, "docs/DEPLOY.md lost its install-path block"
    return found.group(1)


@pytest.fixture
def fresh_server() -> Iterator[KubeApiserver]:
    """A cluster nobody installed anything in (the session's has the chart already)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = KubeApiserver.start(prefix="camp-install-kube-", agent=False)
    try:
        yield server
    finally:
        server.stop()


def test_deploy_md_install_path_registers_the_cluster_and_a_notebook_runs(
        world: Any, live_server: Any, fresh_server: KubeApiserver, tmp_path: Path) -> None:
    from tenants import services as tenant_services

    block = install_block()
    assert CAMP_URL in block
    tools = install_tools()
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")  # the block runs from a checkout
    _, camp_token = tenant_services.token_create(actor=world.admin, name="install")
    env = {**os.environ, "KUBECONFIG": str(fresh_server.kubeconfig), "CAMP_TOKEN": camp_token,
           "PATH": f"{tools['helm'].parent}{os.pathsep}{os.environ['PATH']}"}
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", block.replace(CAMP_URL, live_server.url)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0, ran.stdout + ran.stderr

    cluster = Cluster.objects.get(name="prod-a100")
    assert cluster.enabled  # checked at registration (a disabled cluster is not)
    from scheduling.backends.credentials import decrypt_credentials

    token = decrypt_credentials(cluster.credentials_encrypted)["token"]
    assert token != fresh_server.token  # the chart's ServiceAccount, not the admin
    from scheduling.backends.kubernetes import KubernetesBackend

    assert KubernetesBackend.for_cluster(cluster).service_account() == (AGENT_NAMESPACE, "camp")

    plugin = HamiDevicePlugin(fresh_server.core)
    with Kubelet(fresh_server.core, plugin) as kubelet:
        create_node(fresh_server.core, "gpu-a", devices=hami_devices(2))
        default_storage_class(fresh_server, True)  # a cluster as installed has a default class
        services.inventory_sync(cluster=cluster)  # what the worker does after registration
        r = client_for(world.a.member).post("/api/v1/environments/", {
            "project": world.a.project.pk, "cluster": "prod-a100", "name": "nb", "kind": "jupyter",
            "image_reference": "jupyter/base:1", "gpu_count": 1, "gpu_memory_mib": 20000,
            "gpu_cores_percent": 25, "cpu_millicores": 1000, "ram_mib": 2048}, format="json")
        assert r.status_code == 201, r.content
        from workspaces.models import DevEnvironment

        job = DevEnvironment.objects.get(pk=r.json()["id"]).job
        services.cycle_run(cluster=cluster)
        # "pending": the handshake's answer came after the dispatch's poll
        # (CAMP_HAMI_BIND_POLL_SECONDS, under load); the follow-up dispatch the task would queue
        # resumes the wait.
        outcome = services.job_dispatch(job_id=job.pk)
        for _ in range(20):
            if outcome != "pending":
                break
            outcome = services.job_dispatch(job_id=job.pk)
        assert outcome == "created", (outcome, Job.objects.get(pk=job.pk).reason)
        job = wait_running(cluster, job)
        assert job.state == JobState.RUNNING
        (pod,) = [p for p in camp_pods(fresh_server.core)
                  if p.metadata.labels["camp.io/job-id"] == str(job.pk)]
        assert pod.spec.node_name == "gpu-a" and pod.status.phase == "Running"
        assert pod.metadata.annotations["hami.io/bind-phase"] == "success"
    assert not kubelet.errors, kubelet.errors
