"""A simulated cluster's inventory is parsed once per text (issue 35): each dispatch makes a
backend from its cluster's row, and parsing the openb trace's 1,213 nodes took 0.68 s each
time. What a caller gets back stays its own, and an edited inventory is read as edited."""

from __future__ import annotations

import pytest

from scheduling.backends.simulated import InventoryError, parse_inventory

INVENTORY = """
start_delay_seconds: 2
nodes:
  - name: a100-{i}
    count: 2
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
"""


def test_a_callers_nodes_and_options_are_its_own() -> None:
    nodes, options = parse_inventory(INVENTORY)
    assert [n.name for n in nodes] == ["a100-0", "a100-1"] and options["start_delay_seconds"] == 2
    nodes.clear()
    options["start_delay_seconds"] = 99
    again, options_again = parse_inventory(INVENTORY)
    assert [n.name for n in again] == ["a100-0", "a100-1"]
    assert options_again["start_delay_seconds"] == 2


def test_an_edited_inventory_is_read_as_edited() -> None:
    parse_inventory(INVENTORY)
    edited = INVENTORY.replace("count: 2", "count: 3").replace("count: 4,", "count: 8,")
    nodes, _ = parse_inventory(edited)
    assert [n.name for n in nodes] == ["a100-0", "a100-1", "a100-2"]
    assert all(len(n.gpus) == 8 for n in nodes)
    assert [len(n.gpus) for n in parse_inventory(INVENTORY)[0]] == [4, 4]


def test_a_bad_inventory_is_refused_every_time() -> None:
    for _ in range(2):  # a failure is not remembered as a result
        with pytest.raises(InventoryError, match="needs a name"):
            parse_inventory("nodes:\n  - cpu_cores: 4\n")
