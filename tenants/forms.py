"""Console forms: input shape only; services apply the rules and name bad fields."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError

from .models import RESOURCE_LABELS, RESOURCES, Project, Quota, Role, Tenant, User
from .validators import NOT_INVITABLE, canonical_username


class LoginForm(AuthenticationForm):
    username = forms.CharField(widget=forms.TextInput(attrs={"autofocus": True, "autocomplete": "username"}))

    def clean_username(self) -> str:
        # Normalised once, here: every backend, django-axes and the audit see one spelling.
        return canonical_username(str(self.cleaned_data.get("username") or ""))


class TenantForm(forms.ModelForm[Tenant]):
    class Meta:
        model = Tenant
        fields = ["name", "display_name", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}


class ProjectForm(forms.ModelForm[Project]):
    class Meta:
        model = Project
        fields = ["name", "display_name", "description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2})}

    def validate_unique(self) -> None:
        """Uniqueness within the tenant is checked by the service."""


class MembershipForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices)

    def __init__(self, *args: Any, roles: list[tuple[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if roles is not None:
            self.fields["role"].choices = roles  # type: ignore[attr-defined]

    def clean_username(self) -> User:
        username = self.cleaned_data["username"].strip()
        user = User.objects.filter(username__in=[canonical_username(username), username],
                                   is_active=True).order_by("username").first()
        if user is None:  # unknown or deactivated: one answer (the views check the right first)
            raise ValidationError(NOT_INVITABLE)
        return user


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


class ClassLimitsField(forms.CharField):
    """GPU memory limits per GPU model class as lines ``A100-80G = 163840`` (MiB) ↔ the
    quota's ``{class: MiB}`` map. Shape only; the service checks the classes and amounts."""

    widget = forms.Textarea(attrs={"rows": 3, "placeholder": "A100-80G = 163840"})

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, dict):
            return "\n".join(f"{k} = {v}" for k, v in sorted(value.items()))
        return value

    def to_python(self, value: Any) -> dict[str, int]:  # type: ignore[override]
        text = super().to_python(value) or ""
        out: dict[str, int] = {}
        for n, line in enumerate(str(text).splitlines(), 1):
            if not line.strip():
                continue
            name, sep, amount = line.partition("=")
            # ASCII digits only, at most 16: str.isdigit() also accepts '²' and other
            # Unicode digits that int() refuses, and int() refuses over 4,300 digits.
            if not sep or not name.strip() or not re.fullmatch(r"[0-9]{1,16}", amount.strip()):
                raise ValidationError(f"Line {n}: write one 'GPU model class = MiB' per line "
                                      f"(whole MiB in digits 0-9).")
            if name.strip() in out:
                raise ValidationError(f"Line {n}: {name.strip()} is given twice.")
            out[name.strip()] = int(amount.strip())
        return out


class QuotaForm(forms.ModelForm[Quota]):
    ALL_CLUSTERS = ("gpus_guaranteed_all_clusters", "gpus_limit_all_clusters",
                    "gpu_memory_mib_limits_all_clusters")
    """Tenant and project quotas only (the cluster quota's form leaves them out)."""

    gpu_memory_mib_limits_all_clusters = ClassLimitsField(
        required=False, label="GPU memory limit per GPU model class across all clusters (MiB)",
        help_text="One 'class = MiB' per line, e.g. A100-80G = 163840; empty: no limit.")

    class Meta:
        model = Quota
        fields = [*(f"{r}_{k}" for r in RESOURCES for k in ("guaranteed", "limit")),
                  "gpus_guaranteed_all_clusters", "gpus_limit_all_clusters",
                  "gpu_memory_mib_limits_all_clusters"]
        labels = {
            **{f"{r}_{k}": f"{RESOURCE_LABELS[r]} {k}" for r in RESOURCES for k in ("guaranteed", "limit")},
            "gpus_guaranteed_all_clusters": "GPUs guaranteed across all clusters",
            "gpus_limit_all_clusters": "GPU limit across all clusters",
        }

    def __init__(self, *args: Any, scope: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if scope == "cluster":
            for name in self.ALL_CLUSTERS:
                del self.fields[name]

    def validate_constraints(self, exclude: Any = None) -> None:
        """Scope constraints are the service's to check (the form only edits amounts)."""


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False,
                                     help_text="Narrow the token to one project.")
    read_only = forms.BooleanField(required=False)
    expires_in_days = forms.IntegerField(min_value=1, max_value=3650, initial=90, required=False,
                                         help_text="Empty: never expires.")

    def __init__(self, *args: Any, projects: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if projects is not None:
            self.fields["project"].queryset = projects  # type: ignore[attr-defined]


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(required=False)
    first_name = forms.CharField(max_length=150, required=False)
    last_name = forms.CharField(max_length=150, required=False)
    password = forms.CharField(widget=forms.PasswordInput, required=False,
                               help_text="Empty for SSO-only accounts.")
    is_platform_admin = forms.BooleanField(required=False)


def apply_service_errors(form: forms.BaseForm, exc: ValidationError) -> None:
    """Show a service's ValidationError on the form, field by field."""
    if hasattr(exc, "error_dict"):
        for field, errors in exc.message_dict.items():
            target = field if field in form.fields else None
            for message in errors:
                form.add_error(target, message)
    else:
        for message in exc.messages:
            form.add_error(None, message)
