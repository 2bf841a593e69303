"""Import direction between the apps' layers, read from the source with ``ast`` (nothing is
imported, so a cycle cannot hide behind import order).

- Services request work through their package's ``enqueue`` seam (a call-time import); the tasks
  import the services. A module-level import of the app's own ``tasks`` from a services module
  would make the two import each other.
- Tenancy is the ground floor: no module of ``tenants/`` (management commands, SSO, API,
  migrations included) imports scheduling, workspaces, registry or portal — not at the top, not
  inside a function, not under TYPE_CHECKING, not by a dotted name handed to
  ``import_module``/``import_string``/``apps.get_model``. What tenancy needs from above comes
  through its registries (tenants.permissions.register, tenants.extensions).
- The scheduling engine is pure: ``scheduling/engine/`` imports the standard library and itself,
  nothing of Django or any Camp app (DESIGN.md §3; tests/unit/engine/test_boundary.py checks the
  third-party frameworks).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("scheduling", "workspaces")  # apps whose services/ is a package
ABOVE_TENANCY = ("scheduling", "workspaces", "registry", "portal")
DYNAMIC_IMPORTERS = {"import_module", "import_string", "get_model", "get_app_config",
                     "get_containing_app_config", "__import__"}


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
        elif isinstance(node, ast.Call) and _called(node) in DYNAMIC_IMPORTERS:
            # Any string handed to it, by position or keyword: get_model("app", "Model"),
            # get_model("app.Model"), get_model(app_label="app", model_name="Model").
            found.update(_strings([*node.args, *(k.value for k in node.keywords)]))
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "modules"):  # sys.modules["app.module"]
            found.update(_strings([node.slice]))
    return found


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _strings(nodes: list[ast.expr]) -> list[str]:
    return [n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _sources(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no sources under {package}/"
    return files


def _imports_of_file(path: Path) -> set[str]:
    return imports_of(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def _top(name: str) -> str:
    return name.split(".")[0]


def test_tenants_imports_no_app_above_it() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imports_of_file(path)
                                            if _top(m) in ABOVE_TENANCY)
        for path in _sources("tenants")
    }
    assert {f: m for f, m in offenders.items() if m} == {}


def _commands_of(apps: tuple[str, ...]) -> dict[str, str]:
    return {p.stem: app for app in apps
            for p in (ROOT / app / "management" / "commands").glob("*.py") if p.stem != "__init__"}


def test_tenants_runs_no_management_command_of_an_app_above_it() -> None:
    above = _commands_of(ABOVE_TENANCY)
    assert "seed_demo" in above  # the demo's commands are portal's
    offenders = {}
    for path in _sources("tenants"):
        called = {c for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Call) and _called(node) == "call_command"
                  for c in _strings(node.args[:1])}
        if called & set(above):
            offenders[str(path.relative_to(ROOT))] = sorted(called & set(above))
    assert offenders == {}


# tenants.permissions walks the foreign-key paths each app declares (its own rules, by name):
# generic model metadata, not a reference to any app above.
RELATED_MODEL_ALLOWED = {"tenants/permissions.py"}


def test_tenants_reaches_no_model_above_it_through_relations() -> None:
    """``SomeModel._meta.get_field("x").related_model`` names a model of whichever app the
    field points at: an import in disguise. What tenancy needs from above is registered
    with it (tenants.extensions.register_cluster_model)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _sources("tenants") if str(path.relative_to(ROOT)) not in RELATED_MODEL_ALLOWED
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("related_model", "remote_field")
    ]
    assert offenders == []


TEMPLATE_TAG = re.compile(r"{%\s*(load|include|extends)\s+([^%]*?)\s*%}")


def _template_libraries(apps: tuple[str, ...]) -> dict[str, str]:
    return {p.stem: app for app in apps
            for p in (ROOT / app / "templatetags").glob("*.py") if p.stem != "__init__"}


def _template_path(name: str) -> Path | None:
    for candidate in (ROOT / "templates" / name, ROOT / "tenants" / "templates" / name):
        if candidate.exists():
            return candidate
    return None


def template_references(text: str) -> tuple[set[str], set[str]]:
    """The tag libraries a template loads and the templates it includes or extends by a
    literal name (``{% include section %}``, a variable, is how extensions add sections)."""
    libraries: set[str] = set()
    templates: set[str] = set()
    for tag, args in TEMPLATE_TAG.findall(text):
        if tag == "load":
            words = args.split()
            libraries.update(words[words.index("from") + 1:] if "from" in words else words)
        else:
            first = args.split()[0]
            if first[:1] in "\"'":
                templates.add(first.strip("\"'"))
    return libraries, templates


