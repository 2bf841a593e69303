"""Fixtures on a real kube-apiserver (harness.py says what is real and what stands in).

* ``kube_apiserver`` (session): one etcd + kube-apiserver for the whole run, skipped with the
  reason when ``../shared/tools`` or etcd is absent.
* ``kube`` (per test): the server emptied of what earlier tests left, a HAMi device-plugin
  stand-in and a running kubelet stand-in; ``kube.register(world)`` registers it in Camp as
  an admin would (token + CA), ``kube.node(...)`` adds nodes.
* ``hami_webhook``: HAMi's admission rule registered on the apiserver for this test.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from .harness import (
    HamiDevicePlugin,
    HamiWebhook,
    KubeApiserver,
    Kubelet,
    create_node,
    default_storage_class,
    unavailable_reason,
)


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[KubeApiserver]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    server = KubeApiserver.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class KubeEnv:
    server: KubeApiserver
    plugin: HamiDevicePlugin
    kubelet: Kubelet

    @property
    def core(self) -> Any:
        return self.server.core

    def node(self, name: str, **kw: Any) -> Any:
        return create_node(self.server.core, name, **kw)

    def register(self, world: Any, name: str = "real", **kw: Any) -> Any:
        """Register the server as a Camp cluster and sync its inventory."""
        from scheduling import services

        cluster = services.cluster_create(actor=world.admin, name=name, backend="kubernetes",
                                          api_server=self.server.host,
                                          credentials=self.server.credentials, **kw)
        services.inventory_sync(cluster=cluster)
        return cluster


@pytest.fixture
def kube(kube_apiserver: KubeApiserver) -> Iterator[KubeEnv]:
    kube_apiserver.reset()
    default_storage_class(kube_apiserver, True)
    plugin = HamiDevicePlugin(kube_apiserver.core)
    with Kubelet(kube_apiserver.core, plugin) as kubelet:
        yield KubeEnv(kube_apiserver, plugin, kubelet)
    assert not kubelet.errors, kubelet.errors


@pytest.fixture
def hami_webhook(kube: KubeEnv) -> Iterator[HamiWebhook]:
    with HamiWebhook() as hook:
        hook.register(kube.server.client())
        yield hook
