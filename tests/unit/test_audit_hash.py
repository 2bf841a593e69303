"""The audit chain's hash prepared before the chain lock is exactly ``compute_hash`` (issue 13):
the JSON is built outside the lock and only the previous hash is filled in under it."""

from __future__ import annotations

from typing import Any

import pytest

from tenants.audit import GENESIS_HASH, _Prepared, compute_hash

FIELDS: list[dict[str, Any]] = [
    {"created_at": "2026-11-23T11:00:00+00:00", "actor_id": 3, "actor_username": "ana",
     "tenant_id": 1, "project_id": None, "action": "job.submitted", "target_type": "scheduling.job",
     "target_id": "7", "target_repr": "sweep-0", "before": None,
     "after": {"gpu": 2.0, "env": {"K": "vålue \"quoted\" \\ ünï"}, "groups": [{"n": 1e16}]},
     "request_id": "r1", "client_ip": "::1"},
    {"prev_hash": "attacker-chosen", "target_repr": "a" * 300, "after": {"prev_hash": GENESIS_HASH}},
]


@pytest.mark.parametrize("fields", FIELDS)
def test_prepared_hash_is_compute_hash(fields: dict[str, Any]) -> None:
    for prev in (GENESIS_HASH, "f" * 64, compute_hash(fields, GENESIS_HASH)):
        assert _Prepared(fields).hash(prev) == compute_hash(fields, prev)
    assert _Prepared(fields).hash("a" * 64) != _Prepared(fields).hash("b" * 64)
