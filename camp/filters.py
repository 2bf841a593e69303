"""django-filter defaults for every API list: references filter by plain id.

django-filter's default for a foreign key is a ModelChoiceFilter over *all* rows, which
answers 400 for an id that does not exist and 200 (empty) for one that exists in another
tenant — telling outsiders which ids exist. A NumberFilter answers the same for both; the
queryset being filtered is already restricted to what the user may see.
"""

from __future__ import annotations

from typing import Any

import django_filters
from django.db import models
from django_filters.rest_framework import DjangoFilterBackend

_ID_FILTER: dict[str, Any] = {"filter_class": django_filters.NumberFilter}


class CampFilterSet(django_filters.FilterSet):
    FILTER_DEFAULTS = {
        **django_filters.filterset.FILTER_FOR_DBFIELD_DEFAULTS,
        models.ForeignKey: _ID_FILTER,
        models.OneToOneField: _ID_FILTER,
    }


class CampFilterBackend(DjangoFilterBackend):
    filterset_base = CampFilterSet
