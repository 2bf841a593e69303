"""Issue 27, findings 1, 2 and 8: one source of Camp's RBAC (``REQUIRED_ACCESS``: the
camp-agent chart and docs/KUBERNETES.md's table are compared with it), pods bound through
``pods/{name}/binding`` as the chart's ServiceAccount, and writes only in Camp's namespaces
(the session's apiserver has the chart installed; Camp's token is its ServiceAccount's)."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from scheduling import services
from scheduling.backends.kubernetes import REQUIRED_ACCESS, WORKLOADS_ROLE, Access
from tests.conftest import client_for
from tests.integration.deploy.tools import install_tools

from .harness import AGENT_CHART, AGENT_NAMESPACE, AGENT_RELEASE, ROOT, camp_pods, hami_devices
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def _expand(rules: list[dict[str, Any]]) -> set[Access]:
    return {(verb, group, resource, name) for rule in rules for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]
            for name in (rule.get("resourceNames") or [""])}


def _chart_roles() -> dict[str, list[dict[str, Any]]]:
    helm = install_tools()["helm"]
    out = subprocess.run([str(helm), "template", AGENT_RELEASE, str(AGENT_CHART), "-n", AGENT_NAMESPACE],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return {d["metadata"]["name"]: d["rules"] for d in yaml.safe_load_all(out)
            if d and d["kind"] == "ClusterRole"}


def test_the_chart_writes_out_required_access_and_nothing_else() -> None:
    roles = _chart_roles()
    assert set(roles) == {f"{AGENT_RELEASE}-camp-agent", WORKLOADS_ROLE}
    assert _expand(roles[f"{AGENT_RELEASE}-camp-agent"]) == set(REQUIRED_ACCESS["cluster"])
    assert _expand(roles[WORKLOADS_ROLE]) == set(REQUIRED_ACCESS["namespace"])


def test_the_docs_table_is_required_access() -> None:
    text = (ROOT / "docs" / "KUBERNETES.md").read_text()
    section = text[text.index("## RBAC Camp needs"):text.index("## Registering a cluster")]
    rows: set[tuple[str, Access]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] not in ("cluster", "namespace"):
            continue
        scope, resource, name, verbs = cells
        found = re.fullmatch(r"([a-z/]+)(?: \(([a-z0-9.]+)\))?", resource)
        assert found, line
        for verb in verbs.split(", "):
            rows.add((scope, (verb, found.group(2) or "", found.group(1), name)))
    assert rows == {(scope, a) for scope, rules in REQUIRED_ACCESS.items() for a in rules}
    # docs/ARCHITECTURE.md points to that table and carries no second copy of the rules.
    assert "kind: ClusterRole" not in (ROOT / "docs" / "ARCHITECTURE.md").read_text()


def _as_camp(kube: Any) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    cfg.host = kube.server.host
    cfg.api_key = {"authorization": f"Bearer {kube.server.agent_token}"}
    cfg.ssl_ca_cert = str(kube.server.base / "run" / "pki" / "ca.crt")
    return k8s.ApiClient(cfg)


def _refused(call: Any, *args: Any, **kwargs: Any) -> bool:
    try:
        call(*args, **kwargs)
    except ApiException as exc:
        return exc.status == 403
    return False


def test_camp_binds_and_runs_pods_in_its_namespace_and_may_write_nowhere_else(
        world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(2))
    kube.node("plain")  # no HAMi: bound with the plain binding, no handshake
    cluster = kube.register(world)
    job = submit(world, cluster, "bound")
    services.cycle_run(cluster=cluster)
    assert services.job_dispatch(job_id=job.pk) == "created", job.reason
    job = wait_running(cluster, job)
    (pod,) = [p for p in camp_pods(kube.core) if p.metadata.labels["camp.io/job-id"] == str(job.pk)]
    assert pod.spec.node_name == "gpu-a"  # bound through pods/binding by the chart's account
    binding = k8s.RbacAuthorizationV1Api(kube.server.client()).read_namespaced_role_binding(
        "camp-agent", job.namespace)
    assert binding.role_ref.name == WORKLOADS_ROLE
    assert [(s.namespace, s.name) for s in binding.subjects] == [(AGENT_NAMESPACE, "camp")]

    core = k8s.CoreV1Api(_as_camp(kube))
    privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
                  "spec": {"serviceAccountName": "default", "hostPID": True, "nodeName": "plain",
                           "containers": [{"name": "c", "image": "busybox",
                                           "securityContext": {"privileged": True},
                                           "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                           "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}
    assert _refused(core.create_namespaced_pod, "kube-system", privileged)
    assert _refused(core.create_namespaced_pod, "default", privileged)
    assert _refused(core.create_namespaced_secret, "default",
                    {"metadata": {"name": "s"}, "stringData": {"k": "v"}})
    assert _refused(core.patch_namespace, "kube-system", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged"}}})
    assert _refused(core.patch_namespace, job.namespace, {"metadata": {"labels": {"x": "y"}}})
    assert _refused(core.list_namespaced_secret, job.namespace)  # Secrets are write-only
    assert _refused(core.delete_node, "gpu-a")
    # Binding a role it does not hold is an escalation RBAC refuses, even in its namespace.
    rbac = k8s.RbacAuthorizationV1Api(_as_camp(kube))
    assert _refused(rbac.create_namespaced_role_binding, job.namespace, {
        "metadata": {"name": "admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "namespace": AGENT_NAMESPACE, "name": "camp"}]})
    assert not kube.core.list_namespaced_pod("kube-system").items


def test_registration_names_what_the_workloads_role_lacks(world: Any, kube: Any) -> None:
    rbac = k8s.RbacAuthorizationV1Api(kube.server.client())
    original = rbac.read_cluster_role(WORKLOADS_ROLE)
    rules = [r for r in original.rules if r.resources != ["pods/binding"]]

    def register() -> Any:
        return client_for(world.admin).post("/api/v1/clusters/", {
            "name": "prod", "backend": "kubernetes", "api_server": kube.server.host,
            **kube.server.credentials}, format="json")

    try:
        rbac.patch_cluster_role(WORKLOADS_ROLE, {"rules": [rbac.api_client.sanitize_for_serialization(r)
                                                           for r in rules]})
        r = register()
        assert r.status_code == 400 and list(r.json()) == ["credentials"], r.content
        assert r.json()["credentials"][0].startswith(
            f"The ClusterRole {WORKLOADS_ROLE} does not grant create pods/binding")
        rbac.delete_cluster_role(WORKLOADS_ROLE)
        r = register()
        assert r.status_code == 400, r.content
        assert f"The ClusterRole {WORKLOADS_ROLE} (Camp's rights inside its namespaces) does not exist" \
            in r.json()["credentials"][0]
    finally:
        try:
            rbac.delete_cluster_role(WORKLOADS_ROLE)
        except ApiException:
            pass
        original.metadata = k8s.V1ObjectMeta(name=WORKLOADS_ROLE, labels=original.metadata.labels,
                                             annotations=original.metadata.annotations)
        rbac.create_cluster_role(original)
    assert register().status_code == 201


def test_an_expired_token_is_named_as_such(world: Any, kube: Any) -> None:
    """A `kubectl create token` token past its --duration: the API server answers 401, and
    what Camp records (a dispatch's or reconcile's reason) says what to do."""
    from scheduling.backends.base import BackendError
    from scheduling.backends.kubernetes import KubernetesBackend

    cfg = k8s.Configuration()
    cfg.host = kube.server.host
    cfg.api_key = {"authorization": "Bearer " + kube.server.agent_token[:-4] + "AAAA"}  # not valid
    cfg.ssl_ca_cert = str(kube.server.base / "run" / "pki" / "ca.crt")
    with pytest.raises(BackendError, match="token is wrong or has expired; register a new one"):
        KubernetesBackend(k8s.ApiClient(cfg), retries=0).list_nodes()


def test_the_job_webhook_is_off_by_default_and_refuses_to_render_half_configured() -> None:
    """The chart's Kueue-style webhook (issue 34): nothing rendered unless enabled; enabled
    without Camp's https URL or installation id, ``helm`` fails naming the value."""
    helm = str(install_tools()["helm"])
    base = [helm, "template", AGENT_RELEASE, str(AGENT_CHART), "-n", AGENT_NAMESPACE]
    out = subprocess.run(base, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "MutatingWebhookConfiguration" not in out
    done = subprocess.run([*base, "--set", "jobWebhook.enabled=true", "--set",
                           "jobWebhook.campUrl=http://camp.example.com"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "jobWebhook.campUrl" in done.stderr
    done = subprocess.run([*base, "--set", "jobWebhook.enabled=true", "--set",
                           "jobWebhook.campUrl=https://camp.example.com"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "jobWebhook.installation" in done.stderr
    out = subprocess.run([*base, "--set", "jobWebhook.enabled=true", "--set",
                          "jobWebhook.campUrl=https://camp.example.com/", "--set",
                          "jobWebhook.installation=i1"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    (config,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "MutatingWebhookConfiguration"]
    hooks = config["webhooks"]
    assert [h["objectSelector"]["matchExpressions"][0]["key"] for h in hooks] == [
        "kueue.x-k8s.io/queue-name", "camp.io/queue-name"]
    for h in hooks:
        assert h["clientConfig"]["url"] == "https://camp.example.com/scheduling/webhooks/batch-jobs"
        assert h["rules"] == [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["jobs"], "scope": "Namespaced"}]
        assert {"key": "camp.io/installation", "operator": "In", "values": ["i1"]} in \
            h["namespaceSelector"]["matchExpressions"]
        assert h["sideEffects"] == "None" and h["failurePolicy"] == "Fail"
