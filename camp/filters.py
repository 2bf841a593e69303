"""django-filter defaults for every API list: references filter by plain id, numbers and
booleans are checked strictly.

django-filter's default for a foreign key is a ModelChoiceFilter over *all* rows, which
answers 400 for an id that does not exist and 200 (empty) for one that exists in another
tenant — telling outsiders which ids exist. An integer filter answers the same for both; the
queryset being filtered is already restricted to what the user may see.

Its default number filter is a DecimalField with no range, so `?project=10**24` reached
PostgreSQL and failed with an OverflowError (a 500); its boolean filter silently ignores
what it does not understand (`?enabled=7` listed everything). Here a number out of the
column's range and a boolean other than true/false are a 400 naming the parameter, and the
OpenAPI schema states the same bounds.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field

BIGINT_MAX = 2**63 - 1  # PostgreSQL bigint, the type of every primary key (BigAutoField)
INT_MAX = 2**31 - 1  # PostgreSQL integer


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": BIGINT_MAX})
class IdFilter(django_filters.NumberFilter):
    """An object id: a whole number within bigint's range."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", BIGINT_MAX)
        super().__init__(*args, **kwargs)


@extend_schema_field({"type": "integer", "minimum": -INT_MAX - 1, "maximum": INT_MAX})
class IntFilter(django_filters.NumberFilter):
    """A whole number within the integer column's range."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", -INT_MAX - 1)
        kwargs.setdefault("max_value", INT_MAX)
        super().__init__(*args, **kwargs)


class StrictBooleanField(forms.Field):
    """`true` or `false` (any case), as the schema's boolean says; anything else is an error."""

    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        text = str(value).lower()
        if text in ("true", "false"):
            return text == "true"
        raise ValidationError("Must be true or false.", code="invalid")


@extend_schema_field({"type": "boolean"})
class BooleanFilter(django_filters.BooleanFilter):
    field_class = StrictBooleanField


_ID_FILTER: dict[str, Any] = {"filter_class": IdFilter}
_INT_FILTER: dict[str, Any] = {"filter_class": IntFilter}
_BOOL_FILTER: dict[str, Any] = {"filter_class": BooleanFilter}


class CampFilterSet(django_filters.FilterSet):
    FILTER_DEFAULTS = {
        **django_filters.filterset.FILTER_FOR_DBFIELD_DEFAULTS,
        models.ForeignKey: _ID_FILTER,
        models.OneToOneField: _ID_FILTER,
        models.AutoField: _ID_FILTER,
        models.BigAutoField: _ID_FILTER,
        models.IntegerField: _INT_FILTER,
        models.SmallIntegerField: _INT_FILTER,
        models.PositiveIntegerField: _INT_FILTER,
        models.PositiveSmallIntegerField: _INT_FILTER,
        models.BooleanField: _BOOL_FILTER,
    }


class CampFilterBackend(DjangoFilterBackend):
    filterset_base = CampFilterSet
