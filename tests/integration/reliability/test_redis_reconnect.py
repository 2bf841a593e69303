"""A Celery worker of Camp survives Redis going away and coming back, again and again.

Celery 5.7.0 with kombu 5.7.0 made the worker exit ("Unrecoverable error: AttributeError:
'NoneType' object has no attribute 'hostname'") after most such reconnects while it held
unacknowledged messages (camp/kombu_redis_close.py says why and what fixes it). Here a real
worker with its beat runs against a throwaway redis-server, which is SIGKILLed and started
again (nothing persisted) several times; after each return the worker process must still
be the same, running one, and after the last it must consume tasks again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from .harness import REPO, Redis

RECONNECTS = 6
SETTLE_SECONDS = 6.0  # the worker notices the loss at once and retries every 2 s


def _follow_done(url: str) -> int:
    try:
        return int(redis.Redis.from_url(url, socket_timeout=2).get("reconnect:follow-done") or 0)
    except redis.RedisError:
        return 0


def test_worker_survives_repeated_redis_restarts() -> None:
    server = Redis()
    server.start()
    root = Path(tempfile.mkdtemp(prefix="camp-reconnect-"))
    log_path = root / "worker.log"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "CELERY_"))},
        "DJANGO_SETTINGS_MODULE": "camp.settings.test",
        "REDIS_URL": server.url,
        "CELERY_BROKER_URL": server.url,
        "CAMP_TEST_RUN_ID": f"reconnect-{os.getpid()}",
        "PYTHONUNBUFFERED": "1",
    }
    with open(log_path, "ab") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.integration.reliability.reconnect_app",
                "worker",
                "-B",
                "--schedule",
                str(root / "beat-schedule"),
                "--pool=prefork",
                "--concurrency=2",
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"reconnect-{os.getpid()}@localhost",
            ],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def tail() -> str:
        return log_path.read_text(errors="replace")[-4000:]

    def wait_consuming(what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while _follow_done(server.url) < 2:
            assert worker.poll() is None, f"the worker exited {what}:\n{tail()}"
            assert time.monotonic() < deadline, f"no task ran {what} in {timeout}s:\n{tail()}"
            time.sleep(0.2)

    rng = random.Random(7)
    try:
        wait_consuming("at start")
        for i in range(1, RECONNECTS + 1):
            server.kill()  # every queued message and unacked copy goes with it
            time.sleep(rng.choice([0.0, 0.2, 0.5]))
            server.start()
            time.sleep(SETTLE_SECONDS)
            assert worker.poll() is None, (
                f"the worker exited after Redis restart {i} of {RECONNECTS}"
                f" (exit code {worker.returncode}):\n{tail()}"
            )
        wait_consuming("after the last restart")
        assert "Unrecoverable error" not in log_path.read_text(errors="replace"), tail()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(10)
        server.kill()
        subprocess.run(["rm", "-rf", str(root)], check=False)
