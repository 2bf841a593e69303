"""Throwaway real services for fault injection: a PostgreSQL cluster, a Redis server, Camp's
web server (uvicorn), a Celery worker with its beat and any other Camp process (camp_watch),
each on a spare 127.0.0.1 port and each killed in a finaliser. Never the shared PostgreSQL
and Redis of the machine. The real kube-apiserver (start, outage, stop) is
tests/integration/realkube/harness.py's ``KubeApiserver``; the API client the burst uses is
``Client``."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import requests

from camp.settings.database import RECOMMENDED_POOL_SIZE

REPO = Path(__file__).resolve().parents[3]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb and postgres refuse to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port} after {timeout}s")


class Postgres:
    def __init__(self, root: Path) -> None:
        self.dir = root / "pg"
        self.dir.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(root, "postgres")
            shutil.chown(self.dir, "postgres")
        self.port = free_port()
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.dir), "-U", "postgres",
                                     "--auth=trust", "-E", "UTF8", "--no-sync"]),
                       check=True, capture_output=True)
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/camp"

    def _ctl(self, *args: str) -> None:
        subprocess.run(_as_postgres([
            str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-w", "-l", str(self.dir / "log"),
            "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            *args]), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """A crash: every connection dies, WAL recovery on start."""
        self._ctl("restart", "-m", "immediate")

    def stop(self) -> None:
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m",
                                     "immediate", "stop"]), capture_output=True, timeout=60)

    def connect(self, dbname: str = "camp") -> psycopg.Connection[Any]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname,
                               autocommit=True, connect_timeout=5)


class Redis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # No persistence: a restart loses every queued message and cache key.
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, start_new_session=True)
        _wait_port(self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()


@dataclass
class Service:
    """A Camp process (web or worker) in its own process group.

    ``supervised``: started again when it exits on its own, as production's supervisors do
    (docker-compose ``restart: unless-stopped``, a Kubernetes Deployment's pods); ``restarts``
    counts those. A :meth:`kill` (or :meth:`restart`) is deliberate and is not undone. The
    fault test asserts that neither process needed it: an exit of its own is a defect (Celery
    5.7.0's worker used to exit after a broker reconnect, "Unrecoverable error:
    AttributeError ... conninfo.hostname"; camp/kombu_redis_close.py), and the supervisor
    keeps the run going so that the rest of its figures are still measured."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    port: int | None = None
    supervised: bool = False
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    restarts: int = field(default=0, init=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _halted: bool = field(default=True, init=False, repr=False)
    _watcher: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        with self._lock:
            self._spawn()
            self._halted = False
            if self.supervised and (self._watcher is None or not self._watcher.is_alive()):
                self._watcher = threading.Thread(target=self._watch, daemon=True,
                                                 name=f"supervise-{self.log.stem}")
                self._watcher.start()
        if self.port:
            _wait_port(self.port, timeout=60)

    def _spawn(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=REPO, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                if self._halted:
                    return
                if self.proc is not None and self.proc.poll() is not None:
                    with open(self.log, "ab") as out:
                        out.write(f"\n[supervisor] exited with {self.proc.returncode};"
                                  " starting it again\n".encode())
                    self.restarts += 1
                    self._spawn()

    def kill(self) -> None:
        """SIGKILL, the whole group (a prefork worker's children too)."""
        with self._lock:
            self._halted = True
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()


@dataclass
class Stack:
    pg: Postgres
    redis: Redis
    web: Service
    worker: Service
    env: dict[str, str]
    root: Path
    extra: list[Service] = field(default_factory=list)  # killed with the stack

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.web.port}"

    def manage_service(self, name: str, *args: str) -> Service:
        """Start another long-running Camp process (``manage.py <args>``, e.g. camp_watch),
        logging to ``<name>.log``; SIGKILLed when the stack ends."""
        service = Service([sys.executable, "manage.py", *args], self.env, self.root / f"{name}.log")
        self.extra.append(service)
        service.start()
        return service

    def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """A query on the throwaway database (a fresh connection: it may have restarted)."""
        with self.pg.connect() as conn:
            return list(conn.execute(sql, args).fetchall())

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", *args], env=self.env, cwd=REPO,
                              capture_output=True, text=True, timeout=300, check=check)

    def python(self, code: str) -> str:
        done = subprocess.run([sys.executable, "-c", "import django; django.setup()\n" + code],
                              env=self.env, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout


@contextmanager
def camp_stack(*, tick_seconds: int = 2) -> Iterator[Stack]:
    """PostgreSQL + Redis + uvicorn + a Celery worker with embedded beat, all throwaway."""
    with ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="camp-faults-"))
        if os.environ.get("CAMP_FAULTS_KEEP_LOGS"):  # debugging: keep the processes' logs
            print(f"fault-suite logs in {root}")
        else:
            stack.callback(shutil.rmtree, root, True)
        pg = Postgres(root)
        pg.start()
        stack.callback(pg.stop)
        redis = Redis()
        redis.start()
        stack.callback(redis.kill)
        with pg.connect("postgres") as conn:
            conn.execute("CREATE DATABASE camp")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_",
                                                                          "CELERY_"))},
               "DJANGO_SETTINGS_MODULE": "camp.settings.test", "DATABASE_URL": pg.url,
               "REDIS_URL": redis.url, "CELERY_BROKER_URL": redis.url,
               "CAMP_TEST_RUN_ID": f"faults-{os.getpid()}",
               "SCHEDULER_TICK_SECONDS": str(tick_seconds), "PYTHONUNBUFFERED": "1",
               # The production retry ladder (camp/settings/tasks.py), not the test settings'
               # short one: the faults are struck at the processes as they run in production.
               "CAMP_KUBE_API_BACKOFF_MS": "200",
               # The recommended connection pool (each connection checked at checkout), so a
               # PostgreSQL crash is survived as an installed web server and worker survive it.
               "DB_POOL_MAX_SIZE": str(RECOMMENDED_POOL_SIZE)}
        migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], env=env,
                                 cwd=REPO, capture_output=True, text=True, timeout=600)
        assert migrate.returncode == 0, migrate.stderr
        web_port = free_port()
        web = Service([sys.executable, "-m", "uvicorn", "camp.asgi:application", "--host",
                       "127.0.0.1", "--port", str(web_port), "--workers", "1", "--no-access-log"],
                      env, root / "web.log", port=web_port, supervised=True)
        worker = Service([sys.executable, "-m", "celery", "-A", "camp", "worker", "-B",
                          "--schedule", str(root / "beat-schedule"), "--pool=prefork",
                          "--concurrency=2", "--loglevel=WARNING", "--without-gossip",
                          "--without-mingle", "-n", f"faults-{os.getpid()}@localhost"],
                         env, root / "worker.log", supervised=True)
        web.start()
        stack.callback(web.kill)
        worker.start()
        stack.callback(worker.kill)
        camp = Stack(pg=pg, redis=redis, web=web, worker=worker, env=env, root=root)

        def kill_extra() -> None:
            for service in camp.extra:
                service.kill()

        stack.callback(kill_extra)
        yield camp


