"""Import direction between Camp's layers, read from the sources with ``ast`` (no imports run).

- tenancy is the ground floor: no module of ``tenants/`` (management commands, SSO, API,
  migrations included) imports scheduling, workspaces, registry or portal — not at the top,
  not inside a function, not under TYPE_CHECKING, not by a dotted name handed to
  ``import_module``/``import_string``/``apps.get_model``. What tenancy needs from above
  comes through its registries (tenants.permissions.register, tenants.extensions).
- the scheduling engine is pure: ``scheduling/engine/`` imports the standard library and
  itself, nothing of Django or any Camp app (DESIGN.md §3; tests/unit/engine/test_boundary.py
  checks the third-party frameworks).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ABOVE_TENANCY = ("scheduling", "workspaces", "registry", "portal")
DYNAMIC_IMPORTERS = {"import_module", "import_string", "get_model", "__import__"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, as absolute dotted names:
    relative imports resolved, imports anywhere in the file, and dotted names given as the
    first argument of a dynamic importer (``apps.get_model("app", ...)`` counts as ``app``)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level - 1 >= len(base):
                    found.add("<beyond the top-level package>")
                    continue
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # ``from scheduling import models`` imports scheduling.models too.
            found.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if (name in DYNAMIC_IMPORTERS and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                found.add(first.value)
    return found


def _sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    return files


def _imports_of_file(path: Path) -> set[str]:
    return imports_of(path.read_text(), _module_name(path), is_package=path.name == "__init__.py")


def _top(name: str) -> str:
    return name.split(".")[0]


def test_tenants_imports_no_app_above_it() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imports_of_file(path)
                                            if _top(m) in ABOVE_TENANCY)
        for path in _sources("tenants")
    }
    assert {f: m for f, m in offenders.items() if m} == {}


def test_engine_imports_only_the_standard_library_and_itself() -> None:
    allowed_top = set(sys.stdlib_module_names) | {"__future__"}
    offenders = {}
    for path in _sources("scheduling/engine"):
        bad = sorted(m for m in _imports_of_file(path)
                     if _top(m) not in allowed_top
                     and not (m == "scheduling.engine" or m.startswith("scheduling.engine.")))
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert offenders == {}


@pytest.mark.parametrize(("source", "module", "expected"), [
    ("from scheduling.models import Cluster", "tenants.views", "scheduling.models"),
    ("def f():\n    from portal.home import home", "tenants.views", "portal.home"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import registry.models",
     "tenants.services", "registry.models"),
    ("from django.apps import apps\nM = apps.get_model('workspaces', 'Profile')",
     "tenants.services", "workspaces"),
    ("from ..models import Job", "scheduling.engine.fit", "scheduling.models"),
    ("from .. import services", "scheduling.engine.fit", "scheduling.services"),
    ("from . import queue", "scheduling.engine", "scheduling.engine.queue"),
], ids=["absolute", "in-function", "type-checking", "get_model", "relative-up", "relative-name",
        "package-init"])
def test_the_import_reader_sees_every_way_in(source: str, module: str, expected: str) -> None:
    # The checks above are only as good as this reader: each way a module can pull another
    # in must show up, so a new back edge fails the suite instead of slipping through.
    assert expected in imports_of(source, module, is_package=module == "scheduling.engine")
