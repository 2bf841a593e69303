"""Database and cache: SQLite and local memory by default; PostgreSQL and Redis by URL."""

import dj_database_url

from camp.env import env_int, env_str

from .base import BASE_DIR

DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{BASE_DIR / 'var' / 'camp.sqlite3'}")
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=env_int("DB_CONN_MAX_AGE", 0)
    ),
}
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
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
