"""Database and cache: SQLite and a file cache (the demo) by default; PostgreSQL and Redis by URL."""

from typing import Any

import dj_database_url

from camp.env import ImproperlyConfiguredEnv, env_bool, env_int, env_str

from .base import VAR_DIR

# The Helm chart's evaluation mode (evaluation.enabled): an in-chart PostgreSQL and Redis for a
# trial. `manage.py doctor` reports it as a problem: not for production.
CAMP_EVALUATION = env_bool("CAMP_EVALUATION", False)
DEMO_DATABASE_URL = f"sqlite:///{VAR_DIR / 'camp.sqlite3'}"
DATABASE_URL = env_str("DATABASE_URL", DEMO_DATABASE_URL)


SUPPORTED_ENGINES = ("django.db.backends.postgresql", "django.db.backends.sqlite3")


def parse_database_url(url: str, **kw: Any) -> dict[str, Any]:
    """dj_database_url's parse, with an error that names the variable and never echoes the URL
    (it holds the password): an empty value or an unknown scheme stops the process in one line."""
    if not url.strip():
        raise ImproperlyConfiguredEnv("DATABASE_URL is set but empty: give postgres://user:password@host/db "
                                      "(or unset it for the demo's SQLite)")
    scheme = url.split("://", 1)[0] if "://" in url else ""
    refusal = ImproperlyConfiguredEnv(f"DATABASE_URL is not a database URL Camp can use (scheme "
                                      f"{scheme!r}; use postgres:// or, for the demo, sqlite://)")
    try:
        parsed = dict(dj_database_url.parse(url, **kw))
    except (ValueError, KeyError) as exc:  # dj_database_url.UnknownSchemeError is a ValueError
        raise refusal from exc
    if parsed.get("ENGINE") not in SUPPORTED_ENGINES:
        raise refusal
    return parsed


RECOMMENDED_POOL_SIZE = 8
"""Connections a process keeps for its requests (PostgreSQL; ``DB_POOL_MAX_SIZE``'s default).
Under ASGI every request runs in a thread of its own: without a pool each opens its own
connection, so an overloaded web process opened hundreds (PostgreSQL's ``max_connections`` was
reached and requests failed) and each paid a backend start; with one, requests wait their turn
for an open connection and admission control (``camp.admission``) bounds them
(docs/BENCHMARKS.md §15). ``/readyz`` checks the database on an idle pooled connection,
else on a connection of its own (``camp.health``), so a process whose database is not
reachable yet answers 503 at once instead of waiting the pool's timeout."""

POOL_RECONNECT_TIMEOUT_S = 10
"""How long the pool keeps retrying a connection that failed before it gives up until the
next request asks for one (psycopg_pool's ``reconnect_timeout``, 300 s by default). Its
retries back off exponentially (1, 2, 4 … s): with 300 s, a database back after a minute's
outage was found only at the next retry, up to a minute later, and requests waited out the
pool's timeout meanwhile; given up sooner, the next request's checkout tries again at once
(the retries' delays stay under 10 s)."""


POOL_CONNECT_TIMEOUT_S = 10
"""How long one of the pool's connection attempts waits for PostgreSQL to answer."""


def pool_options(db: dict[str, Any], max_size: int, min_size: int = 1, timeout: int = 10) -> dict[str, Any]:
    """``db`` with a psycopg connection pool of ``max_size`` per process (0: none, each request
    opens its own connection). Opening one costs the web process ~2 ms of CPU and PostgreSQL a
    backend start, on every request (issue 35); a pool hands out open ones, each checked at
    checkout (``CONN_HEALTH_CHECKS``: after a PostgreSQL restart a dead one is replaced, not
    handed to a request). Django's pool and persistent connections (``DB_CONN_MAX_AGE``)
    exclude each other; SQLite has no pool."""
    if max_size <= 0 or db.get("ENGINE") != "django.db.backends.postgresql":
        return db
    if db.get("CONN_MAX_AGE"):
        raise ImproperlyConfiguredEnv("DB_POOL_MAX_SIZE and DB_CONN_MAX_AGE exclude each other: "
                                      "set DB_CONN_MAX_AGE=0 with a pool")
    # psycopg's connect waits as long as the kernel's TCP timeout (~2 min) on a host that drops
    # packets; bounded, a failed attempt reaches the pool's retries (POOL_RECONNECT_TIMEOUT_S).
    options = {"connect_timeout": POOL_CONNECT_TIMEOUT_S, **db.get("OPTIONS", {}),
               "pool": {"min_size": min(min_size, max_size), "max_size": max_size, "timeout": timeout,
                        "reconnect_timeout": POOL_RECONNECT_TIMEOUT_S}}
    return {**db, "OPTIONS": options, "CONN_HEALTH_CHECKS": True}


def pool_size_from_env() -> int:
    """``DB_POOL_MAX_SIZE``; unset: ``RECOMMENDED_POOL_SIZE``, unless ``DB_CONN_MAX_AGE`` asks
    for persistent connections instead (the two exclude each other); 0: no pool."""
    if env_str("DB_POOL_MAX_SIZE", "") == "" and env_int("DB_CONN_MAX_AGE", 0):
        return 0
    return env_int("DB_POOL_MAX_SIZE", RECOMMENDED_POOL_SIZE)


def admission(db: dict[str, Any]) -> tuple[int, int, float]:
    """A web process's admission control (``camp.admission``) for database ``db``: requests
    run at once (``WEB_MAX_IN_FLIGHT``, default the pool's size, so none waits for a
    connection; 0: off, as without a pool), requests waiting for a turn (``WEB_MAX_WAITING``,
    default 4 × that) and how long they wait (the pool's timeout)."""
    pool = db.get("OPTIONS", {}).get("pool") or {}
    in_flight = env_int("WEB_MAX_IN_FLIGHT", int(pool.get("max_size", 0)))
    return in_flight, env_int("WEB_MAX_WAITING", 4 * in_flight), float(pool.get("timeout", 10))


DATABASES = {"default": pool_options(
    parse_database_url(DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0)),
    max_size=pool_size_from_env(), min_size=env_int("DB_POOL_MIN_SIZE", 1),
    timeout=env_int("DB_POOL_TIMEOUT", 10))}
WEB_MAX_IN_FLIGHT, WEB_MAX_WAITING, WEB_WAIT_SECONDS = admission(DATABASES["default"])
# The demo serves web and worker from one SQLite file. A busy timeout alone is not enough:
# a transaction that reads and then writes (every launch) begins DEFERRED, and when another
# process wrote meanwhile SQLite answers "database is locked" at once, without waiting
# (SQLITE_BUSY_SNAPSHOT; the timeout never applies to a read lock's upgrade). Transactions
# that take the write lock when they begin (IMMEDIATE, Django >= 5.1) wait their turn instead,
# and WAL lets pages read while the worker writes.
SQLITE_OPTIONS: dict[str, object] = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"].setdefault("OPTIONS", {}).update(SQLITE_OPTIONS)

REDIS_URL = env_str("REDIS_URL", "")

if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "camp",
        }
    }
else:
    # The demo: one cache for the web server and every worker process (files under VAR_DIR),
    # so a periodic run queued by one process is seen as queued by the others and the admin
    # home reads the tick the workers recorded (a per-process memory cache showed no lag ever).
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
                          "LOCATION": str(VAR_DIR / "cache"), "KEY_PREFIX": "camp"}}
