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
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The demo serves web and worker from one SQLite file: wait for the lock.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20

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
