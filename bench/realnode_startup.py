"""Submit → running on a real Kubernetes node (issue 28): median and p95 over 20 notebooks and
one 2-worker job, split into Camp's part (submit → bound) and the node's (bound → started →
Ready). Needs what the real-node tier needs (root, ../shared/tools/node); ~10 min.

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
