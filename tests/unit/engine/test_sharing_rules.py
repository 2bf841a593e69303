"""Where slices may land (issue 11): a slice stays on shareable cards (HAMi nodes) and takes a
whole exclusive-only card (a node without HAMi) only when no shareable card can hold it."""

from __future__ import annotations

import pytest

from scheduling.engine import Placer, SharingMode, pod
from scheduling.engine.state import ClusterState
from tests.unit.engine.builders import cluster, node

SLICE = pod("p", gpu_count=1, gpu_memory_mib=10_000, gpu_cores_percent=30)
WHOLE = pod("p", gpu_count=1)

CASES = {
    # (nodes, request, expected node or None)
    "slice prefers the shareable card, whatever the names' order": (
        [node("a-plain", 2, sharing=SharingMode.EXCLUSIVE_ONLY, model="T4", memory_mib=15_360),
         node("z-hami", 4)], SLICE, "z-hami"),
    "slice prefers shareable even when the plain node is emptier": (
        [node("a-plain", 8, sharing=SharingMode.EXCLUSIVE_ONLY), node("b-hami", 1)], SLICE, "b-hami"),
    "slice falls back to a whole plain card when nothing shareable fits": (
        [node("a-plain", 2, sharing=SharingMode.EXCLUSIVE_ONLY),
         node("b-hami", 1, memory_mib=8_000)], SLICE, "a-plain"),
    "whole-card request may use either": (
        [node("a-plain", 2, sharing=SharingMode.EXCLUSIVE_ONLY), node("b-hami", 1)], WHOLE, None),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_slices_stay_on_shareable_cards(case: str) -> None:
    nodes, request, expected = CASES[case]
    placement = Placer(ClusterState(cluster(*nodes))).find(request)
    assert placement is not None
    if expected is not None:
        assert placement.node == expected
    if expected == "a-plain":
        assert placement.gpus[0].exclusive  # the whole card, as a plain node can only give
