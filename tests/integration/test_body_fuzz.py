"""Hostile request bodies on every write endpoint answer 4xx, never 5xx (issue 30, item 7):
nesting depth, size, and wrong types, as a platform admin and with a read-only token."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from camp.api_urls import router
from tenants import services as tenant_services
from tests.conftest import World, client_for

pytestmark = pytest.mark.django_db

DEEP = "[" * 1000 + "]" * 1000
DEEP_OBJECT = '{"a":' * 1000 + "1" + "}" * 1000
BODIES: list[str] = [
    DEEP, DEEP_OBJECT, json.dumps({"name": DEEP_OBJECT}), '{"name": ' + DEEP + "}",
    json.dumps({"name": "x" * 200_000}), "[]", '"text"', "12", "null", "{",
    json.dumps({"name": ["a"], "project": {"x": 1}, "cluster": [1, 2], "groups": "x",
                "env": ["A"], "replicas": 1e308, "jobs": {"a": 1}}),
    json.dumps({"name": "n", "groups": [{"replicas": "many", "env": {"A": {"b": 1}}}], "jobs": [1, None]}),
]


def _collections() -> list[str]:
    paths = [f"/api/v1/{prefix}/" for prefix, _, _ in router.registry]
    return paths + ["/api/v1/jobs/bulk/"]


def _clients(world: World) -> list[Any]:
    _, read_only = tenant_services.token_create(actor=world.a.member, name="ro", read_only=True)
    ro = APIClient()
    ro.credentials(HTTP_AUTHORIZATION=f"Bearer {read_only}")
    return [client_for(world.admin), client_for(world.a.member), ro]


def test_no_body_makes_a_write_endpoint_fail_with_5xx(world: World) -> None:
    failures = []
    for client in _clients(world):
        for path in _collections():
            for body in BODIES:
                r = client.generic("POST", path, body, content_type="application/json")
                if r.status_code >= 500:
                    failures.append((path, body[:40], r.status_code))
    assert not failures, failures


def test_deep_json_is_a_400_at_the_parser(world: World) -> None:
    r = client_for(world.a.member).generic("POST", "/api/v1/projects/", DEEP_OBJECT,
                                           content_type="application/json")
    assert r.status_code == 400 and "nested deeper" in r.content.decode()


def test_a_date_past_the_calendar_is_a_400_not_a_500(world: World) -> None:
    client = client_for(world.a.owner)
    for query in ("?until=9999-12-31", "?since=9999-12-31&until=9999-12-31",
                  "?until=9999-12-31&format=csv", "?since=0001-01-01"):
        r = client.get(f"/t/{world.a.tenant.name}/usage/{query}")
        assert r.status_code < 500, (query, r.status_code)
