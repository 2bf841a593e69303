"""Tenancy: users, tenants, projects, memberships, quotas, API tokens, audit events."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from .validators import canonical_username, confusable_username_reason, slug_validator


class User(AbstractUser):
    """A person or service account. ``is_platform_admin`` is the top role."""

    is_platform_admin = models.BooleanField(
        default=False, help_text="Platform admins manage the whole platform."
    )
    # Single sign-on (tenants/sso, docs/AUTH.md). Accounts of different sources never
    # merge: OIDC users are found by (issuer, subject) only, SAML users by (IdP entity
    # id, NameID) in the same two fields, LDAP users by username
    # among LDAP-sourced accounts only.
    auth_source = models.CharField(
        max_length=8,
        choices=[("local", "Local"), ("ldap", "LDAP"), ("oidc", "OpenID Connect"),
                 ("saml", "SAML 2.0")],
        default="local", help_text="Where this account signs in.",
    )
    sso_issuer = models.CharField(max_length=255, blank=True, default="")
    sso_subject = models.CharField(max_length=255, blank=True, default="")
    sso_grants = models.JSONField(
        default=list, blank=True,
        help_text="Roles last granted by SSO group mapping; only these are revoked by a re-sync.",
    )

    class Meta(AbstractUser.Meta):
        constraints = [
            models.UniqueConstraint(
                fields=["sso_issuer", "sso_subject"], condition=~Q(sso_subject=""),
                name="user_unique_sso_identity",
            )
        ]

    @classmethod
    def normalize_username(cls, username: str) -> str:
        """NFKC + case folding (Django's own is NFKC only): one person, one username."""
        return canonical_username(username) if isinstance(username, str) else username

    _stored_username: str | None = None  # as loaded from the database (clean())

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any],
                **kwargs: Any) -> User:
        user = super().from_db(db, field_names, values, **kwargs)
        user._stored_username = user.__dict__.get("username")
        return user

    def clean(self) -> None:
        typed = self.username
        super().clean()  # normalises the username
        if self.pk is not None and typed == getattr(self, "_stored_username", None):
            # An unchanged name is kept as stored: an account from before normalisation
            # (a look-alike) can still be edited and deactivated.
            self.username = typed
            return
        reason = confusable_username_reason(self.username)
        if reason:
            raise ValidationError({"username": [reason]})

    @property
    def platform_admin(self) -> bool:
        return bool(self.is_active and (self.is_platform_admin or self.is_superuser))


class Role(models.TextChoices):
    """Roles below platform admin, highest first; each holds every right of those below."""

    TENANT_OWNER = "tenant_owner", "Tenant owner"
    PROJECT_ADMIN = "project_admin", "Project admin"
    PROJECT_MEMBER = "project_member", "Project member"


PROJECT_ROLES = (Role.PROJECT_ADMIN, Role.PROJECT_MEMBER)


