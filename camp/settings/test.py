"""Test settings: the real PostgreSQL and Redis of DESIGN.md §6.

Importing this module imports the package (and so the SQLite defaults) first;
the database, cache, broker and channel layer are therefore set again here.
"""

import os

import dj_database_url

from camp.env import env_str

from . import *  # noqa: F403

DATABASE_URL = env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/camp")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
# One test database per pytest process, so concurrent runs on one machine never
# drop each other's database (pytest-xdist adds its own worker suffix).
DATABASES["default"]["TEST"] = {"NAME": env_str("CAMP_TEST_DB", f"test_camp_{os.getpid()}")}
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/15")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "camp-test",
    }
}
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL]},
    }
}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; tests only
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
