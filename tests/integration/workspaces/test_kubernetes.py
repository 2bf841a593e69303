"""Workload objects through the Kubernetes backend: the official client against kmock over
real HTTP (see tests/integration/scheduling/test_kubernetes.py for what kmock cannot do
and how the namespace and owner uid are served). For each kind — JupyterLab, VS Code,
SSH, PyTorch, TensorFlow, DeepSpeed, MPI — the test reads back what Camp created: pods,
Services, PVCs, Secrets (imagePullSecrets), Ingresses and ConfigMaps."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from registry import services as registry_services
from registry.models import Image
from scheduling import services as scheduling_services
from tests.integration.scheduling.conftest import project_ns
from tests.integration.scheduling.kmockserver import stored
from tests.integration.scheduling.test_kubernetes import _serve_namespace, _serve_owner_uid, kube  # noqa: F401
from workspaces import services, tasks
from workspaces.models import DevEnvironment, TrainingJob
from workspaces.pods import environment_objects

from .test_ssh_keys import public_key

pytestmark = pytest.mark.django_db
NS = ""  # the project's namespace, set per test (ids differ between tests)


@pytest.fixture(autouse=True)
def _project_namespace(world: Any) -> None:
    global NS
    NS = project_ns(world)
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAID9iGbd4jNEsHIMHFZ0h4o7jyUuNlZ13tMfUpp8WPm6m alice@laptop"


def _dispatch(k: Any, cluster: Any, job: Any) -> None:
    _serve_owner_uid(k, NS, f"{job.name}-{job.pk}")
    summary = scheduling_services.cycle_run(cluster=cluster)
    assert summary is not None and job.pk in summary.admitted, summary
    assert scheduling_services.job_dispatch(job_id=job.pk) == "created"


def _env(world: Any, cluster: Any, name: str, kind: str, **kw: Any) -> DevEnvironment:
    env, _ = services.environment_launch(
        actor=world.a.member,
        project=world.a.project,
        cluster=cluster,
        name=name,
        kind=kind,
        cpu_millicores=1000,
        ram_mib=2048,
        **kw,
    )
    return env


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][0])


def _env_vars(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in _container(pod)["env"]}


def test_jupyter_objects_with_private_image(world: Any, kube: Any) -> None:  # noqa: F811
    k, core, cluster = kube
    scheduling_services.inventory_sync(cluster=cluster)
    _serve_namespace(k, NS)
    registry = registry_services.registry_create(
        actor=world.a.owner,
        tenant=world.a.tenant,
        name="ghcr",
        server="https://ghcr.io",
        username="bot",
        password="pat-123",
    )
    image = registry_services.image_create(
        actor=world.a.owner,
        tenant=world.a.tenant,
        name="nb",
        reference="ghcr.io/acme/notebook:2024.10",
        variant="jupyter",
        registry=registry,
    )
    env = _env(
        world,
        cluster,
        "nb",
        "jupyter",
        image=image,
        gpu_count=1,
        gpu_memory_mib=10000,
        gpu_cores_percent=30,
        home_gib=20,
    )
    _dispatch(k, cluster, env.job)
    pod = stored(k, "pods", NS, env.job.allocations.get().pod_name)
    c = _container(pod)
    assert c["image"] == "ghcr.io/acme/notebook:2024.10"
    assert c["command"][:2] == ["jupyter", "lab"] and f"--ServerApp.base_url=/ws/{env.pk}-nb/" in c["command"]
    assert c["ports"] == [{"name": "http", "containerPort": 8888}]
    assert {"name": "home", "mountPath": "/home/jovyan"} in c["volumeMounts"]
    assert {"name": "home", "persistentVolumeClaim": {"claimName": f"ws-{env.pk}-home"}} in pod["spec"][
        "volumes"
    ]
    assert pod["spec"]["imagePullSecrets"] == [{"name": f"camp-registry-{registry.pk}"}]
    assert pod["metadata"]["labels"]["camp.io/workspace"] == str(env.pk)
    assert ",NVIDIA," in pod["metadata"]["annotations"]["hami.io/vgpu-devices-to-allocate"]
    assert _env_vars(pod)["CAMP_WORKLOAD"] == "jupyter"
    pvc = stored(k, "persistentvolumeclaims", NS, f"ws-{env.pk}-home")
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"] and "ownerReferences" not in pvc["metadata"]
    svc = stored(k, "services", NS, f"ws-{env.pk}")
    assert svc["spec"]["selector"] == {"camp.io/workspace": str(env.pk)}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]
    secret = stored(k, "secrets", NS, f"camp-registry-{registry.pk}")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    assert (
        config["auths"]["ghcr.io"]["username"] == "bot"
        and config["auths"]["ghcr.io"]["password"] == "pat-123"
    )
    ingress = k.objects[(_ingress_resource(), NS, f"ws-{env.pk}")].raw
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "workspaces.camp.local"
    path = rule["http"]["paths"][0]
    assert (path["path"], path["pathType"]) == (f"/ws/{env.pk}-nb/", "Prefix")
    assert path["backend"]["service"] == {"name": f"ws-{env.pk}", "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"].endswith(
        f"/workspaces/auth/{env.pk}/"
    )
    # Deleting the environment removes what outlives its runs, home volume included.
    ns, objects = environment_objects(env)
    assert tasks.delete_objects(cluster.pk, ns, objects) == 3
    assert [p.metadata.name for p in core.list_namespaced_persistent_volume_claim(NS).items] == []
    from kubernetes import client as k8s

    assert k8s.NetworkingV1Api(core.api_client).list_namespaced_ingress(NS).items == []


def _ingress_resource() -> Any:
    import kmock

    return kmock.resource("networking.k8s.io", "v1", "ingresses")


def test_vscode_and_ssh_objects(world: Any, kube: Any) -> None:  # noqa: F811
    k, core, cluster = kube
    scheduling_services.inventory_sync(cluster=cluster)
    _serve_namespace(k, NS)
    code = _env(world, cluster, "code", "vscode", image=Image.objects.get(name="pytorch-vscode"))
    _dispatch(k, cluster, code.job)
    c = _container(stored(k, "pods", NS, code.job.allocations.get().pod_name))
    assert c["command"][:5] == ["code-server", "--bind-addr", "0.0.0.0:8080", "--auth", "none"]
    assert c["ports"] == [{"name": "http", "containerPort": 8080}]
    # The owner's stored keys come first, then the ones given for this environment.
    stored_key = services.ssh_key_add(actor=world.a.member, name="laptop", public_key=public_key("ecdsa"))
    shell = _env(
        world, cluster, "shell", "ssh", image=Image.objects.get(name="pytorch-ssh"), ssh_public_keys=KEY
    )
    _dispatch(k, cluster, shell.job)
    pod = stored(k, "pods", NS, shell.job.allocations.get().pod_name)
    assert _container(pod)["ports"] == [{"name": "ssh", "containerPort": 22}]
    keys = stored(k, "configmaps", NS, f"ws-{shell.pk}-ssh")
    assert keys["data"]["authorized_keys"] == f"{stored_key.public_key}\n{KEY}\n"
    # A key added later reaches the (already existing) ConfigMap at the next start.
    added = services.ssh_key_add(actor=world.a.member, name="desktop", public_key=public_key("rsa"))
    services.environment_stop(actor=world.a.member, env=shell)
    scheduling_services.job_stop(job_id=shell.job.pk)
    shell = services.environment_start(actor=world.a.member, env=shell)
    _dispatch(k, cluster, shell.job)
    keys = stored(k, "configmaps", NS, f"ws-{shell.pk}-ssh")
    assert keys["data"]["authorized_keys"] == f"{stored_key.public_key}\n{added.public_key}\n{KEY}\n"
    assert {"name": "ssh-keys", "mountPath": "/etc/camp-ssh", "readOnly": True} in _container(pod)[
        "volumeMounts"
    ]
    svc = stored(k, "services", NS, f"ws-{shell.pk}")
    assert svc["spec"]["ports"] == [{"name": "ssh", "port": 22, "targetPort": "ssh"}]
    assert (_ingress_resource(), NS, f"ws-{shell.pk}") not in k.objects  # SSH has no URL


def _training(world: Any, cluster: Any, name: str, framework: str, **kw: Any) -> TrainingJob:
    return services.training_submit(
        actor=world.a.member,
        project=world.a.project,
        cluster=cluster,
        name=name,
        framework=framework,
        image=Image.objects.get(name=f"{'tensorflow' if framework == 'tensorflow' else 'pytorch'}-training"),
        cpu_millicores=1000,
        ram_mib=2048,
        **kw,
    )


def test_pytorch_with_checkpoint_volume_and_tensorboard(world: Any, kube: Any) -> None:  # noqa: F811
    k, core, cluster = kube
    scheduling_services.inventory_sync(cluster=cluster)
    _serve_namespace(k, NS)
    t = _training(
        world,
        cluster,
        "ddp",
        "pytorch",
        workers=2,
        gpu_count=2,
        gpu_memory_mib=20000,
        gpu_cores_percent=50,
        checkpoint_dir="/ckpt",
        checkpoint_volume_gib=50,
        log_dir="/logs",
        data_volume="imagenet",
    )
    _dispatch(k, cluster, t.job)
    owner = f"ddp-{t.job.pk}"
    for rank in range(2):
        pod = stored(k, "pods", NS, f"ddp-{t.job.pk}-worker-{rank}")
        env = _env_vars(pod)
        assert (env["RANK"], env["WORLD_SIZE"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == (
            str(rank),
            "2",
            str(rank),
            "2",
        )
        assert env["MASTER_ADDR"] == f"ddp-{t.job.pk}-worker-0.{owner}.{NS}.svc"
        assert env["CAMP_CHECKPOINT_DIR"] == "/ckpt" and env["CAMP_LOG_DIR"] == "/logs"
        mounts = _container(pod)["volumeMounts"]
        assert {"name": "checkpoints", "mountPath": "/ckpt"} in mounts
        assert {"name": "data", "mountPath": "/data", "readOnly": True} in mounts
    pvc = stored(k, "persistentvolumeclaims", NS, f"tr-{t.pk}-ckpt")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert stored(k, "services", NS, owner)["spec"]["clusterIP"] == "None"  # rendezvous
    tb = stored(k, "services", NS, f"tr-{t.pk}-tb")
    assert tb["spec"]["selector"] == {
        "camp.io/job-id": str(t.job.pk),
        "camp.io/role": "worker",
        "camp.io/replica": "0",
    }
    assert tb["metadata"]["ownerReferences"][0]["name"] == owner  # goes with the run
    ingress = k.objects[(_ingress_resource(), NS, f"tr-{t.pk}-tb")].raw
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["path"] == f"/tb/{t.pk}-ddp/"


def test_tensorflow_deepspeed_and_mpi_rank_environment(world: Any, kube: Any) -> None:  # noqa: F811
    k, core, cluster = kube
    scheduling_services.inventory_sync(cluster=cluster)
    _serve_namespace(k, NS)
    tf = _training(
        world, cluster, "tf", "tensorflow", workers=2, gpu_count=1, gpu_memory_mib=10000, gpu_cores_percent=20
    )
    _dispatch(k, cluster, tf.job)
    owner = f"tf-{tf.job.pk}"
    hosts = [f"tf-{tf.job.pk}-worker-{i}.{owner}.{NS}.svc:2222" for i in range(2)]
    for i in range(2):
        tf_config = json.loads(_env_vars(stored(k, "pods", NS, f"tf-{tf.job.pk}-worker-{i}"))["TF_CONFIG"])
        assert tf_config == {"cluster": {"worker": hosts}, "task": {"type": "worker", "index": i}}
    for framework in ("deepspeed", "mpi"):
        t = _training(
            world,
            cluster,
            framework,
            framework,
            workers=2,
            gpu_count=1,
            gpu_memory_mib=10000,
            gpu_cores_percent=20,
            command=["deepspeed", "train.py"],
        )
        _dispatch(k, cluster, t.job)
        owner = f"{framework}-{t.job.pk}"
        hostfile = stored(k, "configmaps", NS, owner)["data"]["hostfile"]
        assert hostfile == "".join(
            f"{framework}-{t.job.pk}-worker-{i}.{owner}.{NS}.svc slots=1\n" for i in range(2)
        )
        launcher = stored(k, "pods", NS, f"{framework}-{t.job.pk}-launcher-0")
        env = _env_vars(launcher)
        assert "RANK" not in env and _container(launcher)["command"] == ["deepspeed", "train.py"]
        assert "nvidia.com/gpu" not in _container(launcher)["resources"]["limits"]
        worker = _env_vars(stored(k, "pods", NS, f"{framework}-{t.job.pk}-worker-1"))
        assert (worker["RANK"], worker["WORLD_SIZE"]) == ("1", "2")
        if framework == "deepspeed":
            assert env["DS_HOSTFILE"] == "/etc/camp/hostfile"
        else:
            assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/camp/hostfile"
