"""Calling a model service from outside the cluster (issue 32, finding 7): its Ingress lets a
call through only with the service's own API key (made by whoever may change the service,
shown once, kept as a hash, audited without the key), and the service page, the API and
the CLI give the external endpoint and copyable calls."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from registry.models import Image
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.conftest import client_for
from workspaces.models import ModelService
from workspaces.services.serving import ingress_manifest

pytestmark = pytest.mark.django_db
URL = "/api/v1/services/"


def _made(world: Any, **kw: Any) -> dict[str, Any]:
    body = {"name": "chat", "project": world.a.project.pk, "cluster": "sim",
            "image": Image.objects.get(name="vllm").pk, "model_source": "hf://Qwen/Qwen2.5-7B-Instruct",
            "gpu_memory_mib": 20480, "gpu_cores_percent": 30, "ram_mib": 8192,
            "ingress_host": "chat.example.com", **kw}
    made = client_for(world.a.member).post(URL, body, format="json")
    assert made.status_code == 201, made.content
    return dict(made.json())


def _call(pk: int, **headers: str) -> int:
    """What ingress-nginx asks Camp before passing a call on (its auth-url)."""
    return Client().get(f"/workspaces/services/{pk}/auth/", **headers).status_code


def test_only_the_current_key_passes_the_ingress(world: Any, sim_cluster: Any) -> None:
    svc = _made(world)
    assert svc["external_endpoint"] == "http://chat.example.com/" and svc["api_key_set"] is False
    manifest = ingress_manifest(ModelService.objects.get(pk=svc["id"]))
    assert manifest["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-url"].endswith(
        f"/workspaces/services/{svc['id']}/auth/")
    assert _call(svc["id"]) == 401  # no key made yet: nothing passes
    member = client_for(world.a.member)
    first = member.post(f"{URL}{svc['id']}/api-key/")
    assert first.status_code == 200 and first["Cache-Control"] == "no-store"
    key = first.json()["api_key"]
    assert key.startswith("cms_") and first.json()["external_endpoint"] == "http://chat.example.com/"
    assert _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {key}") == 200
    assert _call(svc["id"], HTTP_X_API_KEY=key) == 200
    assert _call(svc["id"], HTTP_AUTHORIZATION="Bearer cms_guess") == 401
    assert _call(svc["id"] + 1000, HTTP_AUTHORIZATION=f"Bearer {key}") == 401
    # A Camp API token is not a service key (the server behind the Ingress sees what callers send).
    _, camp_token = tenant_services.token_create(actor=world.a.member, name="t")
    assert _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {camp_token}") == 401
    second = member.post(f"{URL}{svc['id']}/api-key/").json()["api_key"]
    assert _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {key}") == 401  # replaced at once
    assert _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {second}") == 200
    stored = ModelService.objects.get(pk=svc["id"])
    assert second not in stored.api_key_hash and member.get(f"{URL}{svc['id']}/").json()["api_key_set"]
    events = AuditEvent.objects.filter(action="service.api_key_rotated", target_id=str(svc["id"]))
    assert events.count() == 2 and all(e.actor_id == world.a.member.pk for e in events)
    assert not any(k in str(e.before) + str(e.after) for e in events for k in (key, second))


def test_who_may_make_a_key(world: Any, sim_cluster: Any) -> None:
    svc = _made(world)
    # The project admin may change the member's service; a plain colleague may only look;
    # another tenant does not see it.
    assert client_for(world.a.project_admin).post(f"{URL}{svc['id']}/api-key/").status_code == 200
    other = _made(world, name="other", ingress_host="")
    no_ingress = client_for(world.a.member).post(f"{URL}{other['id']}/api-key/")
    assert no_ingress.status_code == 400 and "ingress_host" in no_ingress.json()
    assert client_for(world.b.owner).post(f"{URL}{svc['id']}/api-key/").status_code == 404


def test_the_service_page_shows_the_key_once_and_how_to_call(world: Any, sim_cluster: Any) -> None:
    svc = _made(world)
    page = Client()
    page.force_login(world.a.member)
    before = page.get(f"/workspaces/services/{svc['id']}/").content.decode()
    assert "http://chat.example.com/" in before and "every call through the Ingress is refused" in before
    assert "v1/chat/completions" in before and "from openai import OpenAI" in before  # vLLM
    assert "simulated: the demo&#x27;s daily curve" in before or "simulated: the demo's daily curve" in before
    made = page.post(f"/workspaces/services/{svc['id']}/api-key/")
    assert made.status_code == 200 and made["Cache-Control"] == "no-store"
    shown = made.content.decode()
    key = shown.split('id="api-key" value="')[1].split('"')[0]
    assert key.startswith("cms_") and _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {key}") == 200
    again = page.get(f"/workspaces/services/{svc['id']}/").content.decode()
    assert key not in again and "Replace the API key" in again


def test_camp_serve_api_key(world: Any, sim_cluster: Any, live_server: Any, tmp_path: Any) -> None:
    svc = _made(world)
    _, token = tenant_services.token_create(actor=world.a.member, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    out = subprocess.run([sys.executable, "-m", "camp_cli", "serve", "api-key", "chat"], env=env,
                         cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    key = out.stdout.strip()  # alone on stdout: export CAMP_SERVICE_KEY=$(camp serve api-key chat)
    assert key.startswith("cms_") and "http://chat.example.com/" in out.stderr
    assert _call(svc["id"], HTTP_AUTHORIZATION=f"Bearer {key}") == 200
