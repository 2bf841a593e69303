"""The real-node tier's images, built once per recipe and cached outside the repository.

``images/build.sh`` (with ``train.py``, ``serve.py``) is the recipe; its files' hash is the
cache key and the images' tag, so a changed recipe builds anew and an unchanged one is reused
by later runs and by CI on the same machine (~8-10 min the first time, 0 s after).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPE = HERE / "images"
CACHE = Path(os.environ.get("CAMP_TEST_IMAGE_CACHE", "/var/cache/camp-test-images"))
NAMES = ("jupyter", "train", "serve")


def recipe_key(mkimage: Path) -> str:
    h = hashlib.sha256()
    # (a fixed order: the tools folder may be reached through a symlink, so no path sorting)
    for f in [mkimage, *sorted([*RECIPE.glob("*.sh"), *RECIPE.glob("*.py")], key=lambda p: p.name)]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def image_ref(name: str, key: str) -> str:
    return f"localhost/camp-{name}:{key}"


def build_images(node_tools: Path, log: Path | None = None) -> tuple[str, dict[str, Path]]:
    """(key, {name: tar}) — built under an exclusive lock unless the cache already has them."""
    mkimage = node_tools / "mkimage.py"
    key = recipe_key(mkimage)
    out = CACHE / key
    tars = {n: out / f"{n}.tar" for n in NAMES}
    if all(t.exists() for t in tars.values()):
        return key, tars
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent run waits for this build, then reuses it
        if not all(t.exists() for t in tars.values()):
            with open(log or out.with_suffix(".log"), "w") as fh:
                subprocess.run(["bash", str(RECIPE / "build.sh")], check=True, stdout=fh,
                               stderr=subprocess.STDOUT,
                               env={**os.environ, "OUT": str(out), "KEY": key, "MKIMAGE": str(mkimage)},
                               timeout=3600)
    return key, tars
