"""Compute presets (workspaces.Profile with a GPU model): launched from the console form in
one post, used per worker by training jobs, counted as "free now" from the inventory, and
refused when not offered to the project."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from registry.models import Image
from workspaces import presets, services
from workspaces.models import DevEnvironment, Profile, TrainingJob

from .conftest import advance

pytestmark = pytest.mark.django_db


def _preset(world: Any, name: str, **kw: Any) -> Profile:
    return services.profile_create(actor=world.admin, name=name, **kw)


def test_slice_preset_reads_as_a_fraction_of_a_named_card_and_counts_free_slices(
    world: Any, sim_cluster: Any
) -> None:
    quarter = _preset(world, "a100-quarter", display_name="¼ A100 · 20 GB", gpu_model="A100-80G",
                      gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25)
    whole = _preset(world, "l4-2", gpu_model="L4", gpu_count=2, cpu_millicores=1000, ram_mib=2048)
    cards = {c.profile.name: c for c in presets.preset_cards([quarter, whole], [sim_cluster], world.a.member)}
    assert cards["a100-quarter"].gpu == "¼ of an A100-80G"
    assert "20480 MiB" in cards["a100-quarter"].detail and "25 %" in cards["a100-quarter"].detail
    # SMALL_INVENTORY: 2 nodes × 4 A100 (4 quarters each), 1 node × 2 L4
    assert cards["a100-quarter"].free_now == [(sim_cluster, 32)]
    assert cards["l4-2"].free_now == [(sim_cluster, 1)]
    assert cards["l4-2"].gpu == "2× L4 (whole cards)"


def test_console_launch_with_a_preset_takes_its_shape_and_model(world: Any, sim_cluster: Any) -> None:
    jupyter = Image.objects.get(name="pytorch-jupyter")
    quarter = _preset(world, "a100-quarter", gpu_model="A100-80G", gpu_count=1, gpu_memory_mib=20480,
                      gpu_cores_percent=25, cpu_millicores=1000, ram_mib=2048, image=jupyter)
    c = Client()
    c.force_login(world.a.member)
    form = c.get("/workspaces/environments/new/").content.decode()
    assert "¼ of an A100-80G" in form and "Free now: 32" in form
    assert 'value="sim" selected' in form  # the only cluster is preselected
    ok = c.post("/workspaces/environments/new/", {
        "project": world.a.project.pk, "cluster": "sim", "name": "nb", "kind": "jupyter",
        "profile": quarter.pk, "gpu_count": 0, "gpu_memory_mib": 0, "gpu_cores_percent": 0,
        "cpu_millicores": 100, "ram_mib": 128, "home_gib": 5})
    assert ok.status_code == 302
    env = DevEnvironment.objects.get(name="nb")
    assert (env.gpu_count, env.gpu_memory_mib, env.gpu_cores_percent) == (1, 20480, 25)
    assert env.gpu_models == ["A100-80G"] and env.image == jupyter
    advance(sim_cluster)
    env.refresh_from_db()
    assert env.state == "running"
    assert env.job is not None
    nodes = set(env.job.allocations.values_list("node__name", flat=True))
    assert nodes and all(n.startswith("a100-") for n in nodes)
    # one quarter is taken now
    card = presets.preset_cards([quarter], [sim_cluster], world.a.member)[0]
    assert card.free_now == [(sim_cluster, 31)]


def test_training_with_a_preset_is_workers_times_preset(world: Any, sim_cluster: Any) -> None:
    l4 = _preset(world, "l4-1", gpu_model="L4", gpu_count=1, cpu_millicores=1000, ram_mib=2048)
    t = services.training_submit(
        actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="ddp",
        framework="pytorch", image_reference="pytorch/pytorch:2.4", workers=2, profile=l4,
        gpu_count=8, cpu_millicores=64000)  # the preset wins over the shape fields
    assert (t.gpu_count, t.cpu_millicores, t.gpu_models) == (1, 1000, ["L4"])
    advance(sim_cluster)
    t.refresh_from_db()
    assert t.state == "running"
    assert t.job is not None
    assert set(t.job.allocations.values_list("node__name", flat=True)) == {"l4-0"}


def test_a_preset_limited_to_another_tenant_is_refused(world: Any, sim_cluster: Any) -> None:
    only_b = _preset(world, "globex-only", gpu_count=1, cpu_millicores=1000, ram_mib=2048,
                     tenants=[world.b.tenant])
    with pytest.raises(ValidationError) as exc:
        services.training_submit(
            actor=world.a.member, project=world.a.project, cluster=sim_cluster, name="ddp",
            framework="pytorch", image_reference="pytorch/pytorch:2.4", profile=only_b)
    assert "profile" in exc.value.message_dict
    assert not TrainingJob.objects.filter(name="ddp").exists()
    c = Client()
    c.force_login(world.a.member)
    assert "globex-only" not in c.get("/workspaces/training/new/").content.decode()


def test_platform_admin_defines_a_preset_in_the_console_with_audit(world: Any, sim_cluster: Any) -> None:
    from tenants.models import AuditEvent

    member = Client()
    member.force_login(world.a.member)
    assert member.get("/workspaces/profiles/new/").status_code == 403
    assert member.post("/workspaces/profiles/new/", {"name": "sneaky"}).status_code == 403
    admin = Client()
    admin.force_login(world.admin)
    form = admin.get("/workspaces/profiles/new/").content.decode()
    assert '<option value="A100-80G">' in form  # GPU models come from the inventory
    ok = admin.post("/workspaces/profiles/new/", {
        "name": "a100-half", "display_name": "½ A100", "gpu_model": "A100-80G", "gpu_count": 1,
        "gpu_memory_mib": 40960, "gpu_cores_percent": 50, "cpu_millicores": 4000, "ram_mib": 16384,
        "home_gib": 10, "enabled": "on", "tenants": [world.a.tenant.pk]})
    assert ok.status_code == 302, ok.content.decode()[:2000]
    p = Profile.objects.get(name="a100-half")
    assert list(p.tenants.all()) == [world.a.tenant]
    event = AuditEvent.objects.filter(action="profile.created").latest("id")
    assert event.after["gpu_model"] == "A100-80G"
    listing = member.get("/workspaces/profiles/").content.decode()
    assert "½ of an A100-80G" in listing
    b = Client()
    b.force_login(world.b.member)
    assert "½ A100" not in b.get("/workspaces/profiles/").content.decode()
    edit = admin.post(f"/workspaces/profiles/{p.pk}/edit/", {
        "name": "a100-half", "display_name": "½ A100", "gpu_model": "A100-80G", "gpu_count": 1,
        "gpu_memory_mib": 40960, "gpu_cores_percent": 150, "cpu_millicores": 4000, "ram_mib": 16384,
        "home_gib": 10, "enabled": "on"})
    assert edit.status_code == 200 and "100" in edit.content.decode()  # refused, nothing saved
    assert Profile.objects.get(pk=p.pk).gpu_cores_percent == 50


def _fill(world: Any, cluster: Any, durations: tuple[int | None, int | None, int | None]) -> None:
    """Every GPU of SMALL_INVENTORY taken by another tenant's jobs with these durations."""
    from scheduling.models import Job
    from tests.integration.scheduling.conftest import submit

    shapes = [{"gpu_count": 4, "gpu_models": ["A100-80G"]}, {"gpu_count": 4, "gpu_models": ["A100-80G"]},
              {"gpu_count": 2, "gpu_models": ["L4"]}]
    for i, (shape, seconds) in enumerate(zip(shapes, durations, strict=True)):
        submit(world, cluster, f"busy-{i}", side="b", duration_seconds=seconds, group=shape)
        advance(cluster, rounds=1)
    assert Job.objects.filter(state="running").count() == 3


