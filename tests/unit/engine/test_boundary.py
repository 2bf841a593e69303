"""The engine is pure: it imports nothing from the platform's frameworks (DESIGN.md §3)."""

from __future__ import annotations

import ast
from pathlib import Path

import scheduling.engine

FORBIDDEN = {"django", "celery", "kubernetes", "rest_framework", "channels", "redis", "psycopg"}
ENGINE = Path(scheduling.engine.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            found.update(a.name.split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            found.add(n.module.split(".")[0])
    return found


def test_engine_imports_no_framework() -> None:
    files = sorted(ENGINE.rglob("*.py"))
    assert files, "engine sources not found"
    offenders = {str(f.relative_to(ENGINE)): sorted(_imports(f) & FORBIDDEN) for f in files}
    assert {f: m for f, m in offenders.items() if m} == {}


def test_engine_imports_only_itself_and_stdlib() -> None:
    import sys

    allowed = set(sys.stdlib_module_names) | {"scheduling", "__future__"}
    for f in ENGINE.rglob("*.py"):
        assert _imports(f) <= allowed, f
