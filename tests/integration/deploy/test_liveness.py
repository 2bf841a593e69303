"""Worker, beat and watcher have liveness probes that pass while their loops make progress and
fail when they stop (issue 33, finding 3). The commands are read from the rendered chart and
docker-compose.yml and run as the kubelet or Docker would, against real processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings

from camp import liveness

from .test_helm import BASE_VALUES, CHART, _run
from .tools import ROOT, install_tools

VENV_BIN = str(Path(sys.executable).parent)


def _chart_probes() -> dict[str, list[str]]:
    helm = install_tools()["helm"]
    result = _run([helm, "template", "r1", CHART, *BASE_VALUES, "--set", "watcher.clusters={prod}"])
    assert result.returncode == 0, result.stderr
    probes = {}
    for doc in yaml.safe_load_all(result.stdout):
        if doc and doc["kind"] == "Deployment":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            probe = container.get("livenessProbe", {})
            if "exec" in probe:
                probes[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = probe["exec"]["command"]
    return probes


def _compose_probes() -> dict[str, list[str]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return {name: [part.replace("$$", "$") for part in services[name]["healthcheck"]["test"][1:]]
            for name in ("worker", "beat", "watcher")}


def test_chart_and_compose_probe_every_process_alike() -> None:
    chart, compose = _chart_probes(), _compose_probes()
    assert set(chart) == {"worker", "beat", "watcher"}
    assert chart == compose
    assert chart["worker"] == ["sh", "-c", liveness.WORKER_PROBE]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    db = settings.DATABASES["default"]
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test",
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "CAMP_TEST_RUN_ID": settings.TEST_RUN_ID, "CAMP_LIVENESS_DIR": str(tmp_path),
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", **extra}


def _probe(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _until(predicate: Any, what: str, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_beat_probe_passes_while_it_ticks_and_fails_once_it_stalls(
    tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    probe = _chart_probes()["beat"]
    # An in-memory broker: this beat's ticks reach no queue of the suite.
    env = _env(tmp_path, CELERY_BROKER_URL="memory://")
    assert _probe(probe, env).returncode == 1  # no beat yet: no mark
    beat = subprocess.Popen([sys.executable, "-m", "celery", "-A", "camp", "beat", "--loglevel=WARNING",
                             "--schedule", str(tmp_path / "schedule")], cwd=ROOT, env=env,
                            start_new_session=True, text=True)
    processes.append(beat)
    _until(lambda: _probe(probe, env).returncode == 0, "the beat never marked its liveness")
    os.killpg(beat.pid, signal.SIGSTOP)  # wedged: the process exists, its loop does not run
    stalled = [*probe, "--max-age", "3"]
    _until(lambda: _probe(stalled, env).returncode == 1, "a stalled beat still looked alive")
    assert "beat: last progress" in _probe(stalled, env).stderr
    os.killpg(beat.pid, signal.SIGCONT)
    _until(lambda: _probe(stalled, env).returncode == 0, "the resumed beat did not mark again")


def test_worker_probe_pings_its_own_node(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    from camp.celery import app

    probe = _chart_probes()["worker"]
    host = f"probe-{os.getpid()}"
    env = _env(tmp_path, HOSTNAME=host)
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "camp", "worker", "--pool=solo",
                               "--loglevel=WARNING", "--without-gossip", "--without-mingle",
                               "-n", f"celery@{host}"], cwd=ROOT, env=env, start_new_session=True,
                              text=True)
    processes.append(worker)
    _until(lambda: bool(app.control.ping(destination=[f"celery@{host}"], timeout=0.5)),
           "the worker did not start")
    alive = _probe(probe, env)
    assert alive.returncode == 0, alive.stdout + alive.stderr
    os.killpg(worker.pid, signal.SIGSTOP)  # a wedged consumer answers nothing
    try:
        wedged = _probe(probe, env)
        assert wedged.returncode != 0
    finally:
        os.killpg(worker.pid, signal.SIGCONT)


@pytest.mark.django_db(transaction=True)
def test_watcher_logs_its_start_and_marks_while_it_retries(tmp_path: Path) -> None:
    """A watcher whose API server is away backs off and stays alive (a restart would not
    help); it says on start which cluster it watches and where its mark is."""
    from scheduling.models import Cluster

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    Cluster.objects.create(name="probe-away", backend="kubernetes", api_server=f"https://127.0.0.1:{closed}")
    probe = _chart_probes()["watcher"]
    env = _env(tmp_path)
    assert _probe(probe, env).returncode == 1
    run = subprocess.run([sys.executable, "manage.py", "camp_watch", "--cluster", "probe-away",
                          "--duration", "4"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "camp_watch of probe-away starting" in run.stderr
    assert _probe(probe, env).returncode == 0
