"""REST API behaviour: field errors, idempotency, tokens, quotas, schema."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.models import ApiToken, AuditEvent, Membership, Project, Quota
from tests.conftest import World, client_for

pytestmark = pytest.mark.django_db


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, fields",
    [
        ({}, {"tenant", "name"}),
        ({"tenant": "x", "name": "Bad Name!"}, {"tenant", "name"}),
        ({"tenant": 999999, "name": "ok"}, {"tenant"}),
        ({"tenant": None, "name": "a" * 100}, {"tenant", "name"}),
    ],
)
def test_bad_project_input_names_each_field(world: World, body: dict[str, Any], fields: set[str]) -> None:
    response = client_for(world.a.owner).post("/api/v1/projects/", body, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields


def test_duplicate_project_name_is_a_field_error_not_a_500(world: World) -> None:
    client = client_for(world.a.owner)
    response = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "acme-p1"},
                           format="json")
    assert response.status_code == 400
    assert "name" in response.json()
    assert Project.objects.filter(tenant=world.a.tenant, name="acme-p1").count() == 1


def test_malformed_json_is_400(world: World) -> None:
    response = client_for(world.a.owner).generic(
        "POST", "/api/v1/projects/", "{not json", content_type="application/json")
    assert response.status_code == 400


def test_membership_role_must_match_scope(world: World) -> None:
    client = client_for(world.a.owner)
    response = client.post("/api/v1/memberships/", {
        "user": "outsider", "tenant": world.a.tenant.pk, "role": "project_member"}, format="json")
    assert response.status_code == 400 and "project" in response.json()
    response = client.post("/api/v1/memberships/", {
        "user": "nobody-here", "tenant": world.a.tenant.pk, "project": world.a.project.pk,
        "role": "boss"}, format="json")
    # where and which role are read first (permission is checked on them before any username
    # is looked up, issue 30 item 8); the username's error comes once they are valid
    assert response.status_code == 400 and set(response.json()) == {"role"}
    response = client.post("/api/v1/memberships/", {
        "user": "nobody-here", "tenant": world.a.tenant.pk, "project": world.a.project.pk,
        "role": "project_member"}, format="json")
    assert response.status_code == 400 and set(response.json()) == {"user"}


def test_project_admin_cannot_make_a_tenant_owner(world: World) -> None:
    membership = Membership.objects.get(user=world.a.member, project=world.a.project)
    response = client_for(world.a.project_admin).patch(
        f"/api/v1/memberships/{membership.pk}/", {"role": "tenant_owner"}, format="json")
    assert response.status_code in (400, 403)
    membership.refresh_from_db()
    assert membership.role == "project_member"


# --- idempotency ---------------------------------------------------------------------------


def test_idempotency_key_replays_the_first_result(world: World) -> None:
    client = client_for(world.a.owner)
    body = {"tenant": world.a.tenant.pk, "name": "retry-me"}
    first = client.post("/api/v1/projects/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    second = client.post("/api/v1/projects/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Project.objects.filter(name="retry-me").count() == 1
    assert AuditEvent.objects.filter(action="project.created", target_repr="acme/retry-me").count() == 1


def test_idempotency_key_reused_with_other_body_is_refused(world: World) -> None:
    client = client_for(world.a.owner)
    client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "one"}, format="json",
                HTTP_IDEMPOTENCY_KEY="k-2")
    response = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "two"},
                           format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert response.status_code == 422
    assert not Project.objects.filter(name="two").exists()


def test_idempotency_keys_are_per_user(world: World) -> None:
    body = {"name": "t"}
    a = client_for(world.a.owner).post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    b = client_for(world.b.owner).post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert a.status_code == b.status_code == 201
    assert a.json()["token"] != b.json()["token"]


def test_failed_create_does_not_consume_the_key(world: World) -> None:
    client = client_for(world.a.owner)
    bad = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "Bad!"},
                      format="json", HTTP_IDEMPOTENCY_KEY="k-3")
    assert bad.status_code == 400
    good = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "bad"},
                       format="json", HTTP_IDEMPOTENCY_KEY="k-3")
    # Nothing was stored for the failed attempt, so the corrected retry goes through.
    assert good.status_code == 201
    assert Project.objects.filter(name="bad").count() == 1


# --- tokens ------------------------------------------------------------------------------


def test_token_is_shown_once_stored_hashed_and_works(world: World) -> None:
    client = client_for(world.a.member)
    created = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json").json()
    plaintext = created["token"]
    assert plaintext.startswith("camp_")
    row = ApiToken.objects.get(pk=created["id"])
    assert plaintext not in (row.key_hash, row.prefix) and len(row.key_hash) == 64
    assert "token" not in client.get(f"/api/v1/tokens/{row.pk}/").json()
    me = bearer(plaintext).get("/api/v1/users/me/")
    assert me.status_code == 200 and me.json()["username"] == "acme-member"
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_revoked_and_expired_tokens_are_refused(world: World) -> None:
    token, plaintext = services.token_create(actor=world.a.member, name="old")
    assert bearer(plaintext).get("/api/v1/projects/").status_code == 200
    assert client_for(world.a.member).delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    assert bearer(plaintext).get("/api/v1/projects/").status_code == 401
    token2, plaintext2 = services.token_create(actor=world.a.member, name="short",
                                               expires_at=timezone.now() + timedelta(seconds=60))
    ApiToken.objects.filter(pk=token2.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(plaintext2).get("/api/v1/projects/").status_code == 401
    assert bearer("camp_nonsense").get("/api/v1/projects/").status_code == 401
    assert AuditEvent.objects.filter(action="token.revoked", target_id=str(token.pk)).exists()


def test_read_only_token_cannot_write(world: World) -> None:
    _, plaintext = services.token_create(actor=world.a.owner, name="ro", read_only=True)
    client = bearer(plaintext)
    assert client.get("/api/v1/projects/").status_code == 200
    response = client.post("/api/v1/projects/", {"tenant": world.a.tenant.pk, "name": "nope"},
                           format="json")
    assert response.status_code == 403
    assert not Project.objects.filter(name="nope").exists()


def test_project_token_sees_only_its_project(world: World) -> None:
    _, plaintext = services.token_create(actor=world.a.owner, name="p1", project=world.a.project)
    client = bearer(plaintext)
    names = {p["name"] for p in client.get("/api/v1/projects/").json()["results"]}
    assert names == {"acme-p1"}
    # the owner's tenant-level rights do not travel with a project token
    assert client.get(f"/api/v1/projects/{world.a.other_project.pk}/").status_code == 404
    assert client.get("/api/v1/audit-events/").json()["results"] == []
    # but it may still administer its own project
    response = client.post("/api/v1/memberships/", {
        "user": "outsider", "tenant": world.a.tenant.pk, "project": world.a.project.pk,
        "role": "project_member"}, format="json")
    assert response.status_code == 201


def test_token_cannot_be_narrowed_to_a_foreign_project(world: World) -> None:
    response = client_for(world.a.member).post(
        "/api/v1/tokens/", {"name": "x", "project": world.b.project.pk}, format="json")
    assert response.status_code == 400 and "project" in response.json()


def test_tokens_of_deactivated_users_stop_working(world: World) -> None:
    _, plaintext = services.token_create(actor=world.a.member, name="t")
    services.user_update(actor=world.admin, user=world.a.member, is_active=False)
    assert bearer(plaintext).get("/api/v1/projects/").status_code == 401


# --- quotas ------------------------------------------------------------------------------


def _tenant_quota(world: World, g: int = 8, lim: int | None = 16) -> Quota:
    return services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant, values={
        "gpus_guaranteed": Decimal(g), "gpus_limit": None if lim is None else Decimal(lim)})


QUOTA_BODY = {"gpu_memory_mib_guaranteed": 0, "cpu_cores_guaranteed": "0", "ram_mib_guaranteed": 0}


def test_quota_negative_and_guaranteed_above_limit(world: World) -> None:
    client = client_for(world.admin)
    response = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "tenant", "tenant": world.a.tenant.pk, "gpus_guaranteed": "-1",
        "cpu_cores_limit": "-2"}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"gpus_guaranteed", "cpu_cores_limit"}
    response = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "tenant", "tenant": world.a.tenant.pk, "gpus_guaranteed": "3",
        "gpus_limit": "2", "ram_mib_guaranteed": 10, "ram_mib_limit": 5}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"gpus_guaranteed", "ram_mib_guaranteed"}
    assert not Quota.objects.filter(tenant=world.a.tenant).exists()


def test_a_quota_field_its_scope_does_not_use_is_refused_by_name(world: World) -> None:
    """Issue 28 finding 9: ``"cluster": 1`` on a tenant quota answered 201 with ``"cluster":
    null`` (dropped); a tenant quota applies on every cluster, so it is a 400 naming the field."""
    from scheduling.models import Cluster

    cluster = Cluster.objects.create(name="c1")
    client = client_for(world.admin)
    response = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "gpus_guaranteed": "1", "scope": "tenant", "tenant": world.a.tenant.pk,
        "cluster": cluster.pk}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["cluster"], response.content
    assert "every cluster" in response.json()["cluster"][0]
    response = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "gpus_guaranteed": "1", "scope": "cluster", "cluster": cluster.pk,
        "tenant": world.a.tenant.pk}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["tenant"], response.content
    assert not Quota.objects.exists()
    ok = client.post("/api/v1/quotas/", {**QUOTA_BODY, "gpus_guaranteed": "1", "scope": "cluster",
                                         "cluster": cluster.pk},
                     format="json")
    assert ok.status_code == 201 and ok.json()["cluster"] == cluster.pk


def test_children_guarantees_must_fit_in_the_parent(world: World) -> None:
    _tenant_quota(world, g=8, lim=16)
    client = client_for(world.a.owner)
    ok = client.post("/api/v1/quotas/", {**QUOTA_BODY, "scope": "project", "project": world.a.project.pk,
                                         "gpus_guaranteed": "5"}, format="json")
    assert ok.status_code == 201
    too_much = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "project", "project": world.a.other_project.pk, "gpus_guaranteed": "4"},
        format="json")
    assert too_much.status_code == 400
    assert "9" in too_much.json()["gpus_guaranteed"][0]  # names the total it would reach
    above_limit = client.post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "project", "project": world.a.other_project.pk, "gpus_guaranteed": "1",
        "gpus_limit": "32"}, format="json")
    assert above_limit.status_code == 400 and "gpus_limit" in above_limit.json()


def test_parent_cannot_shrink_below_its_children(world: World) -> None:
    quota = _tenant_quota(world, g=8, lim=16)
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={"gpus_guaranteed": Decimal(6)})
    response = client_for(world.admin).patch(f"/api/v1/quotas/{quota.pk}/", {"gpus_guaranteed": "4"},
                                             format="json")
    assert response.status_code == 400 and "gpus_guaranteed" in response.json()
    quota.refresh_from_db()
    assert quota.gpus_guaranteed == 8


def test_owner_cannot_raise_own_tenant_quota(world: World) -> None:
    quota = _tenant_quota(world)
    response = client_for(world.a.owner).patch(f"/api/v1/quotas/{quota.pk}/", {"gpus_guaranteed": "100"},
                                               format="json")
    assert response.status_code == 403


# --- schema and docs ---------------------------------------------------------------------


def test_openapi_schema_and_docs_are_served(world: World) -> None:
    client = client_for(world.a.member)
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    doc = schema.json()
    assert doc["openapi"].startswith("3.")
    for path in ("/api/v1/tenants/", "/api/v1/projects/", "/api/v1/quotas/", "/api/v1/audit-events/export/"):
        assert path in doc["paths"]
    assert "bearerAuth" in doc["components"]["securitySchemes"]
    assert client.get("/api/docs/").status_code == 200


def test_schema_and_docs_need_a_signed_in_user_by_default(world: World) -> None:
    anonymous = APIClient()
    for path in ("/api/schema/", "/api/docs/"):
        assert anonymous.get(path).status_code in (401, 403), path
    _, plaintext = services.token_create(actor=world.a.member, name="schema")
    assert bearer(plaintext).get("/api/schema/?format=json").status_code == 200


def test_committed_schema_matches_the_code() -> None:
    """docs/openapi.yaml is regenerated by `make schema`; it must not drift."""
    from pathlib import Path

    import yaml
    from drf_spectacular.generators import SchemaGenerator

    generated = SchemaGenerator().get_schema(request=None, public=True)
    committed = yaml.safe_load(Path("docs/openapi.yaml").read_text())
    assert sorted(committed["paths"]) == sorted(generated["paths"])
    assert committed["components"]["schemas"].keys() == generated["components"]["schemas"].keys()


def test_pagination_and_ordering(world: World) -> None:
    client = client_for(world.admin)
    page = client.get("/api/v1/projects/", {"ordering": "-name"}).json()
    names = [p["name"] for p in page["results"]]
    assert names == sorted(names, reverse=True)
    assert page["count"] == Project.objects.count()
    assert client.get("/api/v1/projects/", {"page": 999}).status_code == 404


def test_project_token_cannot_mint_a_broader_token(world: World) -> None:
    _, narrow = services.token_create(actor=world.a.owner, name="p1", project=world.a.project)
    client = bearer(narrow)
    wide = client.post("/api/v1/tokens/", {"name": "escape"}, format="json")
    assert wide.status_code == 403
    other = client.post("/api/v1/tokens/", {"name": "escape", "project": world.a.other_project.pk},
                        format="json")
    assert other.status_code in (400, 403)
    same = client.post("/api/v1/tokens/", {"name": "ok", "project": world.a.project.pk}, format="json")
    assert same.status_code == 201
    assert ApiToken.objects.filter(user=world.a.owner, project__isnull=True).count() == 0


def test_expiring_token_cannot_mint_a_longer_lived_one(world: World) -> None:
    soon = timezone.now() + timedelta(days=1)
    _, parent = services.token_create(actor=world.a.owner, name="short", expires_at=soon)
    client = bearer(parent)
    assert client.post("/api/v1/tokens/", {"name": "forever"}, format="json").status_code == 403
    later = (soon + timedelta(days=30)).isoformat()
    assert client.post("/api/v1/tokens/", {"name": "later", "expires_at": later},
                       format="json").status_code == 403


def test_idempotent_token_replay_never_stores_the_secret(world: World) -> None:
    from tenants.models import IdempotencyRecord

    client = client_for(world.a.member)
    first = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY="tok-1")
    secret = first.json()["token"]
    record = IdempotencyRecord.objects.get(key="tok-1")
    assert secret not in str(record.response_body) and record.response_body["token"] is None
    replay = client.post("/api/v1/tokens/", {"name": "ci"}, format="json", HTTP_IDEMPOTENCY_KEY="tok-1")
    assert replay.status_code == 201 and replay.json()["token"] is None
    assert replay.json()["id"] == first.json()["id"]
    assert ApiToken.objects.filter(user=world.a.member, name="ci").count() == 1


@pytest.mark.parametrize("path, param", [
    ("/api/v1/projects/", "tenant"), ("/api/v1/memberships/", "tenant"), ("/api/v1/quotas/", "tenant"),
    ("/api/v1/audit-events/", "tenant"), ("/api/v1/tokens/", "project"), ("/api/v1/jobs/", "project"),
])
def test_filters_do_not_reveal_which_ids_exist(world: World, path: str, param: str) -> None:
    """A foreign tenant's id and an id that does not exist answer alike."""
    foreign = world.b.tenant.pk if param == "tenant" else world.b.project.pk
    client = client_for(world.a.owner)
    seen = client.get(path, {param: foreign})
    missing = client.get(path, {param: 99999999})
    assert seen.status_code == missing.status_code == 200
    assert seen.json()["results"] == missing.json()["results"] == []
    assert client.get(path, {param: "x"}).status_code == 400


