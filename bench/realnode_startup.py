"""Submit → running on a real Kubernetes node (issue 28): median and p95 over 20 notebooks and
five 2-worker jobs (one at a time), split into Camp's part (submit → bound) and the node's
(bound → started → Ready). Needs what the real-node tier needs (root, ../shared/tools/node);
~15 min on the shared 2-core machine. ``CAMP_BENCH_NOTEBOOKS``, ``CAMP_BENCH_JOBS`` change the
counts.

    .venv/bin/python bench/realnode_startup.py     # writes bench/results/realnode_startup.json
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.exit(subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "tests/integration/realnode/test_bench_startup.py"],
        cwd=ROOT, env={**os.environ, "CAMP_BENCH": "1"}))
