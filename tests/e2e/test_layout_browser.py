"""Where things sit on the screen (issue 32, finding 10), measured by bounding boxes in real
Chromium: on a phone (390 px) a notebook's Open, Stop and Logs are on screen and the nav does
not fill the first screen; on a laptop (1280 px) the nav is one line, its less used links in
"More" and "Admin" menus that open without a script."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import World
from tests.e2e.conftest import login, shot
from tests.e2e.test_portal_browser import portal  # noqa: F401 (fixture)
from tests.integration.workspaces.conftest import advance
from workspaces import services as workspace_services

pytestmark = pytest.mark.django_db(transaction=True)

# The boxes of the top bar's items: the brand, the switcher, each nav link and menu, logout.
BAR_ITEMS = """() => [...document.querySelectorAll(
    'header.topbar > .brand, header.topbar > nav.switcher summary, header.topbar nav.links > a,'
    + ' header.topbar nav.links > details > summary, header.topbar form.logout button')]
  .map(e => { const r = e.getBoundingClientRect();
              return {text: e.textContent.trim(), top: r.top, left: r.left, right: r.right}; })"""


def _on_screen(page: Any, locator: Any) -> bool:
    """Inside the viewport and not covered: the click would land on it."""
    box = locator.bounding_box()
    view = page.viewport_size
    if not box or box["x"] < 0 or box["x"] + box["width"] > view["width"]:
        return False
    if box["y"] < 0 or box["y"] + box["height"] > view["height"]:
        return False
    return bool(locator.evaluate(
        "e => { const r = e.getBoundingClientRect();"
        " const hit = document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2);"
        " return hit === e || e.contains(hit); }"))


def test_phone_shows_open_stop_logs_and_a_short_nav(world: World, live_server: Any, browser: Any,
                                                   portal: Any) -> None:  # noqa: F811
    env, _ = workspace_services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=portal["cluster"], name="nb",
        kind="jupyter", profile=portal["quarter"])
    advance(portal["cluster"])
    env.refresh_from_db()
    assert env.state == "running"
    context = browser.new_context(viewport={"width": 390, "height": 844})
    page = context.new_page()
    page.set_default_timeout(15000)
    base = live_server.url
    try:
        login(page, base, "acme-member")
        header = page.locator("header.topbar").bounding_box()
        assert header and header["height"] < 844 / 3, header  # the nav leaves the screen to the page
        heading = page.locator("#home-mine").bounding_box()
        assert heading and heading["y"] < 844 / 2  # "My workloads" on the first screen
        row = page.locator("table.workloads tbody tr", has_text="nb")
        row.scroll_into_view_if_needed()
        for name in ("Open", "Stop", "Logs"):
            action = row.locator(f"td.row-actions :text-is('{name}')").first
            assert _on_screen(page, action), f"{name} is not on screen: {action.bounding_box()}"
        shot(page, "home-phone")
        # the notebook's own page: its Open button on screen too
        page.goto(f"{base}/workspaces/environments/{env.pk}/")
        open_button = page.locator("main form[action$='/open/'] button")
        open_button.scroll_into_view_if_needed()
        assert _on_screen(page, open_button)
    finally:
        context.close()


@pytest.mark.parametrize("user", ["acme-member", "acme-owner", "root-admin"])
def test_laptop_nav_is_one_line_with_menus_that_open_without_script(
        world: World, live_server: Any, browser: Any, portal: Any, user: str) -> None:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 860}, java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(15000)
    base = live_server.url
    try:
        login(page, base, user)
        items = page.evaluate(BAR_ITEMS)
        names = [i["text"] for i in items]
        assert "Environments" in names and "More" in names
        assert ("Admin" in names) == (user != "acme-member")  # who administers has the menu
        tops = {round(i["top"]) for i in items}
        assert max(tops) - min(tops) <= 8, items  # one line: no item wrapped below the others
        assert all(i["right"] <= 1280 for i in items)
        # the menus: closed, then opened by a click on their summary (no script on this page)
        more = page.locator("nav.links details.menu", has_text="More")
        images = more.locator("a", has_text="Images")
        assert not images.is_visible()
        more.locator("summary").click()
        assert images.is_visible() and _on_screen(page, images)
        shot(page, f"nav-more-{user}")
        images.click()
        page.wait_for_url(f"{base}/registry/images/")
        if user == "root-admin":
            admin = page.locator("nav.links details.menu", has_text="Admin")
            admin.locator("summary").click()
            for name in ("Audit log", "Tenants", "Users"):
                assert admin.locator("a", has_text=name).is_visible()
    finally:
        context.close()
