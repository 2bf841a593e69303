"""The Helm charts lint, render with several value sets, and the real kube-apiserver accepts
every rendered object (server-side dry-run); camp-agent's RBAC grants what the backend needs.

The apiserver is ../shared/tools' kube-apiserver v1.24 (DESIGN.md §6), started on fresh
ports in a fresh directory by the real-apiserver harness (tests/integration/realkube/harness.py)
and stopped in a finaliser.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.realkube.harness import KubeApiserver, unavailable_reason

from .tools import ROOT, install_tools

CHART = ROOT / "deploy" / "helm" / "camp"
AGENT_CHART = ROOT / "deploy" / "helm" / "camp-agent"
BASE_VALUES = ["--set", "secretKey=an-example-secret-key-that-is-long-enough-0123456789",
               "--set", "database.url=postgres://camp:pw@db.example:5432/camp",
               "--set", "redis.url=redis://redis.example:6379/0"]
# Value sets a platform team would use: the defaults; ingress with TLS, two watchers and
# extra secrets; an existing Secret with one replica each and no NetworkPolicy/beat/migrations.
VALUE_SETS: dict[str, list[str]] = {
    "defaults": BASE_VALUES,
    "ingress-watchers": [*BASE_VALUES, "--set", "ingress.enabled=true",
                         "--set", "ingress.className=nginx",
                         "--set", "ingress.tls[0].secretName=camp-tls",
                         "--set", "ingress.tls[0].hosts[0]=camp.example.com",
                         "--set", "watcher.clusters={prod-a100,research}",
                         "--set", "extraSecrets.CAMP_ENCRYPTION_KEY=k",
                         "--set", "env.OIDC_ENABLED=false",
                         "--set", "networkPolicy.egressTo[0].ipBlock.cidr=10.0.0.0/8"],
    # Two database roles (issue 30, item 2): the pods as the app role, the migrations Job as the owner.
    "two-roles": [*BASE_VALUES, "--set", "database.url=postgres://camp_app:apw@db.example:5432/camp",
                  "--set", "database.ownerUrl=postgres://camp:opw@db.example:5432/camp"],
    "existing-secret": ["--set", "existingSecret.name=camp-settings",
                        "--set", "web.replicas=1", "--set", "worker.replicas=1",
                        "--set", "networkPolicy.enabled=false", "--set", "beat.enabled=false",
                        "--set", "migrations.enabled=false"],
    # Issue 33, item 7: a one-command trial (in-chart PostgreSQL and Redis) with an initial admin.
    "evaluation": ["--set", "evaluation.enabled=true", "--set", "initialAdmin.username=platform",
                   "--set", "initialAdmin.password=first-Install-password-7731"],
}


@pytest.fixture(scope="module")
def tools() -> dict[str, Path]:
    return install_tools()


def _run(cmd: list[str | Path], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=180, **kwargs)


def _render(helm: Path, chart: Path, args: list[str], namespace: str = "camp") -> list[dict[str, Any]]:
    result = _run([helm, "template", "r1", chart, "--namespace", namespace, *args])
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def kubeconfig() -> Iterator[Path]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = KubeApiserver.start(prefix="camp-helm-kube-", agent=False)
    try:
        yield server.kubeconfig
    finally:
        server.stop()


def test_charts_lint(tools: dict[str, Path]) -> None:
    for args in VALUE_SETS.values():
        result = _run([tools["helm"], "lint", "--strict", CHART, *args])
        assert result.returncode == 0, result.stdout + result.stderr
    result = _run([tools["helm"], "lint", "--strict", AGENT_CHART])
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_refuses_missing_or_wrong_settings(tools: dict[str, Path]) -> None:
    missing = _run([tools["helm"], "template", "r1", CHART])
    assert missing.returncode != 0 and "secretKey is required" in missing.stderr
    wrong = _run([tools["helm"], "template", "r1", CHART, *BASE_VALUES,
                  "--set", "database.url=mysql://x/camp"])
    assert wrong.returncode != 0 and "/database/url" in wrong.stderr
    bad_cluster = _run([tools["helm"], "template", "r1", CHART, *BASE_VALUES,
                        "--set", "watcher.clusters={Prod_A}"])
    assert bad_cluster.returncode != 0 and "/watcher/clusters/0" in bad_cluster.stderr


def test_default_render_has_every_role_hardened(tools: dict[str, Path]) -> None:
    docs = _render(tools["helm"], CHART, VALUE_SETS["ingress-watchers"])
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    deployments = {d["metadata"]["name"]: d for d in by_kind["Deployment"]}
    # web, worker, one beat, one watcher per cluster
    assert set(deployments) == {"r1-camp-web", "r1-camp-worker", "r1-camp-beat",
                                "r1-camp-watch-prod-a100", "r1-camp-watch-research"}
    assert deployments["r1-camp-beat"]["spec"]["replicas"] == 1
    assert deployments["r1-camp-beat"]["spec"]["strategy"]["type"] == "Recreate"
    watch = deployments["r1-camp-watch-research"]["spec"]["template"]["spec"]["containers"][0]
    assert watch["command"][-2:] == ["--cluster", "research"]
    web = deployments["r1-camp-web"]["spec"]["template"]["spec"]
    container = web["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for deployment in deployments.values():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        c = spec["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        env = {e["name"]: e["value"] for e in c["env"]}
        # Secrets come as files, never as values in the pod spec.
        assert env["SECRET_KEY_FILE"] == "/run/secrets/camp/SECRET_KEY"
        assert env["CAMP_ENCRYPTION_KEY_FILE"] == "/run/secrets/camp/CAMP_ENCRYPTION_KEY"
        assert not any("postgres://" in str(e) for e in c["env"])
    job = next(d for d in by_kind["Job"])
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["migrate", "--noinput"]
    assert {p["metadata"]["name"] for p in by_kind["PodDisruptionBudget"]} == {"r1-camp-web",
                                                                            "r1-camp-worker"}
    assert by_kind["Ingress"][0]["spec"]["tls"][0]["secretName"] == "camp-tls"


def test_two_database_roles_pods_as_the_app_role_migrations_as_the_owner(tools: dict[str, Path]) -> None:
    """Only the migrations Job can read the owner's URL; it migrates, then grants the role the
    pods' DATABASE_URL names (db_app_role); every Deployment mounts the app role's URL only."""
    import base64

    docs = _render(tools["helm"], CHART, VALUE_SETS["two-roles"])
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    owner = secrets["r1-camp-migrate-owner"]
    assert base64.b64decode(owner["data"]["DATABASE_URL"]).decode().startswith("postgres://camp:opw@")
    assert base64.b64decode(secrets["r1-camp"]["data"]["DATABASE_URL"]).decode().startswith(
        "postgres://camp_app:apw@")
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        spec = deployment["spec"]["template"]["spec"]
        assert {v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v} == {"r1-camp"}
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["DATABASE_URL_FILE"] == "/run/secrets/camp/DATABASE_URL"
    job = next(d for d in docs if d["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = [e["name"] for e in container["env"]]
    assert len(env) == len(set(env))
    values = {e["name"]: e["value"] for e in container["env"]}
    assert values["DATABASE_URL_FILE"] == "/run/secrets/camp-owner/DATABASE_URL"
    assert values["APP_DATABASE_URL_FILE"] == "/run/secrets/camp/DATABASE_URL"
    steps = container["command"][-1].split("&&")
    assert "manage.py migrate" in steps[0] and "db_app_role --from-url-env APP_DATABASE_URL" in steps[1]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["owner"] == "/run/secrets/camp-owner"
    assert {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}["owner"] == \
        "r1-camp-migrate-owner"


def test_rendered_objects_are_accepted_by_a_real_apiserver(
    tools: dict[str, Path], kubeconfig: Path, tmp_path: Path
) -> None:
    kubectl = [tools["kubectl"], "--kubeconfig", kubeconfig]
    for index, (name, args) in enumerate(VALUE_SETS.items()):
        namespace = f"camp-{index}"
        assert _run([*kubectl, "create", "namespace", namespace]).returncode == 0
        manifest = tmp_path / f"{name}.yaml"
        docs = _render(tools["helm"], CHART, args, namespace)
        manifest.write_text(yaml.safe_dump_all(docs))
        result = _run([*kubectl, "apply", "--dry-run=server", "-n", namespace, "-f", manifest])
        assert result.returncode == 0, f"{name}: {result.stderr}"
        accepted = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
        assert len(accepted) == len(docs), f"{name}: {result.stdout}"
    agent = tmp_path / "agent.yaml"
    agent_docs = _render(tools["helm"], AGENT_CHART, [], "camp-system")
    agent.write_text(yaml.safe_dump_all(agent_docs))
    assert _run([*kubectl, "create", "namespace", "camp-system"]).returncode == 0
    result = _run([*kubectl, "apply", "--dry-run=server", "-f", agent])
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(agent_docs)


def test_camp_agent_rbac_grants_what_the_backend_needs_and_no_more(
    tools: dict[str, Path], kubeconfig: Path, tmp_path: Path
) -> None:
    kubectl = [tools["kubectl"], "--kubeconfig", kubeconfig]
    agent = tmp_path / "agent.yaml"
    agent.write_text(yaml.safe_dump_all(_render(tools["helm"], AGENT_CHART, [], "camp-agent-ns")))
    _run([*kubectl, "create", "namespace", "camp-agent-ns"])
    applied = _run([*kubectl, "apply", "-f", agent])
    assert applied.returncode == 0, applied.stderr
    who = "system:serviceaccount:camp-agent-ns:camp"

    def can(verb: str, resource: str, namespace: str = "team-a") -> bool:
        resource, _, sub = resource.partition("/")
        extra = ["--subresource", sub] if sub else []
        result = _run([*kubectl, "auth", "can-i", verb, resource, *extra, "-n", namespace, "--as", who])
        return result.stdout.strip() == "yes"

    # Cluster-wide (REQUIRED_ACCESS["cluster"]): reads, the node lock, new namespaces.
    for verb, resource in [("list", "nodes"), ("patch", "nodes"), ("create", "namespaces"),
                           ("watch", "pods"), ("list", "configmaps")]:
        assert can(verb, resource), f"camp-agent cannot {verb} {resource}"
    # Writes only where Camp bound camp-agent-workloads (its own namespaces): none here.
    for verb, resource in [("create", "pods"), ("create", "pods/binding"), ("create", "secrets"),
                           ("patch", "configmaps"), ("create", "resourcequotas"),
                           ("create", "ingresses.networking.k8s.io")]:
        assert not can(verb, resource), f"camp-agent may {verb} {resource} in any namespace"
        assert not can(verb, resource, "kube-system"), f"camp-agent may {verb} {resource} in kube-system"
    # Never: read Secrets (other people's credentials), delete nodes or namespaces, relabel a
    # namespace (Pod Security), escalate.
    for verb, resource in [("get", "secrets"), ("list", "secrets"), ("delete", "nodes"),
                           ("delete", "namespaces"), ("patch", "namespaces"),
                           ("create", "clusterrolebindings"), ("create", "pods/exec"),
                           ("update", "pods/status")]:
        assert not can(verb, resource), f"camp-agent may {verb} {resource}"


def test_day2_values_render_where_an_operator_expects_them(tools: dict[str, Path]) -> None:
    """Issue 33, findings 4, 6 and 7: scrape annotations and an optional ServiceMonitor,
    extra env/volumes/annotations/priority/spread on every role, beat and watchers placeable,
    a `helm test` pod, NOTES, and a migrations deadline inside helm's default --timeout."""
    assert not [d for d in _render(tools["helm"], CHART, BASE_VALUES) if d["kind"] == "ServiceMonitor"]
    docs = _render(tools["helm"], CHART, [
        *BASE_VALUES, "--set", "watcher.clusters={prod}",
        "--set", "metrics.scrapeAnnotations=true", "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.tokenSecret.name=camp-metrics",
        "--set", "extraEnv[0].name=HTTPS_PROXY", "--set", "extraEnv[0].value=http://proxy:3128",
        "--set", "extraVolumes[0].name=ca", "--set", "extraVolumes[0].configMap.name=corp-ca",
        "--set", "extraVolumeMounts[0].name=ca", "--set", "extraVolumeMounts[0].mountPath=/etc/ca",
        "--set", "podAnnotations.team=gpu", "--set", "priorityClassName=camp-critical",
        "--set", "beat.nodeSelector.pool=system", "--set", "watcher.tolerations[0].operator=Exists",
        "--set", "web.topologySpreadConstraints[0].maxSkew=1",
        "--set", "web.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "--set", "web.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway"])
    deployments = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d
                   for d in docs if d["kind"] == "Deployment"}
    for role, deployment in deployments.items():
        pod = deployment["spec"]["template"]
        spec = pod["spec"]
        assert pod["metadata"]["annotations"]["team"] == "gpu", role
        assert spec["priorityClassName"] == "camp-critical", role
        container = spec["containers"][0]
        assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in container["env"], role
        assert {"name": "ca", "mountPath": "/etc/ca"} in container["volumeMounts"], role
        assert {"name": "ca", "configMap": {"name": "corp-ca"}} in spec["volumes"], role
        assert ("prometheus.io/scrape" in pod["metadata"]["annotations"]) == (role == "web"), role
    assert deployments["beat"]["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "system"}
    assert deployments["watcher"]["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert deployments["web"]["spec"]["template"]["spec"]["topologySpreadConstraints"][0]["maxSkew"] == 1
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["bearerTokenSecret"] == {"name": "camp-metrics",
                                                                    "key": "METRICS_TOKEN"}
    (test_pod,) = [d for d in docs if d["kind"] == "Pod"]
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["containers"][0]["command"][-1] == "http://r1-camp:80/readyz"
    job = next(d for d in docs if d["kind"] == "Job")
    assert job["spec"]["activeDeadlineSeconds"] < 300  # helm's default --timeout is 5m
    # An existingSecret's content is in the pods' checksum, so a changed Secret rolls them.
    existing = _render(tools["helm"], CHART, VALUE_SETS["existing-secret"])
    web = next(d for d in existing if d["kind"] == "Deployment")
    assert "checksum/secret" in web["spec"]["template"]["metadata"]["annotations"]
    notes = _run([tools["helm"], "install", "r1", CHART, *BASE_VALUES, "--dry-run=client",
                  "--namespace", "camp"])
    assert notes.returncode == 0, notes.stderr
    assert "python manage.py doctor" in notes.stdout and "helm test r1" in notes.stdout


def test_a_changed_existing_secret_rolls_the_pods(
    tools: dict[str, Path], kubeconfig: Path
) -> None:
    """Issue 33, finding 6: the pods' checksum follows your Secret's content (helm reads it from
    the real apiserver at upgrade), so changing it and upgrading rolls every pod."""
    kubectl = [tools["kubectl"], "--kubeconfig", kubeconfig]
    assert _run([*kubectl, "create", "namespace", "camp-roll"]).returncode == 0

    def checksum() -> str:
        result = _run([tools["helm"], "template", "r1", CHART, "--namespace", "camp-roll",
                       "--kubeconfig", kubeconfig, "--dry-run=server",
                       *VALUE_SETS["existing-secret"]])
        assert result.returncode == 0, result.stderr
        web = next(d for d in yaml.safe_load_all(result.stdout)
                   if d and d["kind"] == "Deployment" and d["metadata"]["name"] == "r1-camp-web")
        return str(web["spec"]["template"]["metadata"]["annotations"]["checksum/secret"])

    def secret(key: str) -> None:
        result = _run([*kubectl, "-n", "camp-roll", "create", "secret", "generic", "camp-settings",
                       f"--from-literal=SECRET_KEY={key}", "--dry-run=client", "-o", "yaml"])
        assert result.returncode == 0, result.stderr
        applied = _run([*kubectl, "-n", "camp-roll", "apply", "-f", "-"], input=result.stdout)
        assert applied.returncode == 0, applied.stderr

    secret("first-key-" + "a" * 50)
    first = checksum()
    assert checksum() == first  # unchanged Secret: no roll
    secret("second-key-" + "b" * 50)
    assert checksum() != first


def _by_name(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_evaluation_mode_runs_its_own_databases_and_says_it_is_not_for_production(
    tools: dict[str, Path]
) -> None:
    """Issue 33, item 7: `--set evaluation.enabled=true` alone is a whole install: an in-chart
    PostgreSQL and Redis (a PVC each, hardened pods), generated secrets Camp's URLs agree with,
    migrations that wait for the database instead of a pre-install hook, and the warnings."""
    docs = _render(tools["helm"], CHART, ["--set", "evaluation.enabled=true"])
    sets = _by_name(docs, "StatefulSet")
    assert set(sets) == {"r1-camp-postgresql", "r1-camp-redis"}
    for sts in sets.values():
        spec = sts["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        container = spec["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert container["readinessProbe"] and container["livenessProbe"]
        assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    secrets = _by_name(docs, "Secret")
    generated = secrets["r1-camp-evaluation"]
    assert generated["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    password = base64.b64decode(generated["data"]["password"]).decode()
    assert len(password) >= 32
    camp = {k: base64.b64decode(v).decode() for k, v in secrets["r1-camp"]["data"].items()}
    assert camp["DATABASE_URL"] == f"postgres://camp:{password}@r1-camp-postgresql:5432/camp"
    assert camp["REDIS_URL"] == f"redis://:{password}@r1-camp-redis:6379/0"
    assert f"requirepass {password}" in base64.b64decode(generated["data"]["redis.conf"]).decode()
    assert camp["SECRET_KEY"] == base64.b64decode(generated["data"]["secretKey"]).decode()
    # The migrate hook's own copy of the settings agrees with the release's.
    assert secrets["r1-camp-migrate"]["data"] == secrets["r1-camp"]["data"]
    # No secret in the database pods' environment: PostgreSQL reads a file, Redis a config file.
    postgres = sets["r1-camp-postgresql"]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "POSTGRES_PASSWORD_FILE", "value": "/run/secrets/evaluation/password"} in postgres["env"]
    assert password not in yaml.safe_dump(sets)
    # Migrations cannot run before the in-chart database exists: a release Job (one per
    # revision), retried while it starts; not a pre-install hook.
    (job,) = _by_name(docs, "Job").values()
    assert job["metadata"]["name"] == "r1-camp-migrate-1"
    assert "helm.sh/hook" not in (job["metadata"].get("annotations") or {})
    assert job["spec"]["backoffLimit"] >= 10
    assert _by_name(docs, "ConfigMap")["r1-camp"]["data"]["CAMP_EVALUATION"] == "true"
    # Only this release's pods reach the databases.
    policies = _by_name(docs, "NetworkPolicy")
    assert policies["r1-camp-postgresql"]["spec"]["ingress"][0]["ports"] == [{"port": 5432}]
    notes = _run([tools["helm"], "install", "r1", CHART, "--set", "evaluation.enabled=true",
                  "--dry-run=client", "--namespace", "camp"])
    assert notes.returncode == 0, notes.stderr
    assert "EVALUATION MODE" in notes.stdout and "NOT FOR PRODUCTION" in notes.stdout
    # Without evaluation mode nothing of it renders (the production shape: external databases).
    plain = _render(tools["helm"], CHART, BASE_VALUES)
    assert not _by_name(plain, "StatefulSet") and "r1-camp-evaluation" not in _by_name(plain, "Secret")
    assert "CAMP_EVALUATION" not in _by_name(plain, "ConfigMap")["r1-camp"]["data"]


def test_initial_admin_values_run_initial_admin_after_migrate_with_the_password_as_a_file(
    tools: dict[str, Path]
) -> None:
    """Issue 33, item 7: initialAdmin.* makes the migrations Job run `initial_admin` after
    `migrate` (an init container first), the password mounted from a Secret, never in env."""
    default_job = next(d for d in _render(tools["helm"], CHART, BASE_VALUES) if d["kind"] == "Job")
    assert "initContainers" not in default_job["spec"]["template"]["spec"]

    docs = _render(tools["helm"], CHART, [*BASE_VALUES, "--set", "initialAdmin.username=platform",
                                          "--set", "initialAdmin.email=ops@example.com",
                                          "--set", "initialAdmin.password=first-Install-password-7731"])
    job = next(d for d in docs if d["kind"] == "Job")
    spec = job["spec"]["template"]["spec"]
    assert spec["initContainers"][0]["command"][-2:] == ["migrate", "--noinput"]
    (admin,) = spec["containers"]
    assert admin["command"] == ["python", "manage.py", "initial_admin"]
    env = {e["name"]: e.get("value") for e in admin["env"]}
    assert env["CAMP_ADMIN_USERNAME"] == "platform" and env["CAMP_ADMIN_EMAIL"] == "ops@example.com"
    assert env["CAMP_ADMIN_PASSWORD_FILE"] == "/run/secrets/camp-admin/password"
    assert "first-Install" not in yaml.safe_dump(job)
    hook_secret = _by_name(docs, "Secret")["r1-camp-admin"]
    assert base64.b64decode(hook_secret["data"]["password"]).decode() == "first-Install-password-7731"
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == \
        "before-hook-creation,hook-succeeded"
    admin_volume = {"name": "admin", "secret": {"secretName": "r1-camp-admin", "defaultMode": 0o440}}
    assert admin_volume in spec["volumes"]

    # A Secret you manage: username and password both read from it, the chart makes none.
    docs = _render(tools["helm"], CHART, [*BASE_VALUES, "--set", "initialAdmin.existingSecret=camp-admin",
                                          "--set", "initialAdmin.passwordKey=pw"])
    assert "r1-camp-admin" not in _by_name(docs, "Secret")
    spec = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["CAMP_ADMIN_USERNAME_FILE"] == "/run/secrets/camp-admin/username"
    assert env["CAMP_ADMIN_PASSWORD_FILE"] == "/run/secrets/camp-admin/pw"
    assert {"name": "admin", "secret": {"secretName": "camp-admin", "defaultMode": 0o440}} in spec["volumes"]

    missing = _run([tools["helm"], "template", "r1", CHART, *BASE_VALUES,
                    "--set", "initialAdmin.username=platform"])
    assert missing.returncode != 0 and "initialAdmin.password is required" in missing.stderr


def test_every_pod_meets_pod_security_restricted_on_a_real_apiserver(
    tools: dict[str, Path], kubeconfig: Path, tmp_path: Path
) -> None:
    """The default and evaluation renders in a namespace enforcing (and warning on) Pod Security
    "restricted": the apiserver's admission accepts them without a single warning, the
    in-chart PostgreSQL and Redis included."""
    kubectl = [tools["kubectl"], "--kubeconfig", kubeconfig]
    for name in ("defaults", "evaluation"):
        namespace = f"camp-restricted-{name}"
        assert _run([*kubectl, "create", "namespace", namespace]).returncode == 0
        labelled = _run([*kubectl, "label", "namespace", namespace,
                         "pod-security.kubernetes.io/enforce=restricted",
                         "pod-security.kubernetes.io/warn=restricted"])
        assert labelled.returncode == 0, labelled.stderr
        docs = _render(tools["helm"], CHART, VALUE_SETS[name], namespace)
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(yaml.safe_dump_all(docs))
        result = _run([*kubectl, "apply", "--dry-run=server", "-n", namespace, "-f", manifest])
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert "violate PodSecurity" not in result.stderr and "Warning" not in result.stderr, result.stderr
        assert result.stdout.count("(server dry run)") == len(docs)
