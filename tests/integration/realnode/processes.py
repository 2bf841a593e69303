"""Camp's own processes for the real-node tier (a worker comes from test_concurrency)."""

from __future__ import annotations

from tests.integration.realkube.test_worker_path import camp_watch

__all__ = ["camp_watch"]