class Tenant(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name


class Project(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=63, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"], name="project_unique_name_in_tenant",
                violation_error_message="This tenant already has a project with this name.",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant.name}/{self.name}"


class Membership(models.Model):
    """A role of one user in one tenant (tenant owner) or one project (project roles)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="memberships"
    )
    role = models.CharField(max_length=20, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name", "project__name", "user__username"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant"],
                condition=Q(project__isnull=True),
                name="membership_unique_tenant_role",
                violation_error_message="This user already has a role in this tenant.",
            ),
            models.UniqueConstraint(
                fields=["user", "project"],
                condition=Q(project__isnull=False),
                name="membership_unique_project_role",
                violation_error_message="This user already has a role in this project.",
            ),
            models.CheckConstraint(
                condition=(Q(role="tenant_owner") & Q(project__isnull=True))
                | (Q(role__in=["project_admin", "project_member"]) & Q(project__isnull=False)),
                name="membership_role_matches_scope",
            ),
        ]

    def __str__(self) -> str:
        where = self.project or self.tenant
        return f"{self.user} as {self.get_role_display()} of {where}"


RESOURCES = ("gpus", "gpu_memory_mib", "cpu_cores", "ram_mib")
RESOURCE_LABELS = {
    "gpus": "GPUs",
    "gpu_memory_mib": "GPU memory (MiB)",
    "cpu_cores": "CPU cores",
    "ram_mib": "RAM (MiB)",
}


class QuotaScope(models.TextChoices):
    CLUSTER = "cluster", "Cluster"
    TENANT = "tenant", "Tenant"
    PROJECT = "project", "Project"


def _amount(decimal: bool, null: bool, help_text: str) -> models.Field:  # type: ignore[type-arg]
    validators = [MinValueValidator(0)]
    if decimal:
        return models.DecimalField(
            max_digits=12, decimal_places=2, null=null, blank=null,
            validators=validators, help_text=help_text,
        )
    return models.BigIntegerField(null=null, blank=null, validators=validators, help_text=help_text)


class Quota(models.Model):
    """Guaranteed and limit per resource for one node of the queue tree.

    cluster → tenant → project. ``*_limit`` empty means "no limit beyond the parent's".
    """

    scope = models.CharField(max_length=10, choices=QuotaScope.choices)
    cluster = models.OneToOneField(
        "scheduling.Cluster", on_delete=models.CASCADE, null=True, blank=True, related_name="quota"
    )
    # Set for tenant quotas and, denormalised, for project quotas (tenant-wide filters).
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, null=True, blank=True, related_name="quotas"
    )
    project = models.OneToOneField(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="quota"
    )
    gpus_guaranteed = _amount(True, False, "GPUs guaranteed (fractions allowed)")
    gpus_limit = _amount(True, True, "GPUs at most (empty: no limit)")
    gpu_memory_mib_guaranteed = _amount(False, False, "GPU memory guaranteed, MiB")
    gpu_memory_mib_limit = _amount(False, True, "GPU memory at most, MiB (empty: no limit)")
    cpu_cores_guaranteed = _amount(True, False, "CPU cores guaranteed")
    cpu_cores_limit = _amount(True, True, "CPU cores at most (empty: no limit)")
    ram_mib_guaranteed = _amount(False, False, "RAM guaranteed, MiB")
    ram_mib_limit = _amount(False, True, "RAM at most, MiB (empty: no limit)")
    # Tenant and project quotas only (issue 16): GPUs held on all clusters together, checked
    # by each cluster's cycle under a per-tenant lock (scheduling/services/cycle.py).
    gpus_limit_all_clusters = _amount(
        True, True, "GPUs at most on all clusters together (tenant/project; empty: no limit)")
    # Issue 16's platform level, continued: GPU memory limits per GPU model class over all
    # clusters ({"A100-80G": 163840}: class → MiB; a JSON map, see docs/ARCHITECTURE.md).
    # A GPU guarantee over all clusters together, split each cycle into per-cluster parts
    # that sum to it (scheduling/engine/guarantees.py; docs/ARCHITECTURE.md).
    gpus_guaranteed_all_clusters = _amount(
        True, True, "GPUs guaranteed on all clusters together, beside the per-cluster "
                    "guarantee (tenant/project; empty: none)")
    gpu_memory_mib_limits_all_clusters = models.JSONField(
        default=dict, blank=True,
        help_text="GPU memory (MiB) at most per GPU model class on all clusters together: "
                  "{model class: MiB} (tenant/project)")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["scope", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(scope="cluster", cluster__isnull=False, tenant__isnull=True, project__isnull=True)
                    | Q(scope="tenant", cluster__isnull=True, tenant__isnull=False, project__isnull=True)
                    | Q(scope="project", cluster__isnull=True, tenant__isnull=False,
                        project__isnull=False)
                ),
                name="quota_scope_matches_target",
            ),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(scope="tenant"), name="quota_one_per_tenant"
            ),
        ]

    def __str__(self) -> str:
        return f"quota of {self.scope} {self.target()}"

    def target(self) -> models.Model | None:
        return {"cluster": self.cluster, "tenant": self.tenant, "project": self.project}[self.scope]


class ApiToken(models.Model):
    """A bearer token for automation. Only its SHA-256 is stored; it is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True, help_text="Public part, for display")
    key_hash = models.CharField(max_length=64, unique=True)
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, null=True, blank=True, related_name="api_tokens",
        help_text="If set, the token acts only within this project.",
    )
    read_only = models.BooleanField(default=False)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class AuditEvent(models.Model):
    """One change that mattered. Append-only (database triggers) and hash-chained.

    References are plain ids (no FK constraint) so that deleting a user, tenant or
    project never has to touch, and so never rewrites, the history.
    """

    created_at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.DO_NOTHING,
        db_constraint=False, related_name="+",
    )
    actor_username = models.CharField(max_length=150, blank=True)
    # Indexed by audit_tenant_latest / audit_project_latest, which lead with them: a
    # single-column index as well only cost every audited write (issue 35).
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="+", db_index=False,
    )
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="+", db_index=False,
    )
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    target_repr = models.CharField(max_length=255, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    client_ip = models.GenericIPAddressField(null=True, blank=True)
    # The chain (tenants/audit.py): empty until the row is sealed, shortly after its commit.
    prev_hash = models.CharField(max_length=64, null=True, blank=True)
    hash = models.CharField(max_length=64, unique=True, null=True, blank=True)
    chain_seq = models.BigIntegerField(unique=True, null=True, blank=True,
                                       help_text="Position in the hash chain (order of sealing).")

    class Meta:
        ordering = ["-id"]
        # The API's filters, newest first (tenant owners read their tenant's events).
        indexes = [
            models.Index(fields=["tenant", "-id"], name="audit_tenant_latest"),
            models.Index(fields=["project", "-id"], name="audit_project_latest"),
            models.Index(fields=["target_type", "target_id", "-id"], name="audit_target_latest"),
            models.Index(fields=["actor_username", "-id"], name="audit_actor_latest"),
            models.Index(fields=["request_id"], name="audit_request"),
            # The sealer's queue: committed rows not chained yet, oldest first.
            models.Index(fields=["id"], name="audit_unsealed", condition=models.Q(hash__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.action} by {self.actor_username or 'system'}"


class IdempotencyRecord(models.Model):
    """The first response to a create request carrying an Idempotency-Key."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    endpoint = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "endpoint", "key"], name="idempotency_unique_key")
        ]


class OidcSession(models.Model):
    """A Camp session an OpenID provider signed in: its ``sid`` and subject, so the provider's
    back-channel logout (OpenID Connect Back-Channel Logout 1.0) can end it."""

    session_key = models.CharField(max_length=40, unique=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    sid = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            models.Index(fields=["issuer", "sid"], name="oidc_session_sid"),
            models.Index(fields=["issuer", "subject"], name="oidc_session_subject"),
        ]

    def __str__(self) -> str:
        return f"{self.subject}@{self.issuer} ({self.sid or 'no sid'})"
