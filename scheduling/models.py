"""Scheduling data: clusters (the root of the queue tree).

The scheduler-service issue adds credentials, inventory, allocations and cycles.
"""

from django.core.validators import RegexValidator
from django.db import models

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "Use lowercase letters, digits and '-' (a DNS label, at most 63 characters).",
)


class Cluster(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    display_name = models.CharField(max_length=200, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.display_name or self.name