def test_templates_rendered_by_tenants_use_nothing_of_an_app_above_it() -> None:
    """The console's templates (those tenants' views render, and what they include or
    extend) load no tag library and include no template of an app above tenancy. The site
    frame ``base.html``, shared by every app, links to their pages and is not followed."""
    libraries_above = _template_libraries(ABOVE_TENANCY)
    assert "portal_tags" in libraries_above
    todo = sorted({name for path in _sources("tenants") for node in ast.walk(ast.parse(path.read_text()))
                   for name in _strings([node] if isinstance(node, ast.Constant) else [])
                   if name.endswith(".html")})
    assert "console/home.html" in todo
    seen: set[str] = set()
    offenders: dict[str, list[str]] = {}
    while todo:
        name = todo.pop()
        path = _template_path(name)
        if name in seen or name == "base.html" or path is None:
            continue
        seen.add(name)
        libraries, templates = template_references(path.read_text())
        bad = sorted({f"load {lib}" for lib in libraries if lib in libraries_above}
                     | {f"include {t}" for t in templates if t.split("/")[0] in ABOVE_TENANCY})
        if bad:
            offenders[name] = bad
        todo.extend(templates)
    assert offenders == {}


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
    ("M = apps.get_model(app_label='workspaces', model_name='Profile')",
     "tenants.services", "workspaces"),
    ("c = apps.get_app_config('portal')", "tenants.views", "portal"),
    ("import sys\nm = sys.modules['scheduling.models']", "tenants.views", "scheduling.models"),
    ("from ..models import Job", "scheduling.engine.fit", "scheduling.models"),
    ("from .. import services", "scheduling.engine.fit", "scheduling.services"),
    ("from . import queue", "scheduling.engine", "scheduling.engine.queue"),
], ids=["absolute", "in-function", "type-checking", "get_model", "get_model-keywords",
        "get_app_config", "sys.modules", "relative-up", "relative-name", "package-init"])
def test_the_import_reader_sees_every_way_in(source: str, module: str, expected: str) -> None:
    # The checks above are only as good as this reader: each way a module can pull another
    # in must show up, so a new back edge fails the suite instead of slipping through.
    assert expected in imports_of(source, module, is_package=module == "scheduling.engine")


def test_the_template_reader_sees_loads_and_includes() -> None:
    libraries, templates = template_references(
        '{% extends "base.html" %}{% load static portal_tags %}{% load duration from x_tags %}'
        '{% include "portal/quota_bars.html" with bars=b %}{% include section %}')
    assert libraries == {"static", "portal_tags", "x_tags"}
    assert templates == {"base.html", "portal/quota_bars.html"}



SERVICE_FUNCTION_LINES = 80  # issue 14: a service function a newcomer can read in one screen


def _service_sources() -> list[Path]:
    packages = [p for app in APPS for p in modules_of(f"{app}.services")]
    single = [ROOT / app / "services.py" for app in ("tenants", "registry", "portal")]
    return packages + [p for p in single if p.exists()] + [ROOT / "workspaces" / "kinds.py"]


def long_functions(path: Path, limit: int = SERVICE_FUNCTION_LINES, root: Path = ROOT) -> list[str]:
    """``module.function (N lines)`` for every function or method in ``path`` longer than
    ``limit`` lines, its signature and docstring included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{module_name(path, root)}.{n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno is not None and n.end_lineno - n.lineno + 1 > limit]


def test_no_service_function_runs_over_80_lines() -> None:
    sources = _service_sources()
    assert ROOT / "scheduling" / "services" / "cycle.py" in sources
    assert ROOT / "workspaces" / "services" / "training.py" in sources
    assert [f for p in sources for f in long_functions(p)] == []


def test_the_length_reader_counts_whole_functions(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(79))
    (tmp_path / "m.py").write_text(
        "def short():\n    return 1\n\n\nclass K:\n    def long(self):\n"
        f"        \"\"\"doc\"\"\"\n{body}\n", encoding="utf-8")
    # K.long is 81 lines (signature, docstring, 79 statements); short is 2
    assert long_functions(tmp_path / "m.py", root=tmp_path) == ["m.long (81 lines)"]
    assert long_functions(tmp_path / "m.py", limit=81, root=tmp_path) == []
