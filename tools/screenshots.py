"""Screenshots of the main pages of a running demo (`make demo`) for docs/screenshots/.
Take them ten minutes or more after the start: the demo's load generator has filled the
cluster, queues, preemptions and culled notebooks by then.

    .venv/bin/python tools/screenshots.py [--base http://127.0.0.1:8000] [--out docs/screenshots]

Uses Debian's Chromium through Playwright (never a downloaded browser).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

PASSWORD = "camp-demo-2026"  # noqa: S105 (the demo's published password)


def login(page: Page, base: str, user: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{base}/login/")
    page.fill("#id_username", user)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_load_state()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--out", default="docs/screenshots")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = args.base
    shots: list[tuple[str, str, str]] = [
        ("vince", "/", "home-member"),
        ("vince", "/workspaces/environments/", "environments"),
        ("vince", "/workspaces/environments/new/", "launch-environment"),
        ("vince", "/workspaces/training/new/", "launch-training"),
        ("vince", "/scheduling/jobs/", "jobs"),
        ("vince", "/workspaces/services/", "services"),
        ("vince", "/workspaces/services/new/", "launch-service"),
        ("vera", "/", "home-owner"),
        ("vera", "/t/vision/", "tenant-console"),
        ("vera", "/t/vision/usage/", "usage-showback"),
        ("vera", "/audit/", "audit-log"),
        ("admin", "/", "home-admin"),
        ("admin", "/dashboard/", "dashboard"),
        ("admin", "/admin/clusters/sim/gpus/", "gpu-map"),
        ("admin", "/admin/clusters/sim/queues/", "queue-tree"),
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        page.goto(f"{base}/login/")
        page.screenshot(path=str(out / "login.png"))
        current = ""
        for user, path, name in shots:
            if user != current:
                login(page, base, user)
                current = user
            page.goto(f"{base}{path}")
            page.wait_for_timeout(600)  # charts draw
            page.screenshot(path=str(out / f"{name}.png"), full_page=True)
        login(page, base, "vince")
        page.goto(f"{base}/scheduling/jobs/?state=queued")
        first_waiting = page.locator("tr[data-live-job] a").first
        if first_waiting.count():
            first_waiting.click()
            page.wait_for_load_state()
            page.screenshot(path=str(out / "job.png"), full_page=True)
        page.goto(f"{base}/workspaces/services/")
        first_service = page.locator("tr[data-live-service] a").first
        if first_service.count():
            first_service.click()
            page.wait_for_load_state()
            page.wait_for_timeout(600)
            page.screenshot(path=str(out / "service.png"), full_page=True)
        mobile = browser.new_page(viewport={"width": 390, "height": 800})
        mobile.goto(f"{base}/login/")
        mobile.fill("#id_username", "vera")
        mobile.fill("#id_password", PASSWORD)
        mobile.click("main button[type=submit]")
        mobile.goto(f"{base}/t/vision/")
        mobile.screenshot(path=str(out / "phone-tenant.png"), full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
