#!/usr/bin/env bash
# Build the real-node tier's images with no registry and no image daemon, from the machine's own
# Debian mirror and PyPI (adapted from ../shared/tools/node/build-images.sh; mkimage.py from there).
#
#   localhost/camp-jupyter:<key>  JupyterLab laid out like jupyter/docker-stacks: user jovyan
#                                 (uid 1000, gid 100), HOME /home/jovyan, start-notebook.py
#   localhost/camp-train:<key>    PyTorch CPU (the local torch==2.13.0 wheel) + train.py
#   localhost/camp-serve:<key>    a model server stand-in (serve.py): /healthz answers 200 only
#                                 once the "model" is loaded
#
# OUT=dir KEY=key build.sh  writes jupyter.tar train.tar serve.tar into OUT (images.py picks OUT
# under a cache keyed by a hash of this folder, so a later run on this machine reuses them).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:?set OUT}
KEY=${KEY:?set KEY}
MKIMAGE=${MKIMAGE:?set MKIMAGE to ../shared/tools/node/mkimage.py}
WORK=$OUT/src
MIRROR=${MIRROR:-$(grep -rhoE "https?://[^ ]+/debian/?( |$)" /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -1 | tr -d " " || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
mkdir -p "$OUT" "$WORK"
FIND_LINKS=${FIND_LINKS:-$( [ -d /opt/wheels ] && echo /opt/wheels)}   # where this machine keeps the CPU torch wheel
PATHS=PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

base=$WORK/base
if [ ! -x "$base/opt/venv/bin/pip" ]; then
  rm -rf "$base"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$base" "$MIRROR"
  chroot "$base" /usr/bin/python3 -m venv /opt/venv
  chroot "$base" apt-get clean
  rm -rf "$base"/var/lib/apt/lists/* "$base"/var/cache/apt/*.bin "$base"/usr/share/doc/* "$base"/usr/share/man/*
  # docker-stacks' user: jovyan, uid 1000, group users (gid 100)
  chroot "$base" useradd -m -u 1000 -g 100 -s /bin/bash jovyan
fi
pyv=$(chroot "$base" /usr/bin/python3 -c 'import platform; print(platform.python_version())')

image() {  # name packages...  -> rootfs $WORK/$name with the packages installed into /opt/venv
  local name=$1; shift
  local r=$WORK/$name
  rm -rf "$r"; cp -a "$base" "$r"
  if [ $# -gt 0 ]; then
    mkdir -p "$WORK/wheels-$name"
    # wheels downloaded by the host's pip (its index/proxy config), installed offline in the chroot
    python3 -m pip download -q ${FIND_LINKS:+--find-links "$FIND_LINKS"} -d "$WORK/wheels-$name" --only-binary=:all: --python-version "$pyv" "$@"
    mkdir -p "$r/tmp/wheels"; cp "$WORK/wheels-$name"/* "$r/tmp/wheels/"
    chroot "$r" /opt/venv/bin/pip install -q --no-index --find-links /tmp/wheels "$@"
    rm -rf "$r/tmp/wheels"
  fi
  find "$r/opt/venv" -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null || true
}

# --- JupyterLab, docker-stacks layout -------------------------------------------------------
image jupyter jupyterlab==4.4.10
cat > "$WORK/jupyter/usr/local/bin/start-notebook.py" <<'PY'
#!/opt/venv/bin/python3
"""docker-stacks' entry point, reduced: run JupyterLab with the arguments given."""
import os, sys
os.execvp("jupyter", ["jupyter", "lab", "--no-browser", *sys.argv[1:]])
PY
chmod 755 "$WORK/jupyter/usr/local/bin/start-notebook.py"
python3 "$MKIMAGE" --rootfs "$WORK/jupyter" --tag "localhost/camp-jupyter:$KEY" --env "$PATHS" \
  --env HOME=/home/jovyan --env SHELL=/bin/bash --workdir /home/jovyan --user 1000:100 --port 8888 \
  --cmd '["start-notebook.py"]' -o "$OUT/jupyter.tar"

# --- PyTorch CPU + the test's training script --------------------------------------------------
image train torch==2.13.0
install -m 644 "$HERE/train.py" "$WORK/train/opt/train.py"
python3 "$MKIMAGE" --rootfs "$WORK/train" --tag "localhost/camp-train:$KEY" --env "$PATHS" \
  --workdir / --cmd '["python", "/opt/train.py"]' -o "$OUT/train.tar"

# --- model server stand-in ------------------------------------------------------------------
image serve
install -m 644 "$HERE/serve.py" "$WORK/serve/opt/serve.py"
python3 "$MKIMAGE" --rootfs "$WORK/serve" --tag "localhost/camp-serve:$KEY" --env "$PATHS" \
  --workdir / --entrypoint '["python", "/opt/serve.py"]' --port 8000 -o "$OUT/serve.tar"

rm -rf "$WORK/jupyter" "$WORK/train" "$WORK/serve"
ls -l "$OUT"/*.tar
