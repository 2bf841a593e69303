"""Fixtures of the real-node tier (node.py says what is real).

* ``real_node`` (session): one real single-node cluster for the whole run, started once and
  always stopped; skipped with the reason when ``../shared``, root, cgroup v1 or the host
  packages are missing.
* ``camp_node`` (per test): Camp registered with that cluster as an operator does it
  (camp-agent chart's ServiceAccount), a real ``celery worker`` and ``camp_watch`` running,
  and the namespaces earlier tests left removed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.integration.deploy.tools import install_tools

from .node import AGENT_NAMESPACE, RealNode, unavailable_reason, wait

SYSTEM_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", AGENT_NAMESPACE}


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    tools = install_tools()
    node = RealNode.start(kubectl=tools["kubectl"], helm=tools["helm"])
    try:
        node.credentials = node.install_agent()  # type: ignore[attr-defined]
        yield node
    finally:
        node.stop()


@dataclass
class CampNode:
    node: RealNode
    cluster: Any
    camp_url: str

    @property
    def core(self) -> Any:
        return self.node.core


def _clean(node: RealNode) -> None:
    """What earlier tests left: Camp's namespaces (their pods, claims) and released volumes."""
    core = node.core
    for ns in core.list_namespace().items:
        if ns.metadata.name not in SYSTEM_NAMESPACES and ns.metadata.deletion_timestamp is None:
            core.delete_collection_namespaced_pod(ns.metadata.name, grace_period_seconds=0)
            core.delete_namespace(ns.metadata.name)
    for pv in core.list_persistent_volume().items:
        if pv.status.phase in ("Released", "Failed"):
            core.delete_persistent_volume(pv.metadata.name)


@pytest.fixture
def camp_node(real_node: RealNode, world: Any, live_server: Any, settings: Any,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[CampNode]:
    from scheduling.models import Cluster, Node
    from tests.conftest import client_for
    from tests.integration.scheduling.test_concurrency import celery_worker

    from .processes import camp_watch

    _clean(real_node)
    # the portal the Ingresses' auth hook names (the worker writes them: its environment too)
    monkeypatch.setenv("CAMP_URL", live_server.url)
    settings.CAMP_URL = live_server.url
    creds = real_node.credentials  # type: ignore[attr-defined]
    with celery_worker():
        r = client_for(world.admin).post("/api/v1/clusters/", {
            "name": "node", "backend": "kubernetes", "api_server": real_node.host,
            "token": creds["token"], "ca_cert": creds["ca_cert"]}, format="json")
        assert r.status_code == 201, r.content
        cluster = Cluster.objects.get(name="node")
        # registration queues the inventory sync; a job submitted before it lands sees no node
        # and is refused for good ("no node can ever fit"), so wait for the node, as a user
        # would see it on the cluster's page
        wait(lambda: Node.objects.filter(cluster=cluster, ready=True).exists(), "the inventory")
        with camp_watch("node", seconds=int(os.environ.get("CAMP_REALNODE_WATCH_SECONDS", "900"))):
            yield CampNode(real_node, cluster, live_server.url)
