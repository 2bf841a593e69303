"""What workload pods look like: the ``specs`` of the environment and training kinds
(workspaces/kinds.py, whose one job spec hook calls them; scheduling/extensions.py).

The scheduler derives bound, GPU-annotated pods for every admitted job; these add what
makes them a notebook or a distributed training job:

* dev environments: the server's command, port and base URL, the home PVC, a Service and
  an Ingress guarded by Camp's auth endpoint (ingress-nginx external auth), or for SSH the
  user's public keys in a ConfigMap; these objects outlive a run (``owned=False``) so a
  stopped environment starts again on the same volume behind the same URL;
* training jobs: per-framework rank environment (torchrun ``PET_*``, DeepSpeed and MPI
  hostfiles, ``TF_CONFIG``), the checkpoint PVC and ``CAMP_CHECKPOINT_DIR``, the data
  volume, and a TensorBoard Service and Ingress when a log directory is declared;
* both: an imagePullSecret when the image comes from a registry with credentials.

Everything is derived from rows (a retried dispatch produces the same objects).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from registry.models import ExternalRegistry
from registry.services import pull_secret_manifest, registry_for_reference
from scheduling.backends.base import (
    LABEL_JOB_ID,
    LABEL_REPLICA,
    LABEL_ROLE,
    RENDEZVOUS_PORT,
    ExtraObject,
    JobObjects,
    PodSpec,
)
from scheduling.models import Job
from scheduling.selectors import project_namespace_name

from .models import DevEnvironment, EnvKind, TrainingFramework, TrainingJob
from .selectors import authorized_keys, environment_path

LABEL_WORKSPACE = "camp.io/workspace"
SERVER = {
    EnvKind.JUPYTER: {"port": 8888, "home": "/home/jovyan"},
    EnvKind.VSCODE: {"port": 8080, "home": "/home/coder"},
    EnvKind.SSH: {"port": 22, "home": "/home/camp"},
}
TF_PORT = 2222
TENSORBOARD_PORT = 6006


def _camp_url() -> str:
    return getattr(settings, "CAMP_URL", "http://localhost:8000").rstrip("/")


def _ingress_host() -> str:
    base = getattr(settings, "WORKSPACES_URL", "https://workspaces.camp.local")
    return urlsplit(base).hostname or "workspaces.camp.local"


def _pvc(name: str, gib: int, *, shared: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
                            "resources": {"requests": {"storage": f"{gib}Gi"}}}
    storage_class = getattr(settings, "WORKSPACES_STORAGE_CLASS", "")
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec}


def _ingress(name: str, path: str, service: str, *, auth_id: int | None = None) -> dict[str, Any]:
    annotations = {"nginx.ingress.kubernetes.io/proxy-body-size": "0",
                   "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}
    if auth_id is not None:
        # Every request is checked by Camp (token link, then a signed cookie) before it
        # reaches the server, which itself runs without a password.
        annotations.update({
            "nginx.ingress.kubernetes.io/auth-url": f"{_camp_url()}/workspaces/auth/{auth_id}/",
            "nginx.ingress.kubernetes.io/auth-signin": f"{_camp_url()}/workspaces/environments/{auth_id}/",
            "nginx.ingress.kubernetes.io/auth-always-set-cookie": "true",
        })
    spec: dict[str, Any] = {"rules": [{"host": _ingress_host(), "http": {"paths": [{
        "path": path, "pathType": "Prefix",
        "backend": {"service": {"name": service, "port": {"name": "http"}}}}]}}]}
    ingress_class = getattr(settings, "WORKSPACES_INGRESS_CLASS", "nginx")
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "annotations": annotations}, "spec": spec}


def _pull_secret(project: Any, image: Any, reference: str) -> ExternalRegistry | None:
    if image is not None and image.registry is not None and image.registry.has_credentials:
        return image.registry  # type: ignore[no-any-return]
    return registry_for_reference(project, reference)


def run_as(image: Any) -> dict[str, Any]:
    """What a pod of ``image`` needs to run as its catalog entry says (registry.Image):
    the pod's ``securityContext`` (``runAsUser``, ``runAsGroup``, and ``fsGroup`` so that
    the user can write volumes a provisioner creates root-owned) and the container's; with
    a non-root user, the rest of Pod Security's "restricted" profile (runAsNonRoot, no
    privilege escalation, no capabilities, the runtime's default seccomp profile). An image
    that declares nothing runs as its own USER, untouched."""
    uid = getattr(image, "run_as_user", None)
    gid = getattr(image, "run_as_group", None)
    pod: dict[str, Any] = {}
    container: dict[str, Any] = {}
    if uid is not None:
        pod["runAsUser"] = uid
    if gid is not None:
        pod.update({"runAsGroup": gid, "fsGroup": gid, "fsGroupChangePolicy": "OnRootMismatch"})
    if uid:
        pod.update({"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}})
        container = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {"security_context": pod or None, "container_security_context": container or None}


def jupyter_command(*, base_url: str, home: str, port: int) -> tuple[str, ...]:
    """Camp's own start of JupyterLab (an image whose catalog entry declares no command):
    any image with ``jupyter lab`` on its PATH, listening on all interfaces behind the base
    URL, with no token or password (Camp's auth hook guards it) and the home volume as the
    root of its file browser."""
    return ("jupyter", "lab", f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={home}",
            "--ServerApp.ip=0.0.0.0", f"--ServerApp.port={port}", "--ServerApp.open_browser=False",
            "--IdentityProvider.token=", "--ServerApp.password=")


# --- dev environments -------------------------------------------------------------------------


def environment_objects(env: DevEnvironment) -> tuple[str, list[tuple[str, str]]]:
    """The namespace and (kind, name) of the objects an environment leaves behind."""
    ns = project_namespace_name(cluster=env.cluster, project=env.project)
    objects = [("PersistentVolumeClaim", env.home_claim), ("Service", env.service_name)]
    if env.kind == EnvKind.SSH:
        objects.append(("ConfigMap", f"{env.service_name}-ssh"))
    else:
        objects.append(("Ingress", env.service_name))
    return ns, objects


def _environment_specs(env: DevEnvironment, objs: JobObjects,
                       pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    server = SERVER[EnvKind(env.kind)]
    path = environment_path(env)
    extra = [ExtraObject(_pvc(env.home_claim, env.home_gib), owned=False)]
    port = {"name": "ssh" if env.kind == EnvKind.SSH else "http", "containerPort": server["port"]}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": env.service_name},
               "spec": {"selector": {LABEL_WORKSPACE: str(env.pk)},
                        "ports": [{"name": port["name"], "port": 22 if env.kind == EnvKind.SSH else 80,
                                   "targetPort": port["name"]}]}}
    extra.append(ExtraObject(service, owned=False))
    image = env.image
    home = str((image.home if image is not None and image.home else "") or server["home"])
    volumes: list[dict[str, Any]] = [{"name": "home", "persistentVolumeClaim": {"claimName": env.home_claim}}]
    mounts: list[dict[str, Any]] = [{"name": "home", "mountPath": home}]
    command: tuple[str, ...]
    if image is not None and image.command:
        command = tuple(image.command)
    elif env.kind == EnvKind.JUPYTER:
        command = jupyter_command(base_url=path, home=home, port=int(str(server["port"])))
    elif env.kind == EnvKind.VSCODE:
        command = ("code-server", "--bind-addr", "0.0.0.0:8080", "--auth", "none",
                   "--abs-proxy-base-path", path.rstrip("/"), home)
    else:  # sshd
        command = ("/usr/sbin/sshd", "-D", "-e", "-o", "AuthorizedKeysFile=/etc/camp-ssh/authorized_keys",
                   "-o", "PasswordAuthentication=no")
        keys = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{env.service_name}-ssh"},
                "data": {"authorized_keys": authorized_keys(env)}}
        extra.append(ExtraObject(keys, owned=False))
        volumes.append({"name": "ssh-keys", "configMap": {"name": f"{env.service_name}-ssh",
                                                          "defaultMode": 0o644}})
        mounts.append({"name": "ssh-keys", "mountPath": "/etc/camp-ssh", "readOnly": True})
    # Ready (and the environment running) only once the server answers: Jupyter's /api
    # (its version, served without a login), the port for the others.
    probe: dict[str, Any] = ({"httpGet": {"path": f"{path}api", "port": port["name"]}}
                             if env.kind == EnvKind.JUPYTER else {"tcpSocket": {"port": port["name"]}})
    probe.update({"periodSeconds": 3, "failureThreshold": 3})
    if env.kind != EnvKind.SSH:
        extra.append(ExtraObject(_ingress(env.service_name, path, env.service_name, auth_id=env.pk),
                                 owned=False))
    secrets: tuple[str, ...] = ()
    registry = _pull_secret(env.project, env.image, env.image_reference)
    if registry is not None:
        extra.append(ExtraObject(pull_secret_manifest(registry), owned=False))
        secrets = (registry.secret_name,)
    out = []
    for p in pods:
        out.append(dataclasses.replace(
            p, labels={**p.labels, LABEL_WORKSPACE: str(env.pk)},
            env={**p.env, "CAMP_WORKLOAD": env.kind, "CAMP_BASE_URL": path, "CAMP_HOME": home,
                 "CAMP_PORT": str(server["port"])},
            command=p.command or command, ports=(port,), volumes=tuple(volumes),
            volume_mounts=tuple(mounts), image_pull_secrets=secrets, readiness_probe=probe,
            # The user's files are on the home volume: the server starts there.
            working_dir=home, **run_as(image)))
    return dataclasses.replace(objs, extra=tuple(extra)), out


# --- training -------------------------------------------------------------------------------


def tensorboard_path(t: TrainingJob) -> str:
    return f"/tb/{t.pk}-{t.name}/"


def _training_specs(t: TrainingJob, ns: str, objs: JobObjects,
                    pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    workers = sorted((p for p in pods if p.labels.get(LABEL_ROLE) == "worker"),
                     key=lambda p: int(p.labels.get(LABEL_REPLICA, "0")))
    distributed = len(pods) > 1

    def host(p: PodSpec) -> str:
        return f"{p.name}.{objs.name}.{ns}.svc" if distributed else "localhost"

    hosts = [host(p) for p in workers]
    slots = max(1, t.gpu_count)
    data = dict(objs.data)
    if t.framework in (TrainingFramework.DEEPSPEED, TrainingFramework.MPI):
        data["hostfile"] = "".join(f"{h} slots={slots}\n" for h in hosts)
    extra: list[ExtraObject] = list(objs.extra)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if t.checkpoint_dir and t.checkpoint_volume_gib:
        claim = f"tr-{t.pk}-ckpt"
        extra.append(ExtraObject(_pvc(claim, t.checkpoint_volume_gib, shared=True), owned=False))
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "checkpoints", "mountPath": t.checkpoint_dir})
    if t.data_volume:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": t.data_volume,
                                                                  "readOnly": True}})
        mounts.append({"name": "data", "mountPath": "/data", "readOnly": True})
    if t.log_dir and workers:
        name = f"tr-{t.pk}-tb"
        w0 = workers[0]
        svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": {LABEL_JOB_ID: w0.labels[LABEL_JOB_ID], LABEL_ROLE: "worker",
                                     LABEL_REPLICA: "0"},
                        "ports": [{"name": "http", "port": 80, "targetPort": TENSORBOARD_PORT}]}}
        extra += [ExtraObject(svc), ExtraObject(_ingress(name, tensorboard_path(t), name))]
    registry = _pull_secret(t.project, t.image, t.image_reference)
    secrets: tuple[str, ...] = ()
    if registry is not None:
        extra.append(ExtraObject(pull_secret_manifest(registry), owned=False))
        secrets = (registry.secret_name,)
    common = {"CAMP_WORKLOAD": "training", "CAMP_FRAMEWORK": t.framework, "CAMP_TRAINING": t.name}
    if t.checkpoint_dir:
        common.update({"CAMP_CHECKPOINT_DIR": t.checkpoint_dir,
                       "CAMP_CHECKPOINT_EVERY": str(t.checkpoint_every)})
    if t.log_dir:
        common.update({"CAMP_LOG_DIR": t.log_dir, "TENSORBOARD_PORT": str(TENSORBOARD_PORT)})
    master = hosts[0] if hosts else "localhost"
    rank_of = {p.name: i for i, p in enumerate(workers)}
    out = []
    for p in pods:
        env = {k: v for k, v in p.env.items()
               if k not in ("RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                            "LOCAL_WORLD_SIZE")}
        env.update(common)
        ports: tuple[dict[str, Any], ...] = ()
        if p.name in rank_of:
            i = rank_of[p.name]
            env.update({"RANK": str(i), "NODE_RANK": str(i), "WORLD_SIZE": str(len(workers)),
                        "MASTER_ADDR": master, "MASTER_PORT": str(RENDEZVOUS_PORT),
                        "LOCAL_WORLD_SIZE": str(slots)})
            if t.framework == TrainingFramework.PYTORCH:
                # torchrun reads its arguments from PET_* variables.
                env.update({"PET_NNODES": str(len(workers)), "PET_NODE_RANK": str(i),
                            "PET_NPROC_PER_NODE": str(slots), "PET_MASTER_ADDR": master,
                            "PET_MASTER_PORT": str(RENDEZVOUS_PORT)})
                ports = ({"name": "rendezvous", "containerPort": RENDEZVOUS_PORT},)
            elif t.framework == TrainingFramework.TENSORFLOW:
                env["TF_CONFIG"] = json.dumps({
                    "cluster": {"worker": [f"{h}:{TF_PORT}" for h in hosts]},
                    "task": {"type": "worker", "index": i}}, sort_keys=True)
                ports = ({"name": "tf", "containerPort": TF_PORT},)
            else:
                ports = ({"name": "ssh", "containerPort": 22},)
        elif t.framework == TrainingFramework.DEEPSPEED:
            env.update({"DS_HOSTFILE": "/etc/camp/hostfile", "MASTER_ADDR": master,
                        "MASTER_PORT": str(RENDEZVOUS_PORT)})
        elif t.framework == TrainingFramework.MPI:
            env.update({"OMPI_MCA_orte_default_hostfile": "/etc/camp/hostfile",
                        "CAMP_MPI_WORLD_SIZE": str(len(workers) * slots)})
        out.append(dataclasses.replace(p, env=env, ports=ports, volumes=tuple(volumes),
                                       volume_mounts=tuple(mounts), image_pull_secrets=secrets,
                                       command=p.command or tuple(getattr(t.image, "command", None) or ()),
                                       **run_as(t.image)))
    # rank 0 (the first worker) hosts the rendezvous: the backend's address for it selects it
    rendezvous = ({LABEL_JOB_ID: workers[0].labels[LABEL_JOB_ID], LABEL_ROLE: "worker", LABEL_REPLICA:
                   workers[0].labels[LABEL_REPLICA]} if distributed and workers else {})
    return dataclasses.replace(objs, data=data, extra=tuple(extra), rendezvous=rendezvous), out


def environment_of_job(job: Job) -> DevEnvironment | None:
    return DevEnvironment.objects.filter(job=job).select_related(
        "tenant", "project", "cluster", "image__registry").first()


def training_of_job(job: Job) -> TrainingJob | None:
    return TrainingJob.objects.filter(job=job).select_related(
        "tenant", "project", "cluster", "image__registry").first()


def environment_specs(env: DevEnvironment, job: Job, ns: Any, objs: JobObjects,
                      pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    """The ``environment`` kind's pods and objects (workspaces/kinds.py)."""
    return _environment_specs(env, objs, pods)


def training_specs(t: TrainingJob, job: Job, ns: Any, objs: JobObjects,
                   pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]]:
    """The ``training`` kind's pods and objects (workspaces/kinds.py)."""
    return _training_specs(t, ns.name, objs, pods)
