"""The image catalog: reference validation, scopes, and registry credentials that are
encrypted at rest and never shown back (API, audit log)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from registry.models import ExternalRegistry, Image
from registry.references import ReferenceError, parse_reference
from tenants.models import AuditEvent
from tests.conftest import client_for


@pytest.mark.parametrize(
    ("ref", "ok"),
    [
        ("busybox", True),
        ("pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime", True),
        ("quay.io/jupyter/pytorch-notebook:cuda12-2024-10-07", True),
        ("registry.example.com:5000/team/img@sha256:" + "a" * 64, True),
        ("localhost/img:dev", True),
        ("[::1]:5000/img", True),
        ("team/Image", False),
        ("img:bad tag", False),
        ("img:-dash", False),
        ("img@sha256:short", False),
        ("a//b", False),
        ("host:99999/img", False),
        ("", False),
        ("x" * 256, False),
    ],
)
def test_reference_grammar(ref: str, ok: bool) -> None:
    if ok:
        parse_reference(ref)
    else:
        with pytest.raises(ReferenceError):
            parse_reference(ref)


@pytest.mark.django_db
def test_base_images_are_seeded(world: Any) -> None:
    platform = Image.objects.filter(scope="platform")
    assert {i.framework for i in platform.exclude(variant="inference")} == {"pytorch", "tensorflow", "paddle"}
    for fw in ("pytorch", "tensorflow", "paddle"):
        assert {"jupyter", "vscode", "training"} <= {i.variant for i in platform.filter(framework=fw)}
    # Model services' servers (issue 15): vLLM, Triton and TGI.
    servers = platform.filter(variant="inference").values_list("name", flat=True)
    assert set(servers) == {"vllm", "triton", "tgi"}


@pytest.mark.django_db
def test_registry_password_is_write_only(world: Any) -> None:
    owner = client_for(world.a.owner)
    r = owner.post(
        "/api/v1/registries/",
        {
            "tenant": world.a.tenant.pk,
            "name": "ghcr",
            "server": "ghcr.io",
            "username": "bot",
            "password": "ghp_s3cret",
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    assert "password" not in r.json() and r.json()["has_credentials"] is True
    stored = ExternalRegistry.objects.get(name="ghcr")
    assert "ghp_s3cret" not in stored.password_encrypted
    listed = owner.get("/api/v1/registries/").content.decode()
    assert "ghp_s3cret" not in listed and "password_encrypted" not in listed
    events = AuditEvent.objects.filter(action="registry.created")
    assert "ghp_s3cret" not in json.dumps(list(events.values("before", "after")))
    # A member of the tenant's project sees the registry (to pick its images), never the secret.
    seen = client_for(world.a.member).get(f"/api/v1/registries/{stored.pk}/").json()
    assert seen["server"] == "ghcr.io" and "password" not in seen


@pytest.mark.django_db
def test_bad_image_input_names_each_field(world: Any) -> None:
    owner = client_for(world.a.owner)
    r = owner.post(
        "/api/v1/images/",
        {"tenant": world.a.tenant.pk, "name": "Bad Name", "reference": "x y", "variant": "notebook"},
        format="json",
    )
    assert r.status_code == 400 and {"name", "variant"} <= set(r.json())
    r = owner.post(
        "/api/v1/images/",
        {"tenant": world.a.tenant.pk, "name": "ok", "reference": "x y", "variant": "training"},
        format="json",
    )
    assert r.status_code == 400 and "no spaces" in r.json()["reference"][0]
    foreign = owner.post(
        "/api/v1/images/",
        {"tenant": world.b.tenant.pk, "name": "ok", "reference": "x:1", "variant": "training"},
        format="json",
    )
    assert foreign.status_code == 400 and "tenant" in foreign.json()
    no_platform = owner.post(
        "/api/v1/images/",
        {"tenant": world.a.tenant.pk, "name": "ok", "reference": "x:1", "variant": "training",
         "architectures": []},
        format="json",
    )
    assert no_platform.status_code == 400
    assert "at least one platform" in no_platform.json()["architectures"][0]


@pytest.mark.django_db
def test_registry_and_image_creates_honour_idempotency_key(world: Any) -> None:
    from tenants.models import IdempotencyRecord

    owner = client_for(world.a.owner)
    body = {"tenant": world.a.tenant.pk, "name": "ghcr", "server": "ghcr.io", "username": "bot",
            "password": "ghp_s3cret"}
    first = owner.post("/api/v1/registries/", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    replay = owner.post("/api/v1/registries/", body, format="json", HTTP_IDEMPOTENCY_KEY="r-1")
    assert first.status_code == 201 and replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true" and replay.json()["id"] == first.json()["id"]
    assert ExternalRegistry.objects.filter(name="ghcr").count() == 1
    assert "ghp_s3cret" not in json.dumps(IdempotencyRecord.objects.get(key="r-1").response_body)
    image = {"tenant": world.a.tenant.pk, "name": "mine", "reference": "ghcr.io/acme/mine:1",
             "variant": "training"}
    i1 = owner.post("/api/v1/images/", image, format="json", HTTP_IDEMPOTENCY_KEY="i-1")
    i2 = owner.post("/api/v1/images/", image, format="json", HTTP_IDEMPOTENCY_KEY="i-1")
    assert i1.status_code == 201, i1.content
    assert i2.status_code == 201 and i2.json()["id"] == i1.json()["id"]
    assert Image.objects.filter(name="mine").count() == 1