RETRY_FOR = 90.0  # seconds a client keeps retrying one call


class Client:
    """The API, called the way a careful client does (Camp's CLI): a call that got no answer
    or a 5xx is retried with the same Idempotency-Key."""

    def __init__(self, stack: Stack, token: str, cluster: str = "sim") -> None:
        self.stack = stack
        self.cluster = cluster
        self.headers = {"Authorization": f"Bearer {token}"}
        self.failed_calls = 0  # attempts that got no answer or a 5xx (then retried)
        self.lock = threading.Lock()

    def call(self, method: str, path: str, *, ok: tuple[int, ...], **kw: Any) -> requests.Response:
        deadline = time.monotonic() + RETRY_FOR
        headers = {**self.headers, **kw.pop("headers", {})}  # the same key on every retry
        while True:
            try:
                r = requests.request(method, self.stack.base_url + path, headers=headers,
                                     timeout=10, **kw)
                if r.status_code in ok:
                    return r
                assert r.status_code >= 500, (method, path, r.status_code, r.text[:300])
            except requests.RequestException:
                pass
            with self.lock:
                self.failed_calls += 1
            assert time.monotonic() < deadline, f"{method} {path} kept failing"
            time.sleep(0.3)

    def submit(self, project: int, name: str, gpus: int, **extra: Any) -> int:
        body = {"name": name, "project": project, "cluster": self.cluster, "duration_seconds": 3,
                "groups": [{"name": "w", "replicas": 1, "gpu_count": gpus,
                            "gpu_memory_mib": 20000, "gpu_cores_percent": 25,
                            "cpu_millicores": 1000, "ram_mib": 1024}], **extra}
        r = self.call("POST", "/api/v1/jobs/", ok=(201,), json=body,
                      headers={"Idempotency-Key": str(uuid.uuid4())})
        return int(r.json()["id"])

    def cancel(self, job_id: int) -> None:
        # A retried cancel may find the job already cancelled (or already finished): 400.
        self.call("POST", f"/api/v1/jobs/{job_id}/cancel/", ok=(200, 400))


class Burst:
    """A burst of submits through the API for a fault test: ``threads`` threads submit until
    ``stop`` is set, each pausing ``pace`` seconds between submits; every third job is
    cancelled and one in thirty asks 16 GPUs (never fits: rejected). ``names`` lists every job
    the test expects to exist (pass the ones it made before the burst), ``submitted`` maps
    the burst's names to job ids, ``errors`` holds what a thread raised, ``done`` is set when
    every thread has ended."""

    def __init__(self, client: Client, project: int, *, threads: int, pace: float,
                 names: list[str] | None = None) -> None:
        self.client, self.project, self.threads, self.pace = client, project, threads, pace
        self.names: list[str] = names if names is not None else []
        self.submitted: dict[str, int] = {}
        self.stop, self.done = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self._counter = iter(range(10_000))
        self._lock = threading.Lock()

    def _submitter(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                i = next(self._counter)
                self.names.append(f"burst-{i}")
            gpus = 16 if i % 30 == 29 else 1 + (i % 2)  # a few can never fit: rejected
            job_id = self.client.submit(self.project, f"burst-{i}", gpus)
            self.submitted[f"burst-{i}"] = job_id
            if i % 3 == 0:
                self.client.cancel(job_id)
            time.sleep(self.pace)

    def run(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        try:
            with ThreadPoolExecutor(max_workers=self.threads) as pool:
                for f in [pool.submit(self._submitter) for _ in range(self.threads)]:
                    f.result()
        except BaseException as exc:  # reported by the test's main thread
            self.errors.append(exc)
        finally:
            self.done.set()
