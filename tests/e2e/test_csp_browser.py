"""The Content-Security-Policy in real Chromium (issue 30, item 9): every role's main pages
and the API docs load with no CSP violation, and what used inline handlers still works (the
dashboard's period picker, the project's delete confirmation, the bars' widths)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import World
from tests.e2e.conftest import login
from tests.e2e.test_portal_browser import populated, portal  # noqa: F401  (portal: the shared world of the portal pages)
from tests.integration.scheduling.conftest import submit
from tests.integration.workspaces.conftest import advance

pytestmark = pytest.mark.django_db(transaction=True)

# Chromium reports each blocked script, style, handler or connection both as a
# `securitypolicyviolation` event and as a console error; collect both.
WATCH = """window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(
  e.effectiveDirective + ' ' + (e.blockedURI || 'inline') + ' ' + (e.sourceFile || '') + ':' + e.lineNumber));
"""


class Violations:
    def __init__(self, page: Any) -> None:
        self.page = page
        self.console: list[str] = []
        page.add_init_script(script=WATCH)
        page.on("console", self._console)

    def _console(self, msg: Any) -> None:
        if "Content Security Policy" in msg.text or "Content-Security-Policy" in msg.text:
            self.console.append(f"{self.page.url}: {msg.text}")

    def visit(self, url: str) -> list[str]:
        response = self.page.goto(url)
        assert response is not None and response.status == 200, (url, response and response.status)
        assert response.headers.get("content-security-policy"), f"{url} has no CSP header"
        self.page.wait_for_load_state("load")
        return [f"{url}: {v}" for v in self.page.evaluate("() => window.__csp || []")]


def test_each_roles_main_pages_load_without_a_csp_violation(world: World, live_server: Any, page: Any,
                                                           portal: Any) -> None:  # noqa: F811
    env, job, svc = populated(world, portal)
    base = live_server.url
    pages = {
        "acme-member": ["/", "/workspaces/environments/", "/workspaces/environments/new/",
                        f"/workspaces/environments/{env.pk}/", "/workspaces/training/",
                        "/workspaces/training/new/", "/scheduling/jobs/", f"/scheduling/jobs/{job.pk}/",
                        "/workspaces/services/", "/workspaces/services/new/",
                        f"/workspaces/services/{svc.pk}/",
                        "/workspaces/profiles/", "/registry/images/", "/scheduling/clusters/",
                        "/tokens/", "/workspaces/ssh-keys/", "/api/docs/"],
        "acme-owner": ["/", "/t/acme/", "/t/acme/p/acme-p1/", "/t/acme/p/acme-p1/quota/", "/audit/",
                       "/t/acme/usage/", "/dashboard/"],
        "root-admin": ["/", "/dashboard/", "/admin/clusters/sim/gpus/", "/admin/clusters/sim/queues/",
                       "/admin/preemptions/", "/admin/tenants/", "/admin/users/", "/workspaces/profiles/new/",
                       "/t/acme/quota/", "/scheduling/clusters/sim/nodes/", "/registry/registries/"],
    }
    watch = Violations(page)
    found: list[str] = []
    found += watch.visit(f"{base}/login/")
    for user, paths in pages.items():
        page.context.clear_cookies()
        login(page, base, user)
        for path in paths:
            found += watch.visit(f"{base}{path}")
            if path == "/api/docs/":
                # Swagger UI ran (its init script is a same-origin file) and read the schema.
                page.wait_for_selector(".swagger-ui .information-container .title", timeout=30000)
                assert "Camp API" in page.inner_text(".swagger-ui .information-container")
                page.wait_for_selector(".opblock-tag", timeout=30000)
                found += [f"{base}{path}: {v}" for v in page.evaluate("() => window.__csp || []")]
    assert not found and not watch.console, "\n".join(found + watch.console)


def test_period_picker_confirm_and_bars_work_under_the_policy(world: World, live_server: Any, page: Any,
                                                            portal: Any) -> None:  # noqa: F811
    submit(world, portal["cluster"], "running-one", group={"gpu_count": 2})
    advance(portal["cluster"])
    base = live_server.url
    watch = Violations(page)
    login(page, base, "root-admin")
    # The dashboard's period picker submits on change (static/forms.js, no onchange=).
    assert not watch.visit(f"{base}/dashboard/")
    current = page.locator("select[name=period]").input_value()
    other = next(v for v in page.locator("select[name=period] option").evaluate_all(
        "os => os.map(o => o.value)") if v != current)
    with page.expect_navigation():
        page.select_option("select[name=period]", other)
    assert f"period={other}" in page.url
    # The GPU map's slice for the running job is as wide as its share of the card (a class,
    # not a style attribute): 2 whole cards, each slice the full width of its bar.
    assert not watch.visit(f"{base}/admin/clusters/sim/gpus/")
    slice_ = page.locator(".gpu-bar .slice", has_text="running-one").first
    ratio = slice_.evaluate(
        "s => s.getBoundingClientRect().width / s.parentElement.getBoundingClientRect().width")
    assert ratio > 0.95
    # The project's quota bar shows what is used within the guarantee: 2 of 4 → half the bar.
    page.context.clear_cookies()
    login(page, base, "acme-owner")
    assert not watch.visit(f"{base}/")
    within = page.locator(".bar .within").first
    assert within.evaluate("s => s.getBoundingClientRect().width") > 0
    # Deleting a project asks first (data-confirm, no onsubmit=); dismissing keeps it.
    assert not watch.visit(f"{base}/t/acme/p/acme-p1/")
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", dismiss)
    page.click("button.danger:has-text('Delete project')")
    assert asked == ["Delete project acme-p1?"]
    assert page.url == f"{base}/t/acme/p/acme-p1/"
    assert world.a.project.__class__.objects.filter(pk=world.a.project.pk).exists()
    assert not watch.console, watch.console