def test_full_cluster_card_says_when_a_preset_is_expected_to_start(world: Any, sim_cluster: Any) -> None:
    whole = _preset(world, "a100-1", gpu_model="A100-80G", gpu_count=1, cpu_millicores=1000, ram_mib=2048)
    _fill(world, sim_cluster, (3600, 2400, 3600))  # one A100 node frees in 40 min
    card = presets.preset_cards([whole], [sim_cluster], world.a.member)[0]
    assert card.free_now == [(sim_cluster, 0)]
    assert card.availability == [(sim_cluster, 0, "expected in about 40 min")]
    c = Client()
    c.force_login(world.a.member)
    form = c.get("/workspaces/environments/new/").content.decode()
    assert "None free now, expected in about 40 min" in form


def test_no_estimate_when_nothing_running_ends_by_a_known_time(world: Any, sim_cluster: Any) -> None:
    whole = _preset(world, "a100-1", gpu_model="A100-80G", gpu_count=1, cpu_millicores=1000, ram_mib=2048)
    _fill(world, sim_cluster, (None, None, None))
    card = presets.preset_cards([whole], [sim_cluster], world.a.member)[0]
    assert card.availability == [(sim_cluster, 0, "no estimate: nothing running ends by a known time")]


def test_expected_waits_load_the_cluster_once_whatever_the_number_of_presets(
    world: Any, sim_cluster: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _fill(world, sim_cluster, (3600, 2400, 3600))
    shapes = [
        _preset(world, f"p{i}", gpu_model="A100-80G", gpu_count=1 + i % 2, cpu_millicores=1000, ram_mib=2048)
        for i in range(6)
    ]
    presets.preset_cards(shapes[:1], [sim_cluster], world.a.member)  # per-user lookups cached
    counts = []
    for profiles in ([], shapes[:1], shapes):
        with CaptureQueriesContext(connection) as ctx:
            cards = presets.preset_cards(profiles, [sim_cluster], world.a.member)
        assert all(wait.startswith("expected in about") for c in cards for _cl, _n, wait in c.availability)
        counts.append(len(ctx.captured_queries))
    # the capacity timeline (three queries) is loaded once for the cluster, not once per preset
    assert counts[1] == counts[2] == counts[0] + 3, counts
