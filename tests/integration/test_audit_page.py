"""The audit log reads as changes, not dict reprs (issue 32, finding 8): a compact
before → after per changed field with names instead of ids, the whole values in an
expandable detail, an until filter beside since, an action picker, and the timezone."""

from __future__ import annotations

import datetime as dt
import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from tenants import services
from tenants.models import AuditEvent, Role

pytestmark = pytest.mark.django_db


def _page(user: Any, **params: str) -> str:
    c = Client()
    c.force_login(user)
    r = c.get("/audit/", params)
    assert r.status_code == 200
    return r.content.decode()


def _row(page: str, action: str) -> str:
    i = page.index(f"<code>{action}</code>")
    return page[i:page.index("</tr>", i)]


def test_changes_are_compact_diffs_with_names(world: Any) -> None:
    newcomer = type(world.a.member).objects.create(username="newcomer")
    m = services.membership_create(actor=world.a.owner, user=newcomer, tenant=world.a.tenant,
                                   project=world.a.project, role=Role.PROJECT_MEMBER)
    services.membership_update(actor=world.a.owner, membership=m, role=Role.PROJECT_ADMIN)
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(3)})
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(5)})
    page = _page(world.a.owner)
    created = _row(page, "membership.created")
    # names, not ids; no dict repr
    assert '<span class="field">user</span>: newcomer' in created
    assert (f'<dt>project</dt><dd><span class="muted">after</span> <code>{world.a.project.tenant.name}/'
            f'{world.a.project.name}</code>') in created
    assert "{" not in created.split("<details>")[0]
    updated = _row(page, "membership.updated")
    assert ('<span class="field">role</span>: <del>project_member</del> → <ins>project_admin</ins>'
            in updated)
    assert "newcomer" not in updated.split('class="change"')[1].split("<details>")[0]  # only what changed
    quota = page[page.index("<code>quota.updated</code>"):]
    assert re.search(r'gpus_limit</span>: <del>3(\.00)?</del> → <ins>5(\.00)?</ins>', quota)
    assert "<details><summary>" in quota  # the whole values, folded away
    assert "Time (UTC)" in page and "Until (UTC)" in page


def test_long_values_are_cut_in_the_row_and_whole_in_the_detail(world: Any) -> None:
    uuid = "GPU-" + "0123456789abcdef" * 6
    from tenants.audit import audit_record
    audit_record(actor=world.admin, action="gpu.quarantined", tenant=world.a.tenant,
                 before={"gpus": []}, after={"gpus": [uuid, uuid]})
    row = _row(_page(world.admin), "gpu.quarantined")
    compact, detail = row.split("<details>")
    assert uuid not in compact and "…" in compact
    assert uuid in detail


def test_until_filter_and_action_picker(world: Any) -> None:
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={"gpus_guaranteed": Decimal(0), "gpus_limit": Decimal(3)})
    event = AuditEvent.objects.filter(action="quota.created").latest("id")
    page = _page(world.a.owner)
    assert '<select name="action"><option value="">all</option>' in page
    assert '<option value="quota.created">quota.created</option>' in page
    picked = _page(world.a.owner, action="quota.created")
    assert '<option value="quota.created" selected>' in picked and "<code>quota.created</code>" in picked
    before = (event.created_at - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    after = (event.created_at + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M")
    assert "<code>quota.created</code>" not in _page(world.a.owner, until=before)
    assert "<code>quota.created</code>" in _page(world.a.owner, until=after, since=before)
    # Another tenant's actions are not offered to this owner.
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                       values={"gpus_guaranteed": Decimal(1)})
    assert "quota.created" in _page(world.b.owner) and "tenant.quota" not in page
