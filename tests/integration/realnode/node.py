"""A REAL single-node Kubernetes cluster for the real-node tier (issue 28).

``../shared/tools/node/start-node.sh`` starts etcd + kube-apiserver, containerd, a kubelet,
kube-proxy, kube-controller-manager and kube-scheduler v1.24 on this machine; ``stop-node.sh``
stops exactly that (PID files) and undoes its host changes. ``RealNode`` wraps the two, picks
free ports, feeds it the images of ``images.py`` and keeps containerd's image store under the
image cache (``KEEP_STATE=1``) so an image is imported once per machine, not once per run.

Camp reaches it as a production Camp does (docs/DEPLOY.md): the camp-agent chart installed with
helm, Camp registered with that chart's ServiceAccount token and the cluster's CA, never the
admin (``system:masters``) credentials that the start script hands the test.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from tests.integration.realkube.harness import agent_service_account, free_port, wait_until

from . import images

ROOT = Path(__file__).resolve().parents[3]
NODE_TOOLS = ROOT.parent / "shared" / "tools" / "node"
HOST_BINARIES = ("containerd", "containerd-shim-runc-v2", "runc", "iptables", "conntrack", "ip", "curl",
                 "openssl", "debootstrap")
CHART = ROOT / "deploy" / "helm" / "camp-agent"
AGENT_NAMESPACE = "camp-system"


def unavailable_reason() -> str | None:
    """Why a real node cannot start here, or None when it can."""
    if not (NODE_TOOLS / "start-node.sh").exists():
        return (f"no real node: {NODE_TOOLS} is absent (the project's shared/ tools sit beside "
                "the clone on the project's machines)")
    if os.geteuid() != 0:
        return "the real node needs root (containerd, iptables, a bridge): run the suite as root"
    if not Path("/sys/fs/cgroup/memory").is_dir():
        return "the real node's kubelet v1.24 runs on cgroup v1 and this machine has no v1 memory controller"
    missing = [b for b in HOST_BINARIES if shutil.which(b) is None]
    if missing or not Path("/usr/lib/cni/bridge").exists():
        return (f"missing {' '.join(missing) or 'CNI plugins'}: tools/test-deps.sh installs containerd, "
                "runc, containernetworking-plugins, iptables, conntrack, debootstrap "
                "(make test does, as root)")
    return None


@dataclass
class RealNode:
    base: Path
    env: dict[str, str]
    kubeconfig: Path
    node_name: str
    image_key: str
    kubectl: Path
    helm: Path
    _api: k8s.ApiClient | None = field(default=None, repr=False)

    # --- life -----------------------------------------------------------------------------

    @classmethod
    def start(cls, *, kubectl: Path, helm: Path) -> RealNode:
        key, tars = images.build_images(NODE_TOOLS)
        base = Path(tempfile.mkdtemp(prefix="camp-node-"))
        (base / "images").mkdir()
        for t in [*(NODE_TOOLS / "images").glob("*.tar"), *tars.values()]:
            (base / "images" / t.name).symlink_to(t)
        images.CACHE.mkdir(parents=True, exist_ok=True)
        # hyperkube picks its component from the name it runs under; the shared copy of the
        # tools holds the names as plain files, so make the symlinks the scripts expect
        (base / "bin").mkdir()
        for c in ("kubelet", "kube-proxy", "kube-controller-manager", "kube-scheduler", "hk-crictl"):
            (base / "bin" / c).symlink_to(NODE_TOOLS / "hyperkube")
        env = {**os.environ, "BASE": str(base), "KUBECTL": str(kubectl), "API_PORT": str(free_port()),
               "ETCD_PORT": str(free_port()), "ETCD_PEER_PORT": str(free_port()),
               "KCM_PORT": str(free_port()), "PROXY_HEALTHZ_PORT": str(free_port()),
               "K8S_BIN": str(base / "bin"),
               # the image store outlives the run: imported once per machine (stamps per tar)
               "CTRD_ROOT": str(images.CACHE / "containerd-root"), "KEEP_STATE": "1"}
        node = cls(base=base, env=env, kubeconfig=base / "run" / "kubeconfig", node_name="10.244.0.1",
                   image_key=key, kubectl=kubectl, helm=helm)
        started = subprocess.run(["bash", str(NODE_TOOLS / "start-node.sh")], env=env, capture_output=True,
                                 text=True, timeout=600, check=False)
        if started.returncode != 0:
            node.stop()
            raise RuntimeError(f"the real node did not start:\n{started.stderr[-3000:]}")
        return node

    def stop(self) -> None:
        subprocess.run(["bash", str(NODE_TOOLS / "stop-node.sh")], env=self.env, capture_output=True,
                       timeout=300, check=False)
        shutil.rmtree(self.base, ignore_errors=True)

    def run_dir(self) -> Path:
        return self.base / "run"

    def pidfile(self, component: str) -> Path:
        return self.run_dir() / f"{component}.pid"

    # --- admin access (the test's, not Camp's) ------------------------------------------------

    def admin(self) -> k8s.ApiClient:
        if self._api is None:
            from kubernetes import config

            self._api = config.new_client_from_config(str(self.kubeconfig))
        return self._api

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.admin())

    @property
    def host(self) -> str:
        return f"https://127.0.0.1:{self.env['API_PORT']}"

    @property
    def ca_pem(self) -> str:
        return (self.base / "apiserver" / "run" / "pki" / "ca.crt").read_text()

    def kubectl_run(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        done = subprocess.run([str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def image(self, name: str) -> str:
        return images.image_ref(name, self.image_key)

    # --- what an operator does before registering the cluster in Camp ---------------------

    def install_agent(self) -> dict[str, str]:
        """docs/DEPLOY.md's install path: ``helm install camp-agent``, then a short-lived token
        of its ServiceAccount (``kubectl create token``, the TokenRequest API) and the cluster's
        CA from the kubeconfig. Camp's credentials, never the admin's."""
        done = subprocess.run([str(self.helm), "install", "camp-agent", str(CHART), "-n", AGENT_NAMESPACE,
                               "--create-namespace", "--kubeconfig", str(self.kubeconfig)],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"helm install camp-agent: {done.stderr}")
        token = self.kubectl_run("-n", AGENT_NAMESPACE, "create", "token", agent_service_account(),
                             "--duration=24h").strip()
        config = yaml.safe_load(Path(self.kubeconfig).read_text())
        ca = base64.b64decode(config["clusters"][0]["cluster"]["certificate-authority-data"]).decode()
        return {"token": token, "ca_cert": ca}

    # --- storage: local PersistentVolumes the PV controller binds claims to -----------------

    _pv_seq: int = 0

    def add_volumes(self, count: int, gib: int = 10, *, mode: int = 0o777) -> list[Path]:
        """``local`` PVs on this node (no StorageClass, as Camp's claims name none), so the
        real PV binder binds Camp's home and checkpoint claims; a ``local`` volume honours the
        pod's ``fsGroup`` like a real disk (a ``hostPath`` one would not). ``mode`` 0o777 is
        what local-path-provisioner makes; 0o755 (root's) is a fresh ext4 disk's root."""
        paths = []
        for _ in range(count):
            RealNode._pv_seq += 1
            i = RealNode._pv_seq
            path = self.base / "pv" / f"pv{i}"
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
            paths.append(path)
            body = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"camp-test-pv{i}"},
                    "spec": {"capacity": {"storage": f"{gib}Gi"},
                             "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                             "persistentVolumeReclaimPolicy": "Retain",
                             "local": {"path": str(path)},
                             "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                 {"key": "kubernetes.io/hostname", "operator": "In",
                                  "values": [self.node_name]}]}]}}}}
            try:
                self.core.create_persistent_volume(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
        return paths

    # --- faults -------------------------------------------------------------------------------

    def pid(self, component: str) -> int:
        return int(self.pidfile(component).read_text())

    def restart(self, component: str) -> None:
        """Stop ``component`` (SIGTERM, its PID file's process) and start it again with the
        same command line, log and PID file, as systemd would restart it."""
        pid = self.pid(component)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        exe = os.readlink(f"/proc/{pid}/exe")
        os.kill(pid, signal.SIGTERM)
        wait(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), f"{component} to stop",
             timeout=60)
        log = open(self.run_dir() / "logs" / f"{component}.log", "ab")  # noqa: SIM115 — the child owns it
        proc = subprocess.Popen([a.decode() for a in argv], executable=exe, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.pidfile(component).write_text(str(proc.pid))

    def freeze(self, component: str) -> None:
        os.kill(self.pid(component), signal.SIGSTOP)

    def thaw(self, component: str) -> None:
        os.kill(self.pid(component), signal.SIGCONT)

    def node_ready(self) -> str:
        node = self.core.read_node(self.node_name)
        for c in node.status.conditions or []:
            if c.type == "Ready":
                return str(c.status)
        return "Unknown"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "X"


def wait(check: Any, what: str, timeout: float = 120.0) -> Any:
    """wait_until with the real node's generous default (a loaded 2-core machine)."""
    return wait_until(check, what, timeout=timeout, interval=0.5)


def monotonic() -> float:
    return time.monotonic()
