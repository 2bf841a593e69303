"""/scim/v2/ (namespace ``scim``, as django-scim2's adapters reverse it)."""

from django.urls import re_path
from django_scim import views as scim_views

from . import views

app_name = "scim"

urlpatterns = [
    re_path(r"^$", scim_views.SCIMView.as_view(implemented=False), name="root"),
    re_path(r"^\.search$", scim_views.SearchView.as_view(implemented=False), name="search"),
    re_path(r"^Users/\.search$", views.UserSearchView.as_view(), name="users-search"),
    re_path(r"^Users(?:/(?P<uuid>[^/]+))?$", views.UsersView.as_view(), name="users"),
    re_path(r"^Groups/\.search$", views.GroupSearchView.as_view(), name="groups-search"),
    re_path(r"^Groups(?:/(?P<uuid>[^/]+))?$", views.GroupsView.as_view(), name="groups"),
    re_path(r"^Me$", scim_views.SCIMView.as_view(implemented=False), name="me"),
    re_path(r"^ServiceProviderConfig$", scim_views.ServiceProviderConfigView.as_view(),
            name="service-provider-config"),
    re_path(r"^ResourceTypes(?:/(?P<uuid>[^/]+))?$", views.ResourceTypesView.as_view(),
            name="resource-types"),
    re_path(r"^Schemas(?:/(?P<uuid>[^/]+))?$", views.SchemasView.as_view(), name="schemas"),
    re_path(r"^Bulk$", scim_views.SCIMView.as_view(implemented=False), name="bulk"),
]
