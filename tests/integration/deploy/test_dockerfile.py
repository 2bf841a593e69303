"""The container image's recipe, run for real without a Docker daemon (none runs here).

The Dockerfile is read with dockerfile-parse and each stage is replayed on this machine:
the base image's Python is a fresh virtualenv, container paths (/wheels, /opt/venv, /app,
/src) map to temporary directories, COPY copies from the build context (less
.dockerignore), and every RUN line runs as written with the stage's ENV, except the ones
that change the operating system (apt-get, useradd), which are checked instead: their
Debian packages must exist on Debian 12 (this machine's release) and the final USER must
not be root. Then the image's CMD serves: /healthz answers and whitenoise serves the
collected, hashed static files. Also here: the demo's install set needs no compiler.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from .tools import ROOT

BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # the interpreter under the venv


def _context_files() -> list[str]:
    """The build context: the repository's files less .dockerignore's patterns."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]

    def ignored(path: str) -> bool:
        for pattern in patterns:
            bare = pattern.removeprefix("**/")
            if path == pattern or path.startswith(pattern.rstrip("/") + "/"):
                return True
            if any(fnmatch.fnmatch(part, bare) for part in path.split("/")):
                return True
        return False

    return [p for p in listed if (ROOT / p).is_file() and not ignored(p)]


