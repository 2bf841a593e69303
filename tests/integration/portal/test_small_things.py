"""Issue 32, finding 10's small ones: a favicon (no 404 on every page), a skip link, and the
API docs' schema built once per process instead of per request."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.test import Client

pytestmark = pytest.mark.django_db


def test_favicon_is_served_not_404(world: Any) -> None:
    r = Client().get("/favicon.ico")
    assert r.status_code == 301 and r["Location"] == "/static/favicon.svg"
    assert finders.find("favicon.svg")
    c = Client()
    c.force_login(world.a.member)
    assert '<link rel="icon" href="/static/favicon.svg"' in c.get("/").content.decode()


def test_every_page_starts_with_a_skip_link_to_the_main_content(world: Any) -> None:
    c = Client()
    c.force_login(world.a.member)
    page = c.get("/").content.decode()
    body = page[page.index("<body"):]
    assert body.index('<a class="skip-link" href="#main">Skip to content</a>') < body.index("<header")
    assert '<main id="main" tabindex="-1">' in page


def test_the_api_schema_is_built_once_per_process(world: Any) -> None:
    from camp import schema

    schema._built.clear()
    c = Client()
    assert c.get("/api/schema/").status_code == 401  # signed-in readers only (API_SCHEMA_PUBLIC)
    assert schema.schema_built_count() == 0  # refused before anything is built
    c.force_login(world.a.member)
    t0 = time.perf_counter()
    first = c.get("/api/schema/")
    cold = time.perf_counter() - t0
    assert first.status_code == 200 and schema.schema_built_count() == 1
    t0 = time.perf_counter()
    again = c.get("/api/schema/")
    warm = time.perf_counter() - t0
    assert again.status_code == 200 and again.content == first.content
    assert schema.schema_built_count() == 1  # answered from memory, not built again
    print(f"schema cold {cold:.2f} s, warm {warm:.2f} s")
    assert b"/api/v1/quotas/" in again.content


def test_memory_reads_in_gib_with_thousands_separators() -> None:
    from portal.templatetags.portal_tags import mib

    assert mib(1966080.0) == "1,920 GiB"  # was "1966080.0"
    assert mib(2554) == "2.5 GiB" and mib(20480) == "20 GiB" and mib(512) == "512 MiB"
    assert mib(None) == ""


def test_presets_are_called_presets_wherever_a_user_reads_them(world: Any) -> None:
    c = Client()
    c.force_login(world.a.member)
    for url in ("/", "/workspaces/environments/"):
        page = c.get(url).content.decode()
        assert ">Profiles</a>" not in page and ">Presets</a>" in page, url
