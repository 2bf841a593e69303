"""One preemptible default (issue 29): the job API, the training service, the workload kinds'
never-fits check and the models' field defaults all take it from
``scheduling.models.preemptible_default``; no module computes its own."""

from __future__ import annotations

import re
from pathlib import Path

from scheduling.models import Job, PriorityClass, preemptible_default
from workspaces.kinds import KINDS, _preemptible
from workspaces.models import ModelService, TrainingJob

ROOT = Path(__file__).resolve().parents[2]
CODE = ("camp", "scheduling", "workspaces", "portal", "tenants", "registry")


def test_the_models_defaults_are_the_rule_for_their_default_priority() -> None:
    for model, workload in ((Job, "job"), (TrainingJob, "training"), (ModelService, "service")):
        field = model._meta.get_field("preemptible")
        priority = model._meta.get_field("priority_class").default
        assert field.default == preemptible_default(priority, workload=workload), model


def test_the_kinds_check_asks_the_rule() -> None:
    import workspaces.services  # noqa: F401  (registers the kinds)

    kinds = {k.name: k for k in KINDS.values()}
    for kind in kinds.values():
        for pc in PriorityClass.values:
            assert _preemptible(kind, {"priority_class": pc}) == preemptible_default(pc, workload=kind.name)
    assert _preemptible(kinds["training"], {"priority_class": "normal"})  # batch-only before
    assert not _preemptible(kinds["environment"], {"priority_class": "normal"})


def test_no_other_module_computes_a_preemptible_default() -> None:
    copy = re.compile(r"preemptible\s*=\s*[^=].*PriorityClass\.|==\s*PriorityClass\.BATCH"
                      r"|in \(PriorityClass\.NORMAL, PriorityClass\.BATCH\)")
    found = []
    for app in CODE:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if copy.search(line) and "preemptible_default" not in line:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, found
