"""Validators shared by every app (tenancy is the ground floor, so they live here)."""

from __future__ import annotations

from django.core.validators import RegexValidator

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "Use lowercase letters, digits and '-' (a DNS label, at most 63 characters).",
)
