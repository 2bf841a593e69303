"""The guaranteed-GPU rule for non-preemptible jobs, defined once (issue 29):
``engine.guarantees.nonpreemptible_refusal``. Table-driven, and no copy of its comparisons
elsewhere (it was written three times: the cycle's check across clusters, the placement
step's probe, the submit form)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduling.engine.guarantees import nonpreemptible_refusal

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("held", "ask", "guarantee", "ever", "verdict"), [
    (0, 2, 4, None, ""),            # within
    (2, 2, 4, None, ""),            # exactly at the guarantee
    (3, 2, 4, None, "waits"),       # held + ask beyond: waits for its own jobs to end
    (0, 5, 4, None, "never"),       # more than the guarantee could ever give
    (0, 5, 4, 8, "waits"),          # this cluster's part is 4 of a guarantee that could give 8
    (0, 9, 4, 8, "never"),
    (0.5, 0.25, 0.75, None, ""),    # fractions of a GPU (the accounting unit)
    (0.5, 0.26, 0.75, None, "waits"),
])
def test_the_rule(held: float, ask: float, guarantee: float, ever: float | None, verdict: str) -> None:
    assert nonpreemptible_refusal(held, ask, guarantee, ever=ever) == verdict


def test_no_module_writes_the_rule_again() -> None:
    """The comparisons of the rule (held + ask beyond the guarantee, ask beyond per-cluster +
    across-clusters guarantee) appear in no other module."""
    copies = re.compile(r"\bask\s*>\s*base\s*\+\s*total|here\s*\+\s*ask\s*>\s*base|"
                        r"u\[r\]\s*\+\s*ask\[r\]\s*>\s*g\[r\]|ask\[r\]\s*>\s*g\[r\]")
    found = [f"{p.relative_to(ROOT)}:{n}" for app in ("scheduling", "workspaces", "portal", "tenants")
             for p in sorted((ROOT / app).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if copies.search(line)]
    assert not found, found
