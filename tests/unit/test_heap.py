"""A served process keeps its startup heap out of the cyclic collector (camp/heap.py, issue 35):
the web entry points and a Celery worker freeze what they imported, so a full collection in a
request no longer walks ~180,000 module, class and registry objects. Each case runs in a
process of its own: what is frozen is that process's whole heap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# What the child reports: the frozen count, what a full collection still walks, and whether
# a view module (imported only through the URLconf) was imported before the freeze.
_REPORT = """
import gc, json, sys
walked = len(gc.get_objects())
print(json.dumps({"frozen": gc.get_freeze_count(), "walked": walked,
                  "views": "scheduling.api.views" in sys.modules}))
"""


def _run(code: str) -> dict[str, int]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code + _REPORT], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("entry", ["camp.asgi", "camp.wsgi"])
def test_the_web_entry_points_freeze_the_loaded_app_urlconf_included(entry: str) -> None:
    got = _run(f"import {entry}\n")
    assert got["views"], "the URLconf (and its views) is imported before the freeze"
    assert got["frozen"] > 50_000
    assert got["walked"] < got["frozen"] // 10, got  # a full collection skips the frozen heap


def test_a_process_that_does_not_freeze_walks_its_whole_heap() -> None:
    # The same import without the freeze (the control: what the assertions above rule out).
    got = _run("import django; django.setup()\n"
               "from camp.heap import import_urlconf; import_urlconf()\n")
    assert got["frozen"] == 0 and got["walked"] > 50_000


def test_a_celery_worker_freezes_before_its_pool_forks_and_in_each_child() -> None:
    got = _run("import django; django.setup()\n"
               "from camp.celery import app\n"
               "from celery import signals\n"
               "app.loader.import_default_modules()\n"  # what the worker imports: its tasks
               "signals.worker_init.send(sender=type('Worker', (), {'app': app, 'pool_cls': 'prefork'})())\n"
               "import gc; parent = gc.get_freeze_count()\n"
               "extra = [[i] for i in range(1000)]\n"  # what a child's start-up adds
               "signals.worker_process_init.send(sender=None)\n"
               "assert parent > 50_000 and gc.get_freeze_count() >= parent + 1000, parent\n")
    assert got["frozen"] > 50_000 and got["walked"] < got["frozen"] // 10