def test_gpu_limit_across_all_clusters_is_validated_audited_and_admin_only(world: World) -> None:
    """Issue 16: a tenant's GPU limit across all clusters, set where quotas are set."""
    client = client_for(world.admin)
    bad = client.post("/api/v1/quotas/", {**QUOTA_BODY, "scope": "tenant", "tenant": world.a.tenant.pk,
                                          "gpus_guaranteed": "4", "gpus_limit_all_clusters": "-1"},
                      format="json")
    assert bad.status_code == 400 and set(bad.json()) == {"gpus_limit_all_clusters"}
    below = client.post("/api/v1/quotas/", {**QUOTA_BODY, "scope": "tenant", "tenant": world.a.tenant.pk,
                                            "gpus_guaranteed": "4", "gpus_limit_all_clusters": "2"},
                        format="json")
    assert below.status_code == 400 and "guaranteed" in below.json()["gpus_limit_all_clusters"][0].lower()
    ok = client.post("/api/v1/quotas/", {**QUOTA_BODY, "scope": "tenant", "tenant": world.a.tenant.pk,
                                         "gpus_guaranteed": "4", "gpus_limit_all_clusters": "12"},
                     format="json")
    assert ok.status_code == 201 and ok.json()["gpus_limit_all_clusters"] == "12.00"
    event = AuditEvent.objects.filter(action="quota.created").latest("id")
    assert event.after["gpus_limit_all_clusters"] in ("12.00", "12", 12)
    # The tenant's owner may not raise their own tenant's limit (as for every tenant quota field).
    denied = client_for(world.a.owner).patch(f"/api/v1/quotas/{ok.json()['id']}/",
                                             {"gpus_limit_all_clusters": "100"}, format="json")
    assert denied.status_code == 403
    assert Quota.objects.get(pk=ok.json()["id"]).gpus_limit_all_clusters == 12
    # The owner splits it: a project's limit across clusters.
    project = client_for(world.a.owner).post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "project", "project": world.a.project.pk, "gpus_guaranteed": "1",
        "gpus_limit_all_clusters": "6"}, format="json")
    assert project.status_code == 201
    above = client_for(world.a.owner).post("/api/v1/quotas/", {
        **QUOTA_BODY, "scope": "project", "project": world.a.other_project.pk, "gpus_guaranteed": "1",
        "gpus_limit_all_clusters": "13"}, format="json")
    assert above.status_code == 400 and "12" in above.json()["gpus_limit_all_clusters"][0]
    shrink = client.patch(f"/api/v1/quotas/{ok.json()['id']}/", {"gpus_limit_all_clusters": "5"},
                          format="json")
    assert shrink.status_code == 400 and "6" in shrink.json()["gpus_limit_all_clusters"][0]
