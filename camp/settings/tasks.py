"""Celery and Channels.

With REDIS_URL both use Redis. Without it (the demo) Celery uses kombu's
filesystem transport, so a real ``celery worker`` process runs the same tasks as
production with no server at all, and Channels uses its in-memory layer.
"""

from camp.env import env_bool, env_int, env_list, env_str
from workspaces import serving_load as _serving_load  # PromQL defaults (no Django imports)

from .base import VAR_DIR
from .database import REDIS_URL

_queue_dir = VAR_DIR / "celery"

# channels_redis waits for a live page's messages with BZPOPMIN, which Redis answers after
# ``brpop_timeout`` (5 s) when nothing came; redis-py 8 reads with a 5-s socket timeout by
# default, so an idle wait raced it and lost under load ("Timeout reading from …"), which
# ended the page's WebSocket consumer: the page stopped updating. The read must outlast the
# block; a dead connection still times out (after 15 s).
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 15

if REDIS_URL:
    CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}]},
        }
    }
else:
    CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        # broadcast (remote control) exchanges; kombu defaults to ./control
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
        # kombu polls a folder: with its default (1 s) a worker slept a second whenever its
        # prefetch was full or the folder empty, so the demo's few hundred short tasks a minute
        # queued for 10–50 s on an idle machine (issue 32). A listdir of a small folder is cheap.
        "polling_interval": 0.1,
    }
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_TASK_IGNORE_RESULT = True
# Django's LOGGING (camp/logs.py) formats the worker's and beat's lines too, with task ids.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Only for unit-style runs that cannot start a worker; never in the demo or production.
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}
# Celery's persistent scheduler, marking the beat's liveness at every tick (camp/liveness.py).
CELERY_BEAT_SCHEDULER = "camp.beat:LivenessScheduler"

