"""Only the lifecycle module writes a job's state (DESIGN.md §5, issue 29).

Read from the source with ``ast`` over the product code (every app, the settings and the CLI;
not tests, migrations or ``bench/``, whose reset between runs undoes a cycle rather than moving
a job): outside ``scheduling/services/lifecycle.py`` nothing may

- assign ``<x>.state = JobState.…`` (or assign ``.state`` of a name that says job);
- call ``.update(state=…)`` / ``Job(state=…)`` / ``.create(state=…)`` with a ``JobState`` value or
  on a ``Job`` queryset;
- ``bulk_update`` jobs with a ``"state"`` field, or ``save(update_fields=[…"state"…])`` a job;
- hand a ``("state", …)`` column to the bulk writer (``_update_from_values(Job, …)``).

A job's state moves only along a row of ``lifecycle.TRANSITIONS``, so every move is guarded by
its from-states and recorded (decision row, audit event) the same way.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("camp", "camp_cli", "scheduling", "workspaces", "portal", "tenants", "registry")
WRITER = ROOT / "scheduling" / "services" / "lifecycle.py"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _jobish(node: ast.AST) -> bool:
    """An expression that names a job: ``Job.objects…``, ``job``, ``locked_job``, ``victim``…"""
    return any(n == "Job" or "job" in n.lower() or n in {"victim", "locked"} for n in _names(node))


def _says_state(node: ast.AST) -> bool:
    """A list/tuple literal holding the string "state"."""
    return any(isinstance(n, ast.Constant) and n.value == "state" for n in ast.walk(node))


def state_writes(source: str) -> list[int]:
    """Lines of ``source`` that write a job's state."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    value = node.value if node.value is not None else ast.Constant(None)
                    if isinstance(el, ast.Attribute) and el.attr == "state" and (
                            "JobState" in _names(value) or _jobish(el.value)):
                        found.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = (func.attr if isinstance(func, ast.Attribute)
                    else func.id if isinstance(func, ast.Name) else "")
            receiver = func.value if isinstance(func, ast.Attribute) else func
            for kw in node.keywords:
                if kw.arg == "state" and name in {"update", "create", "Job", "update_or_create"} and (
                        "JobState" in _names(kw.value) or _jobish(receiver)):
                    found.append(node.lineno)
                if (kw.arg == "update_fields" and name == "save" and _says_state(kw.value)
                        and _jobish(receiver)):
                    found.append(node.lineno)
            if name == "bulk_update" and _jobish(receiver) and any(_says_state(a) for a in node.args[1:]):
                found.append(node.lineno)
            if (name == "_update_from_values" and node.args and isinstance(node.args[0], ast.Name)
                    and node.args[0].id == "Job" and len(node.args) > 1 and any(
                        isinstance(t, ast.Tuple) and t.elts and isinstance(t.elts[0], ast.Constant)
                        and t.elts[0].value == "state" for t in ast.walk(node.args[1]))):
                found.append(node.lineno)
    return found


def test_only_the_lifecycle_module_writes_job_state() -> None:
    offenders = []
    for app in CODE:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts or path == WRITER:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in state_writes(path.read_text())]
    assert not offenders, f"Job.state written outside {WRITER.relative_to(ROOT)}: {', '.join(offenders)}"


def test_the_lifecycle_module_is_seen_writing() -> None:
    """The detector finds the writer's own statements (and every shape it looks for), so a pass
    above is not a detector that finds nothing."""
    assert state_writes(WRITER.read_text())
    shapes = [
        "job.state = JobState.QUEUED",
        "locked.state = 'failed'",
        "Job.objects.filter(pk=1).update(state=JobState.FAILED)",
        "rows.update(state=JobState.RUNNING, reason='x')",
        "Job(name='x', state=JobState.QUEUED)",
        "job.save(update_fields=['state', 'reason'])",
        "Job.objects.bulk_update(jobs, ['state'])",
        "_update_from_values(Job, [('state', 'varchar')], rows)",
    ]
    assert [bool(state_writes(s)) for s in shapes] == [True] * len(shapes)
    ok = ["env.state = 'stopped'", "env.save(update_fields=['state'])",
          "Job.objects.filter(state=JobState.QUEUED)", "self.state = state",
          "_update_from_values(Job, [('reason', 'varchar')], rows)"]
    assert [bool(state_writes(s)) for s in ok] == [False] * len(ok)
