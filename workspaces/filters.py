"""The services list's filters (django-filter, like the jobs list in scheduling/filters.py):
search, project and status, over a queryset already restricted to what the reader may see."""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from camp.widgets import FastSelect
from scheduling.filters import _projects

from .models import ModelService, ServiceStatus


class ServiceListFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search", widget=forms.TextInput(
        attrs={"type": "search", "placeholder": "name, model or project"}))
    project = django_filters.ModelChoiceFilter(queryset=_projects, label="Project",
                                               empty_label="Any project", widget=FastSelect)
    status = django_filters.ChoiceFilter(choices=ServiceStatus.choices, label="Status",
                                         empty_label="Any status", widget=FastSelect)

    class Meta:
        model = ModelService
        fields: list[str] = []

    def search(self, queryset: QuerySet[ModelService], name: str, value: str) -> QuerySet[ModelService]:
        value = value.strip()
        if not value:
            return queryset
        return queryset.filter(Q(name__icontains=value) | Q(model_source__icontains=value)
                               | Q(project__name__icontains=value))
