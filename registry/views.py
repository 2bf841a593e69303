"""Console pages for the image catalog and external registries (same services and
permissions as the API). A registry's password is write-only: never rendered back."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from tenants.forms import apply_service_errors
from tenants.models import Project, Tenant
from tenants.permissions import DELETE, actor_of, can, restrict

from . import services
from .models import ExternalRegistry, Framework, Image, Variant


class _OwnedForm(forms.Form):
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False,
                                    help_text="Empty: the platform's (admins only).")
    project = forms.ModelChoiceField(queryset=Project.objects.none(), required=False,
                                     help_text="Set for a project's own entry.")

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields: Any = self.fields
        fields["tenant"].queryset = restrict(Tenant.objects.all(), user)
        fields["project"].queryset = restrict(Project.objects.select_related("tenant"), user)


class ImageForm(_OwnedForm):
    name = forms.CharField(max_length=63)
    display_name = forms.CharField(max_length=200, required=False)
    reference = forms.CharField(max_length=512, help_text="e.g. ghcr.io/acme/trainer:1.2")
    variant = forms.ChoiceField(choices=Variant.choices)
    framework = forms.ChoiceField(choices=Framework.choices, initial=Framework.OTHER)
    registry = forms.ModelChoiceField(queryset=ExternalRegistry.objects.none(), required=False)

    def __init__(self, *args: Any, user: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, user=user, **kwargs)
        fields: Any = self.fields
        fields["registry"].queryset = restrict(ExternalRegistry.objects.all(), user)


class RegistryForm(_OwnedForm):
    name = forms.CharField(max_length=63)
    server = forms.CharField(max_length=253, help_text="e.g. ghcr.io")
    username = forms.CharField(max_length=255, required=False)
    password = forms.CharField(max_length=4096, required=False, widget=forms.PasswordInput,
                               help_text="Or an access token. Write-only: stored encrypted, never shown.")


@login_required
def image_list(request: HttpRequest) -> HttpResponseBase:
    form = ImageForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            image = services.image_create(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Image {image.name} added.")
            return redirect("registry:images")
    images = restrict(Image.objects.select_related("tenant", "project", "registry"), request.user)
    rows = [{"image": i, "can_delete": can(request.user, DELETE, i)} for i in images]
    return render(request, "registry/images.html", {"rows": rows, "form": form})


@login_required
@require_POST
def image_delete(request: HttpRequest, pk: int) -> HttpResponseBase:
    image = get_object_or_404(restrict(Image.objects.all(), request.user), pk=pk)
    services.image_delete(actor=actor_of(request), image=image)
    messages.success(request, f"Image {image.name} removed.")
    return redirect("registry:images")


@login_required
def registry_list(request: HttpRequest) -> HttpResponse | HttpResponseBase:
    form = RegistryForm(request.POST or None, user=request.user)
    if request.method == "POST" and form.is_valid():
        try:
            registry = services.registry_create(actor=actor_of(request), **form.cleaned_data)
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Registry {registry.name} added.")
            return redirect("registry:registries")
    registries = restrict(ExternalRegistry.objects.select_related("tenant", "project"), request.user)
    rows = [{"registry": r, "can_delete": can(request.user, DELETE, r)} for r in registries]
    return render(request, "registry/registries.html", {"rows": rows, "form": form})


@login_required
@require_POST
def registry_delete(request: HttpRequest, pk: int) -> HttpResponseBase:
    registry = get_object_or_404(restrict(ExternalRegistry.objects.all(), request.user), pk=pk)
    try:
        services.registry_delete(actor=actor_of(request), registry=registry)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Registry {registry.name} removed.")
    return redirect("registry:registries")
