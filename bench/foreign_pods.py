"""CPU to read every pod of a cluster in the inventory sync (GPUs held by pods Camp did not
create), per 1,000 pods.

``now``: ``KubernetesBackend._foreign`` as the sync runs it, the pod list in pages of
``POD_PAGE`` read as plain JSON (``_preload_content=False`` + ``json.loads``). ``before``: what
the unpaged list cost before (issue 11 review): the Kubernetes client building its V1Pod
models for the same answer (``ApiClient.deserialize``), which alone dominated the sync; the
walk over the pods after it is not counted, so ``before`` is a lower bound. The pods are
realistic (~2.5 KB each: labels, annotations, managed fields, env, probes, statuses); one in
ten is a HAMi pod with a ``…-devices-allocated`` annotation, one in ten asks ``nvidia.com/gpu``.
No API server: the answers come from memory, so only client CPU is measured.

    .venv/bin/python -m bench.foreign_pods                 # --pods 5000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def _pod(i: int) -> dict[str, Any]:
    ann: dict[str, str] = {"kubectl.kubernetes.io/restartedAt": "2026-11-23T10:00:00Z",
                           "prometheus.io/scrape": "true"}
    limits: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
    if i % 10 == 0:
        ann["hami.io/vgpu-node"] = f"node-{i % 100}"
        ann["hami.io/vgpu-devices-allocated"] = f"GPU-{i % 800:08d},NVIDIA,10000,30:;"
    elif i % 10 == 1:
        limits["nvidia.com/gpu"] = "1"
    ts = "2026-11-23T10:00:00Z"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"p-{i}", "namespace": f"ns-{i % 50}", "uid": f"0d2c6f1e-1111-2222-3333-{i:012d}",
            "resourceVersion": str(100000 + i), "creationTimestamp": ts,
            "labels": {"app": "x", "pod-template-hash": "abc", "team": "t"}, "annotations": ann,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "x-abc",
                                 "uid": "0d2c6f1e-1111-2222-3333-444455556667", "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "v1", "time": ts, "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]},
        "spec": {
            "nodeName": f"node-{i % 100}", "schedulerName": "default-scheduler",
            "serviceAccountName": "default", "restartPolicy": "Always",
            "containers": [{
                "name": "main", "image": "nginx:1.25", "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "env": [{"name": f"A{k}", "value": "v"} for k in range(8)],
                "resources": {"limits": limits, "requests": {"cpu": "500m", "memory": "512Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 80}, "periodSeconds": 10},
                "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                                  "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 300}]},
        "status": {
            "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1", "startTime": ts,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": ts}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "nginx:1.25",
                                   "imageID": "docker://sha256:abc", "containerID": "containerd://abc",
                                   "started": True, "state": {"running": {"startedAt": ts}},
                                   "lastState": {}}]},
    }


class _Answer:
    def __init__(self, data: bytes | str) -> None:
        self.data = data

    def release_conn(self) -> None:
        return None


class _Core:
    """Answers ``list_pod_for_all_namespaces`` from memory, in pages as the API server does."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.pages: dict[tuple[int, int], bytes] = {}

    def list_pod_for_all_namespaces(self, **kw: Any) -> _Answer:
        start = int(kw.get("_continue") or 0)
        limit = int(kw.get("limit") or len(self.pods))
        return _Answer(self.pages[start, limit])

    def encode(self, limit: int) -> None:
        """Encode the pages beforehand: the server's work is not the client's CPU."""
        for start in range(0, len(self.pods), limit):
            more = start + limit < len(self.pods)
            self.pages[start, limit] = json.dumps({
                "kind": "PodList", "apiVersion": "v1", "items": self.pods[start:start + limit],
                "metadata": {"resourceVersion": "1", "continue": str(start + limit) if more else ""},
            }).encode()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")
    import django

    django.setup()
    from kubernetes import client as k8s

    from scheduling.backends.kubernetes import POD_PAGE, KubernetesBackend

    pods = [_pod(i) for i in range(args.pods)]
    backend = KubernetesBackend(k8s.ApiClient())
    core = _Core(pods)
    core.encode(POD_PAGE)
    backend.core = core  # type: ignore[assignment]
    whole = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                        "items": pods})
    api = k8s.ApiClient()
    now, before = [], []
    for _ in range(args.repeats):
        c0 = time.process_time()
        by_uuid, cards = backend._foreign()
        now.append(time.process_time() - c0)
        assert len(by_uuid) and len(cards)
        c0 = time.process_time()
        api.deserialize(_Answer(whole), "V1PodList")  # type: ignore[arg-type]
        before.append(time.process_time() - c0)
    per = 1000 / args.pods
    print(json.dumps({
        "pods": args.pods, "repeats": args.repeats, "bytes_per_pod": len(whole) // args.pods,
        "now_cpu_ms_per_1000": round(statistics.median(now) * per * 1000, 1),
        "before_cpu_ms_per_1000": round(statistics.median(before) * per * 1000, 1),
        "load": os.getloadavg()}))


if __name__ == "__main__":
    main()
