"""Content-Security-Policy (issue 30, item 9): every response carries it, it allows no inline
script or style, and no template has what such a policy would block (an inline <script>,
an on*= handler, a style attribute or element). The browser proof is tests/e2e/test_csp_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.test import Client

from tests.conftest import World

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I), "inline <script>"),
    (re.compile(r"\son[a-z]+\s*=", re.I), "on*= handler"),
    (re.compile(r"\sstyle\s*=", re.I), "style attribute"),
    (re.compile(r"<style[\s>]", re.I), "<style> element"),
    (re.compile(r"javascript:", re.I), "javascript: URL"),
]


def test_every_page_has_a_policy_without_unsafe_inline(world: World) -> None:
    client = Client()
    # (the probes /healthz and /readyz answer JSON before any middleware: camp/health.py)
    assert "script-src 'self'" in client.get("/login/").headers["Content-Security-Policy"]
    client.force_login(world.a.member)
    for path in ("/", "/scheduling/jobs/", "/api/docs/", "/api/v1/jobs/"):
        policy = client.get(path).headers["Content-Security-Policy"]
        directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
        assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'", policy
        assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
        assert "unsafe" not in policy


def test_no_template_has_what_the_policy_blocks() -> None:
    templates = [p for p in (ROOT / "templates").rglob("*.html")]
    assert len(templates) > 40
    found = [f"{p.relative_to(ROOT)}: {what}" for p in templates
             for pattern, what in INLINE if pattern.search(p.read_text())]
    assert not found, "\n".join(found)
