"""Issue 27 findings 3 and 9 (watch health) on the real kube-apiserver: one cluster is never
torn by two registrations or two Camp installations (each touches only what it created), a
second registration of a cluster already managed is refused in words, and the watcher's health
follows its heartbeat."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from scheduling import services
from scheduling.models import WATCH_HEARTBEAT_STALE_SECONDS, Cluster, Job, JobState
from tests.conftest import client_for

from .harness import camp_pods, hami_devices
from .steps import submit, wait_running

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_registration_of_a_managed_cluster_is_refused_in_words(world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(1))
    first = kube.register(world, name="prod")
    assert first.kube_system_uid == kube.core.read_namespace("kube-system").metadata.uid
    # The same API server again (as through a second, private endpoint).
    r = client_for(world.admin).post("/api/v1/clusters/", {
        "name": "prod-private", "backend": "kubernetes", "api_server": kube.server.host,
        "token": kube.server.token, "ca_cert": kube.server.ca_pem}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["api_server"], r.content
    said = r.json()["api_server"][0]
    assert "already registered in Camp as 'prod'" in said and "kube-system" in said
    assert not Cluster.objects.filter(name="prod-private").exists()


def test_two_installations_sharing_a_cluster_only_touch_their_own_pods(world: Any, kube: Any) -> None:
    kube.node("gpu-a", devices=hami_devices(2))
    with override_settings(CAMP_INSTALLATION_ID="staging"):
        staging = kube.register(world, name="staging", namespace_prefix="stg")
        ours = submit(world, staging, "stg-job", gpu_memory_mib=20000, gpu_cores_percent=25)
        services.cycle_run(cluster=staging)
        assert services.job_dispatch(job_id=ours.pk) == "created"
        wait_running(staging, ours)
    # Production's Camp keeps its rows in its own database; here one database holds both, so
    # staging's registration record is set aside for production's registration check.
    Cluster.objects.filter(pk=staging.pk).update(kube_system_uid="")
    with override_settings(CAMP_INSTALLATION_ID="production"):
        prod = kube.register(world, name="production", namespace_prefix="prd")
        theirs = submit(world, prod, "prd-job", gpu_memory_mib=20000, gpu_cores_percent=25)
        services.cycle_run(cluster=prod)
        assert services.job_dispatch(job_id=theirs.pk) == "created"
        wait_running(prod, theirs)
    pods = {p.metadata.labels["camp.io/installation"]: p for p in camp_pods(kube.core)}
    assert set(pods) == {"staging", "production"}
    assert pods["staging"].metadata.labels["camp.io/registration"] == str(staging.pk)
    # Each installation's sweep (reconcile: orphans, leftover objects) runs over the cluster.
    for installation, cluster in (("staging", staging), ("production", prod)):
        with override_settings(CAMP_INSTALLATION_ID=installation):
            result = services.cluster_reconcile(cluster=cluster)
            assert result.orphans_deleted == [] and result.lost == [], (installation, result)
    after = {p.metadata.labels["camp.io/installation"]: p for p in camp_pods(kube.core)}
    for installation in ("staging", "production"):
        assert after[installation].metadata.uid == pods[installation].metadata.uid
        assert after[installation].metadata.deletion_timestamp is None
    assert {j.state for j in Job.objects.filter(pk__in=[ours.pk, theirs.pk])} == {JobState.RUNNING}
    # And a pod of its own that no job holds any more is still swept (the sweep works).
    with override_settings(CAMP_INSTALLATION_ID="staging"):
        services.job_cancel(actor=world.a.member, job=Job.objects.get(pk=ours.pk))
        services.job_stop(job_id=ours.pk)
    remaining = {p.metadata.labels["camp.io/installation"] for p in camp_pods(kube.core)
                 if p.metadata.deletion_timestamp is None}
    assert remaining == {"production"}


def test_a_killed_watcher_reads_unhealthy_once_its_heartbeat_is_stale(world: Any, kube: Any) -> None:
    from django.core.management import call_command

    cluster = kube.register(world)
    call_command("camp_watch", cluster=cluster.name, duration=1, window=1)
    cluster.refresh_from_db()
    assert cluster.watch_heartbeat_at is not None and cluster.watch_healthy
    # SIGKILLed: no more beats, no error written. Its last beat ages past the limit.
    Cluster.objects.filter(pk=cluster.pk).update(
        watch_heartbeat_at=timezone.now() - dt.timedelta(seconds=WATCH_HEARTBEAT_STALE_SECONDS + 1))
    cluster.refresh_from_db()
    assert not cluster.watch_failing and not cluster.watch_healthy
    from django.test import Client

    from tests.integration.portal.test_portal import _metrics

    assert _metrics(Client())["camp_watch_healthy"][(("cluster", cluster.name),)] == 0.0
