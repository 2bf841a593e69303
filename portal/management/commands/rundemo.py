"""Run the demo: migrate, seed, a real Celery worker (with beat) and the web server. The
worker also runs the demo's load generator (portal/demo.py; DEMO_LOAD=false turns it off),
which platform admins pause from the home page."""

import os
import signal
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

# The demo's own load (a cycle every 3 s, two clusters, the load generator) keeps one process
# busy; a second one lets a user's launch be dispatched while a cycle runs (issue 32).
DEMO_WORKER_PROCESSES = 2


def _die_with_parent() -> None:
    """In the worker's child before exec: the kernel sends it SIGTERM when this command's
    process ends in any way (Ctrl-C, SIGTERM, even SIGKILL), so stopping the demo never leaves a
    worker behind (prctl PR_SET_PDEATHSIG; Linux, where the demo runs; elsewhere a no-op)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


class _Supervisor:
    """The demo's worker, started again if it ever exits while the demo serves: a worker that
    died (an unrecoverable error, the OOM killer) left the pages up and nothing scheduled,
    with no word anywhere but the admin home's lag (issue 32). Hand-written: the demo runs
    no process manager (systemd, supervisord), and compose and Helm restart theirs."""

    RESTARTS = 5  # then the demo says so and stops trying: something is wrong for good

    def __init__(self, argv: list[str], env: dict[str, str], say: Any) -> None:
        self.argv, self.env, self.say = argv, env, say
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def _spawn(self) -> int:
        self.proc = subprocess.Popen(  # noqa: S603 (fixed argv: this interpreter running celery)
            self.argv, env=self.env, start_new_session=True, preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        return self.proc.pid

    def start(self) -> int:
        pid = self._spawn()
        threading.Thread(target=self._watch, name="demo-worker-watch", daemon=True).start()
        return pid

    def _watch(self) -> None:
        for restart in range(1, self.RESTARTS + 1):
            assert self.proc is not None
            code = self.proc.wait()
            with self.lock:
                if self.stopping.is_set():
                    return
                pid = self._spawn()
            self.say(f"The Celery worker exited (code {code}); started again (pid {pid}, "
                     f"restart {restart} of {self.RESTARTS}).")
        assert self.proc is not None
        code = self.proc.wait()
        if not self.stopping.is_set():
            self.say(f"The Celery worker exited (code {code}) {self.RESTARTS} times: nothing is "
                     "scheduled any more. Stop the demo and read its log.")

    def stop(self) -> None:
        with self.lock:
            self.stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)


class Command(BaseCommand):
    help = "Migrate, seed demo data, start a Celery worker+beat and serve http://127.0.0.1:8000."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--addr", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **options: Any) -> None:
        for sub in ("queue", "processed", "control"):
            (settings.VAR_DIR / "celery" / sub).mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo")
        # Links Camp makes to itself (a simulated notebook's Open, the ingress auth hook) name
        # the address served here, not the default localhost:8000: another port, or 127.0.0.1
        # against localhost (another cookie jar, so signed out), led nowhere (issue 32).
        camp_url = os.environ.get("CAMP_URL") or f"http://{options['addr']}:{options['port']}"
        settings.CAMP_URL = camp_url
        env = {**os.environ, "CAMP_URL": camp_url, "DJANGO_SETTINGS_MODULE": os.environ.get(
            "DJANGO_SETTINGS_MODULE", "camp.settings"),
            # the living demo: the worker's beat runs portal.tasks.demo_load_tick
            "DEMO_LOAD": os.environ.get("DEMO_LOAD", "true")}
        argv = [sys.executable, "-m", "celery", "-A", "camp", "worker", "--beat", "--loglevel=WARNING",
                f"--concurrency={DEMO_WORKER_PROCESSES}",
                "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")]
        supervisor = _Supervisor(argv, env, self.stdout.write)
        self.stdout.write(f"Celery worker started (pid {supervisor.start()}).")
        self.stdout.write(f"Camp is serving http://{options['addr']}:{options['port']}/ (Ctrl-C stops)")
        try:
            import uvicorn

            # Stopping never waits on a browser's open live-page connections for long.
            uvicorn.run("camp.asgi:application", host=options["addr"], port=options["port"],
                        log_level="warning", timeout_graceful_shutdown=5)
        finally:
            supervisor.stop()