class Replay:
    """Plays a Dockerfile's stages on this machine (see the module docstring)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.paths = {c: tmp / c.strip("/").replace("/", "_")
                      for c in ("/wheels", "/opt/venv", "/app", "/src")}
        self.base = tmp / "base-python"
        subprocess.run([BASE_PYTHON, "-m", "venv", str(self.base)], check=True, timeout=120)
        self.apt: dict[str, list[str]] = {}
        self.user = "root"
        self.accounts: list[str] = []
        self.cmd: list[str] = []
        self.stage_env: dict[str, dict[str, str]] = {}

    def map(self, value: str) -> str:
        for container, host in sorted(self.paths.items(), key=lambda kv: -len(kv[0])):
            value = re.sub(rf"(?<![\w/]){re.escape(container)}(?=/|$|:|\s|\")", str(host), value)
        return value

    def expand(self, value: str, env: dict[str, str]) -> str:
        return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)

    def run(self, dockerfile: Path) -> None:
        parser = DockerfileParser(path=str(dockerfile))
        stage = ""
        env: dict[str, str] = {}
        cwd = self.tmp
        for item in parser.structure:
            op, value = item["instruction"], item["value"]
            if op == "FROM":
                stage = value.split(" AS ")[-1].strip() if " AS " in value else value
                env = {"PATH": f"{self.base}/bin:/usr/bin:/bin", "HOME": str(self.tmp / "home"),
                       "LANG": "C.UTF-8"}
                cwd = self.tmp
            elif op == "ENV":
                for pair in shlex.split(value):
                    key, _, raw = pair.partition("=")
                    env[key] = self.map(self.expand(raw, env))
                # The image disables pip's cache to stay small; here the cache only saves time.
                env.pop("PIP_NO_CACHE_DIR", None)
            elif op == "WORKDIR":
                cwd = Path(self.map(value))
                cwd.mkdir(parents=True, exist_ok=True)
            elif op == "COPY":
                self._copy(value, cwd)
            elif op == "RUN":
                self._run(stage, value, env, cwd)
            elif op == "USER":
                self.user = value.split(":")[0]
            elif op == "CMD":
                self.cmd = [str(c) for c in json.loads(value)]
            self.stage_env[stage] = dict(env)

    def _copy(self, value: str, cwd: Path) -> None:
        args = shlex.split(value)
        sources, dest = args[:-1], args[-1]
        target = Path(self.map(dest)) if dest.startswith("/") else cwd / dest
        if any(a.startswith("--from=") for a in sources):
            sources = [self.map(s) for s in sources if not s.startswith("--")]
            for src in sources:
                shutil.copytree(src, target, dirs_exist_ok=True)
            return
        for src in sources:
            files = _context_files() if src == "." else [src]
            for rel in files:
                out = target / (rel if src == "." else Path(rel).name)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, out)

    def _run(self, stage: str, value: str, env: dict[str, str], cwd: Path) -> None:
        command = re.sub(r"--mount=\S+\s*", "", value).strip()
        if command.startswith("apt-get"):
            self.apt[stage] = re.findall(r"(?<=\s)(lib[\w.+-]+|gcc|make)(?=\s|$)", command)
            return
        if command.startswith(("useradd", "groupadd")):
            self.accounts.append(command)
            return
        result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                                text=True, timeout=900)
        assert result.returncode == 0, f"RUN {command!r} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    replay = Replay(tmp_path_factory.mktemp("image"))
    replay.run(ROOT / "Dockerfile")
    return replay


def test_build_stage_alone_holds_the_compiler_and_headers(image: Replay) -> None:
    assert {"gcc", "libldap2-dev", "libsasl2-dev"} <= set(image.apt["build"])
    assert not [p for p in image.apt["runtime"] if p.endswith("-dev") or p == "gcc"]
    # Each named package exists on Debian 12 (installed here by tools/test-deps.sh or as a
    # dependency of it), so the image's apt lines name real packages.
    for package in image.apt["build"] + image.apt["runtime"]:
        status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                                capture_output=True, text=True)
        assert "installed" in status.stdout, f"{package} is not a Debian 12 package here"
    assert image.user not in ("root", "0")
    venv = image.paths["/opt/venv"]
    check = subprocess.run([venv / "bin" / "python", "-c", "import ldap, django_auth_ldap, uvicorn"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the LDAP extra is in the image


def test_the_image_serves_health_and_collected_static_files(image: Replay) -> None:
    app = image.paths["/app"]
    manifest = (app / "var" / "static" / "staticfiles.json").read_text()
    hashed = re.search(r'"vendor/chartjs/chart\.umd\.min\.js": "([^"]+)"', manifest)
    assert hashed, "collectstatic did not hash Chart.js"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**image.stage_env["runtime"], "SECRET_KEY": "image-test-" + "x" * 60,
           "ALLOWED_HOSTS": "camp.example.com",
           "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/camp"}  # /healthz reads no database
    cmd = [c if c != "8000" else str(port) for c in image.cmd]
    cmd = ["127.0.0.1" if c == "0.0.0.0" else c for c in cmd]  # noqa: S104 - only loopback here
    proc = subprocess.Popen(cmd, cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(150):
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:  # noqa: S310
                    assert r.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                time.sleep(0.2)
        else:
            pytest.fail("the image's CMD never answered /healthz")
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1 only
            f"{base}/static/{hashed.group(1)}",
            headers={"Host": "camp.example.com", "X-Forwarded-Proto": "https",
                     "Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310
            assert r.status == 200
            assert r.headers["Content-Encoding"] == "gzip"  # compressed at build time
            assert "immutable" in r.headers["Cache-Control"]  # hashed names cache forever
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_demo_install_set_needs_no_compiler_and_ldap_says_what_is_missing(tmp_path: Path) -> None:
    """`make demo`'s requirements install from wheels only; without the LDAP extra, enabling
    LDAP stops start-up with a message naming the extra, never an ImportError."""
    venv = tmp_path / "demo-venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                                "--only-binary=:all:", "-r", "requirements.txt"],
                               cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr
    assert subprocess.run([python, "-c", "import ldap"], capture_output=True).returncode != 0
    base_env: dict[str, Any] = {k: v for k, v in os.environ.items()
                                if not k.startswith(("DJANGO_", "LDAP_", "DATABASE_URL", "REDIS_URL"))}
    base_env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
    ok = subprocess.run([python, "manage.py", "check"], cwd=ROOT, env=base_env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    ldap_env = {**base_env, "LDAP_ENABLED": "true", "LDAP_SERVER_URI": "ldap://127.0.0.1:1",
                "LDAP_USER_SEARCH_BASE": "ou=people,dc=example,dc=org", "LDAP_GROUP_TYPE": "memberOf"}
    check = subprocess.run([python, "manage.py", "check"], cwd=ROOT, env=ldap_env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode != 0
    assert "camp.E001" in check.stderr and "requirements-ldap.txt" in check.stderr
    assert "Traceback" not in check.stderr and "ImportError" not in check.stderr
    asgi = subprocess.run([python, "-c", "import camp.asgi"], cwd=ROOT, env=ldap_env,
                          capture_output=True, text=True, timeout=120)
    assert asgi.returncode != 0
    assert "ImproperlyConfigured: LDAP_ENABLED is true but the LDAP extra is not installed" in asgi.stderr


def test_image_user_has_a_group_labels_and_no_suite(image: Replay) -> None:
    """Issue 33, finding 7: gid 10001 is a named group (Celery's 'superuser privileges'
    warning otherwise), the image carries OCI labels, and tests/bench/docs stay out of it."""
    (accounts,) = image.accounts
    assert "groupadd --system --gid 10001 camp" in accounts
    assert "--uid 10001 --gid 10001" in accounts
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    assert {"org.opencontainers.image.title", "org.opencontainers.image.version",
            "org.opencontainers.image.revision"} <= set(parser.labels)
    assert not parser.content.startswith("# syntax=")
    shipped = _context_files()
    assert not [p for p in shipped if p.split("/")[0] in ("tests", "bench", "docs")]
    assert "manage.py" in shipped and "camp/liveness.py" in shipped


ARCH_LITERAL = re.compile(r"\b(amd64|x86_64|x86-64|aarch64|arm64|armv\d\w*|i386|i686)\b", re.IGNORECASE)


def test_the_recipe_names_no_architecture_so_it_builds_for_arm64_too() -> None:
    """Issue 33, item 7: no step is amd64-only. Nothing outside comments names an architecture
    (no `FROM --platform`, no arch-specific package or download), a download (curl, wget, ADD of
    a URL) picks its binary by BuildKit's TARGETARCH declared in its stage, and the runtime
    stage installs PostgreSQL's client tools (backup/restore) from apt, for whichever arch.
    An arm64 build itself cannot run here (no Docker daemon, no emulation): docs/DEPLOY.md
    gives the `docker buildx build --platform linux/amd64,linux/arm64` command."""
    parser = DockerfileParser(path=str(ROOT / "Dockerfile"))
    stage_args: set[str] = set()
    for instruction in parser.structure:
        name, value = instruction["instruction"], instruction["value"]
        if name == "COMMENT":
            continue
        assert not ARCH_LITERAL.search(value), f"line {instruction['startline'] + 1}: {value}"
        if name == "FROM":
            assert "--platform" not in value, value
            stage_args = set()
        if name == "ARG":
            stage_args.add(value.split("=", 1)[0].strip())
        downloads = re.search(r"\b(curl|wget)\b|https?://", value) and name in ("RUN", "ADD")
        if downloads:
            assert "TARGETARCH" in value and "TARGETARCH" in stage_args, \
                f"line {instruction['startline'] + 1} downloads without TARGETARCH: {value}"
    runtime_apt = [i["value"] for i in parser.structure
                   if i["instruction"] == "RUN" and "apt-get install" in i["value"]][-1]
    assert "postgresql-client-15" in runtime_apt.split()
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "postgresql-client-15"],
                            capture_output=True, text=True)
    assert "installed" in status.stdout  # a real Debian 12 package (its pg_dump is the suite's)
    # The documented multi-arch build names both platforms.
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    assert "docker buildx build --platform linux/amd64,linux/arm64" in deploy
