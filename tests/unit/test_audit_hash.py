"""The audit chain's hashes (issue 13): the sealer chains a batch of events with
``chain_hashes``, which must be exactly ``compute_hash`` applied link by link (what
``verify_chain`` recomputes), whatever the content (quotes, unicode, numbers jsonb rewrites,
a field named like the link)."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.audit import GENESIS_HASH, chain_hashes, compute_hash

FIELDS: list[dict[str, Any]] = [
    {"created_at": "2026-11-23T11:00:00+00:00", "actor_id": 3, "actor_username": "ana",
     "tenant_id": 1, "project_id": None, "action": "job.submitted", "target_type": "scheduling.job",
     "target_id": "7", "target_repr": "sweep-0", "before": None,
     "after": {"gpu": 2.0, "env": {"K": "vålue \"quoted\" \\ ünï"}, "groups": [{"n": 1e16}]},
     "request_id": "r1", "client_ip": "::1"},
    {"prev_hash": "attacker-chosen", "target_repr": "a" * 300, "after": {"prev_hash": GENESIS_HASH}},
]


@pytest.mark.parametrize("prev", [GENESIS_HASH, "f" * 64])
def test_chain_hashes_link_each_event_to_the_one_before(prev: str) -> None:
    first, second = chain_hashes(FIELDS, prev)
    assert first == compute_hash(FIELDS[0], prev)
    assert second == compute_hash(FIELDS[1], first)
    # The link is part of what is hashed: another predecessor, another hash.
    assert chain_hashes(FIELDS[:1], "a" * 64) != chain_hashes(FIELDS[:1], "b" * 64)
    # A field named like the link does not stand in for it: the link given is what is hashed.
    without = {k: v for k, v in FIELDS[1].items() if k != "prev_hash"}
    assert compute_hash(FIELDS[1], prev) == compute_hash(without, prev)
