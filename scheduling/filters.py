"""The console's job list filters (django-filter, as the API's lists): search, state,
project, owner, kind and cluster, and sortable columns. Every choice is drawn from what the
reader may see; the queryset being filtered is already restricted (selectors.job_list)."""

from __future__ import annotations

from typing import Any

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from camp.widgets import FastSelect
from tenants.models import Project
from tenants.permissions import restrict

from .models import CLUSTER_BULKY_FIELDS, Cluster, Job, JobState

ACTIVE = "active"  # a pseudo-state: waiting, starting or running

STATE_CHOICES = [(ACTIVE, "Running or waiting"), *JobState.choices]

# Job.kind as people name it (workspaces/ sets these: EnvKind and TrainingFramework values).
KIND_LABELS = {
    "jupyter": "Notebook (JupyterLab)", "vscode": "VS Code", "ssh": "SSH environment",
    "pytorch": "Training: PyTorch", "deepspeed": "Training: DeepSpeed", "mpi": "Training: MPI",
    "tensorflow": "Training: TensorFlow", "batch": "Batch job", "service": "Model service replica",
}


def _projects(request: Any) -> QuerySet[Project]:
    user = getattr(request, "user", None)
    return restrict(Project.objects.select_related("tenant"), user)


def _clusters(request: Any) -> QuerySet[Cluster]:
    # A choice's label needs the name, not a simulated cluster's inventory YAML.
    return restrict(Cluster.objects.defer(*CLUSTER_BULKY_FIELDS), getattr(request, "user", None))


class JobListFilter(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search", widget=forms.TextInput(
        attrs={"type": "search", "placeholder": "name, owner or project"}))
    state = django_filters.ChoiceFilter(choices=STATE_CHOICES, method="by_state", label="State",
                                        empty_label="Any state", widget=FastSelect)
    project = django_filters.ModelChoiceFilter(queryset=_projects, label="Project",
                                               empty_label="Any project", widget=FastSelect)
    owner = django_filters.CharFilter(method="by_owner", label="Owner", widget=forms.TextInput(
        attrs={"placeholder": "a username, or me"}))
    kind = django_filters.ChoiceFilter(choices=list(KIND_LABELS.items()), label="Kind",
                                       empty_label="Any kind", widget=FastSelect)
    cluster = django_filters.ModelChoiceFilter(queryset=_clusters, to_field_name="name",
                                               label="Cluster", empty_label="Any cluster",
                                               widget=FastSelect)
    sort = django_filters.OrderingFilter(
        fields=(("name", "name"), ("project__name", "project"), ("owner__username", "owner"),
                ("state", "state"), ("priority", "priority"), ("submitted_at", "submitted")),
        label="Sort",
    )

    class Meta:
        model = Job
        fields: list[str] = []

    def search(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        value = value.strip()[:100]
        if not value:
            return queryset
        return queryset.filter(Q(name__icontains=value) | Q(owner__username__icontains=value)
                               | Q(project__name__icontains=value))

    def by_state(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        if value == ACTIVE:
            return queryset.filter(state__in=[JobState.QUEUED, JobState.STARTING, JobState.RUNNING,
                                              JobState.PREEMPTING])
        return queryset.filter(state=value)

    def by_owner(self, queryset: QuerySet[Job], name: str, value: str) -> QuerySet[Job]:
        value = value.strip()
        if value == "me":
            return queryset.filter(owner=self.request.user if self.request else None)
        return queryset.filter(owner__username=value) if value else queryset