# --- Scheduler (scheduling/tasks.py) ----------------------------------------------------------
# A dead worker's task goes back to the queue (its cycle's transaction rolled back).
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Two queues, both consumed by every worker (a worker started without -Q consumes all of
# CELERY_TASK_QUEUES): the scheduler's own steps (the tick, a cluster's cycle, the placement
# step) in "scheduling", everything else in "celery". Kombu serves a worker's queues in turn
# (round robin, the queue that just delivered goes last), so a cycle waits for at most one
# task of a backlog instead of all of it: a burst of admissions queues one dispatch per job
# (40,000 at once in bench/scale_out.py), and in one FIFO queue the ticks behind them expired
# unrun, so nothing more was admitted until every dispatch had run (docs/BENCHMARKS.md §14).
SCHEDULING_TASKS = ("scheduling.tasks.scheduler_tick", "scheduling.tasks.cluster_cycle",
                    "scheduling.tasks.placement_step")


def celery_queues(default: str) -> tuple[str, dict[str, dict[str, object]], dict[str, dict[str, str]]]:
    """(the scheduling queue's name, ``CELERY_TASK_QUEUES``, ``CELERY_TASK_ROUTES``) beside the
    ``default`` queue (the test settings name theirs per run)."""
    scheduling = f"{default}.scheduling"
    return scheduling, {scheduling: {}, default: {}}, {t: {"queue": scheduling} for t in SCHEDULING_TASKS}


CELERY_TASK_DEFAULT_QUEUE = "celery"
SCHEDULING_QUEUE, CELERY_TASK_QUEUES, CELERY_TASK_ROUTES = celery_queues(CELERY_TASK_DEFAULT_QUEUE)
SCHEDULER_TICK_SECONDS = env_int("SCHEDULER_TICK_SECONDS", 3)
# Jobs tried per project queue in one cycle (0: all). See docs/BENCHMARKS.md §queueing.
SCHEDULER_HEADS_PER_QUEUE = env_int("SCHEDULER_HEADS_PER_QUEUE", 8)
# On a cluster with room, each queue also offers the jobs whose asks fit its share of the free
# room, and a cycle refills what room its first pass left (scheduling.engine.cycle
# CycleConfig.heads_fill, read by scheduling.services.cycle_config): a burst in one cycle.
SCHEDULER_HEADS_FILL = env_bool("SCHEDULER_HEADS_FILL", True)
SCHEDULER_INVENTORY_SECONDS = env_int("SCHEDULER_INVENTORY_SECONDS", 60)
# The admin home says the scheduler is lagging when its tick waited longer than this in the
# worker's queue (or a periodic cluster run this much longer than its run budget).
SCHEDULER_LAG_SECONDS = env_int("SCHEDULER_LAG_SECONDS", 10)
CELERY_BEAT_SCHEDULE.update({
    "scheduler-tick": {"task": "scheduling.tasks.scheduler_tick",
                       "schedule": float(SCHEDULER_TICK_SECONDS)},
    "inventory-tick": {"task": "scheduling.tasks.inventory_tick",
                       "schedule": float(SCHEDULER_INVENTORY_SECONDS)},
})
# The optional utilisation feed (clusters with a Prometheus URL), and how old a reading may
# be before the scheduler ignores it (scheduling/selectors.py).
SCHEDULER_UTILIZATION_SECONDS = env_int("SCHEDULER_UTILIZATION_SECONDS", 30)
SCHEDULER_UTILIZATION_MAX_AGE_SECONDS = env_int("SCHEDULER_UTILIZATION_MAX_AGE_SECONDS", 120)
# How old a waiting reason may be (its cluster's last cycle) before pages mark it stale (issue 29).
SCHEDULER_REASON_STALE_SECONDS = env_int("SCHEDULER_REASON_STALE_SECONDS", 300)
CELERY_BEAT_SCHEDULE["utilization-tick"] = {
    "task": "scheduling.tasks.utilization_tick", "schedule": float(SCHEDULER_UTILIZATION_SECONDS),
}
# Fernet keys for cluster credentials at rest (first encrypts, all decrypt); empty: a key
# derived from SECRET_KEY (scheduling/backends/credentials.py).
CAMP_ENCRYPTION_KEYS = env_list("CAMP_ENCRYPTION_KEY", [])

# --- Audit chain (tenants/audit.py): writers seal after their commit; this sweeps up the rows
# a race left unsealed, so no event stays outside the chain longer than this.
AUDIT_SEAL_SECONDS = env_int("AUDIT_SEAL_SECONDS", 10)
CELERY_BEAT_SCHEDULE["audit-seal"] = {
    "task": "tenants.tasks.audit_seal", "schedule": float(AUDIT_SEAL_SECONDS),
}

# The chain's head, checkpointed outside the database (tenants/anchor.py): appended to
# AUDIT_ANCHOR_PATH (an append-only file or volume the database role cannot rewrite), signed
# with AUDIT_ANCHOR_KEY (a key the database never holds). audit_verify checks against it.
AUDIT_ANCHOR_PATH = env_str("AUDIT_ANCHOR_PATH", "")
AUDIT_ANCHOR_KEY = env_str("AUDIT_ANCHOR_KEY", "")
AUDIT_ANCHOR_SECONDS = env_int("AUDIT_ANCHOR_SECONDS", 300)
CELERY_BEAT_SCHEDULE["audit-anchor"] = {
    "task": "tenants.tasks.audit_anchor", "schedule": float(AUDIT_ANCHOR_SECONDS),
}

# --- LDAP re-sync (tenants/sso/ldap_sync.py): directories without SCIM deprovision through it.
# Every directory account is read again this often: roles whose groups are gone are revoked,
# accounts removed or locked (ppolicy) in the directory are deactivated. 0 turns it off.
LDAP_SYNC_SECONDS = env_int("LDAP_SYNC_SECONDS", 300)
if LDAP_SYNC_SECONDS > 0:
    CELERY_BEAT_SCHEDULE["ldap-sync"] = {
        "task": "tenants.tasks.ldap_sync", "schedule": float(LDAP_SYNC_SECONDS),
        "options": {"expires": float(LDAP_SYNC_SECONDS)},  # never a queue of stale runs
    }

# --- Portal (portal/tasks.py): usage samples for charts, showback and /metrics ---------------
USAGE_SAMPLE_SECONDS = env_int("USAGE_SAMPLE_SECONDS", 60)
SHOWBACK_CURRENCY = env_str("SHOWBACK_CURRENCY", "USD")  # what the prices of showback are in
USAGE_RETENTION_DAYS = env_int("USAGE_RETENTION_DAYS", 400)
# When set, /metrics requires `Authorization: Bearer <METRICS_TOKEN>`. Without it, /metrics is
# open only when METRICS_PUBLIC is true (the demo's default; production's is false, where a
# platform admin's session still works).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", True)
CELERY_BEAT_SCHEDULE["usage-sample"] = {
    "task": "portal.tasks.usage_sample_all", "schedule": float(USAGE_SAMPLE_SECONDS),
}
# The demo's load generator (portal/demo.py): `manage.py rundemo` turns it on for its worker.
DEMO_LOAD = env_bool("DEMO_LOAD", False)
DEMO_LOAD_SECONDS = env_int("DEMO_LOAD_SECONDS", 20)
DEMO_LOAD_MAX_HOURS = env_int("DEMO_LOAD_MAX_HOURS", 12)
if DEMO_LOAD:
    CELERY_BEAT_SCHEDULE["demo-load"] = {
        "task": "portal.tasks.demo_load_tick", "schedule": float(DEMO_LOAD_SECONDS),
    }

# --- Kubernetes (scheduling/backends/kubernetes.py, docs/KUBERNETES.md) ---------------------
# Camp's pods name Camp as their scheduler: HAMi's webhook leaves such pods alone (it takes
# over pods of the default scheduler and refuses them when already bound).
CAMP_SCHEDULER_NAME = env_str("CAMP_SCHEDULER_NAME", "camp-scheduler")
# This installation's identity on every object it creates in a cluster (camp.io/installation):
# empty means the one generated at first use and kept in the database (scheduling.models
# installation_id). Two installations sharing a cluster each touch only their own objects.
CAMP_INSTALLATION_ID = env_str("CAMP_INSTALLATION_ID", "")
# How long a GPU pod on a HAMi node may wait for the device plugin's bind-phase answer, and
# for another pod's node lock, before its dispatch fails with a reason.
CAMP_HAMI_BIND_TIMEOUT_SECONDS = env_int("CAMP_HAMI_BIND_TIMEOUT_SECONDS", 60)
# A starting pod that reports a problem stopping it (an image it cannot pull, a volume that is
# not bound, a configuration error) gives up this long after admission: the job fails (image,
# configuration) or is requeued (volume, node), freeing what it holds (scheduling/backends/podcause.py).
CAMP_POD_START_PROBLEM_SECONDS = env_int("CAMP_POD_START_PROBLEM_SECONDS", 180)
# A NotReady node keeps its pods this long (Kubernetes' taint manager: tolerationSeconds 300),
# then they are deleted gracefully and their jobs rescheduled (scheduling/services/common.py).
CAMP_NODE_NOT_READY_TOLERATION_SECONDS = env_int("CAMP_NODE_NOT_READY_TOLERATION_SECONDS", 300)
# One dispatch waits at most this long for that answer, then hands over (the pod stays bound,
# its node locked): a follow-up dispatch, or the watcher, concludes. A silent device plugin
# holds a worker for seconds at a time, never for the whole timeout.
CAMP_HAMI_BIND_POLL_SECONDS = env_int("CAMP_HAMI_BIND_POLL_SECONDS", 5)
# A Kubernetes API call that gets no answer, a 5xx or a 429 is retried this many times, after
# this many milliseconds, doubled at each try (4 and 200: at most 3 s of waiting per call).
CAMP_KUBE_API_RETRIES = env_int("CAMP_KUBE_API_RETRIES", 4)
CAMP_KUBE_API_BACKOFF_MS = env_int("CAMP_KUBE_API_BACKOFF_MS", 200)
# Periodic tasks that call a cluster (reconcile, inventory, sweeps) go through one gate
# (scheduling.services.cluster_periodic): a quick probe of the API server (this many seconds,
# no retries), then calls with the periodic timeouts, no retries, and at most this many
# seconds per cluster per run (docs/KUBERNETES.md "Unreachable clusters").
CAMP_KUBE_PROBE_SECONDS = env_int("CAMP_KUBE_PROBE_SECONDS", 3)
CAMP_CLUSTER_RUN_SECONDS = env_int("CAMP_CLUSTER_RUN_SECONDS", 30)
# HAMi's node lock expires after this long (HAMI_NODELOCK_EXPIRE in HAMi, default 5m).
CAMP_HAMI_NODELOCK_EXPIRE_SECONDS = env_int("CAMP_HAMI_NODELOCK_EXPIRE_SECONDS", 300)

# --- Workspaces (workspaces/tasks.py, docs/WORKLOADS.md) ------------------------------------
# Idle culling and training jobs' progress (dependencies, checkpoints, max runtime, retries).
WORKSPACES_TICK_SECONDS = env_int("WORKSPACES_TICK_SECONDS", 30)
CELERY_BEAT_SCHEDULE["workspaces-tick"] = {
    "task": "workspaces.tasks.workspaces_tick", "schedule": float(WORKSPACES_TICK_SECONDS),
}
# Model services (workspaces/services/serving.py, docs/SERVING.md): the autoscaler's step, and where
# it reads load ("auto": the cluster's Prometheus when it has a URL, the simulated daily curve on
# simulated clusters, else none and replicas are held; "prometheus"; "simulated").
SERVING_AUTOSCALE_SECONDS = env_int("SERVING_AUTOSCALE_SECONDS", 15)
SERVING_LOAD_SOURCE = env_str("SERVING_LOAD_SOURCE", "auto")
# PromQL of the Prometheus load source, per autoscale metric ({selector}: the replica pods' label
# matchers, SERVING_PROMQL_SELECTOR with {namespace}, {pods}, {service_id}); latency adds {quantile}.
SERVING_PROMETHEUS_QUERIES = {
    metric: env_str(f"SERVING_PROMQL_{metric.upper()}", _serving_load.DEFAULT_QUERIES[metric])
    for metric in _serving_load.DEFAULT_QUERIES}
SERVING_PROMETHEUS_LATENCY = env_str("SERVING_PROMQL_LATENCY", _serving_load.DEFAULT_LATENCY)
SERVING_PROMETHEUS_SELECTOR = env_str("SERVING_PROMQL_SELECTOR", _serving_load.DEFAULT_SELECTOR)
CELERY_BEAT_SCHEDULE["services-autoscale"] = {
    "task": "workspaces.tasks.services_autoscale", "schedule": float(SERVING_AUTOSCALE_SECONDS),
}
SERVING_SWEEP_SECONDS = env_int("SERVING_SWEEP_SECONDS", 60)  # Services of deleted model services
CELERY_BEAT_SCHEDULE["services-sweep"] = {
    "task": "workspaces.tasks.services_sweep", "schedule": float(SERVING_SWEEP_SECONDS),
}
CAMP_URL = env_str("CAMP_URL", "http://localhost:8000")  # this portal, for the ingress auth hook
WORKSPACES_URL = env_str("WORKSPACES_URL", "https://workspaces.camp.local")  # environment URLs
WORKSPACES_SSH_GATEWAY = env_str("WORKSPACES_SSH_GATEWAY", "ssh.camp.local")
WORKSPACES_INGRESS_CLASS = env_str("WORKSPACES_INGRESS_CLASS", "nginx")
# A model service's optional Ingress (its ingress_host); empty: the cluster's default class.
SERVING_INGRESS_CLASS = env_str("SERVING_INGRESS_CLASS", WORKSPACES_INGRESS_CLASS)
WORKSPACES_STORAGE_CLASS = env_str("WORKSPACES_STORAGE_CLASS", "")
WORKSPACES_IDLE_MINUTES = env_int("WORKSPACES_IDLE_MINUTES", 60)
# An environment's open link works once, within this many seconds of being issued.
WORKSPACES_LINK_TTL_SECONDS = env_int("WORKSPACES_LINK_TTL_SECONDS", 300)

# A periodic tick that waited in the queue much longer than its own period is stale: later ones
# are already on their way and do the same work on fresher state. The worker drops it on receipt
# (Celery's ``expires``) instead of running a backlog, so a worker that fell behind (the demo's
# SQLite-backed worker, a worker restarted after an outage) catches up at once rather than
# staying minutes behind for good. Two periods (at least TICK_EXPIRY_MIN_SECONDS) keep a tick
# running under an ordinary lag: only a queue that is far behind drops them. Tasks queued by
# services (cycle and placement requests, dispatches) carry no expiry: each is work, not a tick.
TICK_EXPIRY_MIN_SECONDS = 30.0


def tick_expiry(period: float) -> float:
    return max(2 * period, TICK_EXPIRY_MIN_SECONDS)


for _entry in CELERY_BEAT_SCHEDULE.values():
    _entry.setdefault("options", {"expires": tick_expiry(float(_entry["schedule"]))})  # type: ignore[arg-type]
