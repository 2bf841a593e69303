"""``manage.py camp_watch --cluster NAME``: the long-running watch consumer.

Streams the cluster's pod events (list, then watch from the list's resourceVersion;
reconnects on a dropped stream and relists on 410 Gone — ``KubernetesBackend.watch_pods``)
and applies each through ``services.pod_event_apply``, so phase changes reach jobs within
moments instead of at the next periodic reconcile. The periodic reconcile task stays the
safety net (e.g. for pods deleted while the stream was away: a relist reports what exists,
not what vanished). One process per cluster; docker-compose runs it as ``watcher``.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from scheduling import services
from scheduling.backends import backend_for
from scheduling.backends.base import BackendError, PodStatus
from scheduling.models import Cluster

logger = logging.getLogger("scheduling.watch")


class Command(BaseCommand):
    help = "Stream a cluster's pod events and apply them to jobs (runs until stopped)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--cluster", required=True, help="Cluster name.")
        parser.add_argument("--window", type=int, default=300,
                            help="Seconds per watch request before it is renewed (default 300).")
        parser.add_argument("--max-events", type=int, default=0,
                            help="Stop after this many events (0: never; for tests and debugging).")
        parser.add_argument("--duration", type=float, default=0,
                            help="Stop after this many seconds (0: never).")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["cluster"]
        stop = {"now": False}

        def _stop(signum: int, frame: Any) -> None:
            stop["now"] = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                signal.signal(sig, _stop)
            except ValueError:  # not the main thread (tests): stop via --max-events/--duration
                pass
        deadline = time.monotonic() + options["duration"] if options["duration"] else None
        max_events = options["max_events"]
        seen = 0
        backoff = 1.0
        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            if not connection.in_atomic_block:  # a long-lived process: drop dead connections
                close_old_connections()
            cluster = Cluster.objects.filter(name=name).first()
            if cluster is None:
                raise CommandError(f"No cluster named {name!r}.")
            if not cluster.enabled:
                time.sleep(5)
                continue
            window = options["window"]
            if deadline is not None:
                window = max(1, min(window, int(deadline - time.monotonic()) + 1))
            pods: dict[str, PodStatus] = {}  # rebuilt by each window's initial list
            try:
                for event in backend_for(cluster).watch_pods(timeout_seconds=window):
                    if event.type == "DELETED":
                        pods.pop(event.pod.name, None)
                    else:
                        pods[event.pod.name] = event.pod
                    outcome = services.pod_event_apply(cluster=cluster, pod_name=event.pod.name,
                                                       pods=pods)
                    logger.info("%s %s %s (%s): %s", cluster.name, event.type, event.pod.name,
                                event.pod.phase, outcome)
                    seen += 1
                    if (max_events and seen >= max_events) or stop["now"] or (
                            deadline is not None and time.monotonic() >= deadline):
                        return
                backoff = 1.0
            except BackendError as exc:
                logger.warning("watch of %s failed: %s; retrying in %.0fs", name, exc, backoff)
                Cluster.objects.filter(pk=cluster.pk).update(last_error=str(exc)[:500])
                time.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
