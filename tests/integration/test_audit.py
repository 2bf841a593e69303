"""The audit log: written with each change, append-only in PostgreSQL, hash-chained."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from tenants import services
from tenants.models import AuditEvent
from tests.conftest import PASSWORD, World, client_for

pytestmark = pytest.mark.django_db


def test_changes_write_events_with_actor_tenant_before_after(world: World) -> None:
    quota = services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                               values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(8)})
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(6)})
    event = AuditEvent.objects.filter(action="quota.updated").get()
    assert event.actor_username == "root-admin"
    assert event.tenant_id == world.a.tenant.pk
    assert event.target_id == str(quota.pk)
    assert event.before["gpus_guaranteed"] == "4.00"
    assert event.after["gpus_guaranteed"] == "6"


def test_api_request_records_request_id_and_client_ip(world: World) -> None:
    client = client_for(world.a.owner)
    response = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "audited"},
                           format="json", HTTP_X_REQUEST_ID="req-12345", REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 201
    assert response["X-Request-ID"] == "req-12345"
    event = AuditEvent.objects.get(action="project.created", target_repr="acme/audited")
    assert event.request_id == "req-12345"
    assert event.client_ip == "10.1.2.3"
    assert event.project_id == response.json()["id"]


def test_login_logout_and_failed_login_are_audited(world: World, client) -> None:  # type: ignore[no-untyped-def]
    client.post("/login/", {"username": "acme-member", "password": "wrong"})
    failed = AuditEvent.objects.get(action="auth.login_failed")
    assert failed.actor_username == "acme-member" and failed.actor_id is None
    assert "wrong" not in str(failed.before) + str(failed.after) + failed.target_repr
    client.post("/login/", {"username": "acme-member", "password": PASSWORD})
    assert AuditEvent.objects.filter(action="auth.login", actor=world.a.member).exists()
    client.post("/logout/")
    assert AuditEvent.objects.filter(action="auth.logout", actor=world.a.member).exists()


def test_update_and_delete_are_refused_by_the_database(world: World) -> None:
    event = AuditEvent.objects.first()
    assert event is not None
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="nothing.happened")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    event.refresh_from_db()
    assert event.action != "nothing.happened"


def test_verify_passes_on_an_intact_chain(world: World) -> None:
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert f"{AuditEvent.objects.count()} events verified" in out.getvalue()


def _as_superuser_bypassing_triggers(sql: str, params: list[object]) -> None:
    """Tamper as a database superuser would: with triggers switched off."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


def _sealed_events() -> list[AuditEvent]:
    """The events as they are once their writers have committed: sealed into the chain
    (here the test's transaction never commits, so seal as the after-commit step would)."""
    from tenants.audit import seal

    seal(wait=True)
    events = list(AuditEvent.objects.order_by("id"))
    assert all(event.hash for event in events)
    return events


def test_verify_names_the_first_edited_row(world: World) -> None:
    events = _sealed_events()
    victim = events[5]
    _as_superuser_bypassing_triggers(
        "UPDATE tenants_auditevent SET after = %s WHERE id = %s", ['{"role": "tenant_owner"}', victim.pk]
    )
    with pytest.raises(CommandError, match=f"event #{victim.pk}: its content does not match"):
        call_command("audit_verify", stdout=StringIO())


def test_verify_names_the_row_after_a_deleted_one(world: World) -> None:
    events = _sealed_events()
    _as_superuser_bypassing_triggers("DELETE FROM tenants_auditevent WHERE id = %s", [events[3].pk])
    with pytest.raises(CommandError, match=f"event #{events[4].pk}: its link"):
        call_command("audit_verify", stdout=StringIO())


def test_owner_sees_only_own_tenant_events_and_exports_csv(world: World) -> None:
    client = client_for(world.a.owner)
    rows = client.get("/api/v1/audit-events/", {"page_size": 200}).json()["results"]
    assert rows and {r["tenant"] for r in rows} == {world.a.tenant.pk}
    response = client.get("/api/v1/audit-events/export/", {"action": "membership."})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    lines = b"".join(response.streaming_content).decode().strip().splitlines()
    assert lines[0].startswith("id,created_at,actor_username")
    assert len(lines) == 1 + AuditEvent.objects.filter(
        tenant=world.a.tenant, action__startswith="membership.").count()
    assert all("globex" not in line for line in lines)


def test_audit_filters(world: World) -> None:
    client = client_for(world.admin)
    rows = client.get("/api/v1/audit-events/", {"actor": "acme-owner"}).json()["results"]
    assert rows and all(r["actor_username"] == "acme-owner" for r in rows)
    bad = client.get("/api/v1/audit-events/", {"since": "not-a-date"})
    assert bad.status_code == 400 and "since" in bad.json()


def test_lockout_does_not_flood_the_audit_log(world: World, client) -> None:  # type: ignore[no-untyped-def]
    from django.core.cache import cache

    cache.clear()
    for _ in range(20):
        client.post("/login/", {"username": "acme-member", "password": "wrong"})
    failed = AuditEvent.objects.filter(action="auth.login_failed").count()
    # The attempts before the limit, then one auth.locked_out for the attempt that reached it;
    # the 15 attempts refused by the lockout write nothing.
    assert failed == 4
    assert AuditEvent.objects.filter(action="auth.locked_out", actor_username="acme-member").count() == 1


def test_normalised_values_do_not_break_the_chain(world: World) -> None:
    from tenants.audit import audit_record
    from tenants.middleware import RequestContext, current_request

    token = current_request.set(RequestContext(request_id="r1", client_ip="2001:DB8:0:0:0:0:0:1"))
    try:
        audit_record(actor=world.admin, action="test.numbers", after={"big": 1e16, "half": 0.5, "two": 2.0})
    finally:
        current_request.reset(token)
    event = AuditEvent.objects.get(action="test.numbers")
    assert event.client_ip == "2001:db8::1"
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "verified" in out.getvalue()


def test_batched_events_chain_in_order(world: World) -> None:
    from django.db import transaction

    from tenants.audit import audit_batch, audit_record

    with transaction.atomic(), audit_batch():
        for i in range(3):
            audit_record(actor=world.admin, action=f"test.batch.{i}")
        assert not AuditEvent.objects.filter(action__startswith="test.batch").exists()  # not yet
    actions = list(AuditEvent.objects.filter(action__startswith="test.batch").order_by("id")
                   .values_list("action", flat=True))
    assert actions == ["test.batch.0", "test.batch.1", "test.batch.2"]
    call_command("audit_verify", stdout=StringIO())
