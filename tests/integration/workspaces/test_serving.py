"""Model services on the simulated backend, through the real services and the scheduler
(cycle → dispatch → stop → reconcile, as the worker runs them): replicas are scheduling
jobs, the autoscaler scales them on the simulated daily load, an ``inference`` replica
preempts batch training, a new revision rolls out without losing ready replicas, and three
models share one 80 GB card."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from scheduling import services as scheduling
from scheduling.models import Allocation, DecisionKind, GpuSlice, Job, JobState, SchedulingDecision
from tenants.models import AuditEvent
from tests.integration.scheduling.conftest import gpu_group
from workspaces.kinds import KINDS
from workspaces.models import ModelService, ServiceReplica
from workspaces.services import serving
from workspaces.serving_load import simulated_load

from .conftest import advance

pytestmark = pytest.mark.django_db

ONE_NODE = """
start_delay_seconds: 0
default_duration_seconds: 86400
nodes:
  - name: a100-0
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 2, memory_mib: 81920}
"""
ONE_CARD = """
start_delay_seconds: 0
nodes:
  - name: a100-solo
    cpu_cores: 64
    ram_gib: 512
    gpus: {model: A100-80G, count: 1, memory_mib: 81920}
"""
NIGHT = dt.datetime(2026, 11, 24, 3, 0, tzinfo=dt.UTC)
PEAK = dt.datetime(2026, 11, 24, 14, 0, tzinfo=dt.UTC)
# No bursts: the test reads the curve at chosen hours (0 at 02:00, 24 at 14:00).
PROFILE = {"base": 0, "peak": 24, "peak_hour": 14, "burst": 0}


def _cluster(world: Any, inventory: str, name: str = "sim") -> Any:
    cluster = scheduling.cluster_create(actor=world.admin, name=name, backend="simulated",
                                        inventory=inventory)
    scheduling.inventory_sync(cluster=cluster)
    return cluster


def _service(world: Any, cluster: Any, name: str = "chat", **kw: Any) -> ModelService:
    base: dict[str, Any] = {"image_reference": "docker.io/vllm/vllm-openai:v0.6.3",
                            "model_source": "hf://Qwen/Qwen2.5-7B-Instruct", "gpu_memory_mib": 20480,
                            "gpu_cores_percent": 30, "cpu_millicores": 2000, "ram_mib": 8192}
    base.update(kw)
    return serving.model_service_create(actor=world.a.member, project=world.a.project, cluster=cluster,
                                        name=name, **base)


def _live(svc: ModelService) -> list[ServiceReplica]:
    return list(svc.replicas.filter(removed_reason="").select_related("job").order_by("number"))


def _states(svc: ModelService) -> list[str]:
    return [r.job.state for r in _live(svc)]


def test_a_service_runs_its_replicas_as_scheduling_jobs(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=2, max_replicas=2)
    reps = _live(svc)
    assert len(reps) == 2 and {r.job.kind for r in reps} == {"service"}
    assert all(r.job.priority_class == "inference" and not r.job.preemptible for r in reps)
    assert [r.job.name for r in reps] == ["chat-r1-1", "chat-r1-2"]
    advance(cluster)
    assert _states(svc) == [JobState.RUNNING, JobState.RUNNING]
    serving.model_service_autoscale(service=svc, load=0.5)
    svc.refresh_from_db()
    assert svc.status == "ready" and svc.ready_replicas == 2
    # Each replica holds a 20 GiB / 30 % slice, not a card.
    assert sorted(GpuSlice.objects.filter(allocation__job__in=[r.job for r in reps])
                  .values_list("memory_mib", "cores_percent")) == [(20480, 30), (20480, 30)]
    # The pods carry the service's label, port, probe, model and arguments (the kind's specs).
    from scheduling.services import job_specs

    _, objs, pods = job_specs(reps[0].job, cluster)
    pod = pods[0]
    assert pod.labels[serving.LABEL_SERVICE] == str(svc.pk)
    assert pod.readiness_probe == {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5,
                                   "failureThreshold": 3}
    assert pod.ports == ({"name": "http", "containerPort": 8000},)
    assert pod.env["CAMP_MODEL"] == "hf://Qwen/Qwen2.5-7B-Instruct"
    services_objs = [e.manifest for e in objs.extra if e.manifest["kind"] == "Service"]
    assert services_objs == [serving.service_manifest(svc)]
    assert "service" in KINDS


def test_bad_input_names_the_field(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    cases = [({"model_source": "llama"}, "model_source"), ({"health_path": "health"}, "health_path"),
             ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"),
             ({"preemptible": True}, "preemptible"), ({"gpu_cores_percent": 130}, "gpu_cores_percent"),
             ({"min_replicas": 0}, "min_replicas"), ({"autoscale_target": 0}, "autoscale_target"),
             ({"load_profile": {"peak": "lots"}}, "load_profile"),
             ({"model_source_kind": "volume", "model_source": "Bad Claim"}, "model_source"),
             ({"gpu_memory_mib": 90000}, "gpu_memory_mib")]
    for i, (kw, field) in enumerate(cases):
        with pytest.raises(ValidationError) as exc:
            _service(world, cluster, name=f"bad-{i}", **kw)
        assert field in exc.value.message_dict, (kw, exc.value.message_dict)
    assert not ModelService.objects.exists() and not Job.objects.exists()


def test_only_project_members_create_and_only_owner_or_admin_change(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    with pytest.raises(PermissionDenied):
        serving.model_service_create(actor=world.b.member, project=world.a.project, cluster=cluster,
                                     name="x", image_reference="vllm/vllm-openai:v0.6.3",
                                     model_source="hf://a/b")
    svc = _service(world, cluster)
    with pytest.raises(PermissionDenied):
        serving.model_service_scale(actor=world.b.owner, service=svc, replicas=2)
    serving.model_service_scale(actor=world.a.project_admin, service=svc, replicas=2)
    assert len(_live(svc)) == 2


def test_manual_scale_adds_and_removes_replicas_and_audits(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster)
    advance(cluster)
    serving.model_service_scale(actor=world.a.member, service=svc, replicas=3)
    assert len(_live(svc)) == 3
    advance(cluster)
    serving.model_service_scale(actor=world.a.member, service=svc, replicas=1)
    live = _live(svc)
    assert [r.number for r in live] == [1]  # the newest went first
    removed = svc.replicas.exclude(removed_reason="")
    assert {r.removed_reason for r in removed} == {"Scaled down to 1"}
    assert all(r.job.state == JobState.CANCELLED for r in removed)
    actions = list(AuditEvent.objects.filter(target_id=str(svc.pk), action__startswith="service.")
                   .values_list("action", flat=True))
    assert actions.count("service.scaled") == 2 and "service.created" in actions


def test_autoscaler_follows_the_daily_curve_with_a_stabilisation_window(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=1, max_replicas=3, autoscale_target=8,
                   scale_down_delay_seconds=600, load_profile=PROFILE)
    assert simulated_load(svc.pk, PROFILE, PEAK) == 24 and simulated_load(svc.pk, PROFILE, NIGHT) < 1
    svc = serving.model_service_autoscale(service=svc, now=PEAK)
    assert svc.desired_replicas == 3 and len(_live(svc)) == 3  # up at once
    advance(cluster)
    # Load falls: held by the window (600 s), then down to the floor.
    svc = serving.model_service_autoscale(service=svc, now=PEAK + dt.timedelta(minutes=1), load=1)
    assert svc.desired_replicas == 3
    svc = serving.model_service_autoscale(service=svc, now=PEAK + dt.timedelta(minutes=11), load=1)
    assert svc.desired_replicas == 1 and len(_live(svc)) == 1
    scaled = AuditEvent.objects.filter(action="service.scaled", actor_username="autoscaler",
                                       target_id=str(svc.pk)).order_by("id")
    assert [e.after["desired_replicas"] for e in scaled] == [3, 1]
    assert "load 24 concurrent requests" in scaled[0].after["reason"]


def test_scale_to_zero_after_the_idle_window_and_back(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=0, max_replicas=2, scale_to_zero_seconds=300,
                   scale_down_delay_seconds=0)
    advance(cluster)
    svc = serving.model_service_autoscale(service=svc, now=NIGHT, load=0)
    assert svc.desired_replicas == 1  # idle, but not yet for the window
    svc = serving.model_service_autoscale(service=svc, now=NIGHT + dt.timedelta(minutes=6), load=0)
    assert svc.desired_replicas == 0 and _live(svc) == [] and svc.status == "idle"
    # No reading while at zero (a source that reads the pods has none to read): it stays at
    # zero rather than waking a replica only to put it back to sleep.
    from django.test import override_settings

    with override_settings(SERVING_LOAD_SOURCE="prometheus"):  # this cluster has no Prometheus URL
        svc = serving.model_service_autoscale(service=svc, now=NIGHT + dt.timedelta(minutes=6, seconds=30))
    assert svc.desired_replicas == 0 and _live(svc) == [] and svc.load_error
    svc = serving.model_service_autoscale(service=svc, now=NIGHT + dt.timedelta(minutes=7), load=3)
    assert svc.desired_replicas == 1 and len(_live(svc)) == 1


def test_inference_scale_up_preempts_batch_training_and_scale_down_lets_it_run(world: Any) -> None:
    """Full cluster of another tenant's batch training; load rises → the new inference
    replica is admitted by preempting a training job (recorded reason); load falls → the
    replica goes and the waiting training job starts again."""
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=1, max_replicas=2, autoscale_target=16,
                   scale_down_delay_seconds=0, load_profile=PROFILE)
    advance(cluster)
    assert _states(svc) == [JobState.RUNNING]
    # Training fills what is left: a whole card, and the rest of the card the replica shares.
    member_b = world.b.member
    whole = scheduling.job_submit(actor=member_b, project=world.b.project, cluster=cluster, name="pretrain",
                                  groups=[gpu_group(gpu_count=1)], priority_class="batch",
                                  checkpoint_capable=True)
    rest = scheduling.job_submit(actor=member_b, project=world.b.project, cluster=cluster, name="finetune",
                                 groups=[gpu_group(gpu_count=1, gpu_memory_mib=61440, gpu_cores_percent=70)],
                                 priority_class="batch")
    advance(cluster)
    for j in (whole, rest):
        j.refresh_from_db()
        assert j.state == JobState.RUNNING
    svc = serving.model_service_autoscale(service=svc, now=PEAK)  # 24 / 16 → 2 replicas
    assert svc.desired_replicas == 2
    second = _live(svc)[1]
    advance(cluster, rounds=4)
    second.job.refresh_from_db()
    assert second.job.state == JobState.RUNNING
    preempted = SchedulingDecision.objects.get(kind=DecisionKind.PREEMPTED, preemptor=second.job)
    assert preempted.job_id in (whole.pk, rest.pk)
    victim = Job.objects.get(pk=preempted.job_id)
    # Recorded with its reason (another tenant's job is not named to the victim's owners).
    assert preempted.reason == "Preempted by a higher-priority job of another tenant"
    assert victim.state == JobState.QUEUED  # waiting again (why-pending says for what)
    # Night: load falls, the replica is removed, the training job takes its place.
    svc = serving.model_service_autoscale(service=svc, now=NIGHT + dt.timedelta(days=1))
    assert svc.desired_replicas == 1 and len(_live(svc)) == 1
    advance(cluster, rounds=4)
    victim.refresh_from_db()
    assert victim.state == JobState.RUNNING
    second.job.refresh_from_db()
    assert second.job.state == JobState.CANCELLED and not Allocation.objects.filter(job=second.job).exists()


def test_rollout_adds_one_new_replica_at_a_time_and_never_drops_ready_replicas(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=2, max_replicas=2, args=["--max-model-len", "4096"])
    advance(cluster)
    svc = serving.model_service_rollout(actor=world.a.member, service=svc,
                                        image_reference="docker.io/vllm/vllm-openai:v0.6.4")
    assert svc.revision == 2
    ready_counts, seen_live = [], []
    for _ in range(8):
        svc = serving.model_service_autoscale(service=svc, load=1)
        live = _live(svc)
        seen_live.append(len(live))
        ready_counts.append(sum(1 for r in live if r.job.state == JobState.RUNNING))
        if all(r.revision == 2 and r.job.state == JobState.RUNNING for r in live) and len(live) == 2:
            break
        advance(cluster, rounds=1)
    live = _live(svc)
    assert [r.revision for r in live] == [2, 2] and svc.status == "ready"
    assert min(ready_counts) >= 2, ready_counts  # never below the ready count during the rollout
    assert max(seen_live) == 3  # surge of one replica at a time
    assert {g.image for r in live for g in r.job.groups.all()} == {"docker.io/vllm/vllm-openai:v0.6.4"}
    assert all(r.spec["args"] == ["--max-model-len", "4096"] for r in live)
    assert AuditEvent.objects.filter(action="service.rolled_out", target_id=str(svc.pk)).count() == 1
    # A rollout without changes restarts on a new revision, audited once.
    svc = serving.model_service_rollout(actor=world.a.member, service=svc)
    assert svc.revision == 3
    assert AuditEvent.objects.filter(action="service.rolled_out", target_id=str(svc.pk)).count() == 2


def test_three_models_share_one_80gb_card_as_20_30_30_gb_slices(world: Any) -> None:
    cluster = _cluster(world, ONE_CARD)
    shapes = {"router-7b": (20480, 25), "summariser-14b": (30720, 35), "embedder-8b": (30720, 35)}
    services = [_service(world, cluster, name=n, gpu_memory_mib=m, gpu_cores_percent=c)
                for n, (m, c) in shapes.items()]
    advance(cluster)
    for s in services:
        assert _states(s) == [JobState.RUNNING], s.name
    slices = GpuSlice.objects.filter(allocation__job__kind="service").select_related("gpu")
    assert len({s.gpu_id for s in slices}) == 1
    assert sorted(s.memory_mib for s in slices) == [20480, 30720, 30720]
    gpu = slices[0].gpu
    gpu.refresh_from_db()
    assert gpu.memory_allocated_mib == 81920 and gpu.sharers == 3


def test_a_rejected_replica_blocks_the_autoscaler_until_a_person_acts(world: Any) -> None:
    # A model this cluster has none of is refused at create once its nodes are known; created
    # before its first inventory sync (nothing refused then), the replica is rejected by the cycle.
    cluster = scheduling.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                        inventory=ONE_NODE)
    svc = _service(world, cluster, gpu_models=["H100-80G"], max_replicas=2)  # this cluster has none
    scheduling.inventory_sync(cluster=cluster)
    advance(cluster)
    (first,) = svc.replicas.select_related("job")
    assert first.job.state == JobState.REJECTED
    for minute in range(3):  # every tick would otherwise queue another doomed replica
        svc = serving.model_service_autoscale(service=svc, now=PEAK + dt.timedelta(minutes=minute), load=1)
    assert svc.replicas.count() == 1
    assert svc.status == "blocked" and "Replica 1 was rejected" in svc.status_reason
    serving.model_service_scale(actor=world.a.member, service=svc, replicas=1)  # a person retries
    assert svc.replicas.count() == 2


def test_scale_up_stays_within_the_projects_limit_and_says_why(world: Any) -> None:
    """Autoscaled within quota: a 20 GiB / 30 % replica counts 0.3 GPU; a 0.6 GPU project
    limit admits two of the three replicas the load asks for, the third waits with the reason."""
    from decimal import Decimal

    from tenants import services as tenant_services

    cluster = _cluster(world, ONE_NODE)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(1), "gpus_limit": Decimal(1)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal("0.6"), "gpus_limit": Decimal("0.6")})
    svc = _service(world, cluster, min_replicas=1, max_replicas=3, autoscale_target=8, load_profile=PROFILE)
    svc = serving.model_service_autoscale(service=svc, now=PEAK)
    assert svc.desired_replicas == 3
    advance(cluster)
    svc = serving.model_service_autoscale(service=svc, now=PEAK + dt.timedelta(seconds=15))
    states = _states(svc)
    assert sorted(states) == [JobState.QUEUED, JobState.RUNNING, JobState.RUNNING]
    waiting = next(r.job for r in _live(svc) if r.job.state == JobState.QUEUED)
    assert "limit" in waiting.reason, waiting.reason
    assert svc.status == "degraded" and svc.ready_replicas == 2
    # A floor the limit can never hold is refused at once, naming min_replicas.
    with pytest.raises(ValidationError) as exc:
        serving.model_service_scale(actor=world.a.member, service=svc, min_replicas=3, max_replicas=3)
    assert "min_replicas" in exc.value.message_dict and "limit" in str(exc.value.message_dict)


def test_replica_names_skip_names_taken_by_history_or_other_jobs(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster)
    serving.model_service_delete(actor=world.a.member, service=svc)
    scheduling.job_submit(actor=world.a.member, project=world.a.project, cluster=cluster, name="chat-r1-2",
                          groups=[gpu_group(gpu_count=0)])  # a user's job with a replica-like name
    again = _service(world, cluster, min_replicas=2, max_replicas=2)  # same name, new service
    assert [r.job.name for r in _live(again)] == ["chat-r1-3", "chat-r1-4"]


def test_the_autoscaler_tick_skips_a_service_deleted_meanwhile(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    gone, kept = _service(world, cluster, name="gone"), _service(world, cluster, name="kept")
    ids = [gone.pk, kept.pk]
    serving.model_service_delete(actor=world.a.member, service=gone)
    assert serving.model_services_autoscale(ids=ids) == {"services": 1, "failed": 0, "gone": 1}
    kept.refresh_from_db()
    assert kept.load_at is not None


def test_no_made_up_load_for_real_clusters_nor_an_unknown_source(world: Any) -> None:
    from django.test import override_settings

    from scheduling.models import Cluster

    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster, min_replicas=1, max_replicas=3, load_profile=PROFILE)
    with override_settings(SERVING_LOAD_SOURCE="prometheus"):  # this cluster has no Prometheus URL
        svc = serving.model_service_autoscale(service=svc, now=PEAK)
    assert svc.desired_replicas == 1 and svc.load_at is None
    assert svc.load_error == "the cluster has no Prometheus URL"
    with override_settings(SERVING_LOAD_SOURCE="graphite"):  # not a source
        svc = serving.model_service_autoscale(service=svc, now=PEAK)
    assert svc.desired_replicas == 1 and svc.load_error == "unknown load source 'graphite'"
    # The simulated curve is for simulated clusters only (a stand-in for a Kubernetes cluster:
    # its backend field, which is all load_of reads).
    Cluster.objects.filter(pk=cluster.pk).update(backend="kubernetes")
    svc = serving.model_service_autoscale(service=svc, now=PEAK)
    assert svc.desired_replicas == 1 and svc.load_at is None
    assert svc.load_error == "no load source: give the cluster a Prometheus URL"
    assert not AuditEvent.objects.filter(action="service.scaled", actor_username="autoscaler").exists()


def test_a_crashing_revision_blocks_the_autoscaler_after_three_failures(world: Any) -> None:
    from django.utils import timezone

    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster)
    for _ in range(3):
        (live,) = _live(svc)
        # Stand-in for a crashing server (the simulated backend's pods do not crash): the
        # replica's job ends FAILED as reconcile ends a job whose pod failed.
        Job.objects.filter(pk=live.job_id).update(state=JobState.FAILED, reason="pod server-0 failed",
                                                  finished_at=timezone.now())
        svc = serving.model_service_autoscale(service=svc, load=1)
    assert svc.replicas.count() == 3 and _live(svc) == []  # no fourth doomed replica
    assert svc.status == "blocked" and "3 replicas of revision 1 failed" in svc.status_reason
    svc = serving.model_service_rollout(actor=world.a.member, service=svc, args=["--fixed"])
    assert len(_live(svc)) == 1 and svc.revision == 2


def test_rollout_waits_for_the_new_replica_to_be_ready_not_just_running(world: Any) -> None:
    cluster = _cluster(world, ONE_NODE)
    svc = _service(world, cluster)
    advance(cluster)
    svc = serving.model_service_rollout(actor=world.a.member, service=svc, args=["--new"])
    advance(cluster)
    new = next(r for r in _live(svc) if r.revision == 2)
    assert new.job.state == JobState.RUNNING
    # Stand-in for a readiness probe still failing (the server loads its model): the pod runs
    # but is not Ready, as reconcile records it from the pod's Ready condition.
    Allocation.objects.filter(job=new.job).update(ready=False)
    svc = serving.model_service_autoscale(service=svc, load=1)
    assert sorted(r.revision for r in _live(svc)) == [1, 2] and svc.status == "rolling"
    advance(cluster, rounds=1)  # reconcile reads the pod as Ready again
    svc = serving.model_service_autoscale(service=svc, load=1)
    assert [r.revision for r in _live(svc)] == [2] and svc.ready_replicas == 1
