"""Import direction between the apps' layers, read from the source with ``ast`` (nothing is
imported, so a cycle cannot hide behind import order).

Services request work through their package's ``enqueue`` seam (a call-time import); the tasks
import the services. A module-level import of the app's own ``tasks`` from a services module would
make the two import each other."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APPS = ("scheduling", "workspaces")  # apps whose services/ is a package


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_level_imports(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute names of the modules ``path`` imports at import time: statements at module level,
    including those under a module-level ``if``/``try`` but not inside functions or classes. For
    ``from X import y`` both ``X`` and ``X.y`` are listed (``y`` may be a submodule)."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit([c for c in children if isinstance(c, ast.stmt | ast.ExceptHandler)])
                if isinstance(node, ast.ExceptHandler):
                    visit(node.body)

    visit(ast.parse(path.read_text()).body)
    return found


def modules_of(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def test_the_helper_lists_module_level_imports_only(tmp_path: Path) -> None:
    pkg = tmp_path / "app" / "services"
    pkg.mkdir(parents=True)
    (pkg / "jobs.py").write_text(
        "import json\n"
        "from .. import tasks\n"
        "from ..models import Job\n"
        "from .common import x\n"
        "try:\n    import yaml\nexcept ImportError:\n    from json import loads\n"
        "def f():\n    from ..tasks import later\n"
        "class C:\n    import os\n"
    )
    assert module_level_imports(pkg / "jobs.py", root=tmp_path) == {
        "json", "app", "app.tasks", "app.models", "app.models.Job", "app.services.common",
        "app.services.common.x", "yaml", "json.loads",
    }


def test_services_do_not_import_their_tasks_at_module_level() -> None:
    offenders = []
    for app in APPS:
        paths = modules_of(f"{app}.services")
        assert len(paths) > 1, f"{app}/services/ is a package of modules"
        for path in paths:
            tasks = {
                name for name in module_level_imports(path)
                if name == f"{app}.tasks" or name.startswith(f"{app}.tasks.")
            }
            if tasks:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(tasks)}")
    assert offenders == []
