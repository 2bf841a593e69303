"""Dashboards, quota bars, showback and Prometheus metrics over real scheduler state."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.test.utils import override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal import services as portal_services
from portal.models import CycleStat, UsageSample
from scheduling import services
from tenants import services as tenant_services
from tenants.models import AuditEvent
from tests.conftest import World
from tests.integration.scheduling.conftest import SMALL_INVENTORY, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def cluster(world: World) -> Any:
    c = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=c)
    return c


def _running(world: World, cluster: Any) -> None:
    """acme-member holds 2 whole A100s and a half L4 slice; globex-member holds 1 A100.
    acme's jobs are preemptible, so they may borrow beyond a guarantee the tests set."""
    submit(world, cluster, "two-cards", preemptible=True, group={"gpu_count": 2, "cpu_millicores": 4000})
    submit(world, cluster, "half-l4", preemptible=True,
           group={"gpu_count": 1, "gpu_memory_mib": 11517, "gpu_cores_percent": 50, "gpu_models": ["L4"]})
    submit(world, cluster, "globex-one", side="b")
    summary = services.cycle_run(cluster=cluster)
    assert summary is not None and len(summary.admitted) == 3, summary


def _metrics(client: Client, **headers: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_metrics_report_allocation_jobs_waits_and_cycles(world: World, cluster: Any) -> None:
    _running(world, cluster)
    submit(world, cluster, "too-many", group={"gpu_count": 8})  # never fits: rejected
    services.cycle_run(cluster=cluster)
    m = _metrics(Client())
    sim = (("cluster", "sim"),)
    assert m["camp_gpus"][(("cluster", "sim"), ("state", "in_use"))] == 4
    assert m["camp_gpus"][(("cluster", "sim"), ("state", "free"))] == 6
    assert m["camp_gpu_share_allocated"][sim] == pytest.approx(3.5, abs=0.01)
    assert m["camp_jobs"][(("cluster", "sim"), ("state", "rejected"))] == 1
    assert m["camp_queue_wait_seconds_count"][sim] == 3
    assert m["camp_cycle_duration_seconds_count"][sim] == CycleStat.objects.count() == 2
    assert m["camp_dispatch_errors_total"][sim] == 0


@override_settings(METRICS_TOKEN="s3cret-scrape-token")
def test_metrics_token_is_enforced(world: World, cluster: Any) -> None:
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert "camp_gpus" in _metrics(Client(), HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")


def test_showback_sums_gpu_hours_per_project_and_user(world: World, cluster: Any) -> None:
    _running(world, cluster)
    start = timezone.now() - dt.timedelta(hours=2)
    for i in range(4):  # four 30-minute samples = 2 hours of the same usage
        portal_services.usage_sample_record(cluster=cluster, now=start + dt.timedelta(minutes=30 * i),
                                            interval_seconds=1800)
    client = Client()
    client.force_login(world.a.owner)
    page = client.get("/t/acme/usage/", {"by": "project"})
    assert page.status_code == 200
    rows = {(r.project, r.cluster, r.gpu_model): r for r in page.context["rows"]}
    # 2 cards + a half L4 for two hours = 5 GPU-hours in acme-p1, split by GPU model (an
    # A100-hour is not an L4-hour); globex is not in acme's report
    assert set(rows) == {("acme-p1", "sim", "A100-80G"), ("acme-p1", "sim", "L4")}
    assert rows[("acme-p1", "sim", "A100-80G")].gpu_hours == pytest.approx(4.0, abs=0.01)
    assert rows[("acme-p1", "sim", "L4")].gpu_hours == pytest.approx(1.0, abs=0.01)
    assert page.context["total"] == pytest.approx(5.0, abs=0.01)
    assert all(r.cost is None for r in rows.values()) and "no price" in page.content.decode()
    by_user = client.get("/t/acme/usage/", {"by": "user"}).context["rows"]
    assert {r.user for r in by_user} == {"acme-member"}
    assert sum(r.gpu_hours for r in by_user) == pytest.approx(5.0, abs=0.01)
    csv = client.get("/t/acme/usage/", {"by": "project", "format": "csv"})
    lines = csv.content.decode().strip().splitlines()
    assert lines[0].startswith("tenant,project,user,cluster,gpu_model,gpu_hours")
    assert sorted(line.split(",")[:6] for line in lines[1:]) == [
        ["acme", "acme-p1", "", "sim", "A100-80G", "4.0"], ["acme", "acme-p1", "", "sim", "L4", "1.0"]]


def test_showback_costs_each_gpu_model_at_its_price(world: World, cluster: Any) -> None:
    """Issue 32, finding 9: platform admins price an hour per GPU model (and CPU, RAM); the
    owner's report costs each row at its model's price and names what has no price."""
    from django.core.exceptions import PermissionDenied, ValidationError

    from portal.models import Price

    _running(world, cluster)
    start = timezone.now() - dt.timedelta(hours=2)
    for i in range(4):
        portal_services.usage_sample_record(cluster=cluster, now=start + dt.timedelta(minutes=30 * i),
                                            interval_seconds=1800)
    admin = Client()
    admin.force_login(world.admin)
    for model, price in (("A100-80G", "2.50"), ("L4", "0.80")):
        set_ = admin.post("/admin/prices/", {"kind": "gpu", "gpu_model": model, "per_hour": price})
        assert set_.status_code == 302
    portal_services.price_set(actor=world.admin, kind="cpu", per_hour="0.04")
    bad = admin.post("/admin/prices/", {"kind": "gpu", "gpu_model": "", "per_hour": "-1"})
    assert bad.status_code == 400 and b"gpu_model" in bad.content
    with pytest.raises(ValidationError) as err:
        portal_services.price_set(actor=world.admin, kind="ram", gpu_model="L4", per_hour="1")
    assert "gpu_model" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        portal_services.price_set(actor=world.admin, kind="cpu", per_hour="NaN")
    assert "per_hour" in err.value.message_dict
    with pytest.raises(PermissionDenied):
        portal_services.price_set(actor=world.a.owner, kind="cpu", per_hour="0")
    owner = Client()
    owner.force_login(world.a.owner)
    assert owner.get("/admin/prices/").status_code == 404  # a platform page
    page = owner.get("/t/acme/usage/")
    report = page.context["report"]
    rows = {r.gpu_model: r for r in report.rows}
    for model, price in (("A100-80G", Decimal("2.50")), ("L4", Decimal("0.80"))):
        r = rows[model]
        expected = price * Decimal(str(r.gpu_hours)) + Decimal("0.04") * Decimal(str(r.cpu_core_hours))
        assert r.cost == pytest.approx(expected, abs=Decimal("0.01"))
    assert rows["A100-80G"].cost > Decimal("10")  # 4 A100-hours at 2.50 = 10, and its CPU
    assert report.cost == rows["A100-80G"].cost + rows["L4"].cost
    assert report.unpriced == ["RAM GiB-hour"]
    assert "No price is set for: RAM GiB-hour" in page.content.decode()
    csv = owner.get("/t/acme/usage/", {"format": "csv"}).content.decode().splitlines()
    assert csv[0].endswith("cost,currency,since,until") and ",USD," in csv[1]
    changes = AuditEvent.objects.filter(action="price.set").order_by("id")
    assert [e.after["gpu_model"] for e in changes] == ["A100-80G", "L4", ""]
    admin.post("/admin/prices/", {"kind": "gpu", "gpu_model": "L4", "per_hour": "1.00"})
    assert Price.objects.get(gpu_model="L4").per_hour == Decimal("1.0000")
    last = AuditEvent.objects.filter(action="price.set").order_by("id").last()
    assert last is not None and last.before == {"per_hour": "0.8000"}


def test_showback_period_is_validated(world: World) -> None:
    client = Client()
    client.force_login(world.a.owner)
    bad = client.get("/t/acme/usage/", {"since": "2026-13-45"})
    assert bad.status_code == 400 and b"since" in bad.content
    reversed_ = client.get("/t/acme/usage/", {"since": "2026-02-01", "until": "2026-01-01"})
    assert reversed_.status_code == 400


def test_usage_pages_are_for_owners_only(world: World) -> None:
    for user, tenant, want in [(world.a.member, "acme", 403), (world.a.project_admin, "acme", 403),
                               (world.a.owner, "globex", 404), (world.outsider, "acme", 404),
                               (world.admin, "globex", 200)]:
        client = Client()
        client.force_login(user)
        assert client.get(f"/t/{tenant}/usage/").status_code == want, (user, tenant)
    member = Client()
    member.force_login(world.a.member)
    assert member.get("/dashboard/").status_code == 403


def test_quota_bars_show_borrowing(world: World, cluster: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(8)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(1), "gpus_limit": Decimal(4)})
    _running(world, cluster)
    client = Client()
    client.force_login(world.a.owner)
    page = client.get("/t/acme/usage/")
    (project, bars), = page.context["project_bars"][:1]
    gpu = next(b for b in bars if b.resource == "gpus")
    assert (gpu.used, gpu.guaranteed, gpu.limit, gpu.borrowed) == (2.5, 1.0, 4.0, 1.5)
    assert b"1.5 borrowed" in page.content


def test_dashboard_charts_for_admin(world: World, cluster: Any) -> None:
    _running(world, cluster)
    portal_services.usage_sample_record(cluster=cluster)
    client = Client()
    client.force_login(world.admin)
    page = client.get("/dashboard/")
    assert page.status_code == 200
    data = page.context["chart_data"]
    assert data["clusters"][0]["name"] == "sim" and data["clusters"][0]["allocated"] == [35.0]
    assert set(data["tenants"]["tenants"]) == {"acme", "globex"}
    assert b"vendor/chartjs/chart.umd.min.js" in page.content
    owner = Client()
    owner.force_login(world.a.owner)
    owner_data = owner.get("/dashboard/").context["chart_data"]
    assert owner_data["clusters"] == [] and set(owner_data["tenants"]["tenants"]) == {"acme"}


def test_samples_record_who_holds_what(world: World, cluster: Any) -> None:
    _running(world, cluster)
    sample = portal_services.usage_sample_record(cluster=cluster)
    assert (sample.gpus_total, sample.gpus_in_use) == (10, 4)
    assert sample.gpu_share_allocated == pytest.approx(3.5, abs=0.01)
    per = {(u.project.name, u.user.username, u.gpu_model): round(u.gpu_share, 2)
           for u in UsageSample.objects.all()}
    assert per == {("acme-p1", "acme-member", "A100-80G"): 2.0, ("acme-p1", "acme-member", "L4"): 0.5,
                   ("globex-p1", "globex-member", "A100-80G"): 1.0}


def test_gpu_map_shows_slices_owners_and_health(world: World, cluster: Any) -> None:
    _running(world, cluster)
    from scheduling.models import GpuDevice

    GpuDevice.objects.filter(node__name="a100-1", index=3).update(healthy=False)
    client = Client()
    client.force_login(world.admin)
    page = client.get("/admin/clusters/sim/gpus/")
    assert page.status_code == 200
    nodes = {n["node"].name: n["cards"] for n in page.context["nodes"]}
    l4 = nodes["l4-0"]
    half = [s for c in l4 for s in c.slices]
    assert len(half) == 1 and half[0].user == "acme-member"
    assert half[0].width_pct == pytest.approx(50, abs=0.1)
    assert not nodes["a100-1"][3].healthy
    assert b"unhealthy" in page.content and b"acme-p1/half-l4" in page.content
    owner = Client()
    owner.force_login(world.a.owner)
    assert owner.get("/admin/clusters/sim/gpus/").status_code == 404


def test_queue_tree_shows_borrowing_and_fair_share(world: World, cluster: Any) -> None:
    tenant_services.quota_set(actor=world.admin, scope="tenant",
                              tenant=world.a.tenant, values={"gpus_guaranteed": Decimal(2)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(1)})
    _running(world, cluster)
    submit(world, cluster, "waits", group={"gpu_count": 8})  # never fits; not queued
    client = Client()
    client.force_login(world.admin)
    rows = {r.name: r for r in client.get("/admin/clusters/sim/queues/").context["rows"]}
    assert rows["acme/acme-p1"].fair_share == 2.5  # 2.5 GPUs used on 1 guaranteed: borrowing
    assert rows["acme"].fair_share == 1.25
    assert rows["globex/globex-p1"].fair_share is None  # no quota row
    assert rows["acme/acme-p1"].running == 2


def test_preemption_log_is_for_platform_admins(world: World) -> None:
    client = Client()
    client.force_login(world.admin)
    assert client.get("/admin/preemptions/").status_code == 200
    client.force_login(world.a.owner)
    assert client.get("/admin/preemptions/").status_code == 404


def test_estimated_start_from_running_jobs_durations(world: World, cluster: Any) -> None:
    from portal.selectors import estimate_start
    from scheduling.models import Job
    from tests.integration.workspaces.conftest import advance

    for i in range(2):  # both A100 nodes busy for an hour
        submit(world, cluster, f"hour-{i}", side="b", duration_seconds=3600,
               group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
        advance(cluster, rounds=1)
    running = list(Job.objects.filter(state="running"))
    assert len(running) == 2
    waiting = submit(world, cluster, "waits", group={"gpu_count": 4, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=cluster)
    waiting.refresh_from_db()
    assert waiting.state == "queued" and waiting.reason_kind == "capacity", waiting.reason
    est = estimate_start(waiting)
    first_end = min(j.started_at for j in running) + dt.timedelta(seconds=3600)
    assert est.at is not None and abs((est.at - first_end).total_seconds()) < 1
    client = Client()
    client.force_login(world.a.member)
    assert b"Estimated start:" in client.get(f"/scheduling/jobs/{waiting.pk}/").content


def test_no_estimate_when_waiting_for_quota(world: World, cluster: Any) -> None:
    from portal.selectors import estimate_start

    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(1), "gpus_limit": Decimal(2)})
    submit(world, cluster, "first", preemptible=True, group={"gpu_count": 2})
    services.cycle_run(cluster=cluster)
    job = submit(world, cluster, "second", preemptible=True, group={"gpu_count": 1})
    services.cycle_run(cluster=cluster)
    job.refresh_from_db()
    assert job.reason_kind == "quota", job.reason
    est = estimate_start(job)
    assert est.at is None and "quota" in est.note


@override_settings(METRICS_TOKEN="", METRICS_PUBLIC=False)
def test_metrics_closed_without_token_when_not_public(world: World, cluster: Any) -> None:
    assert Client().get("/metrics").status_code == 401
    member = Client()
    member.force_login(world.a.member)
    assert member.get("/metrics").status_code == 401
    admin = Client()
    admin.force_login(world.admin)
    assert admin.get("/metrics").status_code == 200


def test_showback_csv_neutralises_formulas(world: World, cluster: Any) -> None:
    from tenants.models import User

    User.objects.filter(pk=world.a.member.pk).update(username="=cmd|calc")
    world.a.member.refresh_from_db()
    _running(world, cluster)
    portal_services.usage_sample_record(cluster=cluster)
    client = Client()
    client.force_login(world.a.owner)
    body = client.get("/t/acme/usage/", {"by": "user", "format": "csv"}).content.decode()
    assert ",'=cmd|calc," in body and ",=cmd" not in body


def test_prices_and_usage_through_the_api_and_cli(world: World, cluster: Any, live_server: Any,
                                                  tmp_path: Any) -> None:
    """The same report as the usage page, from /api/v1/usage/ and ``camp usage``; prices set
    through /api/v1/prices/ by a platform admin only."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tests.conftest import client_for

    _running(world, cluster)
    portal_services.usage_sample_record(cluster=cluster, now=timezone.now() - dt.timedelta(hours=1),
                                        interval_seconds=3600)
    admin = client_for(world.admin)
    made = admin.post("/api/v1/prices/", {"kind": "gpu", "gpu_model": "A100-80G", "per_hour": "3"},
                      format="json")
    assert made.status_code == 201 and made.json()["currency"] == "USD", made.content
    no_model = admin.post("/api/v1/prices/", {"kind": "gpu", "per_hour": "3"}, format="json")
    assert no_model.status_code == 400 and "gpu_model" in no_model.json()
    owner = client_for(world.a.owner)
    assert owner.post("/api/v1/prices/", {"kind": "cpu", "per_hour": "1"}, format="json").status_code == 403
    assert [p["gpu_model"] for p in owner.get("/api/v1/prices/").json()["results"]] == ["A100-80G"]
    report = owner.get("/api/v1/usage/", {"tenant": "acme"}).json()
    page = Client()
    page.force_login(world.a.owner)
    shown = page.get("/t/acme/usage/").context["report"]
    assert [(r["gpu_model"], r["gpu_hours"]) for r in report["rows"]] == [
        (r.gpu_model, r.gpu_hours) for r in shown.rows]
    assert report["cost"] == str(shown.cost) and report["unpriced"] == shown.unpriced
    assert client_for(world.a.member).get("/api/v1/usage/", {"tenant": "acme"}).status_code == 403
    assert client_for(world.b.owner).get("/api/v1/usage/", {"tenant": "acme"}).status_code == 404
    assert owner.get("/api/v1/usage/").json() == {"tenant": ["Name the tenant."]}
    assert "since" in owner.get("/api/v1/usage/", {"tenant": "acme", "since": "2026-13-45"}).json()
    _, token = tenant_services.token_create(actor=world.a.owner, name="cli")
    env = {**os.environ, "CAMP_URL": live_server.url, "CAMP_TOKEN": token,
           "CAMP_CONFIG": str(tmp_path / "config.json")}
    out = subprocess.run([sys.executable, "-m", "camp_cli", "usage", "acme"], env=env, cwd=settings.BASE_DIR,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "acme-p1 · sim · A100-80G: 2 GPU-h" in out.stdout and "USD" in out.stdout
    assert "no price set for: " in out.stdout and "GPU-hour of L4" in out.stdout
