"""A notebook on the real node (issue 28): launched through Camp's API, a real JupyterLab
container starts on the real kubelet, Camp calls it running only once its readiness probe
passes (finding 8), it is opened through the access path docs/WORKLOADS.md promises
(ingress-nginx's external auth, played by Debian's nginx with ``auth_request``, asking Camp's
auth hook before every request), a spent, expired or colleague's link is refused, files land
on the home volume the cluster mounted, and idle culling reads Jupyter's own activity."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import requests
from django.utils import timezone

from scheduling.selectors import project_namespace_name
from tests.conftest import client_for
from workspaces.models import DevEnvironment
from workspaces.services import culling

from .ingress import IngressNginx
from .node import wait

pytestmark = pytest.mark.django_db(transaction=True)


def _pod(core: Any, ns: str, env_id: int) -> Any:
    pods = core.list_namespaced_pod(ns, label_selector=f"camp.io/workspace={env_id}").items
    return pods[0] if pods else None


def _ready(pod: Any) -> bool:
    return pod is not None and any(c.type == "Ready" and c.status == "True"
                                   for c in (pod.status.conditions or []))


def _session_cookie(user: Any) -> str:
    from django.test import Client

    c = Client()
    c.force_login(user)
    return str(c.cookies["sessionid"].value)


def test_a_notebook_runs_real_jupyterlab_behind_the_auth_hook(camp_node: Any, world: Any) -> None:
    node = camp_node.node
    (home,) = node.add_volumes(1)
    member = world.a.member
    api = client_for(member)
    r = api.post("/api/v1/environments/", {
        "name": "nb", "project": world.a.project.pk, "cluster": "node", "kind": "jupyter",
        "image_reference": node.image("jupyter"), "gpu_count": 0, "cpu_millicores": 500, "ram_mib": 1024,
        "home_gib": 1}, format="json")
    assert r.status_code == 201, r.content
    env_id, link = r.json()["id"], r.json()["access_url"]
    env = DevEnvironment.objects.get(pk=env_id)
    ns = project_namespace_name(cluster=camp_node.cluster, project=world.a.project)

    # Running is what Jupyter answering means: whenever Camp says running, the pod is Ready.
    def running() -> bool:
        state = api.get(f"/api/v1/environments/{env_id}/").json()["state"]
        if state == "running":
            assert _ready(_pod(node.core, ns, env_id)), "Camp said running before Jupyter answered"
            return True
        assert state in ("queued", "starting"), api.get(f"/api/v1/environments/{env_id}/").json()
        return False

    wait(running, "the notebook to run", timeout=300)
    pod = _pod(node.core, ns, env_id)
    probe = pod.spec.containers[0].readiness_probe
    assert probe.http_get.path == f"/ws/{env.slug}/api"

    # The Ingress Camp made: its auth hook, path and Service, served by an nginx doing what
    # ingress-nginx does with those annotations.
    ing = node.kubectl_run("-n", ns, "get", "ingress", env.service_name, "-o", "json")
    ingress = json.loads(ing)
    annotations = ingress["metadata"]["annotations"]
    auth_url = annotations["nginx.ingress.kubernetes.io/auth-url"]
    assert auth_url.startswith(camp_node.camp_url)
    path = ingress["spec"]["rules"][0]["http"]["paths"][0]["path"]
    svc = node.core.read_namespaced_service(env.service_name, ns)
    upstream = f"{svc.spec.cluster_ip}:{svc.spec.ports[0].port}"
    with IngressNginx(path=path, auth_url=auth_url, camp_host=camp_node.camp_url.split("//", 1)[1],
                      upstream=upstream) as ingress_nginx:
        url = ingress_nginx.url + link.split(".local", 1)[1]  # the link's path and token
        first = requests.get(url, timeout=30)
        assert first.status_code == 200, (first.status_code, ingress_nginx.log())
        assert "JupyterLab" in first.text
        cookie = first.cookies.get(f"camp_ws_{env_id}") or requests.utils.dict_from_cookiejar(
            first.history[0].cookies if first.history else first.cookies).get(f"camp_ws_{env_id}")
        assert cookie, first.headers
        # a spent link opens nothing; the cookie it bought does
        assert requests.get(url, timeout=30, allow_redirects=False).status_code == 401
        base = f"{ingress_nginx.url}{path}"
        jar = {f"camp_ws_{env_id}": cookie}
        contents = requests.get(f"{base}api/contents", cookies=jar, timeout=30)
        assert contents.status_code == 200, contents.text
        # a notebook saved through Jupyter lands on the home volume the cluster mounted
        xsrf = (first.cookies.get("_xsrf")
                or requests.get(f"{base}lab", cookies=jar, timeout=30).cookies.get("_xsrf"))
        saved = requests.put(f"{base}api/contents/hello.ipynb", cookies={**jar, "_xsrf": xsrf or ""},
                             headers={"X-XSRFToken": xsrf or ""}, timeout=30,
                             json={"type": "notebook", "content": {"cells": [], "metadata": {},
                                                                   "nbformat": 4, "nbformat_minor": 5}})
        assert saved.status_code in (200, 201), saved.text
        assert (home / "hello.ipynb").exists()
        # a colleague in the same project, signed in to the portal, is refused
        colleague = {"sessionid": _session_cookie(world.a.project_admin)}
        assert requests.get(f"{base}api/contents", cookies=colleague, timeout=30).status_code == 401
        assert client_for(world.a.project_admin).post(
            f"/api/v1/environments/{env_id}/open/", format="json").status_code in (403, 404)

        # Idle culling asks Jupyter: the idle clock Camp last saw is hours old, but the
        # server's own /api/status saw our requests just now, so nothing is warned.
        long_ago = timezone.now() - dt.timedelta(hours=3)
        DevEnvironment.objects.filter(pk=env_id).update(last_activity_at=long_ago)
        env.job.__class__.objects.filter(pk=env.job_id).update(started_at=long_ago)
        result = culling.environments_cull()
        assert env_id not in result["warned"] and env_id not in result["culled"]
        env.refresh_from_db()
        assert env.last_activity_at is not None and env.last_activity_at > long_ago + dt.timedelta(hours=2)
        assert not env.cull_warning

        # an expired link (issued longer ago than the link TTL) is refused
        fresh = api.post(f"/api/v1/environments/{env_id}/open/", format="json")
        assert fresh.status_code == 200, fresh.content
        fresh_url = ingress_nginx.url + fresh.json()["url"].split(".local", 1)[1]
        DevEnvironment.objects.filter(pk=env_id).update(
            access_token_issued_at=timezone.now() - dt.timedelta(days=2))
        assert requests.get(fresh_url, timeout=30, allow_redirects=False).status_code == 401
        # the old cookie died with the new link's nonce
        assert requests.get(f"{base}api/contents", cookies=jar, timeout=30).status_code == 401
