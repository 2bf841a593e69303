"""Tenant isolation in the cluster (issue 11, bug 1): one namespace per project, unique by
construction and by a constraint, kept for projects that ran before (migration 0005_i11b),
and data volumes limited to what the submitter may use. Real PostgreSQL, the simulated
backend; the namespace refusal of the Kubernetes backend runs on kmock here and on the
real apiserver in tests/integration/realkube/."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from scheduling import services
from scheduling.backends.base import BackendError, NamespaceSpec
from scheduling.models import Job, JobState, ProjectNamespace
from tenants import services as tenant_services
from tenants.models import Role

from .conftest import submit

pytestmark = pytest.mark.django_db(transaction=True)


def _colliding_projects(world: Any) -> tuple[Any, Any]:
    """Tenant acme's project ml-x, and tenant acme-ml's project x: ``camp-acme-ml-x`` both."""
    first = tenant_services.project_create(actor=world.a.owner, tenant=world.a.tenant, name="ml-x")
    other = tenant_services.tenant_create(actor=world.admin, name="acme-ml")
    second = tenant_services.project_create(actor=world.admin, tenant=other, name="x")
    return first, second


def test_projects_whose_names_join_alike_get_different_namespaces(world: Any, sim_cluster: Any) -> None:
    first, second = _colliding_projects(world)
    one = services.project_namespace_ensure(cluster=sim_cluster, project=first)
    two = services.project_namespace_ensure(cluster=sim_cluster, project=second)
    assert one != two
    assert (one, two) == (f"camp-p{first.pk}-ml-x", f"camp-p{second.pk}-x")
    # Stable: asked again, the stored name.
    assert services.project_namespace_ensure(cluster=sim_cluster, project=first) == one
    from tenants.models import AuditEvent

    assigned = AuditEvent.objects.filter(action="namespace.assigned").order_by("id")
    assert [(e.project_id, e.after["namespace"]) for e in assigned] == [
        (first.pk, one), (second.pk, two)]
    # The constraint is the check: no second project may ever be given the same name.
    with pytest.raises(IntegrityError), transaction.atomic():
        ProjectNamespace.objects.create(cluster=sim_cluster, project=world.b.project, name=one)


def test_a_taken_name_is_never_shared(world: Any, sim_cluster: Any) -> None:
    """Should the id-based name be taken (a namespace kept from before), the project gets
    another one rather than sharing it."""
    project = world.a.project
    ProjectNamespace.objects.create(cluster=sim_cluster, project=world.b.project,
                                    name=f"camp-p{project.pk}-{project.name}")
    name = services.project_namespace_ensure(cluster=sim_cluster, project=project)
    assert name == f"camp-p{project.pk}-1"


def test_jobs_run_in_their_projects_namespace(world: Any, sim_cluster: Any) -> None:
    first, second = _colliding_projects(world)
    member = world.a.member
    tenant_services.membership_create(actor=world.a.owner, user=member, tenant=world.a.tenant,
                                      project=first, role=Role.PROJECT_MEMBER)
    a = services.job_submit(actor=member, project=first, cluster=sim_cluster, name="a",
                            groups=[{"name": "worker", "gpu_count": 1}])
    b = services.job_submit(actor=world.admin, project=second, cluster=sim_cluster, name="b",
                            groups=[{"name": "worker", "gpu_count": 1}])
    services.cycle_run(cluster=sim_cluster)
    for job in (a, b):
        assert services.job_dispatch(job_id=job.pk) == "created"
        job.refresh_from_db()
    assert a.namespace == f"camp-p{first.pk}-ml-x" and b.namespace == f"camp-p{second.pk}-x"
    from scheduling.models import SimulatedPod

    assert {p.namespace for p in SimulatedPod.objects.filter(labels__contains={
        "camp.io/job-id": str(a.pk)})} == {a.namespace}


def test_migration_keeps_existing_namespaces_and_splits_collisions(world: Any, sim_cluster: Any) -> None:
    """Before 0005_i11b both projects shared ``camp-acme-ml-x``. After it, the first keeps
    that namespace (its volumes are there), the second gets its own; a job of the second
    running in the shared namespace is still found there (and stopped there)."""
    first, second = _colliding_projects(world)
    old = "camp-acme-ml-x"
    a = submit(world, sim_cluster, "a")
    Job.objects.filter(pk=a.pk).update(project=first, state=JobState.SUCCEEDED)
    b = services.job_submit(actor=world.admin, project=second, cluster=sim_cluster, name="b",
                            groups=[{"name": "worker", "gpu_count": 1}])
    services.cycle_run(cluster=sim_cluster)
    assert services.job_dispatch(job_id=b.pk) == "created"
    # As the database looked before the migration: no stored names, pods in the old one.
    ProjectNamespace.objects.all().delete()
    Job.objects.filter(pk=b.pk).update(namespace="")
    from scheduling.models import SimulatedPod

    SimulatedPod.objects.filter(labels__contains={"camp.io/job-id": str(b.pk)}).update(namespace=old)
    migration = importlib.import_module("scheduling.migrations.0005_i11b_namespaces_health")
    migration.keep_existing_namespaces(apps, None)

    assert ProjectNamespace.objects.get(project=first).name == old
    assert ProjectNamespace.objects.get(project=second).name == f"camp-p{second.pk}-x"
    b.refresh_from_db()
    assert b.namespace == old  # where its pods are
    services.job_cancel(actor=world.admin, job=b)
    assert services.job_stop(job_id=b.pk) == "released"
    assert not SimulatedPod.objects.filter(namespace=old, deleted_at__isnull=True).exists()


def test_the_kubernetes_backend_refuses_another_projects_namespace(world: Any) -> None:
    from .kmockserver import kmock_server

    with kmock_server() as k:
        from kubernetes import client as k8s

        from scheduling.backends.kubernetes import KubernetesBackend

        cfg = k8s.Configuration()
        cfg.host = str(k.url).rstrip("/")
        # kmock 0.8 cannot store namespaces: a canned one, owned by project 1.
        k["get /api/v1/namespaces/camp-shared"] << {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "camp-shared", "labels": {"camp.io/project-id": "1"}}}
        backend = KubernetesBackend(k8s.ApiClient(cfg), retries=0)
        with pytest.raises(BackendError, match="belongs to another project"):
            backend.ensure_namespace(NamespaceSpec(name="camp-shared", labels={
                "camp.io/project-id": "2", "camp.io/project": "x"}, quota={}))
        assert list(k["patch /api/v1/namespaces/camp-shared"]) == []  # never relabelled


# --- data volumes ----------------------------------------------------------------------------


def _train(world: Any, cluster: Any, user: Any, data_volume: str, name: str = "t") -> Any:
    from workspaces import services as ws

    return ws.training_submit(actor=user, project=world.a.project, cluster=cluster, name=name,
                              framework="pytorch", image_reference="pytorch/pytorch:2",
                              gpu_count=1, cpu_millicores=1000, ram_mib=1024,
                              data_volume=data_volume)


def test_data_volume_may_not_be_a_colleagues_home(world: Any, sim_cluster: Any) -> None:
    from registry.models import Image
    from workspaces import services as ws

    env, _ = ws.environment_launch(actor=world.a.project_admin, project=world.a.project,
                                cluster=sim_cluster, name="nb", kind="jupyter",
                                image=Image.objects.get(name="pytorch-jupyter"))
    with pytest.raises(ValidationError) as err:
        _train(world, sim_cluster, world.a.member, env.home_claim)
    assert list(err.value.message_dict) == ["data_volume"]
    assert "home volume of another user" in err.value.message_dict["data_volume"][0]
    # Its owner may mount it; data sets and the project's checkpoint volumes are fine.
    assert _train(world, sim_cluster, world.a.project_admin, env.home_claim, "own").data_volume
    assert _train(world, sim_cluster, world.a.member, "imagenet", "data").data_volume == "imagenet"


def test_data_volume_may_not_be_another_projects_checkpoints(world: Any, sim_cluster: Any) -> None:
    from workspaces import services as ws

    theirs = ws.training_submit(actor=world.b.member, project=world.b.project, cluster=sim_cluster,
                                name="theirs", framework="pytorch", image_reference="pytorch/pytorch:2",
                                gpu_count=1, cpu_millicores=1000, ram_mib=1024,
                                checkpoint_dir="/ckpt", checkpoint_volume_gib=1)
    with pytest.raises(ValidationError) as err:
        _train(world, sim_cluster, world.a.member, f"tr-{theirs.pk}-ckpt")
    assert "not a checkpoint volume of this project" in err.value.message_dict["data_volume"][0]


def test_api_answers_400_naming_data_volume(world: Any, sim_cluster: Any) -> None:
    from registry.models import Image
    from tests.conftest import client_for
    from workspaces import services as ws

    env, _ = ws.environment_launch(actor=world.a.project_admin, project=world.a.project,
                                cluster=sim_cluster, name="nb", kind="jupyter",
                                image=Image.objects.get(name="pytorch-jupyter"))
    r = client_for(world.a.member).post("/api/v1/training-jobs/", {
        "project": world.a.project.pk, "cluster": sim_cluster.name, "name": "steal",
        "framework": "pytorch", "image": Image.objects.get(name="pytorch-training").pk,
        "workers": 1, "gpu_count": 1, "cpu_millicores": 1000, "ram_mib": 1024,
        "data_volume": env.home_claim}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["data_volume"], r.content
