"""Liveness and readiness for probes and load balancers: ``/healthz`` and ``/readyz``.

Served by a middleware placed first, before host validation, the HTTPS redirect,
sessions and django-axes: a kubelet probes ``http://<pod IP>:8000/readyz``, which is
neither an allowed host nor HTTPS, and must still get an answer. The answers carry no
secret: component names and an exception class, never a URL or a message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger("camp.health")

HEALTH_PATHS = ("/healthz", "/readyz")
_migrations_done = False  # once applied, a process's code cannot gain new migrations


PROBE_CONNECT_TIMEOUT_S = 3
"""How long the readiness checks wait for PostgreSQL to accept a connection of their own
(below the chart's readinessProbe timeout of 5 s)."""


@contextmanager
def _probe_connection() -> Iterator[Any]:
    """The database connection the readiness checks run on. Without a pool, the process's
    own (a new one per request anyway). With one (``DB_POOL_MAX_SIZE``, the default), a
    connection of their own, opened here with a short connect timeout and closed after: a
    pool cannot answer "unreachable" at once. While its connection attempts fail (a web
    process started before ``migrate`` created its role, a database that is down) it keeps
    the caller waiting the whole ``DB_POOL_TIMEOUT`` and then raises a timeout that hides the
    cause, so a probe through it timed out instead of answering 503 (issue 35). Used until the
    migrations are found applied and whenever the pool has no idle connection that answers
    (``_pooled_connection_answers``)."""
    default = connections["default"]
    options = dict(default.settings_dict.get("OPTIONS") or {})
    if not options.pop("pool", None):
        yield default
        return
    options["connect_timeout"] = PROBE_CONNECT_TIMEOUT_S
    probe = type(default)({**default.settings_dict, "OPTIONS": options, "CONN_MAX_AGE": 0,
                           "CONN_HEALTH_CHECKS": False}, alias=default.alias)
    # The migrations check reads django_migrations by alias (MigrationRecorder uses
    # ``connections["default"]``), so the probe stands in for it in this request's context only
    # (Django's connection handler is context-local); otherwise that query took the pool's turn.
    connections["default"] = probe
    try:
        yield probe
    finally:
        connections["default"] = default
        probe.close()


PROBE_POOL_WAIT_S = 0.5
"""How long a readiness check waits for an idle connection of the process's own pool before
it opens one of its own instead."""


def _pooled_connection_answers() -> bool:
    """Whether an idle connection of this process's pool answers ``SELECT 1`` within
    ``PROBE_POOL_WAIT_S``. When it does, the probe needs no backend of its own. At PostgreSQL's
    ``max_connections``, opening one would fail: every web pod would then be marked unready at
    once, although their pools still serve. False when there is no pool, it is not open yet,
    every connection is busy, or the one it got fails. The probe's own connection then gives
    the verdict and names the cause."""
    pool = getattr(connections["default"], "pool", None)  # PostgreSQL only
    if pool is None:
        return False
    try:
        raw = pool.getconn(timeout=PROBE_POOL_WAIT_S)
    except Exception:  # noqa: BLE001 - not open yet, all busy (PoolTimeout), closed: ask directly
        return False
    try:
        raw.execute("SELECT 1")
        raw.rollback()  # a no-op in autocommit; otherwise the pool need not roll it back
        return True
    except Exception:  # noqa: BLE001 - a dead connection: the pool replaces it; ask directly
        return False
    finally:
        pool.putconn(raw)


def database_problem(conn: Any) -> str | None:
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any driver error means "not ready"
        logger.warning("readiness: database unreachable: %s", exc)
        return f"unreachable ({type(exc).__name__})"
    return None


def redis_urls() -> list[str]:
    """The Redis servers this process needs: cache and channel layer, and the broker."""
    urls = [settings.REDIS_URL] if settings.REDIS_URL else []
    broker = str(getattr(settings, "CELERY_BROKER_URL", ""))
    if broker.startswith(("redis://", "rediss://")) and broker not in urls:
        urls.append(broker)
    return urls


def redis_problem() -> str | None:
    for index, url in enumerate(redis_urls()):
        try:
            client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
            try:
                client.ping()
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - any client error means "not ready"
            logger.warning("readiness: redis #%d unreachable: %s", index, type(exc).__name__)
            name = "REDIS_URL" if url == settings.REDIS_URL else "CELERY_BROKER_URL"
            return f"{name} unreachable ({type(exc).__name__})"
    return None


def migrations_problem(conn: Any) -> str | None:
    global _migrations_done
    if _migrations_done:
        return None
    try:
        executor = MigrationExecutor(conn)
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # noqa: BLE001 - the database check names the cause
        return f"unknown ({type(exc).__name__})"
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        more = f" and {len(plan) - 5} more" if len(plan) > 5 else ""
        return f"{len(plan)} not applied: {names}{more} (run manage.py migrate)"
    _migrations_done = True
    return None


READINESS_REQUIRES = ("database", "migrations")
"""What a web process needs to serve pages; /readyz is 503 only when one of these fails.
Redis is reported but not required: every web pod shares it, so an outage would take all of
them out of the Service at once while pages (sessions and data live in PostgreSQL) still
work; live updates and enqueued work wait for it, and the worker's liveness and the alerts
(docs/DEPLOY.md "Day 2") watch it."""


def readiness() -> dict[str, str]:
    """Each component → "ok" or what is wrong. Migrations are only asked of a reachable DB."""
    result: dict[str, str] = {}
    if _migrations_done and _pooled_connection_answers():
        # Both checks hold: the pool's connection answered, and migrations, once applied,
        # stay applied for this process's code.
        result["database"] = result["migrations"] = "ok"
    else:
        with _probe_connection() as conn:
            db = database_problem(conn)
            result["database"] = db or "ok"
            result["migrations"] = "unknown (database unreachable)" if db else (
                migrations_problem(conn) or "ok")
    if redis_urls():
        result["redis"] = redis_problem() or "ok"
    return {name: result[name] for name in ("database", "redis", "migrations") if name in result}


def _json(status: int, body: dict[str, object]) -> HttpResponse:
    response = HttpResponse(json.dumps(body), status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


class HealthCheckMiddleware:
    """Answers the two probe paths; everything else passes through."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path not in HEALTH_PATHS:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = _json(405, {"status": "method not allowed"})
            response["Allow"] = "GET, HEAD"
            return response
        if request.path == "/healthz":
            return _json(200, {"status": "ok"})
        checks = readiness()
        ready = all(checks[name] == "ok" for name in READINESS_REQUIRES)
        status = ("ok" if all(v == "ok" for v in checks.values()) else "degraded") if ready else "unavailable"
        return _json(200 if ready else 503, {"status": status, "checks": checks})
