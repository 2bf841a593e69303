"""Deterministic names and labels for everything Camp creates in a cluster.

Names are derived from database ids only, so a retried create hits the same name
and a 409 Conflict means the work was already done.
"""

from __future__ import annotations

import hashlib
import re

_bad = re.compile(r"[^a-z0-9-]+")


def dns_label(*parts: str, limit: int = 63) -> str:
    """Join parts into a DNS-1123 label; too long → truncated with a short hash suffix."""
    raw = "-".join(p for p in parts if p)
    clean = _bad.sub("-", raw.lower()).strip("-") or "x"
    if len(clean) <= limit:
        return clean
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{clean[: limit - 9].rstrip('-')}-{digest}"


def namespace_name(prefix: str, project_id: int, project: str) -> str:
    """``<prefix>-p<project id>-<project name>``: unique per project by construction (the
    prefix is a fixed DNS label of the cluster and the id ends at the next ``-``, so two
    projects never map to one name, whatever their tenants' and projects' names; a plain
    join of tenant and project names collides: ``acme``/``ml-x`` and ``acme-ml``/``x``).
    A long project name is truncated after the id, which stays whole."""
    return dns_label(prefix, f"p{project_id}", project)


def job_object_name(job_name: str, job_id: int) -> str:
    return dns_label(job_name[:40], str(job_id))


def rendezvous_service_name(job_object: str) -> str:
    """The ClusterIP Service of a job's rendezvous (a ``job_object_name``: at most 61 long)."""
    return dns_label(job_object, "rdzv")


def pod_name(job_name: str, job_id: int, group: str, replica: int) -> str:
    return dns_label(job_name[:30], str(job_id), group[:12], str(replica))
