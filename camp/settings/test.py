"""Test settings: the real PostgreSQL and Redis of DESIGN.md §6.

Importing this module imports the package (and so the SQLite defaults) first;
the database, cache, broker and channel layer are therefore set again here.
"""

import os

from camp.env import env_int, env_str

from . import *  # noqa: F403
from .database import admission, parse_database_url, pool_options
from .tasks import CHANNEL_LAYER_SOCKET_TIMEOUT_S, celery_queues

DATABASE_URL = env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/camp")
# Each test run owns its database, Celery queue and cache keys, so concurrent runs on one
# machine never share them. A worker subprocess joins its run with CAMP_TEST_RUN_ID.
TEST_RUN_ID = env_str("CAMP_TEST_RUN_ID", str(os.getpid()))
DATABASES = {"default": parse_database_url(DATABASE_URL)}
DATABASES["default"]["TEST"] = {"NAME": f"test_camp_{TEST_RUN_ID}"}
# Only the test suite empties the audit log between tests (Django's flush TRUNCATEs every
# table); everywhere else the camp_audit_no_truncate trigger refuses it (tenants migration 0010).
DATABASES["default"]["OPTIONS"] = {"options": "-c camp.audit_allow_truncate=on"}
# The suite's own process opens a connection per request (no pool: pytest-django's test
# databases and a pool do not mix); processes it starts as production runs them (the fault
# suite's web server and worker) set DB_POOL_MAX_SIZE and get production's checked pool.
DATABASES["default"] = pool_options(DATABASES["default"], env_int("DB_POOL_MAX_SIZE", 0),
                                    min_size=env_int("DB_POOL_MIN_SIZE", 1),
                                    timeout=env_int("DB_POOL_TIMEOUT", 10))
WEB_MAX_IN_FLIGHT, WEB_MAX_WAITING, WEB_WAIT_SECONDS = admission(DATABASES["default"])
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/15")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": f"camp-test-{TEST_RUN_ID}",
    }
}
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_TASK_DEFAULT_QUEUE = f"camp-test-{TEST_RUN_ID}"
SCHEDULING_QUEUE, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES = celery_queues(CELERY_TASK_DEFAULT_QUEUE)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # as production's (camp/settings/tasks.py): the read outlasts channels_redis's 5-s block
        "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}]},
    }
}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast; tests only
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# The Kubernetes API retry ladder (settings/tasks.py) with 20 ms instead of 200 ms as its first
# step: the same 4 retries, 0.3 s instead of 3 s per call that a dead server refuses. Tests of a
# cluster whose API server is gone (dispatch failover, reconcile of an unreachable cluster)
# otherwise sleep through the ladder on every call. The reliability suite's throwaway stack sets
# the production value back (tests/integration/reliability/harness.py).
CAMP_KUBE_API_BACKOFF_MS = env_int("CAMP_KUBE_API_BACKOFF_MS", 20)
# One installation id for the test process and the worker subprocesses it starts: the test
# database is emptied between tests, and an id generated at first use (and cached per process)
# would then differ between them (production keeps the generated row for good).
CAMP_INSTALLATION_ID = env_str("CAMP_INSTALLATION_ID", "camp-test")
