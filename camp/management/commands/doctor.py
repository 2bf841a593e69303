"""``manage.py doctor``: what this deployment lacks, in plain words; non-zero exit on problems.

It gathers what otherwise hides in several places: Django's deployment checks (secret
key, hosts, TLS and cookie settings, DEBUG), Camp's own checks (the LDAP extra), the
readiness of the database, Redis and migrations (the same functions as ``/readyz``), and
whether every enabled Kubernetes cluster answers with its stored credentials.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import WARNING, run_checks
from django.core.management.base import BaseCommand, CommandError

from camp import health

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class Command(BaseCommand):
    help = "Print what this deployment lacks (settings, services, clusters); exit 1 on problems."
    # It must run when checks fail: reporting them is its job.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--timeout", type=float, default=5.0,
                            help="Seconds to wait for each cluster's API server (default 5).")

    def handle(self, *args: Any, **options: Any) -> None:
        problems: list[tuple[str, str]] = []
        oks: list[str] = []

        # Without the HTTPS redirect, sessions and tokens travel in clear: a problem for any
        # host but loopback (docker-compose's localhost convenience, SECURE_SSL_REDIRECT=false).
        loopback_only = bool(settings.ALLOWED_HOSTS) and all(
            h in LOOPBACK_HOSTS for h in settings.ALLOWED_HOSTS)
        for message in run_checks(include_deployment_checks=True):
            if message.id == "security.W008" and loopback_only:
                continue
            if message.level >= WARNING:
                text = str(message.msg).strip()
                if message.hint:
                    text += f" ({message.hint})"
                problems.append((message.id or "check", text))
        if not settings.SECURE_SSL_REDIRECT and not loopback_only:
            problems.append(("tls", "SECURE_SSL_REDIRECT=false while ALLOWED_HOSTS names a host that "
                             "is not loopback: passwords, sessions and tokens may travel in clear"))
        if "*" in settings.ALLOWED_HOSTS:
            problems.append(("hosts", "ALLOWED_HOSTS contains '*': name the hosts Camp serves"))
        if not getattr(settings, "CAMP_ENCRYPTION_KEYS", []):
            problems.append(("encryption", "CAMP_ENCRYPTION_KEY is not set: cluster credentials are "
                             "encrypted with a key derived from SECRET_KEY, so rotating SECRET_KEY "
                             "would make them unreadable"))
        if getattr(settings, "CAMP_EVALUATION", False):
            problems.append(("evaluation", "evaluation mode (the chart's evaluation.enabled): the "
                             "in-chart PostgreSQL and Redis have no backups, replication or tuning; "
                             "for production set database.url and redis.url to databases run for it"))
        if not problems:
            oks.append("settings (secret key, hosts, TLS, cookies)")

        checks = health.readiness()
        for name, state in checks.items():
            if state == "ok":
                oks.append(name)
            else:
                problems.append((name, state))
        if "redis" not in checks:
            problems.append(("redis", "REDIS_URL is not set: Celery uses the filesystem broker and "
                             "Channels an in-memory layer (the demo's shape; one host only)"))

        problems.extend(self._proxy(checks, oks))

        if checks["database"] == "ok" and checks["migrations"] == "ok":
            problems.extend(self._clusters(options["timeout"], oks))

        for name in oks:
            self.stdout.write(f"ok       {name}")
        for name, text in problems:
            self.stdout.write(f"PROBLEM  {name}: {text}")
        if problems:
            raise CommandError(f"{len(problems)} problem(s) found", returncode=1)
        self.stdout.write("Nothing missing.")

    def _proxy(self, checks: dict[str, str], oks: list[str]) -> list[tuple[str, str]]:
        """What the web processes saw of the proxies in front of them (the last day)."""
        if "redis" in checks and checks["redis"] != "ok":
            return []  # the note lives in the cache; Redis is already reported
        from django.core.cache import cache

        from tenants.middleware import PROXY_MISMATCH_CACHE_KEY

        try:
            note = cache.get(PROXY_MISMATCH_CACHE_KEY)
        except Exception:  # noqa: BLE001 - reported by the redis check
            return []
        if note:
            return [("proxy", str(note["problem"]))]
        oks.append(f"client addresses (TRUSTED_PROXY_COUNT={settings.TRUSTED_PROXY_COUNT})")
        return []

    def _clusters(self, timeout: float, oks: list[str]) -> list[tuple[str, str]]:
        from scheduling.backends.base import BackendError
        from scheduling.backends.kubernetes import KubernetesBackend
        from scheduling.models import Backend, Cluster

        problems: list[tuple[str, str]] = []
        for cluster in Cluster.objects.filter(enabled=True, backend=Backend.KUBERNETES):
            try:
                backend = KubernetesBackend.for_cluster(cluster)
                # Listing nodes is what inventory sync does first: it proves address, TLS,
                # credentials and RBAC at once.
                backend.core.list_node(limit=1, _request_timeout=timeout)
            except (BackendError, ValueError) as exc:  # ValueError: credentials undecryptable
                problems.append((f"cluster {cluster.name}", str(exc)))
            except Exception as exc:  # noqa: BLE001 - urllib3/ApiException/TLS: all "unreachable"
                status = getattr(exc, "status", None)
                detail = f"HTTP {status}" if status else type(exc).__name__
                problems.append((f"cluster {cluster.name}", f"API server unreachable ({detail})"))
            else:
                oks.append(f"cluster {cluster.name}")
        return problems
